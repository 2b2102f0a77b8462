//! What a cached route's request carries past the cache phase to the upstream and back
//! ([`Pending`]): whether it leads its key's fill, the stale copy that may stand in for a
//! failure or a refusal, and what the cache did (counted, and written in `Cache-Status`, when
//! the response goes out).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, HeaderValue, Response, StatusCode, Uri, header};
use http_body_util::BodyExt;
use tokio::sync::OwnedSemaphorePermit;

use crate::answer::{Body, Rejection};
use crate::cache::shared::Writer;
use crate::cache::{self, Cache, Entry, Key, Leader, NewEntry, Rules, status};
use crate::metrics::{CacheResult, RouteCacheMetrics, StaleReason};

/// A cached route's request on its way to the upstream.
pub(in crate::proxy) struct Pending {
    pub(super) rules: Arc<Rules>,
    /// The route's name (where a stored entry sits, for purges).
    pub(super) route: Arc<str>,
    pub(super) key: Key,
    /// The request as it arrived: what the answer's `Vary` reads, and what RFC 9111 judges.
    pub(super) uri: Uri,
    pub(super) asked: HeaderMap,
    pub(super) credentialed: bool,
    pub(super) role: Role,
    /// A stale copy, for `stale_if_error`, `stale_if_overloaded` and `stale_if_limited`.
    pub(super) stale: Option<(Arc<Entry>, Duration)>,
    pub(super) head: bool,
    /// What the cache did, and its `Cache-Status`: set as the request goes.
    pub(super) result: CacheResult,
    pub(super) status: HeaderValue,
    pub(super) metrics: Arc<RouteCacheMetrics>,
    /// `cache.shared`: where the answer goes for the other instances (and the claim on the key
    /// it holds, given up when it is dropped unused).
    pub(super) writer: Option<Writer>,
}

/// What a request going upstream does with the answer.
pub(super) enum Role {
    /// It leads the key's fill: the answer is streamed to its followers and stored.
    Lead(Leader),
    /// It stores the answer if it may, with no one waiting on it.
    Alone,
    /// A trusted client's `no-cache`: fetched, and stored.
    Refresh,
    /// Among the few sent upstream from a fill that could not be used (held until the answer).
    Released { _place: OwnedSemaphorePermit },
    /// The key's last answer could not be stored, or a HEAD missed: forwarded as it is.
    Pass,
    /// May not use the cache (`Range`): forwarded as it is.
    Bypass,
}

/// An entry's answer, boxed as every answer is.
pub(super) fn from_entry(
    entry: &Entry,
    now: Instant,
    head: bool,
    status: HeaderValue,
) -> Response<Body> {
    cache::answer(entry, now, head, status).map(|b| b.boxed_unsync())
}

/// True for an upstream answer a stale copy may stand in for (`stale_if_error`).
fn failed(forwarded: &Result<Response<Body>, Rejection>) -> bool {
    match forwarded {
        Ok(response) => response.status().is_server_error(),
        Err(rejection) => matches!(
            rejection,
            Rejection::BadGateway(_) | Rejection::GatewayTimeout | Rejection::NoUpstream
        ),
    }
}

impl Pending {
    /// A cached route's request `req`, keyed `key`, before the cache is consulted: a bypass
    /// until the cache phase says otherwise.
    pub(super) fn new(
        rules: Arc<Rules>,
        route: Arc<str>,
        key: Key,
        req: &http::Request<crate::proxy::body::ClientBody>,
        credentialed: bool,
        metrics: Arc<RouteCacheMetrics>,
    ) -> Pending {
        Pending {
            rules,
            route,
            key,
            uri: req.uri().clone(),
            asked: HeaderMap::new(),
            credentialed,
            role: Role::Bypass,
            stale: None,
            head: req.method() == http::Method::HEAD,
            result: CacheResult::Bypass,
            status: status::BYPASS,
            metrics,
            writer: None,
        }
    }

    /// A request of floodgate's own (a refresh), as if a client had asked.
    pub(super) fn detached(
        rules: Arc<Rules>,
        route: Arc<str>,
        key: Key,
        uri: Uri,
        asked: HeaderMap,
        metrics: Option<Arc<RouteCacheMetrics>>,
    ) -> Option<Pending> {
        Some(Pending {
            rules,
            route,
            key,
            uri,
            asked,
            credentialed: false,
            role: Role::Alone,
            stale: None,
            head: false,
            result: CacheResult::Miss,
            status: status::MISS,
            metrics: metrics?,
            writer: None,
        })
    }

