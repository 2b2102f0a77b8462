//! The pipeline's cache phase ([`crate::cache`]), between bans and limits: a fresh hit (or a
//! stale copy under `stale_while_revalidate`) is answered here; a request for a key another
//! request is fetching waits for that fetch and is served from it (`collapsed`); any other
//! request goes on through the limits to the upstream carrying a [`Pending`], which decides,
//! when the upstream answers, whether the answer is stored and streamed to the waiting
//! requests, or whether a stale copy is served instead of an error, an overload or a 429.
//!
//! One place counts what the cache did (`floodgate_cache_requests_total`) and writes
//! `Cache-Status`: [`Pending::finish`], when the response goes out.

pub(super) mod pending;

use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, HeaderValue, Method, Request, Response, header};
use http_body_util::BodyExt;

use super::body::ClientBody;
use super::context::{Admitted, Context};
use super::{Matched, Proxy, Rejection, Snapshot, forward};
use crate::answer::Body;
use crate::cache::shared::{Shelf, Shelved, Through};
use crate::cache::{self, Claim, Followed, Found, Key, Rules, status};
use crate::control::{Purge, PurgeScope};
use crate::metrics::{CacheResult, DecisionLabel, StaleReason};
pub(super) use pending::{Pending, invalidate};
use pending::{Role, from_entry};

/// The URI (and host) whose entries an unsafe method on a cached route removes when it
/// succeeds.
pub(super) fn invalidation(
    route: &crate::config::RouteConfig,
    req: &Request<ClientBody>,
) -> Option<(http::Uri, Option<String>)> {
    (route.cache.is_some() && !req.method().is_safe()).then(|| {
        let host = crate::config::request_host(req.uri(), req.headers());
        (req.uri().clone(), host.map(|h| h.into_owned()))
    })
}

/// How many times a request goes round again after a fill it waited on was given up.
const RETRIES: usize = 3;

/// What the cache phase made of a request.
pub(super) enum Looked {
    /// Answered from the cache.
    Answer(Response<Body>),
    /// On to the limits and the upstream.
    Forward(Box<Pending>),
    Refuse(Rejection),
}

