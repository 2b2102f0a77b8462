//! Prometheus metrics (`prometheus-client`), served on the admin listener's `/metrics`.
//!
//! Per-route handles are resolved once per config load ([`RouteMetrics`]), so the request path
//! only bumps atomics: no label hashing, no allocation. Counters live in the registry, outside the
//! swappable config, so a reload never resets them.

use std::sync::atomic::Ordering;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::limiter::Limiter;
use crate::limiter::guard::{BreakerState, GuardStats};

mod labels;

use labels::*;
pub use labels::{CloseReason, DecisionLabel};

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric floodgate exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    upstream_responses: Family<StatusLabels, Counter>,
    upstream_latency: HistogramFamily<RouteLabel>,
    limiter_latency: Histogram,
    reloads: Family<ResultLabel, Counter>,
    open_connections: Gauge,
    http3_connections: Gauge,
    no_route: Counter,
    streams_refused: Counter,
    http2_resets: Counter,
    connections_closed: [Counter; 2],
    breaker_state: Family<StateLabel, Gauge>,
    untracked: Counter,
    tracked_keys: Gauge,
    adaptive_limit: Family<UpstreamLabel, Gauge>,
    cost_units: Family<CostLabels, Counter>,
    service_decisions: Family<ServiceLabels, Counter>,
    telemetry_dropped: Counter,
    alerts: Family<OutcomeLabel, Counter>,
    global_calls: Family<OutcomeLabel, Counter>,
    global_units: Family<OutcomeLabel, Counter>,
    global_held: Gauge,
    upstream: UpstreamFamilies,
    cache: CacheFamilies,
    rooms: RoomFamilies,
    discovery: DiscoveryFamilies,
    websocket: WebSocketFamilies,
    certificate_expiry: Family<labels::NameLabel, Gauge>,
    acme_orders: Family<OutcomeLabel, Counter>,
}

/// Routes from the containers (`src/provider.rs`).
struct DiscoveryFamilies {
    events: Family<labels::ActionLabel, Counter>,
    errors: Counter,
    connected: Gauge,
    held: Family<OutcomeLabel, Counter>,
}

/// Upgraded WebSocket connections on routes with `websocket:` (`src/proxy/websocket.rs`).
struct WebSocketFamilies {
    open: Family<labels::RouteLabel, Gauge>,
    messages: Family<labels::RouteLabel, Counter>,
    closed: Family<labels::CacheReasonLabels, Counter>,
}

/// One route's WebSocket metrics.
#[derive(Clone)]
pub struct WebSocketMetrics {
    open: Gauge,
    messages: Counter,
    closed: Family<labels::CacheReasonLabels, Counter>,
    route: String,
}

impl WebSocketMetrics {
    /// A connection opened; the returned guard counts it until dropped.
    pub fn opened(&self) -> OpenSocket {
        self.open.inc();
        OpenSocket(self.open.clone())
    }

    /// A client message passed.
    pub fn message(&self) {
        self.messages.inc();
    }

    /// A connection ended, why: `client`, `upstream`, `rate` (1008), `size` (1009), `idle`.
    pub fn closed(&self, reason: &'static str) {
        self.closed
            .get_or_create(&labels::CacheReasonLabels {
                route: self.route.clone(),
                reason,
            })
            .inc();
    }
}

/// Counts one open WebSocket until dropped.
pub struct OpenSocket(Gauge);

impl Drop for OpenSocket {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The waiting rooms' families (`src/room.rs`), by room.
struct RoomFamilies {
    active: Family<labels::RoomLabel, Gauge>,
    waiting: Family<labels::RoomLabel, Gauge>,
    admitted: Family<labels::RoomLabel, Counter>,
}

/// One waiting room's metrics: the room's figures, every instance together where the store is
/// shared (each instance reports what the store said last).
#[derive(Clone, Default)]
pub struct RoomMetrics {
    pub active: Gauge,
    pub waiting: Gauge,
    pub admitted: Counter,
}

/// The response cache's families and gauges.
struct CacheFamilies {
    requests: Family<CacheResultLabels, Counter>,
    stale: Family<CacheReasonLabels, Counter>,
    gauges: CacheGauges,
}

/// What the response cache did with a request (`floodgate_cache_requests_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheResult {
    /// A fresh entry.
    Hit,
    /// No entry: the request went upstream (and its answer was stored).
    Miss,
    /// A stale copy (see [`StaleReason`]).
    Stale,
    /// Served by another request's fetch.
    Collapsed,
    /// The request may not use the cache (credentials, `Range`, a trusted `no-cache`).
    Bypass,
    /// The answer could not be stored.
    Uncacheable,
}

