//! The request pipeline. Every request goes through the same phases, in this order, over one
//! per-request context (`proxy/context.rs`) that each phase reads and writes:
//!
//! 1. `Proxy::normalize`, then `Proxy::route`: normalise the path (one path, one route; 400 if
//!    it cannot be), then find the first matching route, or reject with 404;
//! 2. `Proxy::identify`: work out whose budget the request spends ([`crate::policy`]);
//! 3. `Proxy::limit`: ask the route's enforced limits that apply to the request,
//!    all-or-nothing whatever budget each spends (or apply `on_error`), then its shadow limits,
//!    which count but never deny; what the answers mean is the one limit phase
//!    ([`crate::policy::LimitPhase`]), which replay runs too;
//! 4. `Proxy::gate`: a slot under the upstream's learned limit (`adaptive_concurrency`);
//! 5. `Proxy::forward`: hold the request for a leaky bucket's delay, send it upstream
//!    ([`forward`]) and add the rate-limit headers to the response;
//! 6. `Proxy::respond`: count the decision (its label derived once, by the context), record
//!    the outcome on the request's span (the access log);
//! 7. after the response (`context::AfterResponse`): when the response body ends or is
//!    dropped, what the request held is given back (concurrency leases).
//!
//! Phases 2 to 4 run as `Proxy::admit`. An early exit is a typed [`Rejection`], turned into a
//! response in `response.rs`: the one place where a status is chosen.

pub mod body;
mod context;
pub mod cost;
pub mod forward;
mod multiplex;
mod pool;
pub mod response;
mod snapshot;
mod upstream_frames;
mod usage;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::access_log::{self, field};
use crate::adaptive::Outcome;
use crate::config::{Budget, Config, RequestView, RouteConfig, RouteLimit};
use crate::decider::{Decider, Facts, Side};
use crate::identity::jwt::{Verified, WhenMissing};
use crate::identity::{Identity, IdentityError, IdentityKind};
use crate::limiter::{KeyKind, Limiter};
use crate::metrics::Metrics;
use crate::policy::{Claim, Refusal, Refused, RequestKeys, Whose};
use body::ClientBody;
use context::{Admitted, Context, PendingLog};
pub use forward::Forwarder;
use opentelemetry::KeyValue;
pub use response::{Body, Dialect, RateLimitHeaders, Rejection};
use snapshot::RouteExtras;
pub use snapshot::uptime_us;
pub use snapshot::{Gates, Snapshot, Tops};

/// The proxy: shared by every connection.
pub struct Proxy {
    snapshot: ArcSwap<Snapshot>,
    limiter: Limiter,
    metrics: Arc<Metrics>,
    gates: Gates,
    tops: Tops,
    /// OpenTelemetry, when it is on (`telemetry:`): a trace per request.
    telemetry: crate::telemetry::Shared,
    /// The bans in force (operators' and penalty boxes'): kept across reloads.
    bans: crate::control::SharedBans,
}

/// Reads what is left of an HTTP/1 request's body after floodgate answered it without reading
/// it, so that the client reads the answer ([`body::linger`]). HTTP/2 needs none: a stream is
/// closed on its own, and the connection stays.
fn linger(req: Request<ClientBody>) {
    if req.version() <= http::Version::HTTP_11
        && let ClientBody::Streaming(body) = req.into_body()
        && !hyper::body::Body::is_end_stream(&body)
    {
        tokio::spawn(body::linger(body));
    }
}

/// The access log's `identity_hash`: the hex SHA-256 of an API key (the digest a consumer's
/// `keys_sha256` holds, so replay can find the consumer) or of a user id.
fn digest_hex(value: &[u8]) -> String {
    use sha2::Digest;
    crate::limiter::hex(&sha2::Sha256::digest(value))
}

/// What the phases before the limit phase read from the request for its keys and reserves:
/// the verified token, and the JSON body (on a route that reads it).
#[derive(Clone, Copy)]
struct Read<'a> {
    verified: Option<&'a Verified>,
    json: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// What the decider reads of a live request: its composite keys' parts (recorded, as digests,
