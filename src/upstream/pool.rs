//! A route's pool: its endpoints as discovery and the config last left them, the pick
//! (balancing over those that may be picked), what an attempt's outcome does to an endpoint's
//! health, and the route's retry budget. Kept across reloads by route name ([`Pools`]), so an
//! endpoint that stays keeps its health and its counters.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use http::uri::Scheme;

use super::balance::{self, Load};
use super::budget::RetryBudget;
use super::endpoint::{Endpoint, InFlight};
use super::outlier::may_eject;
use super::spec::{Balance, PoolSpec};
use crate::metrics::{Metrics, UpstreamMetrics};

/// The most addresses one name gives the pool: a larger answer is cut to these (the first, in
/// the order the resolver gave) and logged.
pub const MAX_ADDRESSES_PER_NAME: usize = 512;

/// The endpoints a pick chooses from, with what the balancers need built once per set.
#[derive(Debug, Default)]
struct EndpointSet {
    endpoints: Vec<Arc<Endpoint>>,
    /// Smooth weighted round robin's cycle, by index into `endpoints`.
    order: Vec<u16>,
}

/// A route's pool.
pub struct RoutePool {
    pub route: Arc<str>,
    spec: ArcSwap<PoolSpec>,
    set: ArcSwap<EndpointSet>,
    /// The set has more than one endpoint (a retry is possible): read on every first attempt,
    /// without loading the set again.
    many: std::sync::atomic::AtomicBool,
    /// The set has no endpoint: read on every request to a discovered route (whose requests
    /// are held while it is so), without loading the set.
    empty: std::sync::atomic::AtomicBool,
    /// Per origin (by position in the spec), the addresses its name last resolved to; `None`
    /// for a name not resolved yet (an address or an `https://` origin needs none).
    resolved: Mutex<Vec<Option<Vec<SocketAddr>>>>,
    /// Endpoints discovery dropped that still had requests in flight.
    draining: Mutex<Vec<Arc<Endpoint>>>,
    cursor: AtomicUsize,
    budget: RetryBudget,
    /// When this pool began: the clock of ejections and of the retry budget.
    epoch: Instant,
    /// The latest end of an ejection (ms since `epoch`; 0: none yet): a pick reads the clock
    /// only when an ejection may be in force.
    ejected_until_ms: AtomicU64,
    pub(super) metrics: UpstreamMetrics,
    /// Woken whenever the set is rebuilt with endpoints (requests held for a discovered route's
    /// next endpoint wait on it).
    filled: tokio::sync::Notify,
    /// Since when the set has been empty (`None`: it has endpoints).
    emptied_at: Mutex<Option<Instant>>,
    /// Requests waiting for an endpoint now.
    held: AtomicUsize,
}

/// The most requests one pool holds at once while it has no endpoint: past it a request is
/// answered at once (as a pool without endpoints answers, 503), not held.
pub const MAX_HELD: usize = 1024;

/// How a wait for an endpoint ended ([`RoutePool::wait_for_endpoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// An endpoint came within the grace.
    Served,
    /// The grace ended first.
    Expired,
    /// Too many were held already ([`MAX_HELD`]).
    Overflow,
}

impl Held {
    pub fn as_str(self) -> &'static str {
        match self {
            Held::Served => "served",
            Held::Expired => "expired",
            Held::Overflow => "overflow",
        }
    }
}

/// Gives a held request's place back.
struct HeldPlace<'a>(&'a AtomicUsize);

impl Drop for HeldPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a pick may fall back to when no endpoint health leaves in is left to choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// One of the unwell (counted as a panic): an attempt goes somewhere, since a pool whose
    /// endpoints all look unwell must not fail every request for it.
    Unwell,
    /// One of the unwell only when the pool has no well endpoint at all: the limits
    /// `per: endpoint`, where a well endpoint whose budget is spent is not replaced by an
    /// unwell one.
    OnlyWhenNoneIsWell,
}

