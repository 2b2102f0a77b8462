//! The pipeline's cache phase ([`crate::cache`]), between bans and limits: a fresh hit (or a
//! stale copy under `stale_while_revalidate`) is answered here; a request for a key another
//! request is fetching waits for that fetch and is served from it (`collapsed`); any other
//! request goes on through the limits to the upstream carrying a [`Pending`], which decides,
//! when the upstream answers, whether the answer is stored and streamed to the waiting
//! requests, or whether a stale copy is served instead of an error, an overload or a 429.
//!
//! One place counts what the cache did (`floodgate_cache_requests_total`) and writes
//! `Cache-Status`: [`Pending::finish`], when the response goes out.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::BodyExt;
use tokio::sync::OwnedSemaphorePermit;

use super::body::ClientBody;
use super::context::{Admitted, Context};
use super::{Matched, Proxy, Rejection, Snapshot, forward};
use crate::answer::Body;
use crate::cache::{
    self, Cache, Claim, Entry, Followed, Found, Key, Leader, NewEntry, Rules, status,
};
use crate::metrics::{CacheResult, DecisionLabel, RouteCacheMetrics, StaleReason};

/// How many times a request goes round again after a fill it waited on was given up.
const RETRIES: usize = 3;

/// A cached route's request on its way to the upstream.
pub(super) struct Pending {
    rules: Arc<Rules>,
    key: Key,
    /// The request as it arrived: what the answer's `Vary` reads, and what RFC 9111 judges.
    uri: Uri,
    asked: HeaderMap,
    credentialed: bool,
    role: Role,
    /// A stale copy, for `stale_if_error`, `stale_if_overloaded` and `stale_if_limited`.
    stale: Option<(Arc<Entry>, Duration)>,
    head: bool,
    /// What the cache did, and its `Cache-Status`: set as the request goes.
    result: CacheResult,
    status: HeaderValue,
    metrics: RouteCacheMetrics,
}

/// What a request going upstream does with the answer.
enum Role {
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

/// What the cache phase made of a request.
pub(super) enum Looked {
    /// Answered from the cache.
    Answer(Response<Body>),
    /// On to the limits and the upstream.
    Forward(Box<Pending>),
    Refuse(Rejection),
}

/// True when the request carries credentials (RFC 9111 §3.5, and the API key).
fn credentialed(headers: &HeaderMap, api_key_header: &http::HeaderName) -> bool {
    headers.contains_key(header::AUTHORIZATION)
        || headers.contains_key(header::COOKIE)
        || headers.contains_key(api_key_header)
}

/// A client's own `no-cache`, `max-age=0` or `Pragma: no-cache`.
fn asks_fresh(headers: &HeaderMap) -> bool {
    let cc = |name: &str| cache::judge::has_directive(headers, name);
    let max_age_0 = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| d.trim().eq_ignore_ascii_case("max-age=0"));
    cc("no-cache")
        || max_age_0
        || (!headers.contains_key(header::CACHE_CONTROL)
            && headers
                .get(header::PRAGMA)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.to_ascii_lowercase().contains("no-cache")))
}

