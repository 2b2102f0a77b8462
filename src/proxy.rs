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
//! Phases 2 to 4 run as `Proxy::admit` (`proxy/admit.rs`: identify, verify the token, read the
//! body a limit reads, limit through the decider, gate). An early exit is a typed [`Rejection`], turned into a
//! response in `response.rs`: the one place where a status is chosen.

mod admit;
pub mod body;
mod cached;
mod context;
pub mod cost;
pub mod forward;
mod snapshot;
mod usage;
mod websocket;
mod well_formed;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::{Request, Response};

use crate::adaptive::Signal;
pub use crate::answer::{Body, Dialect, RateLimitHeaders, Rejection};
use crate::config::{Config, RouteConfig};
use crate::decider::{Core, Decider};
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use body::ClientBody;
use context::{Context, PendingLog};
pub use forward::Forwarder;
use opentelemetry::KeyValue;
use snapshot::RouteExtras;
pub use snapshot::uptime_us;
pub use snapshot::{Gates, Snapshot, Tops};

/// The proxy: shared by every connection.
pub struct Proxy {
    snapshot: ArcSwap<Snapshot>,
    /// What every decision is made with (the store, bans and overrides, alerts, global
    /// budgets): the proxy's decider, and the one the service and the admin endpoints ask.
    core: Arc<Core>,
    metrics: Arc<Metrics>,
    gates: Gates,
    tops: Tops,
    /// Every route's upstream pool, kept across reloads (endpoints that stay keep their health).
    pools: Arc<crate::upstream::Pools>,
    /// OpenTelemetry, when it is on (`telemetry:`): a trace per request.
    telemetry: crate::telemetry::Shared,
    /// The bans and overrides in force (operators' and penalty boxes'): kept across reloads;
    /// the core's, which the cache phase reads before any decision.
    control: crate::control::SharedControl,
    /// The response cache every cached route shares: kept across reloads.
    cache: Arc<crate::cache::Cache>,
    /// The waiting rooms, by name: kept across reloads (with their lines, on the memory store).
    rooms: crate::room::Rooms,
}

/// True when the request's `Accept` names HTML (a browser navigating).
fn accepts_html(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"))
}