impl CacheResult {
    pub const ALL: [CacheResult; 6] = [
        CacheResult::Hit,
        CacheResult::Miss,
        CacheResult::Stale,
        CacheResult::Collapsed,
        CacheResult::Bypass,
        CacheResult::Uncacheable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
            CacheResult::Stale => "stale",
            CacheResult::Collapsed => "collapsed",
            CacheResult::Bypass => "bypass",
            CacheResult::Uncacheable => "uncacheable",
        }
    }
}

/// Why a stale copy was served (`floodgate_cache_stale_total{reason}`, and `Cache-Status`'s
/// `detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// `stale_while_revalidate`: a refresh runs behind it.
    Revalidating,
    /// `stale_if_error`: the upstream failed.
    Error,
    /// `stale_if_overloaded`: the adaptive gate would have shed the request.
    Overloaded,
    /// `stale_if_limited`: the client is over its limits.
    Limited,
}

impl StaleReason {
    pub const ALL: [StaleReason; 4] = [
        StaleReason::Revalidating,
        StaleReason::Error,
        StaleReason::Overloaded,
        StaleReason::Limited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StaleReason::Revalidating => "revalidating",
            StaleReason::Error => "error",
            StaleReason::Overloaded => "overloaded",
            StaleReason::Limited => "limited",
        }
    }
}

/// The cache's own gauges: what its entries hold, and how many were evicted.
#[derive(Debug, Clone, Default)]
pub struct CacheGauges {
    pub bytes: Gauge,
    pub entries: Gauge,
    pub evictions: Counter,
}

/// One cached route's handles.
#[derive(Debug, Clone)]
pub struct RouteCacheMetrics {
    results: [Counter; CacheResult::ALL.len()],
    stale: [Counter; StaleReason::ALL.len()],
}

impl RouteCacheMetrics {
    /// Counts what the cache did with one request (a stale answer by its reason too).
    pub fn count(&self, result: CacheResult) {
        self.results[result as usize].inc();
    }

    /// Counts a stale answer for `reason`.
    pub fn stale(&self, reason: StaleReason) {
        self.results[CacheResult::Stale as usize].inc();
        self.stale[reason as usize].inc();
    }
}

/// The upstream pools' metric families (`upstream.rs`).
#[derive(Clone, Default)]
struct UpstreamFamilies {
    endpoints: Family<EndpointStateLabels, Gauge>,
    requests: Family<EndpointLabels, Counter>,
    ejections: Family<EndpointLabels, Counter>,
    retries: Family<RouteOutcomeLabels, Counter>,
    panics: Family<RouteLabel, Counter>,
    resolutions: Family<RouteOutcomeLabels, Counter>,
}

/// One route pool's metric handles and families, taken once per pool.
#[derive(Clone, Default)]
pub struct UpstreamMetrics {
    route: String,
    families: UpstreamFamilies,
    /// `floodgate_upstream_retries_total{outcome}`: sent, over_budget.
    pub retries_sent: Counter,
    pub retries_over_budget: Counter,
    /// `floodgate_upstream_panic_total`: requests sent to an ejected or unhealthy endpoint
    /// because every endpoint was out.
    pub panics: Counter,
}

impl UpstreamMetrics {
    /// `floodgate_upstream_requests_total` of one endpoint (`address:port`).
    pub fn requests(&self, endpoint: &str) -> Counter {
        self.families.requests.get_or_create_owned(&EndpointLabels {
            route: self.route.clone(),
            endpoint: endpoint.to_string(),
        })
    }

    /// Counts an ejection of `endpoint`.
    pub fn ejected(&self, endpoint: &str) {
        self.families
            .ejections
            .get_or_create(&EndpointLabels {
                route: self.route.clone(),
                endpoint: endpoint.to_string(),
            })
            .inc();
    }