/// An entry's answer, boxed as every answer is.
fn from_entry(entry: &Entry, now: Instant, head: bool, status: HeaderValue) -> Response<Body> {
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

impl Proxy {
    /// The cache phase of a request on a cached route (`rules`). Whose the request is is
    /// worked out first when the key or a ban needs it: a banned client is refused, never
    /// served.
    pub(super) async fn look_up(
        &self,
        snapshot: &Arc<Snapshot>,
        route: &Matched<'_>,
        rules: &Arc<Rules>,
        req: &Request<ClientBody>,
        ctx: &mut Context,
    ) -> Option<Looked> {
        let head = match *req.method() {
            Method::GET => false,
            Method::HEAD => true,
            _ => return None,
        };
        let metrics = route.extras.cache.clone()?;
        let headers = req.headers();
        let trusted = snapshot.identity.is_trusted(ctx.peer.ip().to_canonical());
        let identity =
            match rules.keys_identity() || !self.control.is_empty() || snapshot.consumers.is_some()
            {
                true => {
                    let verified = match Self::verify_token(snapshot, req).await {
                        Ok(verified) => verified,
                        Err(rejection) => return Some(Looked::Refuse(rejection)),
                    };
                    let whose = match Self::identify(
                        snapshot,
                        req,
                        verified.as_ref(),
                        ctx.peer,
                        ctx.log.as_deref_mut(),
                    ) {
                        Ok(whose) => whose,
                        Err(rejection) => return Some(Looked::Refuse(rejection)),
                    };
                    let mut buf = [0u8; 16];
                    let id = whose.identity.key_bytes(&mut buf).to_vec();
                    let kind = crate::limiter::KeyKind::from(whose.identity.kind());
                    if let Some(wait_us) = self.control.banned(&route.config.name, kind, &id) {
                        return Some(Looked::Refuse(Rejection::from(
                            crate::policy::Refused::Banned(wait_us),
                        )));
                    }
                    Some((whose.identity.kind() as u8, id))
                }
                false => None,
            };
        let host = crate::config::request_host(req.uri(), req.headers());
        let key = Key::of(
            rules,
            &cache::key::Parts {
                route: &route.config.name,
                host: host.as_deref(),
                path: req.uri().path(),
                query: req.uri().query(),
                headers,
                identity: identity.as_ref().map(|(k, v)| (*k, v.as_slice())),
            },
        );
        let credentialed = credentialed(headers, &snapshot.identity.api_key_header);
        let mut pending = Box::new(Pending {
            rules: rules.clone(),
            key,
            uri: req.uri().clone(),
            asked: headers.clone(),
            credentialed,
            role: Role::Bypass,
            stale: None,
            head,
            result: CacheResult::Bypass,
            status: status::BYPASS,
            metrics,
        });
        // A `Range` passes through; a trusted proxy may ask for a fresh answer (a client
        // cannot bust the cache).
        if headers.contains_key(header::RANGE) {
            return Some(Looked::Forward(pending));
        }
        if trusted && asks_fresh(headers) && !head {
            pending.role = Role::Refresh;
            pending.result = CacheResult::Miss;
            pending.status = status::REQUEST;
            return Some(Looked::Forward(pending));
        }
        for _ in 0..RETRIES {
            let now = Instant::now();
            let found = self
                .cache
                .look_up(&pending.key, &pending.asked, credentialed, rules, now);
            match found {
                Found::Fresh(entry) => {
                    let answer = from_entry(&entry, now, head, status::hit(entry.ttl_at(now)));
                    pending.result = CacheResult::Hit;
                    return Some(self.serve(snapshot, route, req, ctx, pending, answer).await);
                }
                Found::Stale(entry, stale) if stale < rules.stale_while_revalidate => {
                    self.revalidate(snapshot, route, &pending, ctx.peer.ip());
                    let detail = StaleReason::Revalidating;
                    let answer = from_entry(
                        &entry,
                        now,
                        head,
                        status::stale(stale.as_secs().max(1), detail.as_str()),
                    );
                    pending.metrics.stale(detail);
                    pending.result = CacheResult::Stale;
                    return Some(self.serve(snapshot, route, req, ctx, pending, answer).await);
                }
                Found::Stale(entry, stale) => pending.stale = Some((entry, stale)),
                Found::Pass => {
                    pending.role = Role::Pass;
                    pending.result = CacheResult::Uncacheable;
                    pending.status = status::MISS;
                    return Some(Looked::Forward(pending));
                }
                Found::Miss => {}
            }
            pending.result = CacheResult::Miss;
            pending.status = status::MISS;
            // A HEAD cannot fill an entry; a credentialed request's answer may be its own.
            if head || (credentialed && !rules.shares_credentialed()) || !rules.coalesce {
                pending.role = match head {
                    true => Role::Pass,
                    false => Role::Alone,
                };
                return Some(Looked::Forward(pending));
            }
            match self.cache.claim(&pending.key) {
                Claim::Lead(leader) => {
                    pending.role = Role::Lead(leader);
                    return Some(Looked::Forward(pending));
                }
                Claim::Full => {
                    pending.role = Role::Alone;
                    return Some(Looked::Forward(pending));
                }
                Claim::Follow(waiter) => match waiter.wait(rules.coalesce_wait).await {
                    Followed::Served {
                        status: code,
                        headers: fields,
                        body,
                    } => {
                        let mut answer = Response::new(body.boxed_unsync());
                        *answer.status_mut() = code;
                        *answer.headers_mut() = fields;
                        answer
                            .headers_mut()
                            .insert(header::AGE, HeaderValue::from(0));
                        pending.status = status::COLLAPSED;
                        pending.result = CacheResult::Collapsed;
                        return Some(self.serve(snapshot, route, req, ctx, pending, answer).await);
                    }
                    Followed::Failed(permit) => {
                        if let Some(answer) = pending.stale_for(StaleReason::Error, Instant::now())
                        {
                            return Some(
                                self.serve(snapshot, route, req, ctx, pending, answer).await,
                            );
                        }
                        pending.role = Role::Released { _place: permit };
                        return Some(Looked::Forward(pending));
                    }
                    Followed::Released(permit) => {
                        pending.role = Role::Released { _place: permit };
                        pending.result = CacheResult::Uncacheable;
                        return Some(Looked::Forward(pending));
                    }
                    Followed::TimedOut => {
                        pending.role = Role::Alone;
                        return Some(Looked::Forward(pending));
                    }
                    Followed::Retry => continue,
                },
            }
        }
        pending.role = Role::Alone;
        Some(Looked::Forward(pending))
    }

    /// Answers from the cache: the limits that ask for a hit's `cache_hit_cost` are spent
    /// first (and may refuse).
    async fn serve(
        &self,
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: &Request<ClientBody>,
        ctx: &mut Context,
        mut pending: Box<Pending>,
        answer: Response<Body>,
    ) -> Looked {
        let mut answer = answer;
        if let Some(hit_route) = &route.extras.hit_route {
            let hit = Matched {
                config: hit_route,
                extras: route.extras,
            };
            let whose = match Self::identify(snapshot, req, None, ctx.peer, None) {
                Ok(whose) => whose,
                Err(rejection) => return Looked::Refuse(rejection),
            };
            match self
                .limit(snapshot, &hit, req, &whose, super::admit::Read::none(), ctx)
                .await
            {
                Ok(admitted) => {
                    if let Some((verdict, limit)) = &admitted.headline {
                        route
                            .extras
                            .headers
                            .write(answer.headers_mut(), verdict, *limit);
                    }
                }
                Err(rejection) => return Looked::Refuse(rejection),
            }
        }
        pending.role = Role::Bypass;
        ctx.admitted = Some(Admitted {
            label: DecisionLabel::Cached,
            ..Admitted::unlimited()
        });
        ctx.cache = Some(pending);
        Looked::Answer(answer)
    }

    /// `stale_while_revalidate`: one refresh of the key behind the stale copy (none when a
    /// fetch of it is under way). It goes to the upstream as floodgate's own request, spending
    /// no client's budget.
    fn revalidate(
        &self,
        snapshot: &Arc<Snapshot>,
        route: &Matched<'_>,
        pending: &Pending,
        client_ip: std::net::IpAddr,
    ) {
        let Claim::Lead(leader) = self.cache.claim(&pending.key) else {
            return;
        };
        let Some(index) = snapshot
            .routes
            .routes()
            .iter()
            .position(|r| std::ptr::eq(r, route.config))
        else {
            return;
        };
        let snapshot = snapshot.clone();
        let cache = self.cache.clone();
        let (uri, mut headers) = (pending.uri.clone(), pending.asked.clone());
        let (rules, key) = (pending.rules.clone(), pending.key.clone());
        tokio::spawn(async move {
            let config = &snapshot.routes.routes()[index];
            let extras = &snapshot.extras[index];
            forward::strip_connection_listed(&mut headers);
            let mut req = Request::new(ClientBody::Read(bytes::Bytes::new()));
            *req.uri_mut() = uri.clone();
            *req.headers_mut() = headers.clone();
            let to = forward::Outbound {
                route: config,
                pool: &extras.pool,
                key: None,
                first: None,
                client_ip,
                client_tls: snapshot.tls,
                deadline: None,
            };
            let mut used = None;
            let forwarded = snapshot.forwarder.forward(req, to, &mut used).await;
            match forwarded {
                Ok(response) if !response.status().is_server_error() => {
                    let refresh = Pending::detached(rules, key, uri, headers, extras.cache.clone());
                    if let Some(mut refresh) = refresh {
                        // The refreshed answer is stored as its body arrives; no one reads it here.
                        drop(refresh.store(&cache, Some(leader), response));
                    }
                }
                _ => leader.fail(),
            }
        });
    }
}

impl Pending {
    /// A request of floodgate's own (a refresh), as if a client had asked.
    fn detached(
        rules: Arc<Rules>,
        key: Key,
        uri: Uri,
        asked: HeaderMap,
        metrics: Option<RouteCacheMetrics>,
    ) -> Option<Pending> {
        Some(Pending {
            rules,
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
        })
    }

    /// The stale copy, served for `reason`, if its route allows that long.
    fn stale_for(&mut self, reason: StaleReason, now: Instant) -> Option<Response<Body>> {
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
    pub(super) fn instead_of(
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
    pub(super) fn settle(
        &mut self,
        cache: &Arc<Cache>,
        forwarded: Result<Response<Body>, Rejection>,
    ) -> Result<Response<Body>, Rejection> {
        if failed(&forwarded) {
            // The followers hear of it first: each serves its stale copy, or goes upstream.
            if let Role::Lead(leader) = std::mem::replace(&mut self.role, Role::Bypass) {
                leader.fail();
            }
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
    fn store(
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
                self.result = CacheResult::Uncacheable;
                self.status = status::MISS;
                return response;
            }
            Err(why) => {
                if let Some(leader) = leader {
                    leader.pass();
                }
                if why == cache::judge::NotStorable::Credentialed {
                    self.result = CacheResult::Bypass;
                    self.status = status::BYPASS;
                } else {
                    cache.pass(&self.key, self.rules.ttl);
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
        let entry = EntryHead {
            status: parts.status,
            headers: parts.headers.clone(),
            key: self.key.clone(),
            storable,
            vary,
            stored,
            keep_for,
        };
        let leader = match leader {
            Some(leader) => leader,
            None => cache.solo(),
        };
        let target = cache.clone();
        let ended: cache::fill::Ended = Box::new(move |kept| {
            if let Some(body) = kept {
                let key = entry.key.clone();
                target.insert(&key, entry.into_entry(body));
            }
        });
        let body = leader.stream(parts.status, parts.headers.clone(), body, max_entry, ended);
        Response::from_parts(parts, body.boxed_unsync())
    }

    /// The response goes out: counts what the cache did, and writes `Cache-Status`.
    pub(super) fn finish(self, response: &mut Response<Body>) {
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
    pub(super) fn result(&self) -> CacheResult {
        self.result
    }
}

/// What a stored entry is made of, kept until its body has arrived whole.
struct EntryHead {
    status: StatusCode,
    headers: HeaderMap,
    key: Key,
    storable: cache::judge::Storable,
    vary: Vec<(http::HeaderName, Option<HeaderValue>)>,
    stored: Instant,
    keep_for: Duration,
}

impl EntryHead {
    fn into_entry(self, body: Arc<[bytes::Bytes]>) -> NewEntry {
        NewEntry {
            status: self.status,
            headers: self.headers,
            body,
            stored: self.stored,
            age: self.storable.age,
            fresh_for: self.storable.fresh_for,
            keep_for: self.keep_for,
            vary: self.vary,
            credentialed_ok: self.storable.credentialed_ok,
            place: self.key.place,
        }
    }
}

/// An unsafe method answered 2xx or 3xx on a cached route: its URI's entries go, every key
/// variant of them (RFC 9111 §4.4).
pub(super) fn invalidate(cache: &Cache, route: &str, uri: &Uri, host: Option<&str>) -> usize {
    let host = cache::key::bare_host(host.unwrap_or(""));
    cache.remove_where(|p| {
        *p.route == *route
            && *p.host == *host
            && *p.path == *uri.path()
            && p.query.as_deref() == uri.query()
    })
}