/// True when the request carries credentials (RFC 9111 §3.5, and the API key).
/// (One pass over the request's few fields costs less than three look-ups by name.)
fn credentialed(headers: &HeaderMap, api_key_header: &http::HeaderName) -> bool {
    headers.keys().any(|name| {
        name == header::AUTHORIZATION || name == header::COOKIE || name == api_key_header
    })
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

impl Proxy {
    /// The cache phase of a request on a cached route (`rules`). Whose the request is is
    /// worked out first when the key or a ban needs it: a banned client is refused, never
    /// served. A request that goes on upstream carries its headers as they arrived (what the
    /// answer's `Vary` and RFC 9111 read); a hit copies nothing of them.
    pub(super) async fn look_up(
        &self,
        snapshot: &Arc<Snapshot>,
        route: &Matched<'_>,
        rules: &Arc<Rules>,
        req: &Request<ClientBody>,
        ctx: &mut Context,
    ) -> Option<Looked> {
        let mut looked = self.consult(snapshot, route, rules, req, ctx).await;
        if let Some(Looked::Forward(pending)) = &mut looked {
            pending.asked = req.headers().clone();
        }
        looked
    }

    async fn consult(
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
        let identity = match self.cache_identity(snapshot, route, rules, req, ctx).await {
            Ok(identity) => identity,
            Err(rejection) => return Some(Looked::Refuse(rejection)),
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
        let mut pending = Box::new(Pending::new(
            rules.clone(),
            route.config.name.clone(),
            key,
            req,
            credentialed,
            metrics,
        ));
        // A `Range` (or an upgrade) passes through; a trusted proxy may ask for a fresh answer
        // (a client cannot bust the cache).
        if headers.contains_key(header::RANGE) || headers.contains_key(header::UPGRADE) {
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
                .look_up(&pending.key, headers, credentialed, rules, now);
            match found {
                Found::Fresh(entry) => {
                    let answer = from_entry(&entry, now, head, status::hit(entry.ttl_at(now)));
                    pending.result = CacheResult::Hit;
                    return Some(self.serve(snapshot, route, req, ctx, pending, answer).await);
                }
                Found::Stale(entry, stale) if stale < rules.stale_while_revalidate => {
                    self.revalidate(snapshot, route, &pending, headers, ctx.peer.ip());
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
                    // `cache.shared`: what another instance stored, or its fetch, first.
                    let leader = match self.cache.shares() {
                        true => {
                            Box::pin(self.lead_through_store(&mut pending, headers, leader)).await
                        }
                        false => Some(leader),
                    };
                    let Some(leader) = leader else {
                        continue;
                    };
                    pending.role = Role::Lead(leader);
                    return Some(Looked::Forward(pending));
                }
                Claim::Full => {
                    pending.role = Role::Alone;
                    return Some(Looked::Forward(pending));
                }
                Claim::Follow(waiter) => {
                    match self
                        .follow(snapshot, route, req, ctx, pending, waiter)
                        .await
                    {
                        Ok(looked) => return Some(looked),
                        Err(again) => pending = again,
                    }
                }
            }
        }
        pending.role = Role::Alone;
        Some(Looked::Forward(pending))
    }

    /// `cache.shared`: a request that leads its key's fill here asks the store first. What
    /// another instance stored is copied into this instance's memory (or its pass remembered),
    /// and the fill given up so that its followers look again and find it (`None`: look again);
    /// else the leader goes upstream, writing the answer to the store for the others
    /// ([`Pending::writer`]), or, the store failing, caching on this instance alone.
    async fn lead_through_store(
        &self,
        pending: &mut Pending,
        headers: &HeaderMap,
        leader: cache::Leader,
    ) -> Option<cache::Leader> {
        let shelf = Shelf::new(self.core().limiter(), &pending.route, &pending.key);
        let coalesce_wait = pending.rules.coalesce_wait;
        match shelf
            .lead(headers, pending.credentialed, coalesce_wait)
            .await
        {
            Through::Found(Shelved::Answer(entry)) => {
                self.cache.insert(&pending.key, *entry);
                drop(leader);
                None
            }
            Through::Found(Shelved::Pass(left)) => {
                self.cache.pass(&pending.key, left);
                leader.pass();
                None
            }
            Through::Fetch(writer) => {
                pending.writer = Some(writer);
                Some(leader)
            }
            Through::Failed(e) => {
                self.cache.store_failed(&e);
                Some(leader)
            }
        }
    }

    /// Whose the request is, for the cache phase: worked out only when the key holds it, a ban
    /// or override is in force, or `consumers:` may refuse the key; a banned client is refused.
    async fn cache_identity(
        &self,
        snapshot: &Arc<Snapshot>,
        route: &Matched<'_>,
        rules: &Rules,
        req: &Request<ClientBody>,
        ctx: &mut Context,
    ) -> Result<Option<(u8, Vec<u8>)>, Rejection> {
        if !(rules.keys_identity() || !self.control.is_empty() || snapshot.consumers.is_some()) {
            return Ok(None);
        }
        // Boxed, as the follower's wait: rare here, and its state would otherwise size every
        // cached request's future (moved into its box whole).
        let verified = Box::pin(Self::verify_token(snapshot, req)).await?;
        let log = ctx.log.as_deref_mut();
        let whose = Self::identify(snapshot, req, verified.as_ref(), ctx.peer, log)?;
        let mut buf = [0u8; 16];
        let id = whose.identity.key_bytes(&mut buf).to_vec();
        let kind = crate::limiter::KeyKind::from(whose.identity.kind());
        if let Some(wait_us) = self.control.banned(&route.config.name, kind, &id) {
            return Err(Rejection::from(crate::policy::Refused::Banned(wait_us)));
        }
        Ok(Some((whose.identity.kind() as u8, id)))
    }

    /// A follower of another request's fetch of its key: served from it as it streams
    /// (`collapsed`), a stale copy when it failed, or sent upstream (released a few at a time,
    /// or alone past `coalesce_wait`); `Err`: the fill was given up, look again.
    async fn follow(
        &self,
        snapshot: &Arc<Snapshot>,
        route: &Matched<'_>,
        req: &Request<ClientBody>,
        ctx: &mut Context,
        mut pending: Box<Pending>,
        waiter: cache::fill::Waiter,
    ) -> Result<Looked, Box<Pending>> {
        match Box::pin(waiter.wait(pending.rules.coalesce_wait)).await {
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
                Ok(self.serve(snapshot, route, req, ctx, pending, answer).await)
            }
            Followed::Failed(permit) => {
                if let Some(answer) = pending.stale_for(StaleReason::Error, Instant::now()) {
                    return Ok(self.serve(snapshot, route, req, ctx, pending, answer).await);
                }
                pending.role = Role::Released { _place: permit };
                Ok(Looked::Forward(pending))
            }
            Followed::Released(permit) => {
                pending.role = Role::Released { _place: permit };
                pending.result = CacheResult::Uncacheable;
                Ok(Looked::Forward(pending))
            }
            Followed::TimedOut => {
                pending.role = Role::Alone;
                Ok(Looked::Forward(pending))
            }
            Followed::Retry => Err(pending),
        }
    }

    /// A cached route's answer goes out: what the cache did is counted, logged, traced and said
    /// in `Cache-Status`; an unsafe method that succeeded removes its URI's entries.
    ///
    /// `cache.shared`: the invalidation to spread to every instance ([`Proxy::spread_purge`]).
    pub(super) fn cached_answer(
        &self,
        ctx: &mut Context,
        route: &Matched<'_>,
        invalidates: Option<(http::Uri, Option<String>)>,
        response: &mut Response<Body>,
    ) -> Option<Purge> {
        if let Some(pending) = ctx.cache.take() {
            let result = pending.result().as_str();
            if let Some(log) = ctx.log.as_deref_mut() {
                log.cache = Some(result.into());
            }
            if let Some(trace) = &ctx.trace {
                trace.set(|| opentelemetry::KeyValue::new("floodgate.cache", result));
            }
            pending.finish(response);
        }
        let (uri, host) = invalidates?;
        if !(200..400).contains(&response.status().as_u16()) {
            return None;
        }
        invalidate(&self.cache, &route.config.name, &uri, host.as_deref());
        self.cache.shares().then(|| Purge {
            id: self.control.new_id("inv"),
            route: route.config.name.to_string(),
            scope: PurgeScope::Uri {
                host: cache::key::bare_host(host.as_deref().unwrap_or("")).into_owned(),
                path: uri.path().to_string(),
                query: uri.query().map(str::to_string),
            },
            until_us: crate::control::event_ends_us(),
        })
    }

    /// A purge (`POST /cache/purge`, or an unsafe method's invalidation) on this instance and
    /// every instance sharing the store: the store's shared entries go first (`cache.shared`),
    /// then this instance's, and then the purge is written to the control list, which every
    /// other instance follows (within a second). How many of this instance's entries went, and
    /// whether the others were told (`Ok(false)`: there are none, the memory store).
    pub(crate) async fn spread_purge(
        &self,
        purge: &Purge,
    ) -> (usize, Result<bool, crate::limiter::LimiterError>) {
        let limiter = self.core().limiter();
        if self.cache.is_shared() {
            let scope = purge.scope.as_cache_scope();
            if let Err(e) = limiter.cache_remove(&purge.route, scope).await {
                self.cache.store_failed(&e);
                return (self.apply_purge(purge), Err(e));
            }
        }
        let purged = self.apply_purge(purge);
        // Noted before it is written, so that this instance's follower, which may read it at
        // once, does not purge again what was filled since.
        self.control.note_own_purge(&purge.id);
        let text = crate::control::Entry::Purge(purge.clone()).to_json();
        let written = limiter.control_write(&[(&purge.id, Some(&text))]).await;
        if !matches!(written, Ok(true)) {
            self.control.take_own_purge(&purge.id);
        }
        (purged, written)
    }

    /// Removes what `purge` names from this instance's cache: how many entries went.
    pub fn apply_purge(&self, purge: &Purge) -> usize {
        self.cache.remove_where(|place| {
            purge.covers(
                &place.route,
                &place.host,
                &place.path,
                place.query.as_deref(),
            )
        })
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
            // Boxed: the decider's state would otherwise size every cached request's future.
            let read = super::admit::Read::none();
            match Box::pin(self.limit(snapshot, &hit, req, &whose, read, ctx)).await {
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
        headers: &HeaderMap,
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
        let (uri, mut headers) = (pending.uri.clone(), headers.clone());
        let (rules, key) = (pending.rules.clone(), pending.key.clone());
        let limiter = self.core().limiter().clone();
        tokio::spawn(async move {
            let config = &snapshot.routes.routes()[index];
            let extras = &snapshot.extras[index];
            // `cache.shared`: another instance's fresher copy, or its refresh, first.
            let mut writer = None;
            if cache.shares() {
                let shelf = Shelf::new(&limiter, &config.name, &key);
                match shelf.refresh(&headers, rules.coalesce_wait).await {
                    None => return,
                    Some(Through::Found(Shelved::Answer(entry))) => {
                        cache.insert(&key, *entry);
                        return;
                    }
                    Some(Through::Found(Shelved::Pass(_))) => return,
                    Some(Through::Fetch(w)) => writer = Some(w),
                    Some(Through::Failed(e)) => cache.store_failed(&e),
                }
            }
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
                socket: None,
            };
            let mut used = None;
            let forwarded = snapshot.forwarder.forward(req, to, &mut used).await;
            match forwarded {
                Ok(response) if !response.status().is_server_error() => {
                    let refresh = Pending::detached(
                        rules,
                        config.name.clone(),
                        key,
                        uri,
                        headers,
                        extras.cache.clone(),
                    );
                    if let Some(mut refresh) = refresh {
                        refresh.writer = writer;
                        // The refreshed answer is stored as its body arrives; no one reads it here.
                        drop(refresh.store(&cache, Some(leader), response));
                    }
                }
                _ => leader.fail(),
            }
        });
    }
}