/// What an attempt on an endpoint came to, for its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempted {
    /// A response head that is not 502, 503 or 504.
    Answered,
    /// No connection, a connection lost before the response head, or 502/503/504.
    Failed,
}

/// The host of an origin, when it is an address.
fn literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// The port an origin is dialled on.
fn port_of(origin: &super::Origin) -> u16 {
    origin
        .authority
        .port_u16()
        .unwrap_or(if origin.scheme == Scheme::HTTPS {
            443
        } else {
            80
        })
}

/// `scheme://authority`: what names an origin across reloads.
fn origin_key(origin: &super::Origin) -> String {
    format!("{}://{}", origin.scheme, origin.authority)
}

impl RoutePool {
    fn new(route: Arc<str>, spec: PoolSpec, metrics: UpstreamMetrics) -> Arc<RoutePool> {
        let pool = Arc::new(RoutePool {
            route,
            resolved: Mutex::new(vec![None; spec.origins.len()]),
            spec: ArcSwap::from_pointee(spec),
            set: ArcSwap::from_pointee(EndpointSet::default()),
            many: std::sync::atomic::AtomicBool::new(false),
            empty: std::sync::atomic::AtomicBool::new(true),
            draining: Mutex::new(Vec::new()),
            cursor: AtomicUsize::new(0),
            budget: RetryBudget::default(),
            epoch: Instant::now(),
            ejected_until_ms: AtomicU64::new(0),
            metrics,
            filled: tokio::sync::Notify::new(),
            emptied_at: Mutex::new(None),
            held: AtomicUsize::new(0),
        });
        pool.rebuild();
        pool
    }

    /// The spec in force.
    pub fn spec(&self) -> Arc<PoolSpec> {
        self.spec.load_full()
    }

    /// A reload's spec: origins kept by URL keep what they resolved to, endpoints kept by
    /// origin and address keep their health and counters.
    fn update(&self, spec: PoolSpec) {
        let old = self.spec.load_full();
        if *old == spec {
            return;
        }
        {
            let mut resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
            let kept: Vec<Option<Vec<SocketAddr>>> = spec
                .origins
                .iter()
                .map(|(o, _)| {
                    old.origins
                        .iter()
                        .position(|(old, _)| origin_key(old) == origin_key(o))
                        .and_then(|at| resolved.get(at).cloned().flatten())
                })
                .collect();
            *resolved = kept;
        }
        self.spec.store(Arc::new(spec));
        self.rebuild();
    }

    /// The names to resolve: per origin that is an `http://` name, its position, host and
    /// port.
    pub fn names(&self) -> Vec<(usize, String, u16)> {
        self.spec
            .load()
            .origins
            .iter()
            .enumerate()
            .filter(|(_, (o, _))| o.scheme == Scheme::HTTP && literal(o.authority.host()).is_none())
            .map(|(i, (o, _))| (i, o.authority.host().to_string(), port_of(o)))
            .collect()
    }

    /// Discovery's answer for origin `index`: its addresses now (at most
    /// [`MAX_ADDRESSES_PER_NAME`]). The set is rebuilt when they changed.
    pub fn resolved(&self, index: usize, mut addrs: Vec<SocketAddr>) {
        addrs.sort();
        addrs.dedup();
        if addrs.len() > MAX_ADDRESSES_PER_NAME {
            tracing::warn!(
                route = &*self.route,
                addresses = addrs.len(),
                kept = MAX_ADDRESSES_PER_NAME,
                "a name resolved to more addresses than a pool takes; the rest are left out"
            );
            addrs.truncate(MAX_ADDRESSES_PER_NAME);
        }
        let changed = {
            let mut resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
            match resolved.get_mut(index) {
                Some(slot) if slot.as_ref() != Some(&addrs) => {
                    *slot = Some(addrs);
                    true
                }
                _ => false,
            }
        };
        if changed {
            self.rebuild();
        }
    }

