//! Phases 2 to 4 of the pipeline (`proxy.rs` runs them as `Proxy::admit`): whose the request
//! is (its bearer token verified, its identity and address), its route's limits decided by the
//! one decider ([`crate::decider`]) on what the request says ([`HttpFacts`]), and a slot under
//! the upstream's learned limit.

use std::net::SocketAddr;

use http::Request;

use super::body::{self, ClientBody};
use super::context::{Admitted, Context};
use super::{Matched, Proxy, Rejection, Snapshot, cost, uptime_us};
use crate::access_log;
use crate::config::{Budget, RequestView, RouteConfig, RouteLimit};
use crate::decider::{Facts, Question, Side};
use crate::identity::jwt::{Verified, WhenMissing};
use crate::identity::{Identity, IdentityError, IdentityKind};
use crate::limiter::KeyKind;
use crate::policy::{Claim, Refused, RequestKeys, ResolveError, Whose};
use crate::upstream::Fallback;
use opentelemetry::KeyValue;

/// The access log's `identity_hash`: the hex SHA-256 of an API key (the digest a consumer's
/// `keys_sha256` holds, so replay can find the consumer) or of a user id.
///
/// A surge repeats its keys, and a SHA-256 cost 3,600 instructions a logged request: each
/// thread keeps the digests it made last ([`DIGESTS`] of them, then it forgets them all at once),
/// found by a SipHash of the value under the thread's own random key, so no raw key is kept and
/// no client can aim its value at another's entry.
fn digest_hex(value: &[u8]) -> String {
    use sha2::Digest;
    use std::hash::BuildHasher;
    let digest = || crate::limiter::hex(&sha2::Sha256::digest(value));
    RECENT_DIGESTS
        .try_with(|recent| {
            let Ok(mut recent) = recent.try_borrow_mut() else {
                return digest();
            };
            let (state, digests) = &mut *recent;
            let id = state.hash_one(value);
            if let Some(hex) = digests.get(&id) {
                return hex.to_string();
            }
            let hex = digest();
            if digests.len() >= DIGESTS {
                digests.clear();
            }
            digests.insert(id, hex.clone().into_boxed_str());
            hex
        })
        .unwrap_or_else(|_| digest())
}

/// How many digests a thread keeps (4,096 × ~100 bytes).
const DIGESTS: usize = 4096;

thread_local! {
    /// Each thread's recent digests (see [`digest_hex`]).
    static RECENT_DIGESTS: std::cell::RefCell<(
        std::collections::hash_map::RandomState,
        std::collections::HashMap<u64, Box<str>>,
    )> = std::cell::RefCell::new(Default::default());
}

/// What the phases before the limit phase read from the request for its keys and reserves
/// (the verified token, and the JSON body on a route that reads it), and whether a refusal
/// counts toward a penalty box now (not while it may yet be held: `wait:`).
#[derive(Clone, Copy)]
pub(super) struct Read<'a> {
    verified: Option<&'a Verified>,
    json: Option<&'a serde_json::Map<String, serde_json::Value>>,
    penalizes: bool,
}

impl Read<'_> {
    /// Nothing read (a cache hit's limits read no token claim or body).
    pub(super) fn none() -> Self {
        Read {
            verified: None,
            json: None,
            penalizes: true,
        }
    }
}

/// What the decider reads of a live request: its composite keys' parts (recorded, as digests,
/// in the access log's line for replay) and its settled limits' reserves.
struct HttpFacts<'a> {
    view: RequestView<'a>,
    /// Whether the access log is on (its `keys` are then written down).
    logging: bool,
    /// The access log's `keys`: every composite key's digest, enforced and shadow.
    logged_keys: String,
}

impl Facts for HttpFacts<'_> {
    fn keys(&mut self, budget: &Budget, identity: (KeyKind, &[u8]), ip: &[u8]) -> RequestKeys {
        let keys = RequestKeys::of(budget, &self.view, identity, ip);
        if self.logging {
            access_log::keys_field(keys.digests(budget), &mut self.logged_keys);
        }
        keys
    }

    fn reserve(&mut self, limit: &RouteLimit) -> u32 {
        limit.settled.as_ref().map_or(limit.limit.cost(), |s| {
            s.reserve.of(self.view.headers, self.view.json)
        })
    }
}

