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
//! response in `answer.rs`: the one place where a status is chosen.
//!
//! The phases run in two steps. [`Proxy::begin`] runs them as far as they go without waiting:
//! routing, then the decision (the cache phase and admission, one future polled once where it
//! is made: on this stack when it cannot wait after doing something, else in a box), so that
//! what floodgate answers itself (a refusal, a cache hit, a preflight, a 404) is answered
//! before any future of the pipeline's exists for hyper to hold and move. A request that
//! waits (forwarded, or its decision waiting on a store) goes on in [`Proxy::go_on`] from the
//! phase it stopped at. One set of phases, one decider, one answer table; `tests/fast_path.rs`
//! compares the answers with those of the decision first polled inside the future.

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

/// Which route a request matched: its place in the snapshot, and whether it is a WebSocket
/// upgrade, decided by the route's upgrade budget (`websocket.max_connections`).
#[derive(Clone, Copy)]
struct RouteAt {
    index: usize,
    upgrade: bool,
}

impl RouteAt {
    fn of(self, snapshot: &Snapshot) -> Matched<'_> {
        let config = &snapshot.routes.routes()[self.index];
        let upgrade = (config.websocket.as_deref()).and_then(|w| w.upgrade.as_deref());
        Matched {
            config: match (self.upgrade, upgrade) {
                (true, Some(upgrade)) => upgrade,
                _ => config,
            },
            extras: &snapshot.extras[self.index],
        }
    }
}

/// A routed request's state between the phases that may wait (its decision, its forward),
/// the request itself aside.
struct Routed {
    snapshot: Arc<Snapshot>,
    ctx: Context,
    at: RouteAt,
    /// The request's `Origin`, on a route with `cors`.
    origin: Option<http::HeaderValue>,
    /// An unsafe method on a cached route: the URI whose entries go once it succeeds.
    invalidates: Option<(http::Uri, Option<String>)>,
}

/// What routing made of a request (its state is in the [`Routed`] it filled in).
enum Arrived {
    /// Routed: on to the decision.
    Routed,
    /// Answered before a route was found (a 400, a 404).
    Unrouted(Response<Body>),
    /// A CORS preflight, answered by its route.
    Preflight(Response<Body>),
    /// The usage endpoint, which waits on the store.
    Usage,
}

/// The decision's outcome: `Ok(None)` to forward, `Ok(Some)` a cache hit, `Err` a refusal.
struct Decided {
    routed: Routed,
    req: Request<ClientBody>,
    decided: Result<Option<Response<Body>>, Rejection>,
}

/// What [`Proxy::begin`] made of a request. (Not boxed: a step is made once and taken apart at
/// once, and a request that waits goes on into the box of [`Proxy::go_on`]'s future.)
#[allow(clippy::large_enum_variant)]
pub enum Step<'p> {
    /// Answered without waiting (floodgate's own answer).
    Answered(Response<Body>),
    /// Waiting on a phase: [`Proxy::go_on`] answers it.
    Going(Going<'p>),
}

/// A request waiting on a phase of the pipeline.
pub struct Going<'p>(Waits<'p>);