    /// Builds the endpoint set from the spec and what the names resolved to, keeping every
    /// endpoint that stays; one that goes with requests in flight drains.
    fn rebuild(&self) {
        let spec = self.spec.load_full();
        let resolved = self
            .resolved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let old = self.set.load_full();
        let mut by_key: HashMap<(String, String), Arc<Endpoint>> = old
            .endpoints
            .iter()
            .map(|e| ((origin_key(&e.origin), e.name.clone()), e.clone()))
            .collect();
        let mut endpoints: Vec<Arc<Endpoint>> = Vec::new();
        for (i, (origin, weight)) in spec.origins.iter().enumerate() {
            let addrs: Vec<Option<SocketAddr>> = match literal(origin.authority.host()) {
                Some(ip) => vec![Some(SocketAddr::new(ip, port_of(origin)))],
                None if origin.scheme == Scheme::HTTPS => vec![None],
                None => resolved
                    .get(i)
                    .cloned()
                    .flatten()
                    .unwrap_or_default()
                    .into_iter()
                    .map(Some)
                    .collect(),
            };
            for addr in addrs {
                let name = match addr {
                    Some(a) => a.to_string(),
                    None => origin.authority.to_string(),
                };
                let key = (origin_key(origin), name);
                let endpoint = match by_key.remove(&key) {
                    Some(kept) if kept.origin == *origin => {
                        kept.set_weight(*weight);
                        kept
                    }
                    _ => Arc::new(Endpoint::new(origin.clone(), i, addr, *weight, |n| {
                        self.metrics.requests(n)
                    })),
                };
                if !endpoints
                    .iter()
                    .any(|e| e.name == endpoint.name && e.origin_index == i)
                {
                    endpoints.push(endpoint);
                }
            }
        }
        let weights: Vec<u32> = endpoints.iter().map(|e| e.weight()).collect();
        let order = match spec.balance {
            Balance::RoundRobin => balance::smooth_order(&weights),
            _ => Vec::new(),
        };
        {
            let mut draining = self.draining.lock().unwrap_or_else(|p| p.into_inner());
            draining.retain(|e| e.in_flight() > 0);
            draining.extend(by_key.into_values().filter(|e| e.in_flight() > 0));
        }
        self.many.store(endpoints.len() > 1, Ordering::Relaxed);
        let filled = !endpoints.is_empty();
        self.set.store(Arc::new(EndpointSet { endpoints, order }));
        self.empty.store(!filled, Ordering::Release);
        {
            let mut emptied = self.emptied_at.lock().unwrap_or_else(|p| p.into_inner());
            match (filled, *emptied) {
                (true, _) => *emptied = None,
                (false, None) => *emptied = Some(Instant::now()),
                (false, Some(_)) => {}
            }
        }
        if filled {
            self.filled.notify_waiters();
        }
    }

    /// A discovered route's attempt that never reached its endpoint (a container whose
    /// process has exited before the engine's event said so: podman sends no `kill`) waits for
    /// an endpoint not yet `tried`, for up to `grace`, and starts an attempt on it; `None` when
    /// none came (or too many wait already).
    pub async fn wait_for_another(
        &self,
        tried: &[u64],
        grace: std::time::Duration,
    ) -> Option<super::InFlight> {
        if self.held.fetch_add(1, Ordering::Relaxed) >= MAX_HELD {
            self.held.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let _place = HeldPlace(&self.held);
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let filled = self.filled.notified();
            tokio::pin!(filled);
            filled.as_mut().enable();
            let fresh = (self.set.load().endpoints.iter()).any(|e| !tried.contains(&e.id));
            if fresh {
                return self
                    .pick(None, tried, Fallback::Unwell)
                    .map(|e| self.start(&e));
            }
            tokio::time::timeout_at(deadline, filled).await.ok()?;
        }
    }

