//! What a config reload swaps in the proxy: the [`Snapshot`] of everything the request path
//! reads, built once per config, and what outlives snapshots (each route's `/top` table, each
//! upstream's learned limit).

use std::sync::Arc;
use std::time::Instant;

use super::forward::{self, Forwarder};
use crate::adaptive::EndpointGates;
use crate::answer::RateLimitHeaders;
use crate::config::{Config, OnError};
use crate::identity::{Consumers, IdentityConfig};
use crate::metrics::{Metrics, RouteMetrics};
use crate::policy::Policy;
use crate::route::RouteTable;
use crate::top::TopTable;

/// What a config reload changes in the proxy (which settings a reload changes at all is the one
/// list in [`crate::config::reload`]). Everything derived from them is built here, once, and
/// swapped whole on reload; a request
/// keeps the snapshot it started with.
pub struct Snapshot {
    pub routes: RouteTable,
    /// Per route, by position: metric handles and prebuilt header writers.
    pub(super) extras: Vec<RouteExtras>,
    pub identity: IdentityConfig,
    pub consumers: Option<Arc<Consumers>>,
    pub tiers: Arc<crate::config::KnownTiers>,
    pub paths: crate::path::PathRules,
    /// `underscores_in_headers`: keep header names with `_` (default false: dropped).
    pub underscores_in_headers: bool,
    pub on_error: OnError,
    pub shadow: bool,
    pub(super) no_limit_headers: RateLimitHeaders,
    /// `rate_limit_headers`: which fields answers carry (the rate-limit service's `/check` too).
    pub header_profile: crate::config::HeaderProfile,
    /// The upstream client, with its own connection pools: a reload makes a new one (new
    /// connections with the new timeouts and `upstream_ca`; requests in flight keep theirs).
    pub(super) forwarder: Forwarder,
    /// The listener terminates TLS (`X-Forwarded-Proto: https`).
    pub(super) tls: bool,
    /// `usage_path:`: where a client reads its own budgets (`usage.rs`).
    pub(super) usage_path: Option<String>,
    /// The admin write endpoints' bearer token (`admin.token_file`), if any.
    pub admin_token: Option<Arc<str>>,
}

impl Snapshot {
    /// The `/top` table of the route at `index`.
    pub fn top_of(&self, index: usize) -> &TopTable {
        &self.extras[index].top
    }

    /// True when bearer tokens are verified (`identity.jwt`): a limit may read a claim.
    pub fn verifies_tokens(&self) -> bool {
        self.identity.jwt.is_some()
    }

    /// The rules that say whose allowance a request spends ([`crate::policy`]).
    pub fn policy(&self) -> Policy<'_> {
        Policy {
            identity: &self.identity,
            consumers: self.consumers.as_deref(),
            tiers: &self.tiers,
            shadow: self.shadow,
        }
    }
}

pub(super) struct RouteExtras {
    pub metrics: RouteMetrics,
    pub headers: RateLimitHeaders,
    /// The learned limits of the route's upstream's endpoints, if any route to it asks for them.
    pub gate: Option<Arc<EndpointGates>>,
    /// The route's heaviest identities of the recent past (`/top`).
    pub top: Arc<TopTable>,
    /// Per limit position, a settled limit's `floodgate_cost_units_total` handles.
    pub costs: Vec<Option<crate::metrics::CostCounters>>,
    /// Where its requests go: its upstream pool (kept across reloads by route name).
    pub pool: Arc<crate::upstream::RoutePool>,
    /// A cached route's `floodgate_cache_*` handles.
    pub cache: Option<Arc<crate::metrics::RouteCacheMetrics>>,
    /// A cached route whose limits ask a hit's `cache_hit_cost`: the route with only those
    /// limits, each costing that.
    pub hit_route: Option<crate::config::RouteConfig>,
    /// The waiting room the route is in, if any (`waiting_room:`).
    pub room: Option<Arc<crate::room::Room>>,
    /// A route with `websocket:` limits: its `floodgate_websocket_*` handles.
    pub websocket: Option<crate::metrics::WebSocketMetrics>,
    /// True when nothing of the route makes its decision wait after it has done something
    /// (a body read, a gate's or a waiting room's queue, a held request's timer, a penalty
    /// box's or a global budget's store call, a discovered route's wait for a container):
    /// the proxy may then decide it in place ([`super::Proxy::begin`]).
    pub decides_now: bool,
}