/// The phase a request waits on.
enum Waits<'p> {
    /// The usage endpoint's peek.
    Usage {
        snapshot: Arc<Snapshot>,
        req: Request<ClientBody>,
        ctx: Context,
    },
    /// The decision, already polled once.
    Deciding(std::pin::Pin<Box<dyn Future<Output = Decided> + Send + 'p>>),
    /// Admitted: the forward to the upstream.
    Forward(Routed, Request<ClientBody>),
    /// Answered: the other instances told of an invalidation first.
    Purge(Routed, Response<Body>, crate::control::Purge),
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
    /// exit is a typed [`Rejection`], answered in `answer.rs`.
    pub async fn handle(&self, req: Request<body::Incoming>, peer: SocketAddr) -> Response<Body> {
        match self.begin(req, peer) {
            Step::Answered(response) => response,
            Step::Going(going) => self.go_on(going).await,
        }
    }

    /// The pipeline as far as it goes without waiting: routing, then the decision (the cache
    /// phase and the limits), whose future is polled once where it is made. A request that
    /// floodgate answers itself without waiting (a refusal on the memory store or from a remote
    /// store's deny cache, a cache hit in memory, a preflight, a 404) is [`Step::Answered`]
    /// here, before any future of the pipeline's exists for hyper to hold and move; the rest
    /// go on in [`Proxy::go_on`], from where they stopped. Both are the same phases, in the
    /// same order, run by the same code (`tests/fast_path.rs` compares their answers).
    pub fn begin(&self, req: Request<body::Incoming>, peer: SocketAddr) -> Step<'_> {
        self.start(req, peer, true)
    }

    /// The pipeline with nothing answered in [`Proxy::begin`]: the decision, made in the same
    /// box, is first polled by `go_on`, as every phase was before the fast path. What the fast
    /// path is compared with (`tests/fast_path.rs`).
    pub async fn handle_unhurried(
        &self,
        req: Request<body::Incoming>,
        peer: SocketAddr,
    ) -> Response<Body> {
        match self.start(req, peer, false) {
            Step::Answered(response) => response,
            Step::Going(going) => self.go_on(going).await,
        }
    }

    /// [`Proxy::begin`], which polls the decision where it is made when `poll_now`.
    fn start(&self, req: Request<body::Incoming>, peer: SocketAddr, poll_now: bool) -> Step<'_> {
        // Made here and filled in by routing, so that nothing routing learns is moved again.
        let mut req = req.map(ClientBody::Streaming);
        let mut routed = Routed {
            snapshot: self.snapshot.load_full(),
            ctx: Context::new(&req, peer),
            at: RouteAt {
                index: 0,
                upgrade: false,
            },
            origin: None,
            invalidates: None,
        };
        match self.arrive(&mut routed, &mut req) {
            Arrived::Routed => {}
            Arrived::Unrouted(response) => {
                linger(req);
                return Step::Answered(Self::respond(routed.ctx, None, response));
            }
            Arrived::Preflight(response) => {
                linger(req);
                return Step::Answered(Self::finish(routed, response));
            }
            Arrived::Usage => {
                let Routed { snapshot, ctx, .. } = routed;
                return Step::Going(Going(Waits::Usage { snapshot, req, ctx }));
            }
        }
        // A decision that can wait only before it has done anything (see `decides_now`) is
        // made where it is, on this stack, borrowing the request: no box, nothing moved.
        if poll_now && self.decides_now(&routed) {
            let polled = {
                let deciding = std::pin::pin!(self.decide_in_place(&mut routed, &mut req));
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                deciding.poll(&mut cx)
            };
            match polled {
                std::task::Poll::Ready(decided) => return self.decided(routed, req, decided),
                // A cache follower's wait for another request's fill: given up untouched
                // (nothing was spent), and waited for again in the box below.
                std::task::Poll::Pending => {}
            }
        }
        // Boxed: the decision's state (the cache's, the decider's, the store's) is most of a
        // request's; in a box it is made in place and never moved, and when it has to wait
        // the box is handed on as it is.
        let mut deciding = Box::pin(self.decide(routed, req));
        if !poll_now {
            return Step::Going(Going(Waits::Deciding(deciding)));
        }
        // A waker that does nothing: a future that waits is polled again at once, in
        // `go_on`, with the task's own (a future registers the waker of its latest poll).
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match deciding.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Decided {
                routed,
                req,
                decided,
            }) => self.decided(routed, req, decided),
            std::task::Poll::Pending => Step::Going(Going(Waits::Deciding(deciding))),
        }
    }

    /// The pipeline's answer to a request that [`Proxy::begin`] left waiting.
    pub async fn go_on(&self, going: Going<'_>) -> Response<Body> {
        let mut waits = going.0;
        loop {
            let step = match waits {
                Waits::Usage {
                    snapshot,
                    req,
                    mut ctx,
                } => {
                    // Boxed: the usage endpoint is rare, and its peek's state (every route's
                    // budgets, a global slice's store call) would otherwise size every
                    // request's future.
                    let response = match Box::pin(self.usage(&snapshot, &req, &mut ctx)).await {
                        Ok(response) => response,
                        Err(rejection) => rejection.respond(&usage::headers(), ctx.dialect),
                    };
                    linger(req);
                    return Self::respond(ctx, None, response);
                }
                Waits::Deciding(deciding) => {
                    let Decided {
                        routed,
                        req,
                        decided,
                    } = deciding.await;
                    self.decided(routed, req, decided)
                }
                Waits::Forward(mut routed, req) => {
                    let route = routed.at.of(&routed.snapshot);
                    let response = self
                        .forward(&routed.snapshot, &route, req, &mut routed.ctx)
                        .await;
                    self.answered(routed, response)
                }
                Waits::Purge(routed, response, purge) => {
                    // `cache.shared`: the other instances drop the URI's entries too; the
                    // store's go before this answer does (a client's next read finds none).
                    if let (_, Err(e)) = Box::pin(self.spread_purge(&purge)).await {
                        let route = routed.at.of(&routed.snapshot);
                        tracing::warn!(route = %route.config.name, error = %e, "an invalidation could not reach the other instances");
                    }
                    return Self::finish(routed, response);
                }
            };
            match step {
                Step::Answered(response) => return response,
                Step::Going(going) => waits = going.0,
            }
        }
    }

    /// Phases 1 and 1a, and what routing decides by itself, written into `routed`: the
    /// request's path normalised, its route found (or its 400, 404), the usage endpoint, and a
    /// CORS preflight answered before anything is held, decided or spent.
    fn arrive(&self, routed: &mut Routed, req: &mut Request<ClientBody>) -> Arrived {
        let Routed {
            snapshot,
            ctx,
            at,
            origin,
            invalidates,
        } = routed;
        let peer = ctx.peer;
        if let Some(telemetry) = &self.telemetry {
            ctx.trace = Some(telemetry.server_span(
                req.method(),
                req.uri().path(),
                req.version(),
                req.headers(),
                || snapshot.identity.client_addr(req.headers(), peer.ip()),
            ));
        }
        // `GET {usage_path}`: the caller's own budgets, answered in `usage.rs`.
        let normalized = Self::normalize(snapshot, req, peer);
        if let Some(path) = &snapshot.usage_path
            && normalized.is_ok()
            && req.method() == http::Method::GET
            && req.uri().path() == path
        {
            return Arrived::Usage;
        }
        let (index, preflight) = match normalized.and_then(|()| Self::route(snapshot, req)) {
            Ok(found) => found,
            Err(rejection) => {
                if rejection == Rejection::NoRoute {
                    self.metrics.no_route();
                }
                return Arrived::Unrouted(
                    rejection.respond(&snapshot.no_limit_headers, ctx.dialect),
                );
            }
        };
        // An upgrade on a route with `websocket.max_connections` is decided by the route's
        // upgrade budget: its limits and the connections per identity.
        let config = &snapshot.routes.routes()[index];
        let upgrade = (config.websocket.as_deref()).is_some_and(|w| w.upgrade.is_some())
            && forward::is_websocket_upgrade(req);
        *at = RouteAt { index, upgrade };
        let route = at.of(snapshot);
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
        *origin = (route.config.cors.as_ref())
            .and_then(|_| req.headers().get(http::header::ORIGIN).cloned());
        if preflight && let Some(cors) = &route.config.cors {
            ctx.refuse(Some(crate::metrics::DecisionLabel::Preflight));
            return Arrived::Preflight(crate::answer::preflight(cors, req.headers()));
        }
        // An unsafe method on a cached route: its URI's entries go once it succeeds.
        *invalidates = cached::invalidation(route.config, req);
        Arrived::Routed
    }

    /// True when the request's decision waits, if ever, only before it has done anything, so
    /// that [`Proxy::begin`] may make it in place and give it up if it waits: on the memory
    /// store, without global budgets, bearer tokens or a shared cache, on a route whose every
    /// wait comes after an effect excluded (`RouteExtras::decides_now`). What may still wait is
    /// a cache follower's wait for a fill, before it spends anything.
    fn decides_now(&self, routed: &Routed) -> bool {
        let snapshot = &routed.snapshot;
        matches!(self.core.limiter(), crate::limiter::Limiter::Memory(_))
            && self.core.global().is_none()
            && snapshot.identity.jwt.is_none()
            && !self.cache.is_shared()
            && !routed.at.upgrade
            && snapshot.extras[routed.at.index].decides_now
    }

    /// [`Proxy::decide_in_place`], owning what it reads: the decision's future, boxed, which
    /// may wait.
    async fn decide(&self, mut routed: Routed, mut req: Request<ClientBody>) -> Decided {
        let decided = self.decide_in_place(&mut routed, &mut req).await;
        Decided {
            routed,
            req,
            decided,
        }
    }

    /// The decision: a discovered route's wait for a container, the cache phase (a hit is
    /// answered here) and the limit phases (`admit.rs`): `Ok(None)` to forward.
    async fn decide_in_place(
        &self,
        routed: &mut Routed,
        req: &mut Request<ClientBody>,
    ) -> Result<Option<Response<Body>>, Rejection> {
        let Routed {
            snapshot, ctx, at, ..
        } = routed;
        let snapshot: &Arc<Snapshot> = snapshot;
        let route = at.of(snapshot);
        // A discovered route whose containers are all gone or starting (compose recreating its
        // only one): held until one serves, within `recreate_grace`, rather than answered 503.
        if let Some(grace) = route.config.recreate_grace
            && route.extras.pool.is_empty()
        {
            let held = route.extras.pool.wait_for_endpoint(grace).await;
            self.metrics.discovery_held(held.as_str());
        }
        // The cache phase, on a cached route (`cached.rs`): a hit is answered here.
        let looked = match &route.config.cache {
            Some(rules) => self.look_up(snapshot, &route, rules, req, ctx).await,
            None => None,
        };
        match looked {
            Some(cached::Looked::Answer(answer)) => Ok(Some(answer)),
            Some(cached::Looked::Refuse(rejection)) => Err(rejection),
            looked => {
                if let Some(cached::Looked::Forward(pending)) = looked {
                    ctx.cache = Some(pending);
                }
                let admitted = self.admit(snapshot, &route, req, ctx).await;
                admitted.map(|()| None)
            }
        }
    }

    /// What follows the decision: a request admitted goes on to the upstream; floodgate's
    /// own answer (a cache hit, a refusal) is made now.
    fn decided(
        &self,
        mut routed: Routed,
        req: Request<ClientBody>,
        decided: Result<Option<Response<Body>>, Rejection>,
    ) -> Step<'_> {
        let response = match decided {
            Ok(None) => return Step::Going(Going(Waits::Forward(routed, req))),
            Ok(Some(answer)) => {
                linger(req);
                answer
            }
            Err(rejection) => self.refused(&mut routed, req, rejection),
        };
        self.answered(routed, response)
    }

    /// The answer to a request the decision refused: its rejection's answer, or a waiting
    /// room's page for a browser, or (where the route allows it) a stale copy.
    fn refused(
        &self,
        routed: &mut Routed,
        req: Request<ClientBody>,
        rejection: Rejection,
    ) -> Response<Body> {
        let Routed {
            snapshot, ctx, at, ..
        } = routed;
        let route = at.of(snapshot);
        ctx.refuse(rejection.label());
        if let (Rejection::WaitingRoom { position, .. }, Some(log)) =
            (&rejection, ctx.log.as_deref_mut())
        {
            log.position = Some(*position);
        }
        // A browser in a waiting room's line gets a page that asks again by itself.
        let page = match rejection {
            Rejection::WaitingRoom { .. } if accepts_html(req.headers()) => rejection.page(),
            _ => None,
        };
        if let (Some(trace), Rejection::RateLimited(verdict, limit)) = (&ctx.trace, &rejection) {
            let index = limit.index(route.config.enforced.limits.len());
            trace.set(|| KeyValue::new("floodgate.limit", index as i64));
            trace.set(|| KeyValue::new("floodgate.remaining", verdict.headline.remaining as i64));
        }
        linger(req);
        // "Degrade, don't deny": a stale copy instead of a 429 or an overload's 503, where
        // the route allows it.
        let stale = (ctx.cache.as_deref_mut())
            .and_then(|pending| pending.instead_of(&rejection, &route.extras.headers));
        match (stale, page) {
            (Some(stale), _) => stale,
            (None, Some(page)) => page,
            (None, None) => rejection.respond(&route.extras.headers, ctx.dialect),
        }
    }

    /// A routed request's answer, on its way out: the cache phase's part (the entry filled,
    /// the URI's entries invalidated); the other instances told of an invalidation before it
    /// goes (`cache.shared`: [`Waits::Purge`]).
    fn answered(&self, mut routed: Routed, mut response: Response<Body>) -> Step<'_> {
        let route = routed.at.of(&routed.snapshot);
        if route.config.cache.is_some()
            && let Some(purge) = self.cached_answer(
                &mut routed.ctx,
                &route,
                routed.invalidates.take(),
                &mut response,
            )
        {
            return Step::Going(Going(Waits::Purge(routed, response, purge)));
        }
        Step::Answered(Self::finish(routed, response))
    }

    /// `response_headers` and CORS on every answer of the route, floodgate's own refusals
    /// too; then the response goes out (phase 6).
    fn finish(routed: Routed, response: Response<Body>) -> Response<Body> {
        let Routed {
            snapshot,
            ctx,
            at,
            origin,
            ..
        } = routed;
        let route = at.of(&snapshot);
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
    fn route(snapshot: &Snapshot, req: &Request<ClientBody>) -> Result<(usize, bool), Rejection> {
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
        if let Some(asked) = crate::config::Cors::preflight_method(req.method(), req.headers())
            && let Some(i) = find(&asked)
            && snapshot.routes.routes()[i].cors.is_some()
        {
            return Ok((i, true));
        }
        let i = find(req.method()).ok_or(Rejection::NoRoute)?;
        Ok((i, false))
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