    /// Waits, while the pool has no endpoint, until one comes or `grace` has passed since it
    /// lost its last (a discovered route whose only container is being recreated), holding at
    /// most [`MAX_HELD`] requests at once.
    pub async fn wait_for_endpoint(&self, grace: std::time::Duration) -> Held {
        if self.held.fetch_add(1, Ordering::Relaxed) >= MAX_HELD {
            self.held.fetch_sub(1, Ordering::Relaxed);
            return Held::Overflow;
        }
        let _place = HeldPlace(&self.held);
        let since = (*self.emptied_at.lock().unwrap_or_else(|p| p.into_inner()))
            .unwrap_or_else(Instant::now);
        let deadline = tokio::time::Instant::from_std(since + grace);
        loop {
            let filled = self.filled.notified();
            tokio::pin!(filled);
            filled.as_mut().enable();
            if !self.is_empty() {
                return Held::Served;
            }
            if tokio::time::timeout_at(deadline, filled).await.is_err() {
                return if self.is_empty() {
                    Held::Expired
                } else {
                    Held::Served
                };
            }
        }
    }

    /// True when the pool has no endpoint (a name that never resolved).
    pub fn is_empty(&self) -> bool {
        self.empty.load(Ordering::Acquire)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The one pick: the endpoint the route's `balance` chooses among those not `excluded`
    /// (endpoint ids) that health leaves in (active checks passing, not ejected). When none of
    /// those is left, `fallback` says whether one of the others will do. `key` is what
    /// `balance: hash` hashes. Nothing is counted but a pick of the unwell: the attempt starts
    /// with [`RoutePool::start`], a retry takes its budget with [`RoutePool::take_retry`].
    pub fn pick(
        &self,
        key: Option<u64>,
        excluded: &[u64],
        fallback: Fallback,
    ) -> Option<Arc<Endpoint>> {
        let set = self.set.load();
        let endpoints = &set.endpoints;
        // One endpoint, first pick: nothing to choose.
        if endpoints.len() == 1 && excluded.is_empty() && fallback == Fallback::Unwell {
            return Some(endpoints[0].clone());
        }
        let now = (self.ejected_until_ms.load(Ordering::Relaxed) > 0).then(Instant::now);
        let well = |e: &Arc<Endpoint>| e.is_healthy() && now.is_none_or(|now| !e.is_ejected(now));
        let chosen = match fallback {
            Fallback::Unwell => self
                .choose(&set, key, &|e| well(e) && !excluded.contains(&e.id))
                .or_else(|| {
                    // Every endpoint left is out: one of them anyway, round robin's turn taken
                    // once (from where the first look began), or the panic would go to every
                    // other endpoint only.
                    if matches!(self.spec.load().balance, Balance::RoundRobin) {
                        self.cursor.fetch_sub(1, Ordering::Relaxed);
                    }
                    let chosen = self.choose(&set, key, &|e| !excluded.contains(&e.id));
                    if chosen.is_some() {
                        self.metrics.panics.inc();
                    }
                    chosen
                }),
            Fallback::OnlyWhenNoneIsWell => match endpoints.iter().any(well) {
                true => self.choose(&set, key, &|e| well(e) && !excluded.contains(&e.id)),
                false => self.choose(&set, key, &|e| !excluded.contains(&e.id)),
            },
        };
        chosen.map(|i| endpoints[i].clone())
    }

    /// A request's first attempt starts on `endpoint` (counted for the retry budget): in
    /// flight there until the guard is dropped.
    pub fn start(&self, endpoint: &Arc<Endpoint>) -> InFlight {
        if self.many.load(Ordering::Relaxed) {
            self.count_request();
        }
        endpoint.start()
    }

    fn choose(
        &self,
        set: &EndpointSet,
        key: Option<u64>,
        eligible: &dyn Fn(&Arc<Endpoint>) -> bool,
    ) -> Option<usize> {
        let endpoints = &set.endpoints;
        let spec = self.spec.load();
        match (&spec.balance, key) {
            (Balance::RoundRobin, _) if !set.order.is_empty() => {
                let start = self.cursor.fetch_add(1, Ordering::Relaxed);
                (0..set.order.len())
                    .map(|step| set.order[(start + step) % set.order.len()] as usize)
                    .find(|&i| endpoints.get(i).is_some_and(eligible))
            }
            // Nothing allocated: each eligible endpoint scored in place.
            (Balance::Hash(_), Some(key)) => balance::highest(
                endpoints
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| eligible(e))
                    .map(|(i, e)| (i, balance::rendezvous_score(key, e.id, e.weight()))),
            ),
            _ => {
                // least_request (and hash without a key): on a small stack buffer.
                const INLINE: usize = 32;
                let mut which = [0usize; INLINE];
                let mut loads = [Load {
                    weight: 1,
                    in_flight: 0,
                }; INLINE];
                let (mut which_vec, mut loads_vec) = (Vec::new(), Vec::new());
                let mut n = 0;
                for (i, e) in endpoints.iter().enumerate() {
                    if !eligible(e) {
                        continue;
                    }
                    let load = Load {
                        weight: e.weight(),
                        in_flight: e.in_flight(),
                    };
                    if endpoints.len() <= INLINE {
                        which[n] = i;
                        loads[n] = load;
                    } else {
                        which_vec.push(i);
                        loads_vec.push(load);
                    }
                    n += 1;
                }
                let (which, loads) = if endpoints.len() <= INLINE {
                    (&which[..n], &loads[..n])
                } else {
                    (&which_vec[..], &loads_vec[..])
                };
                balance::least_request(loads, |n| fastrand::usize(..n)).map(|at| which[at])
            }
        }
    }

