//! The request pipeline. Every request goes through the same phases, in this order:
//!
//! 1. [`Proxy::route`]: find the first matching route, or reject with 404;
//! 2. [`Proxy::identify`]: work out whose budget the request spends (only on limited routes);
//! 3. [`Proxy::limit`]: ask the route's enforced limits, all-or-nothing (or apply `on_error`),
//!    then its shadow limits, which count but never deny;
//! 4. [`Proxy::forward`]: hold the request for a leaky bucket's delay, send it upstream and add
//!    the rate-limit headers to the response;
//! 5. [`Proxy::log`]: count the outcome and record it on the request's span.
//!
//! An early exit is a typed [`Rejection`], turned into a response in `response.rs`.

pub mod forward;
pub mod response;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::{Request, Response};
use hyper::body::Incoming;
use tracing::field::Empty;

use crate::config::{Config, OnError, RouteConfig};
use crate::identity::{Identity, IdentityConfig};
use crate::limiter::{BudgetKey, Decided, Limit, Limiter, LimiterError, Verdict};
use crate::metrics::{DecisionLabel, Metrics, RouteMetrics};
use crate::route::RouteTable;
pub use forward::Forwarder;
pub use response::{Body, RateLimitHeaders, Rejection};

/// What a config reload can change without a restart: routes, identity rules, the error policy,
/// shadow mode and the header profile. Everything derived from them is built here, once.
pub struct Runtime {
    pub routes: RouteTable,
    /// Per route, by position: metric handles and prebuilt header writers.
    extras: Vec<RouteExtras>,
    pub identity: IdentityConfig,
    pub on_error: OnError,
    pub shadow: bool,
    no_limit_headers: RateLimitHeaders,
}

struct RouteExtras {
    metrics: RouteMetrics,
    headers: RateLimitHeaders,
}

impl Runtime {
    pub fn from_config(config: &Config, metrics: &Metrics) -> Self {
        Runtime {
            extras: config
                .routes
                .iter()
                .map(|r| RouteExtras {
                    metrics: metrics.route(&r.name),
                    headers: RateLimitHeaders::for_route(config.rate_limit_headers, r),
                })
                .collect(),
            routes: RouteTable::new(config.routes.clone()),
            identity: config.identity.clone(),
            on_error: config.storage.on_error,
            shadow: config.shadow,
            no_limit_headers: RateLimitHeaders::none(),
        }
    }
}

/// The proxy: shared by every connection.
pub struct Proxy {
    runtime: ArcSwap<Runtime>,
    limiter: Limiter,
    forwarder: Forwarder,
    metrics: Arc<Metrics>,
    tls: bool,
}

/// What the limit phase decided for a request that goes on to the upstream.
struct Admission {
    /// The verdict whose figures go in the response headers, if any, and whether it came from the
    /// shadow limits.
    verdict: Option<(Verdict, bool)>,
    label: DecisionLabel,
}

/// A matched route with its prebuilt extras.
struct Matched<'r> {
    config: &'r RouteConfig,
    extras: &'r RouteExtras,
}

impl Proxy {
    pub fn new(config: &Config, limiter: Limiter, metrics: Arc<Metrics>) -> Self {
        Proxy {
            runtime: ArcSwap::from_pointee(Runtime::from_config(config, &metrics)),
            limiter,
            forwarder: Forwarder::new(
                config.timeouts.upstream_connect,
                config.timeouts.upstream_response,
                config.upstream_ca.as_ref(),
            ),
            metrics,
            tls: config.tls.is_some(),
        }
    }

    /// Swaps in a new runtime for requests that start from now on. In-flight requests finish
    /// with the runtime they started with; limiter state of unchanged routes carries over
    /// because it is keyed by the route's budget id.
    pub fn reload(&self, config: &Config) {
        self.runtime
            .store(Arc::new(Runtime::from_config(config, &self.metrics)));
    }

