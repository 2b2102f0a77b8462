//! One endpoint of a route's pool: an address an origin resolved to (or, for an `https://`
//! origin, the origin itself, dialled by name), with what the balancer and the health rules read
//! of it. Shared (`Arc`) by the pool's current set, the requests in flight on it and, once
//! discovery drops it, the draining list.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;

use super::Origin;
use super::outlier::Health;

/// One endpoint.
#[derive(Debug)]
pub struct Endpoint {
    /// `address:port` (or the origin's `host:port` when dialled by name): its name in metrics
    /// and `/upstreams`.
    pub name: String,
    /// The address, when it is one.
    pub addr: Option<SocketAddr>,
    /// What the forwarded request names (its `Host`, `:authority`, redirects): the origin
    /// that resolved to this endpoint.
    pub origin: Origin,
    /// Its index among the pool's origins (as configured).
    pub origin_index: usize,
    /// What is dialled: the origin with the address as its authority (the origin itself when
    /// dialled by name). Connections are pooled by it.
    pub target: Origin,
    weight: AtomicU32,
    /// A stable hash of its name, for `balance: hash`.
    pub id: u64,
    in_flight: AtomicU64,
    requests: AtomicU64,
    failures: AtomicU64,
    health: Mutex<Health>,
    /// Active checks: passes (positive) or failures (negative) in a row.
    streak: std::sync::atomic::AtomicI32,
    /// False while active checks keep it out.
    checked_healthy: std::sync::atomic::AtomicBool,
    /// `floodgate_upstream_requests_total{route, endpoint}`.
    counter: Counter,
}

impl Endpoint {
    pub(super) fn new(
        origin: Origin,
        origin_index: usize,
        addr: Option<SocketAddr>,
        weight: u32,
        counter: impl FnOnce(&str) -> Counter,
    ) -> Endpoint {
        let (name, target) = match addr {
            Some(addr) => {
                let name = addr.to_string();
                let authority = name.parse().unwrap_or_else(|_| origin.authority.clone());
                let target = Origin {
                    authority,
                    ..origin.clone()
                };
                (name, target)
            }
            None => (origin.authority.to_string(), origin.clone()),
        };
        Endpoint {
            id: super::balance::hash_bytes(name.as_bytes()),
            counter: counter(&name),
            name,
            addr,
            origin,
            origin_index,
            target,
            weight: AtomicU32::new(weight.max(1)),
            in_flight: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            health: Mutex::new(Health::default()),
            streak: std::sync::atomic::AtomicI32::new(0),
            checked_healthy: std::sync::atomic::AtomicBool::new(true),
        }
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    pub(super) fn set_weight(&self, weight: u32) {
        self.weight.store(weight.max(1), Ordering::Relaxed);
    }

    /// Requests it serves now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Attempts sent to it so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Failed attempts so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Its passive health, locked (briefly: no await while held).
    pub(super) fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while passive health keeps it out.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.health().is_ejected(now)
    }

    /// False while active health checks keep it out.
    pub fn is_healthy(&self) -> bool {
        self.checked_healthy.load(Ordering::Relaxed)
    }

    /// One active check's result: `healthy_after` passes in a row bring it back,
    /// `unhealthy_after` failures in a row take it out. Returns its health when it changed.
    pub(super) fn checked(
        &self,
        passed: bool,
        healthy_after: u32,
        unhealthy_after: u32,
    ) -> Option<bool> {
        let streak = self.streak.load(Ordering::Relaxed);
        let streak = match (passed, streak > 0) {
            (true, true) => streak.saturating_add(1),
            (true, false) => 1,
            (false, false) => streak.saturating_sub(1),
            (false, true) => -1,
        };
        self.streak.store(streak, Ordering::Relaxed);
        let healthy = self.is_healthy();
        if healthy && streak <= -(unhealthy_after as i32) {
            self.checked_healthy.store(false, Ordering::Relaxed);
            return Some(false);
        }
        if !healthy && streak >= healthy_after as i32 {
            self.checked_healthy.store(true, Ordering::Relaxed);
            return Some(true);
        }
        None
    }

    pub(super) fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// An attempt starts on it: counted until the returned guard is dropped.
    pub(super) fn start(self: &std::sync::Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.counter.inc();
        InFlight(self.clone())
    }
}

/// An attempt in flight on an endpoint: it counts in the endpoint's load until dropped (with the
/// response's body, when the response is relayed).
#[derive(Debug)]
pub struct InFlight(std::sync::Arc<Endpoint>);

impl InFlight {
    pub fn endpoint(&self) -> &std::sync::Arc<Endpoint> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