    /// What an attempt on `endpoint` came to: a failure counts toward its ejection (when the
    /// pool may lose one more), an answer starts the count again.
    pub fn outcome(&self, endpoint: &Endpoint, outcome: Attempted) {
        match outcome {
            Attempted::Answered => endpoint.health().success(),
            Attempted::Failed => {
                endpoint.failed();
                let spec = self.spec.load();
                let now = Instant::now();
                let set = self.set.load();
                let ejected = set
                    .endpoints
                    .iter()
                    .filter(|e| !std::ptr::eq(e.as_ref(), endpoint) && e.is_ejected(now))
                    .count();
                let may = may_eject(
                    set.endpoints.len(),
                    ejected,
                    spec.outlier.max_ejected_percent,
                );
                let ejection = endpoint.health().failure(now, &spec.outlier, may);
                if let Some(length) = ejection {
                    let until = self.now_ms() + length.as_millis() as u64;
                    self.ejected_until_ms.fetch_max(until, Ordering::Relaxed);
                    self.metrics.ejected(&endpoint.name);
                    tracing::warn!(route = &*self.route, endpoint = %endpoint.name, ejection = ?length, "upstream endpoint ejected after consecutive failures");
                }
            }
        }
    }

    /// The endpoints now (for active health checks).
    pub fn endpoints(&self) -> Vec<Arc<Endpoint>> {
        self.set.load().endpoints.clone()
    }

    /// The route's retries (what the forwarder needs of the spec, copied out).
    pub fn retries(&self) -> super::RetrySpec {
        self.spec.load().retries
    }

    /// How many endpoints the pool has now.
    pub fn len(&self) -> usize {
        self.set.load().endpoints.len()
    }

    /// Counts a request of the route for its retry budget.
    fn count_request(&self) {
        if self.spec.load().retries.attempts > 1 {
            self.budget.request(self.epoch.elapsed().as_secs());
        }
    }

    /// Another attempt for a request that failed on the endpoints `tried`: an endpoint not yet
    /// tried, picked as a first attempt's is, if there is one and the retry budget allows it
    /// (counted as sent or over budget).
    pub fn retry(&self, key: Option<u64>, tried: &[u64]) -> Option<InFlight> {
        let set = self.set.load();
        if !set.endpoints.iter().any(|e| !tried.contains(&e.id)) {
            return None;
        }
        drop(set);
        if !self.take_retry() {
            return None;
        }
        self.pick(key, tried, Fallback::Unwell).map(|e| e.start())
    }