    /// SIGHUP: re-reads and validates `path`. A valid file is swapped in (and counted); an
    /// invalid one is logged with its field paths (and counted), and the running config stays.
    /// `running` is the config the process started with, to warn about restart-only changes.
    pub fn reload_file(&self, path: &std::path::Path, running: &Config) {
        match Config::load(path) {
            Ok(new) => {
                self.reload(&new);
                self.metrics.reload(true);
                let restart_only = new.listen != running.listen
                    || new.admin_listen != running.admin_listen
                    || new.storage.backend != running.storage.backend
                    || new.tls.as_ref().map(|t| (&t.cert, &t.key))
                        != running.tls.as_ref().map(|t| (&t.cert, &t.key))
                    || new.upstream_ca.as_ref().map(|c| &c.path)
                        != running.upstream_ca.as_ref().map(|c| &c.path);
                if restart_only {
                    tracing::warn!(
                        "listen, admin_listen, tls, upstream_ca and storage.backend changes take effect on restart only"
                    );
                }
                tracing::info!(routes = new.routes.len(), "config reloaded");
            }
            Err(e) => {
                self.metrics.reload(false);
                tracing::error!(problems = %e, "config reload rejected; keeping the running config");
            }
        }
    }

    /// The limiter this proxy asks.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The metrics this proxy records.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Runs the pipeline for one request.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let started = Instant::now();
        let span = tracing::info_span!(
            target: "floodgate::access",
            "request",
            method = %req.method(),
            path = req.uri().path(),
            route = Empty,
            identity = Empty,
            decision = Empty,
            status = Empty,
            latency_ms = Empty,
        );
        let runtime = self.runtime.load_full();
        let route = match Self::route(&runtime, &req) {
            Ok(route) => route,
            Err(rejection) => {
                self.metrics.no_route();
                let response = rejection.into_response(&runtime.no_limit_headers);
                Self::log(&span, None, None, &response, started);
                return response;
            }
        };
        span.record("route", route.config.name.as_str());
        let admission = if route.config.limits.is_empty() && route.config.shadow_limits.is_empty() {
            Ok(Admission {
                verdict: None,
                label: DecisionLabel::Unlimited,
            })
        } else {
            match Self::identify(&runtime, &req, peer) {
                Ok(identity) => {
                    span.record("identity", identity.kind().as_str());
                    self.limit(&runtime, &route, &identity).await
                }
                Err(rejection) => Err((rejection, None)),
            }
        };
        let (response, label) = match admission {
            Ok(admission) => {
                let label = admission.label;
                (
                    self.forward(req, &route, admission, peer).await,
                    Some(label),
                )
            }
            Err((rejection, label)) => (rejection.into_response(&route.extras.headers), label),
        };
        if let Some(label) = label {
            route.extras.metrics.decision(label);
        }
        Self::log(&span, Some(&route), label, &response, started);
        response
    }

    /// Phase 1: the first route that matches the method and path.
    fn route<'r>(runtime: &'r Runtime, req: &Request<Incoming>) -> Result<Matched<'r>, Rejection> {
        let i = runtime
            .routes
            .position(req.method(), req.uri().path())
            .ok_or(Rejection::NoRoute)?;
        Ok(Matched {
            config: &runtime.routes.routes()[i],
            extras: &runtime.extras[i],
        })
    }

    /// Phase 2: whose budget the request spends.
    fn identify<'a>(
        runtime: &Runtime,
        req: &'a Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Identity<'a>, Rejection> {
        runtime
            .identity
            .identify(req.headers(), peer.ip())
            .map_err(|e| Rejection::BadRequest(e.to_string()))
    }

    /// Phase 3: the enforced limits (all-or-nothing), then the shadow limits. A store failure
    /// follows `on_error`: never a 429 or a 500.
    async fn limit(
        &self,
        runtime: &Runtime,
        route: &Matched<'_>,
        identity: &Identity<'_>,
    ) -> Result<Admission, (Rejection, Option<DecisionLabel>)> {
        let config = route.config;
        let mut admission = Admission {
            verdict: None,
            label: DecisionLabel::Allowed,
        };
        if !config.limits.is_empty() {
            match self
                .ask(runtime, &config.budget_id, &config.limits, identity)
                .await
            {
                Err(_) => {
                    return Err((
                        Rejection::LimiterUnavailable,
                        Some(DecisionLabel::StoreError),
                    ));
                }
                Ok(Decided {
                    verdict,
                    store_failed,
                }) => {
                    if store_failed {
                        admission.label = DecisionLabel::StoreError;
                    }
                    match verdict {
                        Some(v) if !v.allowed && !runtime.shadow => {
                            return Err((Rejection::RateLimited(v), Some(DecisionLabel::Denied)));
                        }
                        Some(v) if !v.allowed => {
                            admission.label = DecisionLabel::ShadowDenied;
                            admission.verdict = Some((v, false));
                        }
                        Some(v) => admission.verdict = Some((v, false)),
                        None => {}
                    }
                }
            }
        }
        if !config.shadow_limits.is_empty()
            && let Ok(Decided {
                verdict: Some(shadow),
                ..
            }) = self
                .ask(
                    runtime,
                    &config.shadow_budget_id,
                    &config.shadow_limits,
                    identity,
                )
                .await
        {
            if !shadow.allowed {
                admission.label = DecisionLabel::ShadowDenied;
            }
            // The headers speak for whichever budget has the fewest remaining.
            let fewer = admission
                .verdict
                .is_none_or(|(v, _)| shadow.headline.remaining < v.headline.remaining);
            if fewer {
                admission.verdict = Some((shadow, true));
            }
        }
        Ok(admission)
    }

    /// One store decision, timed. `Err` when the store failed and `on_error` is `deny`. Shadow
    /// limits go through here too, but their errors only mean "no shadow verdict".
    async fn ask(
        &self,
        runtime: &Runtime,
        budget_id: &str,
        limits: &[Limit],
        identity: &Identity<'_>,
    ) -> Result<Decided, LimiterError> {
        let mut buf = [0u8; 16];
        let key = BudgetKey {
            route: budget_id,
            kind: identity.kind().as_str(),
            value: identity.key_bytes(&mut buf),
        };
        let started = Instant::now();
        let decided = self.limiter.decide(&key, limits, runtime.on_error).await;
        self.metrics
            .observe_limiter(started.elapsed().as_secs_f64());
        decided
    }

    /// Phase 4: delay (leaky bucket), forward, and add the rate-limit headers to the response.
    async fn forward(
        &self,
        req: Request<Incoming>,
        route: &Matched<'_>,
        admission: Admission,
        peer: SocketAddr,
    ) -> Response<Body> {
        if let Some((verdict, _)) = &admission.verdict
            && verdict.delay_us > 0
        {
            tokio::time::sleep(Duration::from_micros(verdict.delay_us)).await;
        }
        let started = Instant::now();
        let mut response = match self
            .forwarder
            .forward(req, &route.config.upstream, peer.ip(), self.tls)
            .await
        {
            Ok(response) => response,
            Err(rejection) => rejection.into_response(&route.extras.headers),
        };
        route
            .extras
            .metrics
            .upstream(response.status().as_u16(), started.elapsed().as_secs_f64());
        if let Some((verdict, shadow)) = &admission.verdict {
            route
                .extras
                .headers
                .write(response.headers_mut(), verdict, *shadow);
        }
        response
    }

    /// Phase 5: the request's outcome on its span (the access log, target `floodgate::access`).
    fn log(
        span: &tracing::Span,
        route: Option<&Matched<'_>>,
        label: Option<DecisionLabel>,
        response: &Response<Body>,
        started: Instant,
    ) {
        if span.is_disabled() {
            return;
        }
        let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
        span.record("status", response.status().as_u16());
        span.record("latency_ms", latency_ms);
        if let Some(label) = label {
            span.record("decision", tracing::field::debug(label));
        }
        let _entered = span.enter();
        tracing::info!(
            target: "floodgate::access",
            route = route.map(|r| r.config.name.as_str()),
            status = response.status().as_u16(),
            "request done"
        );
    }
}