/// [`RouteExtras::decides_now`] for `route`, with its `gate` and `room`.
fn decides_now(route: &crate::config::RouteConfig, gate: bool, room: bool) -> bool {
    let limits = route.enforced.limits.iter().chain(&route.shadow.limits);
    let waits_after = |l: &crate::config::RouteLimit| {
        !l.wait.is_zero() || l.penalty.is_some() || l.limit.is_global()
    };
    !gate
        && !room
        && !route.reads_body
        && route.recreate_grace.is_none()
        && route.websocket.is_none()
        && !limits.clone().any(waits_after)
}

/// A cached route whose limits name a `cache_hit_cost`: the route with only those limits, each
/// costing it, and no shadow limits (what a hit spends). The limits keep their ids, so a hit
/// spends from the same allowance as a miss.
fn hit_route(route: &crate::config::RouteConfig) -> Option<crate::config::RouteConfig> {
    route.cache.as_ref()?;
    let limits: Vec<_> = (route.enforced.limits.iter())
        .filter(|l| l.cache_hit_cost > 0)
        .map(|l| {
            let mut hit = l.clone();
            hit.limit = l.limit.costing(l.cache_hit_cost);
            hit.settled = None;
            hit
        })
        .collect();
    if limits.is_empty() {
        return None;
    }
    let mut hit = route.clone();
    hit.enforced = crate::config::Budget { limits };
    hit.shadow = crate::config::Budget::default();
    Some(hit)
}

/// Each route's heavy-hitter table, by route name: kept across reloads.
#[derive(Default)]
pub struct Tops(std::sync::Mutex<std::collections::HashMap<Arc<str>, Arc<TopTable>>>);

impl Tops {
    fn for_routes(&self, config: &Config) -> Vec<Arc<TopTable>> {
        let mut tops = self.0.lock().unwrap_or_else(|p| p.into_inner());
        tops.retain(|name, _| config.routes.iter().any(|r| r.name == *name));
        config
            .routes
            .iter()
            .map(|r| tops.entry(r.name.clone()).or_default().clone())
            .collect()
    }
}

/// Microseconds since the process started: the heavy-hitter tables' clock.
pub fn uptime_us() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// The gates of upstreams with `adaptive_concurrency`, by origin (each one gate per endpoint):
/// kept across reloads, so learned limits survive one (unless their bounds change).
#[derive(Default)]
pub struct Gates(std::sync::Mutex<std::collections::HashMap<String, Arc<EndpointGates>>>);

impl Gates {
    /// The gates of each route's upstream (`None` where no route to it has
    /// `adaptive_concurrency`), reusing the ones with unchanged bounds.
    fn for_routes(&self, config: &Config, metrics: &Metrics) -> Vec<Option<Arc<EndpointGates>>> {
        let mut gates = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut wanted = std::collections::HashMap::new();
        for route in &config.routes {
            if let Some(bounds) = route.adaptive {
                wanted.entry(route.upstream.origin()).or_insert(bounds);
            }
        }
        gates.retain(|origin, gate| wanted.get(origin) == Some(&gate.bounds()));
        for (origin, bounds) in wanted {
            gates
                .entry(origin.clone())
                .or_insert_with(|| Arc::new(EndpointGates::new(bounds, metrics.adaptive_limits())));
        }
        config
            .routes
            .iter()
            .map(|r| gates.get(&r.upstream.origin()).cloned())
            .collect()
    }
}