    /// Sets how many endpoints are in each state.
    pub fn states(&self, counts: [(&'static str, i64); 4]) {
        for (state, n) in counts {
            self.families
                .endpoints
                .get_or_create(&EndpointStateLabels {
                    route: self.route.clone(),
                    state,
                })
                .set(n);
        }
    }

    /// Counts a resolution of the pool's names: `ok` or `error`.
    pub fn resolved(&self, outcome: &'static str) {
        self.families
            .resolutions
            .get_or_create(&RouteOutcomeLabels {
                route: self.route.clone(),
                outcome,
            })
            .inc();
    }
}

/// One settled limit's `floodgate_cost_units_total` handles (`cost: {reserve, actual}`).
#[derive(Debug, Clone, Default)]
pub struct CostCounters {
    /// Units held at admission.
    pub reserved: Counter,
    /// Units the responses said they cost (the reserve when one did not say).
    pub settled: Counter,
    /// Units given back: reserved beyond the actual cost.
    pub refunded: Counter,
    /// Units taken beyond the reserve (into debt if need be).
    pub charged: Counter,
}

/// One route's metric handles, resolved when the config is loaded.
#[derive(Debug, Clone)]
pub struct RouteMetrics {
    decisions: [Counter; DecisionLabel::ALL.len()],
    status_classes: [Counter; 5],
    upstream_latency: Histogram,
}

fn latency_histogram() -> Histogram {
    // 50 µs to about 26 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 20))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl UpstreamFamilies {
    /// The families, registered in `registry`.
    fn registered(registry: &mut Registry) -> Self {
        let families = UpstreamFamilies::default();
        registry.register(
            "upstream_endpoints",
            "Endpoints of each route's upstream pool by state: healthy, ejected (passive), unhealthy (active checks), draining (gone from discovery, requests still in flight)",
            families.endpoints.clone(),
        );
        registry.register(
            "upstream_requests",
            "Attempts sent to each endpoint (address:port) of a route's pool, retries included",
            families.requests.clone(),
        );
        registry.register(
            "upstream_ejections",
            "Passive ejections of each endpoint of a route's pool (consecutive failures)",
            families.ejections.clone(),
        );
        registry.register(
            "upstream_retries",
            "Retries of a route's failed attempts by outcome: sent (to an endpoint not yet tried), over_budget (refused by the retry budget)",
            families.retries.clone(),
        );
        registry.register(
            "upstream_panic",
            "Requests sent to an ejected endpoint because every endpoint of the route's pool was out",
            families.panics.clone(),
        );
        registry.register(
            "upstream_resolutions",
            "Resolutions of a route's upstream names by outcome: ok, error (the last addresses are kept)",
            families.resolutions.clone(),
        );
        families
    }
}

/// `config_reloads`, its two series exported at 0 from the start (so that rate() and alerts
/// see them).
fn reloads(registry: &mut Registry) -> Family<ResultLabel, Counter> {
    let reloads = Family::<ResultLabel, Counter>::default();
    for result in ["success", "failure"] {
        let _ = reloads.get_or_create_owned(&ResultLabel { result });
    }
    registry.register(
        "config_reloads",
        "Config reloads by result (success, failure)",
        reloads.clone(),
    );
    reloads
}

/// `connections_closed`, a counter per reason.
fn connections_closed(registry: &mut Registry) -> [Counter; CloseReason::ALL.len()] {
    let closed = Family::<ReasonLabel, Counter>::default();
    let counters = CloseReason::ALL.map(|reason| {
        closed.get_or_create_owned(&ReasonLabel {
            reason: reason.as_str(),
        })
    });
    registry.register(
        "connections_closed",
        "Client connections floodgate closed itself, by reason (resets, idle)",
        closed,
    );
    counters
}

/// The response cache's families and gauges (`src/cache.rs`), registered in `registry`.
fn cache_families(registry: &mut Registry) -> CacheFamilies {
    let gauges = CacheGauges {
        bytes: register(
            registry,
            "cache_bytes",
            "Bytes the response cache's entries hold (bodies, headers and keys), at most cache.memory",
        ),
        entries: register(registry, "cache_entries", "Entries in the response cache"),
        evictions: register(
            registry,
            "cache_evictions",
            "Entries evicted from the response cache to stay within cache.memory",
        ),
    };
    let requests = register(
        registry,
        "cache_requests",
        "Requests on cached routes by what the cache did: hit, miss, stale, collapsed (served by another request's fetch), bypass (may not use the cache), uncacheable (the answer could not be stored)",
    );
    let stale = register(
        registry,
        "cache_stale",
        "Stale copies served by reason: revalidating (stale_while_revalidate), error (stale_if_error), overloaded (stale_if_overloaded), limited (stale_if_limited)",
    );
    CacheFamilies {
        requests,
        stale,
        gauges,
    }
}

/// `metric`, registered under `name` with `help`, and a handle to it.
fn register<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: prometheus_client::registry::Metric + Clone + Default,
{
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

impl Metrics {
    /// Every metric, registered in a new registry. The store guard's counters are added by
    /// [`Metrics::with_limiter`].
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("floodgate");
        let upstream_latency: HistogramFamily<RouteLabel> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "upstream_latency_seconds",
            "Time from forwarding a request to the upstream's response headers",
            upstream_latency.clone(),
        );
        let limiter_latency = latency_histogram();
        registry.register(
            "limiter_decision_seconds",
            "Time to take one limiter decision (store round trip included)",
            limiter_latency.clone(),
        );
        let reloads = reloads(&mut registry);
        let connections_closed = connections_closed(&mut registry);
        let upstream = UpstreamFamilies::registered(&mut registry);
        let cache = cache_families(&mut registry);
        let rooms = RoomFamilies {
            active: register(
                &mut registry,
                "waiting_room_active",
                "Clients a waiting room admits now (every instance together where the store is shared)",
            ),
            waiting: register(
                &mut registry,
                "waiting_room_waiting",
                "Clients waiting in a waiting room's line",
            ),
            admitted: register(
                &mut registry,
                "waiting_room_admitted",
                "Clients a waiting room has admitted",
            ),
        };
        let discovery = DiscoveryFamilies {
            events: register(
                &mut registry,
                "discovery_events",
                "Container events from the engine (providers.docker) by action (podman's died counted as die)",
            ),
            errors: register(
                &mut registry,
                "discovery_errors",
                "Discovery errors: the engine unreachable or failing a call, a container's labels invalid, a route name claimed twice",
            ),
            connected: register(
                &mut registry,
                "discovery_connected",
                "1 while the engine's event stream is open (0 without providers.docker)",
            ),
            held: register(
                &mut registry,
                "discovery_held_requests",
                "Requests to a discovered route with no endpoint, held for recreate_grace, by outcome: served (an endpoint came), expired (the grace ended), overflow (too many held)",
            ),
        };
        let websocket = WebSocketFamilies {
            open: register(
                &mut registry,
                "websocket_connections",
                "Upgraded WebSocket connections open on routes with websocket: limits",
            ),
            messages: register(
                &mut registry,
                "websocket_messages",
                "Client messages passed on routes with websocket: limits",
            ),
            closed: register(
                &mut registry,
                "websocket_closed",
                "WebSocket connections ended, by reason: client or upstream (either side closed), rate (too many messages: close 1008), size (a message past max_message: close 1009), idle (idle_timeout)",
            ),
        };
        Metrics {
            certificate_expiry: register(
                &mut registry,
                "tls_certificate_expiry_seconds",
                "Seconds until the certificate served for a name expires (file and ACME certificates; a wildcard's name is *.example.com)",
            ),
            acme_orders: register(
                &mut registry,
                "acme_orders",
                "ACME orders by outcome: issued, failed",
            ),
            upstream,
            cache,
            rooms,
            discovery,
            websocket,
            alerts: register(
                &mut registry,
                "alerts",
                "Quota alerts (alerts:) by outcome: sent (a webhook answered 2xx), failed (no 2xx after retrying for a minute), dropped (the queue was full)",
            ),
            global_calls: register(
                &mut registry,
                "global_calls",
                "Round trips to the global store (storage.global) by outcome: ok, error, timeout",
            ),
            global_units: register(
                &mut registry,
                "global_units",
                "Units of region slices of global budgets: granted (by the global store), returned (given back), lapsed (held by a slice that ended unrenewed)",
            ),
            global_held: register(
                &mut registry,
                "global_units_held",
                "Units this region's slices of global budgets hold now (as this instance's keeper last saw them)",
            ),
            cost_units: register(
                &mut registry,
                "cost_units",
                "Units of settled costs (cost: {reserve, actual}) by route, limit and outcome: reserved at admission, settled (what responses cost), refunded, charged",
            ),
            service_decisions: register(
                &mut registry,
                "service_decisions",
                "Rate-limit service answers (ShouldRateLimit, /json, /check) by domain (a domain no rule names counts as \"other\") and code: ok, over_limit, error",
            ),
            telemetry_dropped: register(
                &mut registry,
                "telemetry_dropped",
                "Spans not exported: the queue to the OTLP exporter was full, or an export failed",
            ),
            requests: register(
                &mut registry,
                "requests",
                "Requests by route and limiter decision",
            ),
            upstream_responses: register(
                &mut registry,
                "upstream_responses",
                "Responses to forwarded requests by status class (502/504 are floodgate's own)",
            ),
            upstream_latency,
            limiter_latency,
            reloads,
            open_connections: register(
                &mut registry,
                "open_connections",
                "Client connections open now",
            ),
            http3_connections: register(
                &mut registry,
                "http3_connections",
                "HTTP/3 (QUIC) client connections open now",
            ),
            no_route: register(
                &mut registry,
                "no_route_requests",
                "Requests that matched no route (404)",
            ),
            streams_refused: register(
                &mut registry,
                "http2_streams_refused",
                "HTTP/2 streams answered 429 because their connection opened streams too fast",
            ),
            http2_resets: register(
                &mut registry,
                "http2_resets",
                "HTTP/2 streams the client abandoned (reset, or its connection closed) before their response",
            ),
            connections_closed,
            breaker_state: register(
                &mut registry,
                "store_breaker_state",
                "Circuit breaker state (1 for the current one of closed, open, half_open)",
            ),
            untracked: register(
                &mut registry,
                "memory_untracked_admissions",
                "Requests admitted untracked because the in-process store was full (storage.max_keys)",
            ),
            tracked_keys: register(
                &mut registry,
                "memory_tracked_keys",
                "Identities the in-process store tracks now",
            ),
            adaptive_limit: register(
                &mut registry,
                "adaptive_limit",
                "The learned limit of requests in flight to an upstream (adaptive_concurrency)",
            ),
            registry,
        }
    }

    /// The handles of route `route`'s upstream pool.
    pub fn upstream(&self, route: &str) -> UpstreamMetrics {
        let outcome = |outcome| {
            self.upstream
                .retries
                .get_or_create_owned(&RouteOutcomeLabels {
                    route: route.to_string(),
                    outcome,
                })
        };
        UpstreamMetrics {
            route: route.to_string(),
            families: self.upstream.clone(),
            retries_sent: outcome("sent"),
            retries_over_budget: outcome("over_budget"),
            panics: self.upstream.panics.get_or_create_owned(&RouteLabel {
                route: route.to_string(),
            }),
        }
    }

    /// An engine event, by its action.
    pub fn discovery_event(&self, action: &str) {
        let label = labels::ActionLabel {
            action: action.to_string(),
        };
        self.discovery.events.get_or_create(&label).inc();
    }

    /// A discovery error.
    pub fn discovery_error(&self) {
        self.discovery.errors.inc();
    }

    /// Whether the engine's event stream is open.
    pub fn discovery_connected(&self, connected: bool) {
        self.discovery.connected.set(i64::from(connected));
    }

    /// A request held for a discovered route's endpoints: `served`, `expired` or `overflow`.
    pub fn discovery_held(&self, outcome: &'static str) {
        self.discovery
            .held
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Route `route`'s WebSocket metrics.
    pub fn websocket(&self, route: &str) -> WebSocketMetrics {
        let label = labels::RouteLabel {
            route: route.to_string(),
        };
        WebSocketMetrics {
            open: self.websocket.open.get_or_create(&label).clone(),
            messages: self.websocket.messages.get_or_create(&label).clone(),
            closed: self.websocket.closed.clone(),
            route: route.to_string(),
        }
    }

    /// Waiting room `room`'s metrics.
    pub fn room(&self, room: &str) -> RoomMetrics {
        let label = labels::RoomLabel {
            room: room.to_string(),
        };
        RoomMetrics {
            active: self.rooms.active.get_or_create_owned(&label),
            waiting: self.rooms.waiting.get_or_create_owned(&label),
            admitted: self.rooms.admitted.get_or_create_owned(&label),
        }
    }

    /// The gauge of `upstream`'s learned limit.
    /// [`Metrics::adaptive_limit`] for any label, later (for gates made as endpoints appear).
    pub fn adaptive_limits(&self) -> impl Fn(&str) -> Gauge + Send + Sync + 'static {
        let family = self.adaptive_limit.clone();
        move |upstream| {
            family.get_or_create_owned(&UpstreamLabel {
                upstream: upstream.to_string(),
            })
        }
    }

    pub fn adaptive_limit(&self, upstream: &str) -> Gauge {
        self.adaptive_limit.get_or_create_owned(&UpstreamLabel {
            upstream: upstream.to_string(),
        })
    }

    /// The metrics, with the limiter's guard counters (a remote store's) registered as they are.
    pub fn with_limiter(limiter: &Limiter) -> Self {
        let mut metrics = Metrics::new();
        if let Some(stats) = limiter.guard_stats() {
            metrics.register_guard(stats, limiter.backend_name());
        }
        metrics
    }

    fn register_guard(&mut self, stats: &GuardStats, backend: &'static str) {
        self.registry
            .sub_registry_with_label((
                std::borrow::Cow::Borrowed("backend"),
                std::borrow::Cow::Borrowed(backend),
            ))
            .register(
                "store_calls",
                "Round trips to the limiter store (a batch of decisions is one)",
                stats.store_calls.clone(),
            );
        let r = &mut self.registry;
        r.register(
            "lease_units",
            "Units of shared budgets leased to this instance, in requests' worth, by outcome (granted, spent, returned, lapsed)",
            stats.leases.family.clone(),
        );
        r.register(
            "store_errors",
            "Limiter store failures (errors and timeouts)",
            stats.store_errors.clone(),
        );
        r.register(
            "store_breaker_skips",
            "Decisions that skipped the store because the circuit breaker was open",
            stats.breaker_skips.clone(),
        );
        r.register(
            "store_breaker_opened",
            "Times the circuit breaker opened",
            stats.breaker_opened.clone(),
        );
        r.register(
            "deny_cache_hits",
            "Denials answered from the local deny cache without asking the store",
            stats.deny_cache_hits.clone(),
        );
    }

    /// `floodgate_telemetry_dropped_total`, for the span exporter.
    pub fn telemetry_dropped(&self) -> Counter {
        self.telemetry_dropped.clone()
    }

    /// Counts one ACME order: issued or failed.
    pub fn acme_order(&self, issued: bool) {
        let outcome = if issued { "issued" } else { "failed" };
        self.acme_orders
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Sets the expiry gauge from the certificates served now: each name and the seconds
    /// until the first certificate serving it expires (what a handshake for it is given).
    /// Names no longer served are dropped.
    pub fn certificates<'a>(&self, served: impl IntoIterator<Item = (&'a str, i64)>) {
        self.certificate_expiry.clear();
        for (name, left) in served {
            let label = labels::NameLabel {
                name: name.to_owned(),
            };
            if self.certificate_expiry.get(&label).is_none() {
                self.certificate_expiry.get_or_create(&label).set(left);
            }
        }
    }