    /// Takes a retry from the budget, counted either way.
    fn take_retry(&self) -> bool {
        let percent = self.spec.load().retries.budget_percent;
        let ok = self
            .budget
            .try_retry(self.epoch.elapsed().as_secs(), percent);
        match ok {
            true => self.metrics.retries_sent.inc(),
            false => self.metrics.retries_over_budget.inc(),
        };
        ok
    }

    /// How many endpoints are in each state, for the gauge (and forgets drained endpoints).
    pub fn publish(&self) {
        let now = Instant::now();
        let set = self.set.load();
        let unhealthy = set.endpoints.iter().filter(|e| !e.is_healthy()).count() as i64;
        let ejected = set
            .endpoints
            .iter()
            .filter(|e| e.is_healthy() && e.is_ejected(now))
            .count() as i64;
        let healthy = set.endpoints.len() as i64 - ejected - unhealthy;
        let draining = {
            let mut draining = self.draining.lock().unwrap_or_else(|p| p.into_inner());
            draining.retain(|e| e.in_flight() > 0);
            draining.len() as i64
        };
        self.metrics.states([
            ("healthy", healthy),
            ("ejected", ejected),
            ("unhealthy", unhealthy),
            ("draining", draining),
        ]);
    }

    /// The pool as admin `GET /upstreams` shows it.
    pub fn to_json(&self) -> serde_json::Value {
        let now = Instant::now();
        let spec = self.spec.load();
        let set = self.set.load();
        let draining = self
            .draining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let row = |e: &Arc<Endpoint>, state: &str| {
            serde_json::json!({
                "endpoint": e.name,
                "origin": origin_key(&e.origin),
                "weight": e.weight(),
                "state": state,
                "in_flight": e.in_flight(),
                "requests": e.requests(),
                "failures": e.failures(),
                "ejections": e.health().ejections(),
            })
        };
        let mut endpoints: Vec<serde_json::Value> = set
            .endpoints
            .iter()
            .map(|e| {
                let state = match (e.is_healthy(), e.is_ejected(now)) {
                    (false, _) => "unhealthy",
                    (true, true) => "ejected",
                    (true, false) => "healthy",
                };
                row(e, state)
            })
            .collect();
        endpoints.extend(draining.iter().map(|e| row(e, "draining")));
        serde_json::json!({
            "route": &*self.route,
            "balance": match spec.balance {
                Balance::LeastRequest => "least_request",
                Balance::RoundRobin => "round_robin",
                Balance::Hash(_) => "hash",
            },
            "endpoints": endpoints,
        })
    }
}

/// Every route's pool, by route name: kept across reloads.
#[derive(Default)]
pub struct Pools {
    by_route: Mutex<HashMap<Arc<str>, Arc<RoutePool>>>,
    /// Wakes discovery when a reload brought names it has not resolved.
    pub(super) wake: tokio::sync::Notify,
}

impl Pools {
    /// The pool of each route, in order: kept (with the route's new spec) for a route that
    /// stays, new for a route that is new; the pools of routes gone are dropped.
    pub fn for_routes(
        &self,
        routes: &[(Arc<str>, PoolSpec)],
        metrics: &Metrics,
    ) -> Vec<Arc<RoutePool>> {
        let mut by_route = self.by_route.lock().unwrap_or_else(|p| p.into_inner());
        by_route.retain(|name, _| routes.iter().any(|(r, _)| r == name));
        let mut unresolved = false;
        let pools = routes
            .iter()
            .map(|(name, spec)| {
                let pool = by_route
                    .entry(name.clone())
                    .or_insert_with(|| {
                        RoutePool::new(name.clone(), spec.clone(), metrics.upstream(name))
                    })
                    .clone();
                pool.update(spec.clone());
                unresolved |= !pool.names().is_empty() && pool.is_empty();
                pool
            })
            .collect();
        if unresolved {
            self.wake.notify_one();
        }
        pools
    }