impl Snapshot {
    /// Builds everything the request path needs from `config`; upstream gates come from (and
    /// stay in) `gates`.
    pub fn from_config(
        config: &Config,
        metrics: &Metrics,
        gates: &Gates,
        tops: &Tops,
        pools: &crate::upstream::Pools,
        rooms: &crate::room::Rooms,
        previous: Option<&Snapshot>,
    ) -> Self {
        let names: Vec<Arc<str>> = config.routes.iter().map(|r| r.name.clone()).collect();
        let mut rooms = rooms
            .for_routes(&config.rooms, &names, |room| metrics.room(room))
            .into_iter();
        Snapshot {
            extras: config
                .routes
                .iter()
                .zip(gates.for_routes(config, metrics))
                .zip(tops.for_routes(config))
                .zip(
                    pools.for_routes(
                        &config
                            .routes
                            .iter()
                            .map(|r| (r.name.clone(), r.pool.clone()))
                            .collect::<Vec<_>>(),
                        metrics,
                    ),
                )
                .map(|(((r, gate), top), pool)| {
                    let room = rooms.next().flatten();
                    RouteExtras {
                        decides_now: decides_now(r, gate.is_some(), room.is_some()),
                        pool,
                        metrics: metrics.route(&r.name),
                        headers: RateLimitHeaders::for_route(config.rate_limit_headers, r),
                        gate,
                        top,
                        costs: cost_counters(r, metrics),
                        cache: (r.cache.as_ref()).map(|_| Arc::new(metrics.route_cache(&r.name))),
                        hit_route: hit_route(r),
                        room,
                        websocket: (r.websocket.as_ref()).map(|_| metrics.websocket(&r.name)),
                    }
                })
                .collect(),
            routes: RouteTable::new(config.routes.clone()),
            identity: config.identity.clone(),
            consumers: config.consumers.clone(),
            tiers: config.tiers.clone(),
            paths: config.paths,
            underscores_in_headers: config.underscores_in_headers,
            on_error: config.storage.on_error,
            shadow: config.shadow,
            no_limit_headers: RateLimitHeaders::none(),
            header_profile: config.rate_limit_headers,
            usage_path: config.usage_path.clone(),
            admin_token: config.admin_token.clone(),
            forwarder: Forwarder::new_after(
                previous.map(|p| &p.forwarder),
                config.timeouts.upstream_connect,
                config.timeouts.upstream_response,
                forward::BodyLimits {
                    max_request_bytes: config.max_body_size,
                    client_idle: config.timeouts.client_body,
                    upstream_idle: config.timeouts.upstream_body,
                },
                config.upstream_ca.as_ref(),
                &config.routes,
            ),
            tls: config.tls.is_some(),
        }
    }
}

#[cfg(test)]
impl Snapshot {
    /// `config`'s snapshot, with metrics, gates and pools of its own.
    pub(super) fn for_test(config: &Config) -> Self {
        let pools = crate::upstream::Pools::default();
        Snapshot::from_config(
            config,
            &Metrics::new(),
            &Gates::default(),
            &Tops::default(),
            &pools,
            &crate::room::Rooms::default(),
            None,
        )
    }
}

/// Per limit position of `route`, its `floodgate_cost_units_total` handles if its cost is
/// settled after the response.
fn cost_counters(
    route: &crate::config::RouteConfig,
    metrics: &Metrics,
) -> Vec<Option<crate::metrics::CostCounters>> {
    let limits = || route.enforced.limits.iter().chain(&route.shadow.limits);
    let len = limits().map(|l| l.position() + 1).max().unwrap_or(0);
    let mut costs = vec![None; len];
    for limit in limits() {
        if limit.settled.is_some() {
            costs[limit.position()] = Some(metrics.cost(&route.name, limit.name()));
        }
    }
    costs
}
