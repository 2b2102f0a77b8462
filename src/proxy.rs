//! The request pipeline. Every request goes through the same phases, in this order:
//!
//! 1. [`Proxy::route`]: find the first matching route, or reject with 404;
//! 2. [`Proxy::identify`]: work out whose budget the request spends (only on limited routes);
//! 3. [`Proxy::limit`]: ask the route's limits, all-or-nothing, or apply `on_error`;
//! 4. [`Proxy::forward`]: hold the request for a leaky bucket's delay, send it upstream and add
//!    the rate-limit headers to the response.
//!
//! An early exit is a typed [`Rejection`], turned into a response in `response.rs`.

pub mod forward;
pub mod response;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::config::{Config, OnError, RouteConfig};
use crate::identity::{Identity, IdentityConfig};
use crate::limiter::{BudgetKey, Limiter, Verdict};
use crate::route::RouteTable;
pub use forward::Forwarder;
pub use response::{Body, Rejection};

/// What a config reload can change without a restart: routes, identity rules, the error policy.
#[derive(Debug)]
pub struct Runtime {
    pub routes: RouteTable,
    pub identity: IdentityConfig,
    pub on_error: OnError,
}

impl Runtime {
    pub fn from_config(config: &Config) -> Self {
        Runtime {
            routes: RouteTable::new(config.routes.clone()),
            identity: config.identity.clone(),
            on_error: config.storage.on_error,
        }
    }
}

/// The proxy: shared by every connection.
pub struct Proxy {
    runtime: ArcSwap<Runtime>,
    limiter: Limiter,
    forwarder: Forwarder,
    tls: bool,
}

/// What the limit phase decided.
enum Admission {
    /// The route has no limits, or the store failed and `on_error` let the request through.
    Unlimited,
    Allowed(Verdict),
}

impl Proxy {
    pub fn new(config: &Config, limiter: Limiter) -> Self {
        Proxy {
            runtime: ArcSwap::from_pointee(Runtime::from_config(config)),
            limiter,
            forwarder: Forwarder::new(
                config.timeouts.upstream_connect,
                config.timeouts.upstream_response,
            ),
            tls: config.tls.is_some(),
        }
    }

    /// Swaps in a new runtime for requests that start from now on.
    pub fn reload(&self, config: &Config) {
        self.runtime.store(Arc::new(Runtime::from_config(config)));
    }

    /// The limiter this proxy asks.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Runs the pipeline for one request.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let runtime = self.runtime.load_full();
        let route = match Self::route(&runtime, &req) {
            Ok(route) => route,
            Err(rejection) => return rejection.into_response(),
        };
        let admission = if route.limits.is_empty() {
            Admission::Unlimited
        } else {
            let identity = match Self::identify(&runtime, &req, peer) {
                Ok(identity) => identity,
                Err(rejection) => return rejection.into_response(),
            };
            match self.limit(&runtime, route, &identity).await {
                Ok(admission) => admission,
                Err(rejection) => return rejection.into_response(),
            }
        };
        self.forward(req, route, admission, peer).await
    }

    /// Phase 1: the first route that matches the method and path.
    fn route<'r>(
        runtime: &'r Runtime,
        req: &Request<Incoming>,
    ) -> Result<&'r RouteConfig, Rejection> {
        runtime
            .routes
            .find(req.method(), req.uri().path())
            .ok_or(Rejection::NoRoute)
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

    /// Phase 3: ask the route's limits. A store failure follows `on_error`: never a 429 or 500.
    async fn limit(
        &self,
        runtime: &Runtime,
        route: &RouteConfig,
        identity: &Identity<'_>,
    ) -> Result<Admission, Rejection> {
        let mut buf = [0u8; 16];
        let key = BudgetKey {
            route: &route.budget_id,
            kind: identity.kind().as_str(),
            value: identity.key_bytes(&mut buf),
        };
        match self
            .limiter
            .decide(&key, &route.limits, runtime.on_error)
            .await
        {
            Ok(Some(verdict)) if verdict.allowed => Ok(Admission::Allowed(verdict)),
            Ok(Some(verdict)) => {
                tracing::debug!(route = %route.name, identity = identity.kind().as_str(), "rate limited");
                Err(Rejection::RateLimited(verdict))
            }
            Ok(None) => Ok(Admission::Unlimited),
            Err(_) => Err(Rejection::LimiterUnavailable),
        }
    }

    /// Phase 4: delay (leaky bucket), forward, and add the rate-limit headers to the response.
    async fn forward(
        &self,
        req: Request<Incoming>,
        route: &RouteConfig,
        admission: Admission,
        peer: SocketAddr,
    ) -> Response<Body> {
        if let Admission::Allowed(verdict) = &admission
            && verdict.delay_us > 0
        {
            tokio::time::sleep(Duration::from_micros(verdict.delay_us)).await;
        }
        let mut response = match self
            .forwarder
            .forward(req, &route.upstream, peer.ip(), self.tls)
            .await
        {
            Ok(response) => response,
            Err(rejection) => rejection.into_response(),
        };
        if let Admission::Allowed(verdict) = &admission {
            response::set_rate_limit_headers(response.headers_mut(), verdict);
        }
        response
    }
}