    /// The stale copy, served for `reason`, if its route allows that long.
    pub(super) fn stale_for(
        &mut self,
        reason: StaleReason,
        now: Instant,
    ) -> Option<Response<Body>> {
        let window = match reason {
            StaleReason::Revalidating => self.rules.stale_while_revalidate,
            StaleReason::Error => self.rules.stale_if_error,
            StaleReason::Overloaded => self.rules.stale_if_overloaded,
            StaleReason::Limited => self.rules.stale_if_limited,
        };
        let (entry, _) = self.stale.as_ref()?;
        let stale = entry.stale_for(now)?;
        if stale >= window {
            return None;
        }
        let answer = from_entry(
            entry,
            now,
            self.head,
            status::stale(stale.as_secs().max(1), reason.as_str()),
        );
        self.metrics.stale(reason);
        self.result = CacheResult::Stale;
        Some(answer)
    }

    /// A refusal the route's stale copy may stand in for: `stale_if_limited` (the copy carries
    /// the refusal's rate-limit headers, 0 remaining) or `stale_if_overloaded`.
    pub(in crate::proxy) fn instead_of(
        &mut self,
        rejection: &Rejection,
        headers: &crate::answer::RateLimitHeaders,
    ) -> Option<Response<Body>> {
        let now = Instant::now();
        match rejection {
            Rejection::RateLimited(verdict, limit) => {
                let mut answer = self.stale_for(StaleReason::Limited, now)?;
                headers.write(answer.headers_mut(), verdict, *limit);
                Some(answer)
            }
            Rejection::UpstreamOverloaded => self.stale_for(StaleReason::Overloaded, now),
            _ => None,
        }
    }

    /// What the upstream answered (or why it did not), for the cache: a stale copy instead of a
    /// failure (`stale_if_error`); else the answer, stored (and streamed to the followers) if
    /// it may be.
    pub(in crate::proxy) fn settle(
        &mut self,
        cache: &Arc<Cache>,
        forwarded: Result<Response<Body>, Rejection>,
    ) -> Result<Response<Body>, Rejection> {
        if failed(&forwarded) {
            // The followers hear of it first: each serves its stale copy, or goes upstream.
            if let Role::Lead(leader) = std::mem::replace(&mut self.role, Role::Bypass) {
                leader.fail();
            }
            // Another instance may try: the claim goes, nothing is written.
            drop(self.writer.take());
            if let Some(answer) = self.stale_for(StaleReason::Error, Instant::now()) {
                return Ok(answer);
            }
            self.result = CacheResult::Uncacheable;
            return forwarded;
        }
        let Ok(response) = forwarded else {
            return forwarded;
        };
        let role = std::mem::replace(&mut self.role, Role::Bypass);
        match role {
            Role::Lead(leader) => Ok(self.store(cache, Some(leader), response)),
            Role::Alone | Role::Refresh => Ok(self.store(cache, None, response)),
            Role::Released { .. } | Role::Pass | Role::Bypass => Ok(response),
        }
    }