/// The route's pool, offered to its limits `per: endpoint` in the balancer's order
/// ([`crate::decider::Endpoints`]); the last endpoint offered is the one an admitted request
/// goes to.
struct Offered<'a> {
    pool: &'a crate::upstream::RoutePool,
    key: Option<u64>,
    /// The endpoints offered so far (their ids).
    ids: Vec<u64>,
    last: Option<std::sync::Arc<crate::upstream::Endpoint>>,
}

impl crate::decider::Endpoints for Offered<'_> {
    fn next(&mut self) -> Option<&[u8]> {
        self.last = (self.pool).pick(self.key, &self.ids, Fallback::OnlyWhenNoneIsWell);
        let endpoint = self.last.as_ref()?;
        self.ids.push(endpoint.id);
        Some(endpoint.name.as_bytes())
    }
}

/// The variables of the route's `request_headers` and `response_headers` values for a
/// request by `whose` (`None` when the route's values hold none: nothing is worked out).
fn vars_of(
    snapshot: &Snapshot,
    route: &Matched<'_>,
    req: &Request<ClientBody>,
    whose: Option<&Whose<'_>>,
    peer: SocketAddr,
) -> Option<Box<crate::config::Vars>> {
    let config = route.config;
    if !config.request_headers.uses_vars() && !config.response_headers.uses_vars() {
        return None;
    }
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let identity = whose.map(|w| w.identity);
    Some(Box::new(crate::config::Vars {
        route: config.name.clone(),
        identity_kind: identity.map_or("", |i| i.kind().as_str()),
        consumer: match identity {
            Some(Identity::Consumer(consumer)) => Some(consumer.name.clone()),
            _ => None,
        },
        tier: whose.map(|w| w.tier.to_string()),
        jwt_subject: match identity {
            Some(Identity::Jwt(subject)) => Some(text(subject)),
            _ => None,
        },
        client_ip: Some(snapshot.identity.client_addr(req.headers(), peer.ip())),
    }))
}

/// What `balance: hash` hashes for a request whose identity is `identity`: the identity, or
/// the configured header's value; `None` for the other balances (or without either).
fn balance_key(
    route: &Matched<'_>,
    req: &Request<ClientBody>,
    identity: Option<&Identity<'_>>,
) -> Option<u64> {
    use crate::upstream::{Balance, HashOn, balance::hash_bytes};
    match &route.config.pool.balance {
        Balance::Hash(HashOn::Header(name)) => {
            req.headers().get(name).map(|v| hash_bytes(v.as_bytes()))
        }
        Balance::Hash(HashOn::Identity) => {
            let identity = identity?;
            let mut buf = [0u8; 16];
            let mut key = vec![identity.kind() as u8];
            key.extend_from_slice(identity.key_bytes(&mut buf));
            Some(hash_bytes(&key))
        }
        _ => None,
    }
}