/// The variables of a request whose route's header values hold none, or whose identity was
/// never worked out (refused before): every one empty.
static NO_VARS: std::sync::LazyLock<crate::config::Vars> =
    std::sync::LazyLock::new(crate::config::Vars::default);

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
        let pools = Arc::new(crate::upstream::Pools::default());
        let rooms = crate::room::Rooms::default();
        // Quota alerts: what was crossed is kept across reloads; the sinks are the config's.
        let alerts = Arc::new(crate::alerts::Alerter::new(&config.alerts, metrics.clone()));
        let control = crate::control::SharedControl::default();
        let core = Core::live(limiter, metrics.clone(), control.clone(), alerts);
        Proxy {
            snapshot: ArcSwap::from_pointee(Snapshot::from_config(
                config, &metrics, &gates, &tops, &pools, &rooms, None,
            )),
            pools,
            rooms,
            core: Arc::new(core),
            gates,
            tops,
            telemetry: None,
            control,
            cache: Arc::new(crate::cache::Cache::new(
                config.cache,
                metrics.cache_gauges(),
            )),
            metrics,
        }
    }

    /// The response cache (admin `/cache/purge`).
    pub fn cache(&self) -> &Arc<crate::cache::Cache> {
        &self.cache
    }

    /// Spends `scope: global` limits through `global` (set once, at start).
    pub fn with_global(mut self, global: Arc<crate::global::Global>) -> Self {
        self.core = Arc::new(Core::clone(&self.core).with_global(global));
        self
    }

    /// What every decision is made with: the store, bans and overrides, alerts, global budgets.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Every route's upstream pool (discovery resolves their names; admin `/upstreams`).
    pub fn pools(&self) -> &Arc<crate::upstream::Pools> {
        &self.pools
    }

    /// The bans and overrides in force, which the admin listener writes.
    pub fn control(&self) -> &crate::control::SharedControl {
        &self.control
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
        if let Some(alerts) = self.core.alerts() {
            alerts.configure(&config.alerts);
        }
        self.cache.configure(config.cache);
        let storage = &config.storage;
        self.core
            .limiter()
            .reconfigure(storage.timeout, storage.batch, storage.lease_ttl);
        self.snapshot.store(Arc::new(Snapshot::from_config(
            config,
            &self.metrics,
            &self.gates,
            &self.tops,
            &self.pools,
            &self.rooms,
            Some(&self.snapshot.load()),
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

    /// The metrics this proxy records.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Runs the pipeline for one request: its phases, in order, over one `Context`. An early
    /// exit is a typed [`Rejection`], answered in `response.rs`.
    pub async fn handle(&self, req: Request<body::Incoming>, peer: SocketAddr) -> Response<Body> {
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
        let normalized = Self::normalize(&snapshot, &mut req, peer);
        if let Some(path) = &snapshot.usage_path
            && normalized.is_ok()
            && req.method() == http::Method::GET
            && req.uri().path() == path
        {
            // Boxed: the usage endpoint is rare, and its peek's state (every route's budgets, a
            // global slice's store call) would otherwise size every request's future.
            let response = match Box::pin(self.usage(&snapshot, &req, &mut ctx)).await {
                Ok(response) => response,
                Err(rejection) => rejection.respond(&usage::headers(), ctx.dialect),
            };
            linger(req);
            return Self::respond(ctx, None, response);
        }
        let (route, preflight) = match normalized.and_then(|()| Self::route(&snapshot, &req)) {
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
        // An upgrade on a route with `websocket.max_connections` is decided by the route's
        // upgrade budget: its limits and the connections per identity.
        let route = match (route.config.websocket.as_deref()).and_then(|w| w.upgrade.as_deref()) {
            Some(upgrade) if forward::is_websocket_upgrade(&req) => Matched {
                config: upgrade,
                extras: route.extras,
            },
            _ => route,
        };
        // A gRPC call's refusals take the route's status for a rate-limited call.
        if let Dialect::Grpc(_) = ctx.dialect {
            ctx.dialect = Dialect::Grpc(route.config.grpc_rate_limited);
        }
        if let Some(log) = ctx.log.as_deref_mut() {
            log.route = Some(route.config.name.to_string().into());
            // For replay, which may route a proposed config by host.
            log.host = crate::config::request_host(req.uri(), req.headers())
                .map(|host| host.into_owned().into());
        }
        if let Some(trace) = &ctx.trace {
            trace.rename(|| [req.method().as_str(), " ", &route.config.name].concat());
            trace.set(|| KeyValue::new("http.route", route.config.path_prefix.clone()));
            trace.set(|| KeyValue::new("floodgate.route", route.config.name.clone()));
        }
        // `cors:`: the request's origin, for the CORS headers of whatever answers it; a
        // preflight is answered here, before anything is held, decided or spent.
        let origin = (route.config.cors.as_ref())
            .and_then(|_| req.headers().get(http::header::ORIGIN).cloned());
        if preflight && let Some(cors) = &route.config.cors {
            ctx.refuse(Some(crate::metrics::DecisionLabel::Preflight));
            let response = crate::answer::preflight(cors, req.headers());
            linger(req);
            let response = Self::dressed(&route, &ctx, origin.as_ref(), response);
            return Self::respond(ctx, Some(&route), response);
        }
        // A discovered route whose containers are all gone or starting (compose recreating its
        // only one): held until one serves, within `recreate_grace`, rather than answered 503.
        if let Some(grace) = route.config.recreate_grace
            && route.extras.pool.is_empty()
        {
            let held = Box::pin(route.extras.pool.wait_for_endpoint(grace)).await;
            self.metrics.discovery_held(held.as_str());
        }
        // An unsafe method on a cached route: its URI's entries go once it succeeds.
        let invalidates = cached::invalidation(route.config, &req);
        // The cache phase, on a cached route (`cached.rs`): a hit is answered here.
        let looked = match &route.config.cache {
            Some(rules) => Box::pin(self.look_up(&snapshot, &route, rules, &req, &mut ctx)).await,
            None => None,
        };
        // Boxed, as the forward below: the limit phase's state (the decider's, the store's) is
        // a large part of a request's future, which hyper builds in place and moves several
        // times; one allocation costs less than copying it at every move.
        let decided = match looked {
            Some(cached::Looked::Answer(answer)) => Ok(Some(answer)),
            Some(cached::Looked::Refuse(rejection)) => Err(rejection),
            looked => {
                if let Some(cached::Looked::Forward(pending)) = looked {
                    ctx.cache = Some(pending);
                }
                let admitted = Box::pin(self.admit(&snapshot, &route, &mut req, &mut ctx)).await;
                admitted.map(|()| None)
            }
        };
        let response = match decided {
            Ok(Some(answer)) => {
                linger(req);
                answer
            }
            Ok(None) => self.forward(&snapshot, &route, req, &mut ctx).await,
            Err(rejection) => {
                ctx.refuse(rejection.label());
                if let (Rejection::WaitingRoom { position, .. }, Some(log)) =
                    (&rejection, ctx.log.as_deref_mut())
                {
                    log.position = Some(*position);
                }
                // A browser in a waiting room's line gets a page that asks again by itself.
                let page = match rejection {
                    Rejection::WaitingRoom { .. } if accepts_html(req.headers()) => {
                        rejection.page()
                    }
                    _ => None,
                };
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
                // "Degrade, don't deny": a stale copy instead of a 429 or an overload's 503,
                // where the route allows it.
                let stale = (ctx.cache.as_deref_mut())
                    .and_then(|pending| pending.instead_of(&rejection, &route.extras.headers));
                match (stale, page) {
                    (Some(stale), _) => stale,
                    (None, Some(page)) => page,
                    (None, None) => rejection.respond(&route.extras.headers, ctx.dialect),
                }
            }
        };
        // `response_headers`: on every answer of the route, floodgate's own refusals too.
        let mut response = response;
        if route.config.cache.is_some()
            && let Some(purge) = self.cached_answer(&mut ctx, &route, invalidates, &mut response)
        {
            // `cache.shared`: the other instances drop the URI's entries too; the store's go
            // before this answer does (a client's next read finds none of them).
            if let (_, Err(e)) = Box::pin(self.spread_purge(&purge)).await {
                tracing::warn!(route = %route.config.name, error = %e, "an invalidation could not reach the other instances");
            }
        }
        let response = Self::dressed(&route, &ctx, origin.as_ref(), response);
        Self::respond(ctx, Some(&route), response)
    }

    /// What every answer of a route carries, floodgate's own refusals too: its CORS headers
    /// for an allowed `origin`, then its `response_headers`.
    fn dressed(
        route: &Matched<'_>,
        ctx: &Context,
        origin: Option<&http::HeaderValue>,
        mut response: Response<Body>,
    ) -> Response<Body> {
        if let Some(cors) = &route.config.cors {
            cors.write(origin, response.headers_mut());
        }
        let edits = &route.config.response_headers;
        if !edits.is_empty() {
            edits.apply(
                response.headers_mut(),
                ctx.vars.as_deref().unwrap_or(&NO_VARS),
            );
        }
        response
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
        let line = ctx.log.take().map(|line| PendingLog {
            line,
            started: ctx.started,
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
            Some(line) => line.write(None),
            None => {}
        }
        if after.is_empty() {
            return response;
        }
        response.map(|body| context::with_after_response(body, after))
    }

    /// Phase 1a: a well-formed request (one `Host`), and one path, one route. The path is normalised ([`crate::path`]) before routing,
    /// and the request carries the normalised path on, so the upstream sees what was limited.
    fn normalize(
        snapshot: &Snapshot,
        req: &mut Request<ClientBody>,
        peer: SocketAddr,
    ) -> Result<(), Rejection> {
        // One valid host, the target's over `Host`; no underscored names; no padded values.
        well_formed::check(snapshot, req, peer.ip())?;
        // A request that already passed through this floodgate (an upstream name that resolves
        // to its own listener: a common compose mistake) is not sent round again.
        if forward::came_through_here(req.headers()) {
            return Err(Rejection::LoopDetected);
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

    /// Phase 1: the first route that matches the method and path; and whether the request is
    /// a CORS preflight for it. A preflight (`OPTIONS` asking about a method) is matched by
    /// the method it asks about, so that a route with `cors` answers it whatever its `methods`;
    /// on a route without `cors` it is an `OPTIONS` like any other.
    fn route<'r>(
        snapshot: &'r Snapshot,
        req: &Request<ClientBody>,
    ) -> Result<(Matched<'r>, bool), Rejection> {
        let host = match snapshot.routes.by_host() {
            true => crate::config::request_host(req.uri(), req.headers()),
            false => None,
        };
        let find = |method: &http::Method| {
            snapshot.routes.find(&crate::route::Request {
                method,
                host: host.as_deref(),
                headers: req.headers(),
                path: req.uri().path(),
            })
        };
        let matched = |i: usize| Matched {
            config: &snapshot.routes.routes()[i],
            extras: &snapshot.extras[i],
        };
        if let Some(asked) = crate::config::Cors::preflight_method(req.method(), req.headers())
            && let Some(i) = find(&asked)
            && snapshot.routes.routes()[i].cors.is_some()
        {
            return Ok((matched(i), true));
        }
        let i = find(req.method()).ok_or(Rejection::NoRoute)?;
        Ok((matched(i), false))
    }

    /// The decider on this snapshot's rules and the proxy's store.
    pub fn decider<'s>(&'s self, snapshot: &'s Snapshot) -> Decider<'s> {
        self.core.decider(snapshot.policy(), snapshot.on_error)
    }

    /// What the upstream is told of the request's head: an untrusted peer's user id removed,
    /// the fields its `Connection` lists, then the route's `request_headers`.
    fn told_upstream(
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: &mut Request<ClientBody>,
        ctx: &Context,
    ) {
        let identity = &snapshot.identity;
        // On a route with `websocket:` limits no extension is negotiated: a frame's length is
        // then its message's size (`websocket.rs`).
        if route.config.websocket.is_some() {
            req.headers_mut()
                .remove(http::header::SEC_WEBSOCKET_EXTENSIONS);
        }
        // floodgate ignored an untrusted peer's user id; the upstream must not see it.
        if identity.strip_untrusted_user_id && !identity.is_trusted(ctx.peer.ip().to_canonical()) {
            req.headers_mut().remove(&identity.user_id_header);
        }
        // The fields the client's `Connection` lists go first, so that it cannot name
        // one set below and have it dropped on the way out.
        forward::strip_connection_listed(req.headers_mut());
        // `request_headers`: what the upstream is told (a client-sent value of a name
        // set here is replaced: it cannot be forged).
        let edits = &route.config.request_headers;
        if !edits.is_empty() {
            edits.apply(req.headers_mut(), ctx.vars.as_deref().unwrap_or(&NO_VARS));
        }
    }

    /// The answer to a request whose client left while it was decided (an HTTP/3 stream it
    /// reset: [`body::ClientLeft`]), if it did: it is not forwarded, everything it spent goes
    /// back (its units, its reserves, its slot at the gate; its leases as its answer ends), and
    /// the answer, which nobody will read, is nginx's 499 marked [`body::Abandoned`]. The body
    /// is looked at only while nothing else reads it (not yet read).
    fn abandoned(req: &Request<ClientBody>, ctx: &mut Context) -> Option<Response<Body>> {
        let left = ctx.left.as_ref()?;
        if !matches!(req.body(), ClientBody::Streaming(_)) || !left.left() {
            return None;
        }
        if let Some(admitted) = &mut ctx.admitted {
            if let Some(spent) = admitted.spent.take() {
                spent.give_back();
            }
            for meter in std::mem::take(&mut admitted.costs) {
                meter.give_back();
            }
        }
        drop(ctx.permit.take());
        tracing::debug!(
            path = req.uri().path(),
            "the client left before its request was forwarded: what it spent is given back"
        );
        let mut answer = Response::new(crate::answer::full(bytes::Bytes::new()));
        *answer.status_mut() = http::StatusCode::from_u16(499).ok()?;
        answer.extensions_mut().insert(body::Abandoned);
        Some(answer)
    }

    /// Phase 5: the request's headers as the upstream is told them, delay (leaky bucket),
    /// forward, and add the rate-limit headers to the response.
    /// The request's permit under its upstream's learned limit learns how the upstream answered
    /// and is given back when the response head arrives.
    async fn forward(
        &self,
        snapshot: &Snapshot,
        route: &Matched<'_>,
        req: Request<ClientBody>,
        ctx: &mut Context,
    ) -> Response<Body> {
        // A WebSocket on a route with `websocket:` takes its concurrency slots into its life.
        let socket = match (&route.config.websocket, &route.extras.websocket) {
            (Some(limits), Some(metrics)) if forward::is_websocket_upgrade(&req) => {
                Some(websocket::Socket {
                    limits: limits.clone(),
                    held: (ctx.admitted.as_mut())
                        .map(|a| std::mem::take(&mut a.leases))
                        .unwrap_or_default(),
                    metrics: metrics.clone(),
                })
            }
            _ => None,
        };
        let mut req = req;
        Self::told_upstream(snapshot, route, &mut req, ctx);
        // An HTTP/2 stream the client reset while it was being decided (a rapid-reset
        // flood resets each stream right after opening it) must cost the upstream
        // nothing: hyper looks for the reset only when this future waits, and
        // everything before forwarding can finish without waiting, so it waits once
        // here. Forwarded and then abandoned, each such stream would cost an upstream
        // connection (see `docs/performance.md`, "Rapid reset and the accept queue").
        if req.version() == http::Version::HTTP_2 {
            tokio::task::yield_now().await;
        }
        let headline = ctx.admitted.as_ref().and_then(|a| a.headline);
        if let Some((verdict, _)) = &headline
            && verdict.delay_us() > 0
        {
            tokio::time::sleep(Duration::from_micros(verdict.delay_us())).await;
        }
        if let Some(abandoned) = Self::abandoned(&req, ctx) {
            return abandoned;
        }
        let started = Instant::now();
        // The forwarded request's CLIENT span; the upstream hears of it in `traceparent`.
        let mut req = req;
        let forwarded_span = ctx.trace.as_ref().map(|trace| {
            let method = req.method().clone();
            trace.forward(&method, &route.config.upstream.host, req.headers_mut())
        });
        // A gRPC client's deadline bounds the wait for the upstream too.
        let deadline = match ctx.dialect {
            Dialect::Grpc(_) => crate::grpc::timeout(req.headers()),
            Dialect::Http => None,
        };
        let pool = &route.extras.pool;
        let key = ctx.balance_key;
        // The endpoint whose budget the limits `per: endpoint` spent, if they did.
        let first = ctx
            .admitted
            .as_ref()
            .and_then(|a| a.endpoint.as_ref())
            .map(|endpoint| pool.start(endpoint));
        let mut used = None;
        // Boxed: the forward's state (its attempts, each one's connection and send) is the
        // largest part of a request's future, which hyper builds in place and moves; on the heap
        // it is one allocation instead of kilobytes copied at every move.
        let to = forward::Outbound {
            route: route.config,
            pool,
            key,
            first,
            client_ip: ctx.peer.ip(),
            client_tls: snapshot.tls,
            deadline,
            socket,
        };
        let forwarded = Box::pin(snapshot.forwarder.forward(req, to, &mut used))
            .await
            .map_err(Rejection::from);
        // The HTTP status of what happened, whatever the client is told (a gRPC client hears
        // of floodgate's 502 and 504 as gRPC statuses in a 200).
        let status = match &forwarded {
            Ok(response) => response.status().as_u16(),
            Err(rejection) => rejection.status().as_u16(),
        };
        route
            .extras
            .metrics
            .upstream(status, started.elapsed().as_secs_f64());
        // On a cached route: the answer stored (and streamed to the requests waiting on it),
        // or a stale copy instead of a failure.
        let forwarded = match ctx.cache.as_deref_mut() {
            Some(pending) => pending.settle(&self.cache, forwarded),
            None => forwarded,
        };
        let mut response = match forwarded {
            Ok(response) => response,
            Err(rejection) => rejection.respond(&route.extras.headers, ctx.dialect),
        };
        if let Some(mut span) = forwarded_span {
            if let Some(addr) = used {
                span.endpoint(addr);
            }
            span.end(status);
        }
        if let Some(mut permit) = ctx.permit.take() {
            // 502 (unreachable), 503 (the upstream shedding) and 504 (no answer in time) are
            // overload signals, and so are gRPC's UNAVAILABLE and RESOURCE_EXHAUSTED (in the
            // head of a trailers-only answer, or in the trailers); any other answer is a
            // latency sample, taken at the head.
            let grpc = crate::grpc::status_of(response.headers());
            permit.finish(match (status, grpc) {
                (502..=504, _) => Signal::Overloaded,
                (_, Some(code)) if crate::grpc::is_overload(code) => Signal::Overloaded,
                _ => Signal::Answered(started.elapsed()),
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
                meter.head(response.status(), response.headers());
            }
        }
        response
    }
}