/// on the access log's span for replay) and its settled limits' reserves.
struct HttpFacts<'a> {
    view: RequestView<'a>,
    span: &'a tracing::Span,
    /// The access log's `keys`: every composite key's digest, enforced and shadow.
    logged_keys: String,
}

impl Facts for HttpFacts<'_> {
    fn keys(&mut self, budget: &Budget, identity: (KeyKind, &[u8]), ip: &[u8]) -> RequestKeys {
        let keys = RequestKeys::of(budget, &self.view, identity, ip);
        if !self.span.is_disabled() {
            access_log::keys_field(keys.digests(budget), &mut self.logged_keys);
            if !self.logged_keys.is_empty() {
                self.span.record(field::KEYS, self.logged_keys.as_str());
            }
        }
        keys
    }

    fn reserve(&mut self, limit: &RouteLimit) -> u32 {
        limit.settled.as_ref().map_or(limit.limit.cost(), |s| {
            s.reserve.of(self.view.headers, self.view.json)
        })
    }
}

/// A matched route with its prebuilt extras.
struct Matched<'r> {
    config: &'r RouteConfig,
    extras: &'r RouteExtras,
}

impl Proxy {
    pub fn new(config: &Config, limiter: Limiter, metrics: Arc<Metrics>) -> Self {
        if let Some(jwt) = &config.identity.jwt {
            jwt.keep_fresh(None);
        }
        let gates = Gates::default();
        let tops = Tops::default();
        Proxy {
            snapshot: ArcSwap::from_pointee(Snapshot::from_config(config, &metrics, &gates, &tops)),
            limiter,
            metrics,
            gates,
            tops,
            telemetry: None,
            bans: Default::default(),
        }
    }

    /// The bans in force, which the admin listener writes.
    pub fn bans(&self) -> &crate::control::SharedBans {
        &self.bans
    }

    /// Traces every request with `telemetry` (set once, at start).
    pub fn with_telemetry(mut self, telemetry: Arc<crate::telemetry::Telemetry>) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// The process' telemetry, if it is on.
    pub fn telemetry(&self) -> Option<&Arc<crate::telemetry::Telemetry>> {
        self.telemetry.as_ref()
    }

    /// Swaps in a new snapshot for requests that start from now on, and applies the store's
    /// reloadable settings. In-flight requests finish with the snapshot they started with;
    /// limiter state of unchanged limits carries over because it is keyed by each limit's
    /// budget id.
    pub fn reload(&self, config: &Config) {
        if let Some(jwt) = &config.identity.jwt {
            let old = self.snapshot.load();
            jwt.keep_fresh(old.identity.jwt.as_deref());
        }
        let storage = &config.storage;
        self.limiter
            .reconfigure(storage.timeout, storage.batch, storage.lease_ttl);
        self.snapshot.store(Arc::new(Snapshot::from_config(
            config,
            &self.metrics,
            &self.gates,
            &self.tops,
        )));
    }

    /// The answer to an HTTP/2 stream past its connection's stream budget (see `server`): 429
    /// (a gRPC call: `RESOURCE_EXHAUSTED`) at once, counted, with no routing or forwarding.
    pub fn refuse_stream<B>(&self, req: &Request<B>) -> Response<Body> {
        self.metrics.stream_refused();
        let dialect = Dialect::of(req.headers(), Default::default());
        Rejection::TooManyStreams.respond(&RateLimitHeaders::none(), dialect)
    }