    /// Counts one alert's fate: `sent`, `failed` or `dropped`.
    pub fn alert(&self, outcome: &'static str) {
        self.alerts.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Counts one round trip to the global store: `ok`, `error` or `timeout`.
    pub fn global_call(&self, outcome: &'static str) {
        self.global_calls
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// Counts units of region slices: `granted`, `returned` or `lapsed`.
    pub fn global_units(&self, outcome: &'static str, units: u64) {
        self.global_units
            .get_or_create(&OutcomeLabel { outcome })
            .inc_by(units);
    }

    /// The units this region's slices hold now.
    pub fn set_global_held(&self, units: u64) {
        self.global_held
            .set(i64::try_from(units).unwrap_or(i64::MAX));
    }

    /// Counts one rate-limit service answer: `code` is `ok`, `over_limit` or `error`.
    pub fn service_decision(&self, domain: &str, code: &'static str) {
        self.service_decisions
            .get_or_create(&ServiceLabels {
                domain: domain.to_string(),
                code,
            })
            .inc();
    }

    /// The `floodgate_cost_units_total` handles of a settled limit named `limit` on `route`.
    pub fn cost(&self, route: &str, limit: &str) -> CostCounters {
        let counter = |outcome| {
            self.cost_units.get_or_create_owned(&CostLabels {
                route: route.to_string(),
                limit: limit.to_string(),
                outcome,
            })
        };
        CostCounters {
            reserved: counter("reserved"),
            settled: counter("settled"),
            refunded: counter("refunded"),
            charged: counter("charged"),
        }
    }

    /// The handles of one route.
    pub fn route(&self, route: &str) -> RouteMetrics {
        let decisions = DecisionLabel::ALL.map(|d| {
            self.requests.get_or_create_owned(&RequestLabels {
                route: route.to_string(),
                decision: d.as_str(),
            })
        });
        let status_classes = ["1xx", "2xx", "3xx", "4xx", "5xx"].map(|class| {
            self.upstream_responses.get_or_create_owned(&StatusLabels {
                route: route.to_string(),
                class,
            })
        });
        RouteMetrics {
            decisions,
            status_classes,
            upstream_latency: self.upstream_latency.get_or_create_owned(&RouteLabel {
                route: route.to_string(),
            }),
        }
    }

    /// The response cache's gauges.
    pub fn cache_gauges(&self) -> CacheGauges {
        self.cache.gauges.clone()
    }

    /// A cached route's handles, every series exported from the start (at 0).
    pub fn route_cache(&self, route: &str) -> RouteCacheMetrics {
        RouteCacheMetrics {
            results: CacheResult::ALL.map(|result| {
                self.cache.requests.get_or_create_owned(&CacheResultLabels {
                    route: route.to_string(),
                    result: result.as_str(),
                })
            }),
            stale: StaleReason::ALL.map(|reason| {
                self.cache.stale.get_or_create_owned(&CacheReasonLabels {
                    route: route.to_string(),
                    reason: reason.as_str(),
                })
            }),
        }
    }

    /// Records a limiter decision's duration.
    pub fn observe_limiter(&self, seconds: f64) {
        self.limiter_latency.observe(seconds);
    }

    /// Counts an HTTP/2 stream refused for its connection's stream rate.
    pub fn stream_refused(&self) {
        self.streams_refused.inc();
    }

    /// Counts an HTTP/2 stream the client abandoned before its response.
    pub fn http2_reset(&self) {
        self.http2_resets.inc();
    }

    /// Counts a client connection floodgate closed itself.
    pub fn connection_closed(&self, reason: CloseReason) {
        self.connections_closed[reason as usize].inc();
    }

    /// Counts a request that matched no route.
    pub fn no_route(&self) {
        self.no_route.inc();
    }

    /// Counts a config reload.
    pub fn reload(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.reloads.get_or_create(&ResultLabel { result }).inc();
    }

    /// The open-connections gauge.
    pub fn open_connections(&self) -> &Gauge {
        &self.open_connections
    }

    /// HTTP/3 connections open now (`floodgate_http3_connections`).
    pub fn http3_connections(&self) -> &Gauge {
        &self.http3_connections
    }

    /// Renders every metric in the OpenMetrics text format, after reading the gauges that are
    /// computed on demand (the in-process store's size, the breaker's state).
    pub fn render(&self, limiter: &Limiter) -> String {
        let memory = limiter.memory();
        self.untracked
            .inner()
            .store(memory.untracked_total(), Ordering::Relaxed);
        self.tracked_keys.set(memory.len() as i64);
        if let Some(current) = limiter.breaker_state() {
            for state in BreakerState::ALL {
                self.breaker_state
                    .get_or_create(&StateLabel {
                        state: state.as_str(),
                    })
                    .set(i64::from(state == current));
            }
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

impl RouteMetrics {
    /// Counts a request's decision.
    pub fn decision(&self, decision: DecisionLabel) {
        let i = DecisionLabel::ALL
            .iter()
            .position(|d| *d == decision)
            .unwrap_or(0);
        self.decisions[i].inc();
    }

    /// Counts a forwarded request's response and how long the upstream took.
    pub fn upstream(&self, status: u16, seconds: f64) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.status_classes[class].inc();
        self.upstream_latency.observe(seconds);
    }
}