/// The flow a request waits in at the upstream's gate, by the route's `fairness:` (`None`:
/// first come, first served). Hashed with a key of this process's own, so that nobody can
/// choose flow values that land on another client's queues.
fn flow_of(
    route: &Matched<'_>,
    req: &Request<ClientBody>,
    identity: Option<&Identity<'_>>,
    verified: Option<&Verified>,
) -> Option<u64> {
    use crate::adaptive::Fairness;
    use std::hash::{BuildHasher, Hasher};
    static KEY: std::sync::LazyLock<std::collections::hash_map::RandomState> =
        std::sync::LazyLock::new(Default::default);
    let hash = |kind: u8, value: &[u8]| {
        let mut hasher = KEY.build_hasher();
        hasher.write_u8(kind);
        hasher.write(value);
        hasher.finish()
    };
    match &route.config.fairness {
        Fairness::None => None,
        Fairness::Identity => Some(match identity {
            Some(identity) => {
                let mut buf = [0u8; 16];
                hash(identity.kind() as u8, identity.key_bytes(&mut buf))
            }
            None => hash(0xff, b""),
        }),
        Fairness::Header(name) => {
            let value = req.headers().get(name).map(|v| v.as_bytes());
            Some(hash(0xfe, value.unwrap_or_default()))
        }
        Fairness::Claim(claim) => {
            let value = verified.and_then(|v| v.claims.get(claim));
            let text = match value {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            Some(hash(0xfd, text.as_bytes()))
        }
    }
}

/// True for a refusal that says the route is at its capacity (what opens a waiting room under
/// `activate: overloaded`): its gate shed the request, or a `per: route` or `per: endpoint`
/// limit refused it.
fn refused_for_capacity(route: &crate::config::RouteConfig, rejection: &Rejection) -> bool {
    use crate::config::Per;
    match rejection {
        Rejection::UpstreamOverloaded => true,
        Rejection::RateLimited(_, crate::policy::LimitRef::Enforced(at)) => route
            .enforced
            .limits
            .get(*at)
            .is_some_and(|l| matches!(l.per, Per::Route | Per::Endpoint)),
        _ => false,
    }
}

/// A held request's place among those its limit holds on this instance (`max_waiting`),
/// given back when it is dropped (admitted, refused, or its client gone).
struct Held(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl Held {
    fn take(limit: &RouteLimit) -> Option<Held> {
        use std::sync::atomic::Ordering;
        let taken = limit
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit.max_waiting).then_some(n + 1)
            });
        taken.ok().map(|_| Held(limit.held.clone()))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl From<Refused> for Rejection {
    fn from(refused: Refused) -> Rejection {
        match refused {
            Refused::RateLimited(verdict, limit) => Rejection::RateLimited(verdict, limit),
            Refused::StoreUnavailable => Rejection::LimiterUnavailable,
            // A ban's wait in whole seconds, at least one (`Retry-After`).
            Refused::Banned(wait_us) => Rejection::Banned(wait_us.div_ceil(1_000_000).max(1)),
        }
    }
}

impl Proxy {
    /// Phases 2 to 4: identify, limit, gate. Whose the request is, once known, is counted in the
    /// route's `/top` (admitted or not).
    pub(super) async fn admit(
        &self,
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: &mut Request<ClientBody>,
        ctx: &mut Context,
    ) -> Result<(), Rejection> {
        // A bearer token is verified on every route when `identity.jwt` is set: an invalid one
        // never reaches the upstream.
        let verified = Self::verify_token(snapshot, req).await?;
        let json = match route.config.reads_body {
            true => Self::read_body(snapshot, route.config, req).await?,
            false => None,
        };
        let req = &*req;
        // With `consumers:` every API key is checked, on unlimited routes too.
        let (identity, admitted) = if !route.config.is_limited() && snapshot.consumers.is_none() {
            // Nothing to limit. When the upstream's gate may still shed the request, or a ban
            // may cover the route, whose it is is worked out all the same (never refused for
            // it), to be counted in `/top` and checked against the bans.
            let hashes_identity = matches!(
                route.config.pool.balance,
                crate::upstream::Balance::Hash(crate::upstream::HashOn::Identity)
            );
            let whose = (route.extras.gate.is_some()
                || route.extras.room.is_some()
                || !self.control.is_empty()
                || hashes_identity
                || route.config.request_headers.uses_vars()
                || route.config.response_headers.uses_vars())
            .then(|| {
                Self::identify(
                    snapshot,
                    req,
                    verified.as_ref(),
                    ctx.peer,
                    ctx.log.as_deref_mut(),
                )
                .ok()
            })
            .flatten();
            // The decider answers `unlimited`, or refuses a banned identity.
            let refused = match &whose {
                Some(whose) if !self.control.is_empty() => {
                    self.decider(snapshot)
                        .decide(Question::Request {
                            route: route.config,
                            whose,
                            facts: &mut crate::decider::NoFacts,
                            endpoints: None,
                        })
                        .await
                        .refused
                }
                _ => None,
            };
            let admitted = match (refused, &whose) {
                (Some(refused), _) => Err(Rejection::from(refused)),
                (None, Some(whose)) => self
                    .wait_turn(route, whose)
                    .await
                    .map(|()| Admitted::unlimited()),
                (None, None) => Ok(Admitted::unlimited()),
            };
            ctx.vars = vars_of(snapshot, route, req, whose.as_ref(), ctx.peer);
            (whose.map(|w| w.identity), admitted)
        } else {
            match Self::identify(
                snapshot,
                req,
                verified.as_ref(),
                ctx.peer,
                ctx.log.as_deref_mut(),
            ) {
                Ok(whose) => {
                    // Known before the limits: those `per: endpoint` follow the balancer.
                    ctx.balance_key = balance_key(route, req, Some(&whose.identity));
                    ctx.vars = vars_of(snapshot, route, req, Some(&whose), ctx.peer);
                    if let Err(waiting) = self.wait_turn(route, &whose).await {
                        return self.refused_in_line(route, whose, waiting);
                    }
                    (
                        Some(whose.identity),
                        self.limit_or_hold(
                            snapshot,
                            route,
                            req,
                            &whose,
                            Read {
                                verified: verified.as_ref(),
                                json: json.as_ref(),
                                penalizes: true,
                            },
                            ctx,
                        )
                        .await,
                    )
                }
                Err(rejection) => (None, Err(rejection)),
            }
        };
        if ctx.balance_key.is_none() {
            ctx.balance_key = balance_key(route, req, identity.as_ref());
        }
        if let (Some(trace), Some(identity)) = (&ctx.trace, &identity) {
            trace.set(|| KeyValue::new("floodgate.identity.kind", identity.kind().as_str()));
        }
        let flow = flow_of(route, req, identity.as_ref(), verified.as_ref());
        let admitted = match admitted {
            Ok(mut admitted) => self
                .gate(route, ctx, &mut admitted, flow)
                .await
                .map(|()| admitted),
            Err(rejection) => Err(rejection),
        };
        if let Some(identity) = identity {
            route
                .extras
                .top
                .record(&identity, admitted.is_ok(), uptime_us());
        }
        if let (Some(room), Err(rejection)) = (&route.extras.room, &admitted)
            && refused_for_capacity(route.config, rejection)
        {
            room.overloaded();
        }
        ctx.admitted = Some(admitted?);
        Ok(())
    }

    /// A waiting room's turn (`waiting_room:`), before the limits (waiting spends no budget):
    /// the request goes on when its client is admitted, the room is closed or its tier passes;
    /// else it is told its place in line. A store that fails lets it in.
    async fn wait_turn(&self, route: &Matched<'_>, whose: &Whose<'_>) -> Result<(), Rejection> {
        let Some(room) = &route.extras.room else {
            return Ok(());
        };
        if !room.is_open() || room.bypasses(whose.tier) {
            return Ok(());
        }
        let mut buf = [0u8; 16];
        let id = whose.identity.key_bytes(&mut buf);
        // A banned client takes no place in line: its limits refuse it at once.
        let kind = KeyKind::from(whose.identity.kind());
        if self.control.banned(&route.config.name, kind, id).is_some() {
            return Ok(());
        }
        let mut client = vec![whose.identity.kind() as u8];
        client.extend_from_slice(id);
        match room.enter(self.core.limiter(), &client).await {
            Ok(crate::room::Turn::Enter) => Ok(()),
            Ok(crate::room::Turn::Wait { position, eta_secs }) => {
                Err(Rejection::WaitingRoom { position, eta_secs })
            }
            Err(e) => {
                tracing::debug!(room = %room.name(), error = %e, "a waiting room's store failed: let in");
                Ok(())
            }
        }
    }

    /// A request told to wait its turn: counted in the route's `/top` as refused.
    fn refused_in_line(
        &self,
        route: &Matched<'_>,
        whose: Whose<'_>,
        waiting: Rejection,
    ) -> Result<(), Rejection> {
        route.extras.top.record(&whose.identity, false, uptime_us());
        Err(waiting)
    }

    /// Phase 4: a slot under the learned limit (`adaptive_concurrency`) of the endpoint the
    /// request goes to, if the route's upstream has learned limits. The endpoint is the one its
    /// limits `per: endpoint` chose, or the balancer's pick now: the first attempt goes there.
    /// (A pool with no endpoint has no gate to wait at: the forward answers 503 `no_upstream`.)
    /// It waits in its `flow`'s queue when the route is fair (`fairness:`).
    pub(super) async fn gate(
        &self,
        route: &Matched<'_>,
        ctx: &mut Context,
        admitted: &mut Admitted,
        flow: Option<u64>,
    ) -> Result<(), Rejection> {
        let Some(gates) = &route.extras.gate else {
            return Ok(());
        };
        if admitted.endpoint.is_none() {
            admitted.endpoint = (route.extras.pool).pick(ctx.balance_key, &[], Fallback::Unwell);
        }
        if let Some(endpoint) = &admitted.endpoint {
            let gate = gates.of(&endpoint.name, || endpoint.target.origin());
            let permit = gate.acquire(route.config.priority, flow).await;
            ctx.permit = Some(permit.ok_or(Rejection::UpstreamOverloaded)?);
        }
        Ok(())
    }

    /// Phase 2: whose budgets the request spends: its identity, and its client address.
    /// With `consumers:`, an API key becomes its consumer; an unknown one is rejected (401) or
    /// ignored, as `unknown_key` says.
    /// Writes into the access log's line `log` (when the log is on) what `floodgate replay`
    /// reads back (never a raw key): the identity's kind, the digest of an API key (a
    /// consumer's, or one refused) or user id, the address.
    pub(super) fn identify<'a>(
        snapshot: &'a Snapshot,
        req: &'a Request<ClientBody>,
        verified: Option<&'a Verified>,
        peer: SocketAddr,
        log: Option<&mut access_log::Line>,
    ) -> Result<Whose<'a>, Rejection> {
        let config = &snapshot.identity;
        let headers = req.headers();
        let rejection = |e: ResolveError| match e {
            ResolveError::Identity(IdentityError::UnknownKey) => Rejection::InvalidApiKey,
            other => Rejection::BadRequest(other.to_string()),
        };
        // The order: an API key, then a verified token's subject, then the trusted user id,
        // then the address.
        let keyless = || -> Result<Identity<'a>, IdentityError> {
            match verified {
                Some(v) => Ok(Identity::Jwt(v.subject.as_bytes())),
                None => config.identify_without_key(headers, peer.ip()),
            }
        };
        // A verified client certificate comes first (`identity.client_cert`).
        let certified = match config.client_cert {
            true => req.extensions().get::<crate::tls::PeerName>(),
            false => None,
        };
        let claim = match certified {
            Some(name) => Claim::Certificate(name.as_str()),
            None => match config
                .identify(headers, peer.ip())
                .map_err(|e| rejection(e.into()))?
            {
                Identity::ApiKey(key) => Claim::ApiKey(key),
                _ => Claim::Keyless(keyless().map_err(|e| rejection(e.into()))?),
            },
        };
        let resolved = snapshot.policy().resolve(
            claim,
            verified.and_then(|v| v.tier.as_deref()),
            || Ok(keyless()?),
            || config.client_addr(headers, peer.ip()),
        );
        if let Some(log) = log {
            let (kind, ip) = match &resolved {
                Ok(whose) => (whose.identity.kind(), whose.ip),
                Err(_) => (IdentityKind::ApiKey, config.client_addr(headers, peer.ip())),
            };
            log.identity = Some(kind);
            let mut text = Vec::with_capacity(16);
            super::forward::push_ip(&mut text, ip);
            log.client_ip = Some(String::from_utf8_lossy(&text).into_owned().into());
            // A token's tier, which replay cannot know from the subject's digest.
            if let Ok(whose) = &resolved
                && matches!(whose.identity, Identity::Jwt(_))
            {
                log.tier = Some(whose.tier.to_string().into());
            }
            let hashed = match (claim, resolved.as_ref().map(|w| w.identity)) {
                (
                    _,
                    Ok(Identity::UserId(user) | Identity::Jwt(user) | Identity::ClientCert(user)),
                ) => Some(user),
                (_, Ok(Identity::Ip(_))) => None,
                (Claim::ApiKey(key), _) => Some(key),
                _ => None,
            };
            log.identity_hash = hashed.map(|value| digest_hex(value).into());
        }
        resolved.map_err(rejection)
    }

    /// Phase 2b, on a route whose limits read the JSON body (`json:` keys): the body read whole
    /// (at most `max_body_size`, 16 MiB when that is unlimited: 413 past it), kept to forward,
    /// and parsed. A body that is not a JSON object has no fields (the limits that read one
    /// then spend the identity's budget).
    pub(super) async fn read_body(
        snapshot: &Snapshot,
        route: &RouteConfig,
        req: &mut Request<ClientBody>,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>, Rejection> {
        const UNLIMITED_READ: std::num::NonZeroU64 = std::num::NonZeroU64::new(16 << 20).unwrap();
        let http1 = req.version() <= http::Version::HTTP_11;
        let body = std::mem::replace(req.body_mut(), ClientBody::Read(bytes::Bytes::new()));
        let bytes = match body {
            ClientBody::Read(bytes) => bytes,
            ClientBody::Streaming(body) => {
                let limits = snapshot.forwarder.body_limits(route);
                let limit = limits.max_request_bytes.unwrap_or(UNLIMITED_READ);
                body::read_whole(body, limit, limits.client_idle, http1)
                    .await
                    .map_err(Rejection::from)?
            }
        };
        let json = serde_json::from_slice(&bytes).ok();
        *req.body_mut() = ClientBody::Read(bytes);
        Ok(json)
    }

    /// Phase 2a: the request's bearer token, verified, when `identity.jwt` is set. A token that
    /// does not verify (or none, under `when_missing: reject`) is refused: 401 `invalid_token`.
    /// Why is logged at debug level, never the token.
    pub(super) async fn verify_token(
        snapshot: &Snapshot,
        req: &Request<ClientBody>,
    ) -> Result<Option<Verified>, Rejection> {
        let Some(jwt) = &snapshot.identity.jwt else {
            return Ok(None);
        };
        match jwt.verify(req.headers()).await {
            Ok(Some(verified)) => Ok(Some(verified)),
            Ok(None) if jwt.when_missing == WhenMissing::Reject => Err(Rejection::InvalidToken),
            Ok(None) => Ok(None),
            Err(why) => {
                tracing::debug!(%why, path = req.uri().path(), "bearer token refused");
                Err(Rejection::InvalidToken)
            }
        }
    }

    /// The limit phase, holding a request that the limit refusing it would admit within its
    /// `wait`: a timer for the retry the refusal named (never a polling loop), then decided
    /// again, spending only when admitted (`delayed`); held at most `wait` in all, and by at
    /// most `max_waiting` requests of that limit at once on this instance (past it, refused at
    /// once). A client that leaves while held drops its request, and its timer with it.
    async fn limit_or_hold(
        &self,
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: &Request<ClientBody>,
        whose: &Whose<'_>,
        read: Read<'_>,
        ctx: &mut Context,
    ) -> Result<Admitted, Rejection> {
        let limits = &route.config.enforced.limits;
        if !limits.iter().any(|l| !l.wait.is_zero()) {
            // Nothing to hold for: the limit phase as it is (no clock read, no loop).
            return self.limit(snapshot, route, req, whose, read, ctx).await;
        }
        let arrived = std::time::Instant::now();
        let mut place: Option<Held> = None;
        // A refusal that is then held is not a denial for the penalty box: on a route with
        // both, refusals are decided without it, and one that is final is decided again with
        // it (a second decision, on such routes only).
        let deferred = limits.iter().any(|l| l.penalty.is_some());
        loop {
            let first = Read {
                penalizes: !deferred,
                ..read
            };
            let decided = self.limit(snapshot, route, req, whose, first, ctx).await;
            // The retry the refusal named (at least a millisecond), if its limit has a `wait`
            // and the retry comes within what is left of it, and a place is free.
            let hold = match &decided {
                Err(Rejection::RateLimited(verdict, crate::policy::LimitRef::Enforced(at))) => {
                    (route.config.enforced.limits.get(*at))
                        .filter(|l| !l.wait.is_zero())
                        .map(|l| {
                            let pause = verdict.outcome.retry_after_us().max(1_000);
                            (l, std::time::Duration::from_micros(pause))
                        })
                        .filter(|(l, pause)| arrived.elapsed() + *pause <= l.wait)
                }
                _ => None,
            };
            if let Some((limit, _)) = hold
                && place.is_none()
            {
                place = Held::take(limit);
            }
            match hold {
                Some((_, pause)) if place.is_some() => tokio::time::sleep(pause).await,
                _ => {
                    // The end: a final refusal on a route that deferred its penalty is decided
                    // again with it (and may be admitted, as any decision).
                    let decided =
                        match deferred && matches!(decided, Err(Rejection::RateLimited(..))) {
                            true => self.limit(snapshot, route, req, whose, read, ctx).await,
                            false => decided,
                        };
                    return self.after_hold(decided, place.is_some(), arrived, ctx);
                }
            }
        }
    }

    /// A request's admission after `held` (or not): admitted after a hold, it is `delayed`,
    /// and the access log says how long it waited.
    fn after_hold(
        &self,
        decided: Result<Admitted, Rejection>,
        held: bool,
        arrived: std::time::Instant,
        ctx: &mut Context,
    ) -> Result<Admitted, Rejection> {
        let mut admitted = decided?;
        if held {
            if admitted.label == crate::metrics::DecisionLabel::Allowed {
                admitted.label = crate::metrics::DecisionLabel::Delayed;
            }
            if let Some(log) = ctx.log.as_deref_mut() {
                log.wait_ms = Some(arrived.elapsed().as_millis() as u64);
            }
        }
        Ok(admitted)
    }

    /// Phase 3: the route's limits, decided by the one decider ([`Decider`]) on what this
    /// request says (its headers, query, path, token claims and JSON body: [`HttpFacts`]). A
    /// store failure follows `on_error`: never a 429 or a 500.
    pub(super) async fn limit(
        &self,
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: &Request<ClientBody>,
        whose: &Whose<'_>,
        read: Read<'_>,
        ctx: &mut Context,
    ) -> Result<Admitted, Rejection> {
        let config = route.config;
        let mut facts = HttpFacts {
            view: RequestView {
                headers: req.headers(),
                query: req.uri().query(),
                rest: req
                    .uri()
                    .path()
                    .strip_prefix(config.path_prefix.as_str())
                    .unwrap_or(""),
                claims: read.verified.map(|v| &v.claims),
                json: read.json,
            },
            logging: ctx.log.is_some(),
            logged_keys: String::new(),
        };
        let mut offered = Offered {
            pool: &route.extras.pool,
            key: ctx.balance_key,
            ids: Vec::new(),
            last: None,
        };
        let mut decider = self.decider(snapshot);
        decider.undoable = ctx.left.is_some();
        decider.penalizes = read.penalizes;
        let decided = decider
            .decide(Question::Request {
                route: config,
                whose,
                facts: &mut facts,
                endpoints: Some(&mut offered),
            })
            .await;
        if let Some(log) = ctx.log.as_deref_mut()
            && !facts.logged_keys.is_empty()
        {
            log.keys = Some(std::mem::take(&mut facts.logged_keys).into());
        }
        if let Some(trace) = &ctx.trace {
            let system = match self.core.limiter().backend_name() {
                "postgres" => "postgresql",
                other => other,
            };
            for &(started, took) in &decided.store_calls {
                trace.store_call(system, started, took, false);
            }
            if let Some((verdict, limit)) = &decided.headline {
                let index = limit.index(config.enforced.limits.len());
                trace.set(|| KeyValue::new("floodgate.limit", index as i64));
                trace.set(|| {
                    KeyValue::new("floodgate.remaining", verdict.headline.remaining as i64)
                });
            }
        }
        if let Some(refused) = decided.refused {
            return Err(Rejection::from(refused));
        }
        let costs = decided
            .reservations
            .into_iter()
            .map(|reserved| {
                let budget = match reserved.side {
                    Side::Enforced => &config.enforced,
                    Side::Shadow => &config.shadow,
                };
                let metered = cost::metered(budget, &reserved.positions, &route.extras.costs);
                cost::CostMeter::new(reserved.reservation, metered)
            })
            .collect();
        Ok(Admitted {
            headline: decided.headline,
            label: decided.label,
            leases: decided.leases,
            costs,
            endpoint: offered.last,
            spent: decided.spent,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_digest_is_the_sha256_of_its_own_value() {
        // The digest of "test" (sha256sum), first made, then found.
        let test = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert_eq!(digest_hex(b"test"), test);
        assert_eq!(digest_hex(b"test"), test);
        assert_ne!(digest_hex(b"other"), test);
        // Past the bound the thread forgets and starts again: every answer stays right.
        for i in 0..(DIGESTS + 10) {
            let value = format!("key-{i}");
            use sha2::Digest;
            let expected = crate::limiter::hex(&sha2::Sha256::digest(value.as_bytes()));
            assert_eq!(digest_hex(value.as_bytes()), expected);
        }
        assert_eq!(digest_hex(b"test"), test);
        RECENT_DIGESTS.with_borrow(|(_, digests)| assert!(digests.len() <= DIGESTS));
    }
}