    /// Every pool now.
    pub fn all(&self) -> Vec<Arc<RoutePool>> {
        let by_route = self.by_route.lock().unwrap_or_else(|p| p.into_inner());
        let mut pools: Vec<Arc<RoutePool>> = by_route.values().cloned().collect();
        pools.sort_by(|a, b| a.route.cmp(&b.route));
        pools
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::{OutlierSpec, RetrySpec, UpstreamProtocol};

    /// A pool of four endpoints at 127.0.0.1, ports 1 to 4 (addresses: nothing to resolve).
    fn four() -> Arc<RoutePool> {
        let origins = (1..=4)
            .map(|port| {
                let authority: http::uri::Authority = format!("127.0.0.1:{port}").parse().unwrap();
                let origin = super::super::Origin {
                    scheme: Scheme::HTTP,
                    host_header: http::HeaderValue::from_str(authority.as_str()).unwrap(),
                    host: authority.host().into(),
                    authority,
                    protocol: UpstreamProtocol::Http1,
                };
                (origin, 1)
            })
            .collect();
        let spec = PoolSpec {
            origins,
            balance: Balance::RoundRobin,
            outlier: OutlierSpec {
                consecutive_failures: 2,
                ejection: std::time::Duration::from_secs(60),
                max_ejected_percent: 50,
            },
            retries: RetrySpec::default(),
            health: None,
        };
        let metrics = Metrics::new();
        RoutePool::new("api".into(), spec, metrics.upstream("api"))
    }

    fn port(e: &Endpoint) -> u16 {
        e.addr.map_or(0, |a| a.port())
    }

    /// The ports `pick` returns over enough picks to go round the pool twice.
    fn picked(pool: &RoutePool, excluded: &[u64], fallback: Fallback) -> Vec<u16> {
        let mut ports: Vec<u16> = (0..8)
            .filter_map(|_| pool.pick(None, excluded, fallback))
            .map(|e| port(&e))
            .collect();
        ports.sort();
        ports.dedup();
        ports
    }

    #[test]
    fn the_pick_passes_over_the_ejected_the_unhealthy_and_the_spent() {
        let pool = four();
        let all = pool.endpoints();
        let by_port = |p: u16| all.iter().find(|e| port(e) == p).unwrap().clone();
        // Port 3 fails its active checks; port 4 fails twice in a row and is ejected.
        assert_eq!(by_port(3).checked(false, 1, 1), Some(false));
        pool.outcome(&by_port(4), Attempted::Failed);
        pool.outcome(&by_port(4), Attempted::Failed);
        assert!(by_port(4).is_ejected(Instant::now()));
        for fallback in [Fallback::Unwell, Fallback::OnlyWhenNoneIsWell] {
            assert_eq!(picked(&pool, &[], fallback), [1, 2], "{fallback:?}");
        }
        // Port 1 tried (or its budget spent): port 2 alone.
        let one = [by_port(1).id];
        assert_eq!(picked(&pool, &one, Fallback::Unwell), [2]);
        // Both well ones excluded: an attempt goes to an unwell one (a panic, counted), the
        // limits `per: endpoint` find none.
        let both = [by_port(1).id, by_port(2).id];
        assert_eq!(picked(&pool, &both, Fallback::Unwell), [3, 4]);
        assert_eq!(pool.metrics.panics.get(), 8);
        assert!(picked(&pool, &both, Fallback::OnlyWhenNoneIsWell).is_empty());
        // Every endpoint excluded: nothing.
        let every: Vec<u64> = all.iter().map(|e| e.id).collect();
        assert!(picked(&pool, &every, Fallback::Unwell).is_empty());
    }

    #[test]
    fn with_no_endpoint_well_both_fallbacks_pick_among_the_unwell() {
        let pool = four();
        for e in pool.endpoints() {
            e.checked(false, 1, 1);
        }
        for fallback in [Fallback::Unwell, Fallback::OnlyWhenNoneIsWell] {
            assert_eq!(picked(&pool, &[], fallback), [1, 2, 3, 4], "{fallback:?}");
        }
    }
}