    /// The config snapshot new requests are served with.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The limiter this proxy asks.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The metrics this proxy records.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Runs the pipeline for one request: its phases, in order, over one `Context`. An early
    /// exit is a typed [`Rejection`], answered in `response.rs`.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let mut req = req.map(ClientBody::Streaming);
        let snapshot = self.snapshot.load_full();
        let mut ctx = Context::new(&req, peer);
        if let Some(telemetry) = &self.telemetry {
            ctx.trace = Some(telemetry.server_span(
                req.method(),
                req.uri().path(),
                req.version(),
                req.headers(),
                || snapshot.identity.client_addr(req.headers(), peer.ip()),
            ));
        }
        // `GET {usage_path}`: the caller's own budgets, answered here (`usage.rs`).
        if let Some(path) = &snapshot.usage_path
            && req.method() == http::Method::GET
            && Self::normalize(&snapshot, &mut req).is_ok()
            && req.uri().path() == path
        {
            let response = match self.usage(&snapshot, &req, &ctx).await {
                Ok(response) => response,
                Err(rejection) => rejection.respond(&usage::headers(), ctx.dialect),
            };
            linger(req);
            return Self::respond(ctx, None, response);
        }
        let route = match Self::normalize(&snapshot, &mut req)
            .and_then(|()| Self::route(&snapshot, &req))
        {
            Ok(route) => route,
            Err(rejection) => {
                if rejection == Rejection::NoRoute {
                    self.metrics.no_route();
                }
                let response = rejection.respond(&snapshot.no_limit_headers, ctx.dialect);
                linger(req);
                return Self::respond(ctx, None, response);
            }
        };
        // A gRPC call's refusals take the route's status for a rate-limited call.
        if let Dialect::Grpc(_) = ctx.dialect {
            ctx.dialect = Dialect::Grpc(route.config.grpc_rate_limited);
        }
        ctx.span.record(field::ROUTE, &*route.config.name);
        if let Some(trace) = &ctx.trace {
            trace.rename(|| format!("{} {}", req.method(), route.config.name));
            trace.set(|| KeyValue::new("http.route", route.config.path_prefix.clone()));
            trace.set(|| KeyValue::new("floodgate.route", route.config.name.to_string()));
        }
        let response = match self.admit(&snapshot, &route, &mut req, &mut ctx).await {
            Ok(()) => {
                let identity = &snapshot.identity;
                // floodgate ignored an untrusted peer's user id; the upstream must not see it.
                if identity.strip_untrusted_user_id
                    && !identity.is_trusted(peer.ip().to_canonical())
                {
                    req.headers_mut().remove(&identity.user_id_header);
                }
                // An HTTP/2 stream the client reset while it was being decided (a rapid-reset
                // flood resets each stream right after opening it) must cost the upstream
                // nothing: hyper looks for the reset only when this future waits, and
                // everything before forwarding can finish without waiting, so it waits once
                // here. Forwarded and then abandoned, each such stream would cost an upstream
                // connection (see `docs/performance.md`, "Rapid reset and the accept queue").
                if req.version() == http::Version::HTTP_2 {
                    tokio::task::yield_now().await;
                }
                self.forward(&snapshot, &route, req, &mut ctx).await
            }
            Err(rejection) => {
                ctx.refuse(rejection.label());
                if let (Some(trace), Rejection::RateLimited(verdict, limit)) =
                    (&ctx.trace, &rejection)
                {
                    let index = limit.index(route.config.enforced.limits.len());
                    trace.set(|| KeyValue::new("floodgate.limit", index as i64));
                    trace.set(|| {
                        KeyValue::new("floodgate.remaining", verdict.headline.remaining as i64)
                    });
                }
                linger(req);
                rejection.respond(&route.extras.headers, ctx.dialect)
            }
        };
        Self::respond(ctx, Some(&route), response)
    }

    /// Phases 2 to 4: identify, limit, gate. Whose the request is, once known, is counted in the
    /// route's `/top` (admitted or not).
    async fn admit(
        &self,
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: &mut Request<ClientBody>,
        ctx: &mut Context,
    ) -> Result<(), Rejection> {
        // A bearer token is verified on every route when `identity.jwt` is set: an invalid one
        // never reaches the upstream.
        let verified = Self::verify_token(snapshot, req, &ctx.span).await?;
        let json = match route.config.reads_body {
            true => Self::read_body(snapshot, req).await?,
            false => None,
        };
        let req = &*req;
        // With `consumers:` every API key is checked, on unlimited routes too.
        let (identity, admitted) = if !route.config.is_limited() && snapshot.consumers.is_none() {
            // Nothing to limit. When the upstream's gate may still shed the request, or a ban
            // may cover the route, whose it is is worked out all the same (never refused for
            // it), to be counted in `/top` and checked against the bans.
            let whose = (route.extras.gate.is_some() || !self.bans.is_empty())
                .then(|| Self::identify(snapshot, req, verified.as_ref(), ctx.peer, &ctx.span).ok())
                .flatten();
            let banned = whose.as_ref().and_then(|whose| {
                let mut buf = [0u8; 16];
                let id = whose.identity.key_bytes(&mut buf);
                let kind = KeyKind::from(whose.identity.kind());
                self.bans.banned(
                    &route.config.name,
                    kind,
                    id,
                    crate::limiter::wall_clock_us(),
                )
            });
            let admitted = match banned {
                Some(wait_us) => Err(Rejection::Banned(wait_us.div_ceil(1_000_000).max(1))),
                None => Ok(Admitted::unlimited()),
            };
            (whose.map(|w| w.identity), admitted)
        } else {
            match Self::identify(snapshot, req, verified.as_ref(), ctx.peer, &ctx.span) {
                Ok(whose) => (
                    Some(whose.identity),
                    self.limit(
                        snapshot,
                        route,
                        req,
                        &whose,
                        Read {
                            verified: verified.as_ref(),
                            json: json.as_ref(),
                        },
                        ctx,
                    )
                    .await,
                ),
                Err(rejection) => (None, Err(rejection)),
            }
        };
        if let (Some(trace), Some(identity)) = (&ctx.trace, &identity) {
            trace.set(|| KeyValue::new("floodgate.identity.kind", identity.kind().as_str()));
        }
        let admitted = match admitted {
            Ok(admitted) => self.gate(route, ctx).await.map(|()| admitted),
            Err(rejection) => Err(rejection),
        };
        if let Some(identity) = identity {
            route
                .extras
                .top
                .record(&identity, admitted.is_ok(), uptime_us());
        }
        ctx.admitted = Some(admitted?);
        Ok(())
    }

    /// Phase 4: a slot under the upstream's learned limit (`adaptive_concurrency`), if the
    /// route's upstream has one.
    async fn gate(&self, route: &Matched<'_>, ctx: &mut Context) -> Result<(), Rejection> {
        if let Some(gate) = &route.extras.gate {
            let permit = gate.acquire(route.config.priority).await;
            ctx.permit = Some(permit.ok_or(Rejection::UpstreamOverloaded)?);
        }
        Ok(())
    }

    /// Phase 6: the response goes out. Counts the decision, records the outcome on the
    /// request's span (the access log, target `floodgate::access`), and sets up the phase after
    /// the response ([`context::AfterResponse`]) on its body.
    fn respond(
        mut ctx: Context,
        route: Option<&Matched<'_>>,
        response: Response<Body>,
    ) -> Response<Body> {
        let label = ctx.label();
        if let (Some(route), Some(label)) = (route, label) {
            route.extras.metrics.decision(label);
        }
        if let Some(trace) = ctx.trace.take() {
            if let Some(label) = label {
                trace.set(|| KeyValue::new("floodgate.decision", label.as_str()));
            }
            trace.end(response.status().as_u16());
        }
        let mut after = ctx.after_response();
        let line = (!ctx.span.is_disabled()).then(|| PendingLog {
            span: ctx.span.clone(),
            started: ctx.started,
            route: route.map_or_else(|| Arc::from(""), |r| r.config.name.clone()),
            status: response.status().as_u16(),
            grpc_status: response
                .headers()
                .get(crate::grpc::GRPC_STATUS)
                .and_then(|v| v.to_str().ok()?.parse::<u8>().ok()),
            label,
        });
        match line {
            // A request that settles costs is logged when they are settled.
            Some(line) if after.meters_costs() => after.log = Some(line),
            Some(line) => log_line(&line, None),
            None => {}
        }
        if after.is_empty() {
            return response;
        }
        response.map(|body| response::with_after_response(body, after))
    }

    /// Phase 1a: a well-formed request (one `Host`), and one path, one route. The path is normalised ([`crate::path`]) before routing,
    /// and the request carries the normalised path on, so the upstream sees what was limited.
    fn normalize(snapshot: &Snapshot, req: &mut Request<ClientBody>) -> Result<(), Rejection> {
        // RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host; none may have two.
        let hosts = req.headers().get_all(http::header::HOST).iter().count();
        if hosts > 1 || (hosts == 0 && req.version() == http::Version::HTTP_11) {
            return Err(Rejection::BadRequest(
                "an HTTP/1.1 request needs exactly one Host header".into(),
            ));
        }
        let normalized = match snapshot.paths.normalize(req.uri().path()) {
            Ok(std::borrow::Cow::Borrowed(_)) => return Ok(()),
            Ok(std::borrow::Cow::Owned(path)) => path,
            Err(e) => return Err(Rejection::BadRequest(e.to_string())),
        };
        let path_and_query = match req.uri().query() {
            Some(query) => format!("{normalized}?{query}"),
            None => normalized,
        };
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query = Some(
            path_and_query
                .parse()
                .map_err(|_| Rejection::BadRequest("the path cannot be normalised".into()))?,
        );
        *req.uri_mut() = http::Uri::from_parts(parts)
            .map_err(|_| Rejection::BadRequest("the path cannot be normalised".into()))?;
        Ok(())
    }

    /// Phase 1: the first route that matches the method and path.
    fn route<'r>(
        snapshot: &'r Snapshot,
        req: &Request<ClientBody>,
    ) -> Result<Matched<'r>, Rejection> {
        let i = snapshot
            .routes
            .position(req.method(), req.uri().path())
            .ok_or(Rejection::NoRoute)?;
        Ok(Matched {
            config: &snapshot.routes.routes()[i],
            extras: &snapshot.extras[i],
        })
    }

    /// Phase 2: whose budgets the request spends: its identity, and its client address.
    /// With `consumers:`, an API key becomes its consumer; an unknown one is rejected (401) or
    /// ignored, as `unknown_key` says.
    /// Records on `span` what `floodgate replay` reads back (never a raw key): the identity's
    /// kind, the digest of an API key (a consumer's, or one refused) or user id, the address.
    fn identify<'a>(
        snapshot: &'a Snapshot,
        req: &'a Request<ClientBody>,
        verified: Option<&'a Verified>,
        peer: SocketAddr,
        span: &tracing::Span,
    ) -> Result<Whose<'a>, Rejection> {
        let config = &snapshot.identity;
        let headers = req.headers();
        let rejection = |e: Refusal| match e {
            Refusal::Identity(IdentityError::UnknownKey) => Rejection::InvalidApiKey,
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
        let claim = match config
            .identify(headers, peer.ip())
            .map_err(|e| rejection(e.into()))?
        {
            Identity::ApiKey(key) => Claim::ApiKey(key),
            _ => Claim::Keyless(keyless().map_err(|e| rejection(e.into()))?),
        };
        let resolved = snapshot.policy().resolve(
            claim,
            verified.and_then(|v| v.tier.as_deref()),
            || Ok(keyless()?),
            || config.client_addr(headers, peer.ip()),
        );
        if !span.is_disabled() {
            let (kind, ip) = match &resolved {
                Ok(whose) => (whose.identity.kind(), whose.ip),
                Err(_) => (IdentityKind::ApiKey, config.client_addr(headers, peer.ip())),
            };
            span.record(field::IDENTITY, kind.as_str());
            span.record(field::CLIENT_IP, tracing::field::display(ip));
            // A token's tier, which replay cannot know from the subject's digest.
            if let Ok(whose) = &resolved
                && matches!(whose.identity, Identity::Jwt(_))
            {
                span.record(field::TIER, whose.tier);
            }
            let hashed = match (claim, resolved.as_ref().map(|w| w.identity)) {
                (_, Ok(Identity::UserId(user) | Identity::Jwt(user))) => Some(user),
                (_, Ok(Identity::Ip(_))) => None,
                (Claim::ApiKey(key), _) => Some(key),
                _ => None,
            };
            if let Some(value) = hashed {
                span.record(field::IDENTITY_HASH, digest_hex(value).as_str());
            }
        }
        resolved.map_err(rejection)
    }

    /// Phase 2b, on a route whose limits read the JSON body (`json:` keys): the body read whole
    /// (at most `max_body_size`, 16 MiB when that is unlimited: 413 past it), kept to forward,
    /// and parsed. A body that is not a JSON object has no fields (the limits that read one
    /// then spend the identity's budget).
    async fn read_body(
        snapshot: &Snapshot,
        req: &mut Request<ClientBody>,
    ) -> Result<Option<serde_json::Map<String, serde_json::Value>>, Rejection> {
        const UNLIMITED_READ: std::num::NonZeroU64 = std::num::NonZeroU64::new(16 << 20).unwrap();
        let http1 = req.version() <= http::Version::HTTP_11;
        let body = std::mem::replace(req.body_mut(), ClientBody::Read(bytes::Bytes::new()));
        let bytes = match body {
            ClientBody::Read(bytes) => bytes,
            ClientBody::Streaming(body) => {
                let limits = snapshot.forwarder.body_limits();
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
    async fn verify_token(
        snapshot: &Snapshot,
        req: &Request<ClientBody>,
        span: &tracing::Span,
    ) -> Result<Option<Verified>, Rejection> {
        let Some(jwt) = &snapshot.identity.jwt else {
            return Ok(None);
        };
        match jwt.verify(req.headers()).await {
            Ok(Some(verified)) => Ok(Some(verified)),
            Ok(None) if jwt.when_missing == WhenMissing::Reject => Err(Rejection::InvalidToken),
            Ok(None) => Ok(None),
            Err(why) => {
                span.in_scope(|| tracing::debug!(%why, "bearer token refused"));
                Err(Rejection::InvalidToken)
            }
        }
    }

    /// Phase 3: the route's limits, decided by the one decider ([`Decider`]) on what this
    /// request says (its headers, query, path, token claims and JSON body: [`HttpFacts`]). A
    /// store failure follows `on_error`: never a 429 or a 500.
    async fn limit(
        &self,
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: &Request<ClientBody>,
        whose: &Whose<'_>,
        read: Read<'_>,
        ctx: &Context,
    ) -> Result<Admitted, Rejection> {
        let (span, trace) = (&ctx.span, ctx.trace.as_ref());
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
            span,
            logged_keys: String::new(),
        };
        let decided = self
            .decider(snapshot)
            .decide(config, whose, &mut facts)
            .await;
        if let Some(trace) = trace {
            let system = match self.limiter.backend_name() {
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
            return Err(match refused {
                Refused::RateLimited(verdict, limit) => Rejection::RateLimited(verdict, limit),
                Refused::StoreUnavailable => Rejection::LimiterUnavailable,
                Refused::Banned(wait_us) => Rejection::Banned(wait_us.div_ceil(1_000_000).max(1)),
            });
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
        })
    }

    /// The decider on this snapshot's rules and the proxy's store.
    pub fn decider<'s>(&'s self, snapshot: &'s Snapshot) -> Decider<'s> {
        Decider {
            policy: snapshot.policy(),
            limiter: &self.limiter,
            on_error: snapshot.on_error,
            metrics: Some(&self.metrics),
            bans: Some(&self.bans),
        }
    }

    /// Phase 5: delay (leaky bucket), forward, and add the rate-limit headers to the response.
    /// The request's permit under its upstream's learned limit learns how the upstream answered
    /// and is given back when the response head arrives.
    async fn forward(
        &self,
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: Request<ClientBody>,
        ctx: &mut Context,
    ) -> Response<Body> {
        let headline = ctx.admitted.as_ref().and_then(|a| a.headline);
        if let Some((verdict, _)) = &headline
            && verdict.delay_us() > 0
        {
            tokio::time::sleep(Duration::from_micros(verdict.delay_us())).await;
        }
        let started = Instant::now();
        // The forwarded request's CLIENT span; the upstream hears of it in `traceparent`.
        let mut req = req;
        let forwarded_span = ctx.trace.as_ref().map(|trace| {
            let method = req.method().clone();
            trace.forward(
                &method,
                route.config.upstream.authority.host(),
                req.headers_mut(),
            )
        });
        // A gRPC client's deadline bounds the wait for the upstream too.
        let deadline = match ctx.dialect {
            Dialect::Grpc(_) => crate::grpc::timeout(req.headers()),
            Dialect::Http => None,
        };
        let forwarded = snapshot
            .forwarder
            .forward(req, route.config, ctx.peer.ip(), snapshot.tls, deadline)
            .await
            .map_err(Rejection::from);
        // The HTTP status of what happened, whatever the client is told (a gRPC client hears
        // of floodgate's 502 and 504 as gRPC statuses in a 200).
        let status = match &forwarded {
            Ok(response) => response.status().as_u16(),
            Err(rejection) => rejection.status().as_u16(),
        };
        let mut response = match forwarded {
            Ok(response) => response,
            Err(rejection) => rejection.respond(&route.extras.headers, ctx.dialect),
        };
        route
            .extras
            .metrics
            .upstream(status, started.elapsed().as_secs_f64());
        if let Some(span) = forwarded_span {
            span.end(status);
        }
        if let Some(mut permit) = ctx.permit.take() {
            // 502 (unreachable), 503 (the upstream shedding) and 504 (no answer in time) are
            // overload signals, and so are gRPC's UNAVAILABLE and RESOURCE_EXHAUSTED (in the
            // head of a trailers-only answer, or in the trailers); any other answer is a
            // latency sample, taken at the head.
            let grpc = crate::grpc::status_of(response.headers());
            permit.finish(match (status, grpc) {
                (502..=504, _) => Outcome::Overloaded,
                (_, Some(code)) if crate::grpc::is_overload(code) => Outcome::Overloaded,
                _ => Outcome::Answered(started.elapsed()),
            });
            // A gRPC call's status comes in its trailers: the permit is held until they do.
            match (ctx.dialect, grpc) {
                (Dialect::Grpc(_), None) => ctx.permit = Some(permit),
                _ => drop(permit),
            }
        }
        if let Some((verdict, limit)) = &headline {
            route
                .extras
                .headers
                .write(response.headers_mut(), verdict, *limit);
        }
        if let Some(admitted) = &mut ctx.admitted {
            for meter in &mut admitted.costs {
                meter.head(response.headers());
            }
        }
        response
    }
}

/// A request's outcome on its span (the access log, target `floodgate::access`); `cost`, its
/// settled costs (`cost.rs`).
fn log_line(line: &PendingLog, cost: Option<&str>) {
    let span = &line.span;
    let latency_ms = line.started.elapsed().as_secs_f64() * 1000.0;
    span.record(field::STATUS, line.status);
    if let Some(code) = line.grpc_status {
        span.record(field::GRPC_STATUS, code);
    }
    span.record(field::LATENCY_MS, latency_ms);
    if let Some(label) = line.label {
        span.record(field::DECISION, label.as_str());
    }
    if let Some(cost) = cost {
        span.record(field::COST, cost);
    }
    let _entered = span.enter();
    tracing::info!(
        target: access_log::TARGET,
        route = (!line.route.is_empty()).then_some(&*line.route),
        status = line.status,
        "request done"
    );
}