    /// Stores `response` if RFC 9111 and the route allow it, streaming its body to the
    /// followers of `leader`; else lets them go (a few at a time) and remembers the key as not
    /// storable for the route's `ttl`.
    pub(super) fn store(
        &mut self,
        cache: &Arc<Cache>,
        leader: Option<Leader>,
        response: Response<Body>,
    ) -> Response<Body> {
        let refresh = matches!(self.status.as_bytes(), b"floodgate; fwd=request");
        let judged = cache::judge::judge(
            &self.rules,
            &self.uri,
            &self.asked,
            self.credentialed,
            response.status(),
            response.headers(),
            SystemTime::now(),
        );
        let max_entry = cache.max_entry();
        let too_large = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|n| n > max_entry as u64);
        let storable = match judged {
            Ok(storable) if !too_large && response.status() != StatusCode::PARTIAL_CONTENT => {
                storable
            }
            Ok(_) => {
                // Too large: it streams through; the next request goes upstream too.
                if let Some(leader) = leader {
                    leader.pass();
                }
                if let Some(writer) = self.writer.take() {
                    writer.pass(self.rules.ttl);
                }
                self.result = CacheResult::Uncacheable;
                self.status = status::MISS;
                return response;
            }
            Err(why) => {
                if let Some(leader) = leader {
                    leader.pass();
                }
                let writer = self.writer.take();
                if why == cache::judge::NotStorable::Credentialed {
                    self.result = CacheResult::Bypass;
                    self.status = status::BYPASS;
                } else {
                    cache.pass(&self.key, self.rules.ttl);
                    if let Some(writer) = writer {
                        writer.pass(self.rules.ttl);
                    }
                    self.result = CacheResult::Uncacheable;
                    self.status = if refresh {
                        status::REQUEST
                    } else {
                        status::MISS
                    };
                }
                return response;
            }
        };
        self.status = if refresh {
            status::REQUEST_STORED
        } else {
            status::STORED
        };
        let (parts, body) = response.into_parts();
        let vary = cache::judge::vary_values(&storable.vary, &self.asked);
        let stored = Instant::now();
        let keep_for = storable.fresh_for + self.rules.longest_stale();
        let host = crate::config::request_host(&self.uri, &self.asked);
        let entry = EntryHead {
            status: parts.status,
            headers: parts.headers.clone(),
            key: self.key.clone(),
            place: cache::Place::of(
                &self.route,
                host.as_deref(),
                self.uri.path(),
                self.uri.query(),
            ),
            storable,
            vary,
            stored,
            keep_for,
        };
        let leader = match leader {
            Some(leader) => leader,
            None => cache.solo(),
        };
        let (target, pass_for, writer) = (cache.clone(), self.rules.ttl, self.writer.take());
        let ended: cache::fill::Ended = Box::new(move |kept| match kept {
            Ok(body) => {
                let key = entry.key.clone();
                let new = entry.into_entry(body);
                if let Some(writer) = writer {
                    writer.answer(&new, Instant::now());
                }
                target.insert(&key, new);
            }
            // Its key's next requests go upstream without waiting on each other, as for an
            // answer that could not be stored (a failure is not remembered: the next may do).
            Err(cache::fill::Unkept::TooLarge) => {
                target.pass(&entry.key, pass_for);
                if let Some(writer) = writer {
                    writer.pass(pass_for);
                }
            }
            Err(cache::fill::Unkept::Failed) => drop(writer),
        });
        let body = leader.stream(parts.status, parts.headers.clone(), body, max_entry, ended);
        Response::from_parts(parts, body.boxed_unsync())
    }

    /// The response goes out: counts what the cache did, and writes `Cache-Status`.
    pub(in crate::proxy) fn finish(self, response: &mut Response<Body>) {
        if self.result != CacheResult::Stale {
            self.metrics.count(self.result);
        }
        if !self.status.is_empty() {
            response
                .headers_mut()
                .entry(cache::CACHE_STATUS)
                .or_insert(self.status);
        }
    }

    /// The label of what the cache did (the access log's `cache`).
    pub(in crate::proxy) fn result(&self) -> CacheResult {
        self.result
    }
}

/// What a stored entry is made of, kept until its body has arrived whole.
struct EntryHead {
    status: StatusCode,
    headers: HeaderMap,
    key: Key,
    place: cache::Place,
    storable: cache::judge::Storable,
    vary: Vec<(http::HeaderName, Option<HeaderValue>)>,
    stored: Instant,
    keep_for: Duration,
}

impl EntryHead {
    fn into_entry(self, body: Arc<[bytes::Bytes]>) -> NewEntry {
        // Room for what every hit writes (`cache::answer` rewrites them in place).
        let mut headers = self.headers;
        headers.insert(header::AGE, HeaderValue::from(0));
        headers.insert(cache::CACHE_STATUS, status::STORED);
        NewEntry {
            status: self.status,
            headers,
            body,
            stored: self.stored,
            age: self.storable.age,
            fresh_for: self.storable.fresh_for,
            keep_for: self.keep_for,
            vary: self.vary,
            credentialed_ok: self.storable.credentialed_ok,
            place: self.place,
        }
    }
}

/// An unsafe method answered 2xx or 3xx on a cached route: its URI's entries go, every key
/// variant of them (RFC 9111 §4.4).
pub(in crate::proxy) fn invalidate(
    cache: &Cache,
    route: &str,
    uri: &Uri,
    host: Option<&str>,
) -> usize {
    let host = cache::key::bare_host(host.unwrap_or(""));
    cache.remove_where(|p| {
        *p.route == *route
            && *p.host == *host
            && *p.path == *uri.path()
            && p.query.as_deref() == uri.query()
    })
}
