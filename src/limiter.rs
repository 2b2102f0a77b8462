//! Rate limiting without HTTP: the algorithms, their parameters, the decisions they make and the
//! stores that keep their state.
//!
//! The pieces are independent, as in `governor`: a [`Limit`] (algorithm × parameters × cost) says
//! what is allowed; [`algorithm::State`] holds one identity's state for one limit and decides as a
//! pure function of (state, now, parameters); a store keeps states per budget key; a [`Clock`]
//! says what time it is. Nothing here knows about hyper or the config file.

pub mod algorithm;
pub mod guard;
pub mod memory;
pub mod redis;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use memory::{BudgetKey, MemoryStore};

/// A rate-limiting algorithm with its parameters, in the units the algorithms compute in.
///
/// Rates are stored as the interval between two units of cost, rounded up to whole microseconds,
/// so that every algorithm runs on integers (and the Lua scripts mirror them exactly). Rounding up
/// means a configured rate is never exceeded; the rate actually enforced is
/// `1e6 / ceil(1e6 / rate)` per second, e.g. 2 999 991/s for 3 000 000/s, and exact for every
/// rate that divides a million.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Bursts up to `capacity`, refilled by one token every `interval_us`.
    TokenBucket {
        capacity: NonZeroU32,
        interval_us: u64,
    },
    /// A queue of `capacity` requests drained one every `interval_us`: admitted requests are
    /// delayed so they leave evenly spaced; one that would not fit in the queue is rejected.
    LeakyBucket {
        capacity: NonZeroU32,
        interval_us: u64,
    },
    /// At most `limit` per window aligned to the Unix epoch.
    FixedWindow { limit: NonZeroU32, window_us: u64 },
    /// At most `limit` in any span `window_us` long (one timestamp kept per admitted request).
    SlidingWindowLog { limit: NonZeroU32, window_us: u64 },
    /// The current aligned window's count plus the previous one's, weighted by how much of the
    /// previous window still overlaps the sliding window.
    SlidingWindowCounter { limit: NonZeroU32, window_us: u64 },
}

impl Algorithm {
    /// The interval between two units of a `per_second` rate, in microseconds, rounded up.
    /// `None` when the rate is not a positive finite number or is above one per microsecond.
    pub fn interval_for_rate(per_second: f64) -> Option<u64> {
        if !(per_second.is_finite() && per_second > 0.0 && per_second <= 1e6) {
            return None;
        }
        let interval = (1e6 / per_second).ceil();
        (1.0..1e15).contains(&interval).then_some(interval as u64)
    }

    /// The name used in the config file, logs and store keys.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingWindowLog { .. } => "sliding_window_log",
            Algorithm::SlidingWindowCounter { .. } => "sliding_window_counter",
        }
    }

    /// The algorithm's two numbers: (capacity, interval µs) for the buckets, (limit, window µs)
    /// for the windows. A budget of `units` spans `units × span` µs (buckets) or `span` (windows).
    pub fn parameters(&self) -> (u64, u64) {
        match *self {
            Algorithm::TokenBucket {
                capacity,
                interval_us,
            }
            | Algorithm::LeakyBucket {
                capacity,
                interval_us,
            } => (u64::from(capacity.get()), interval_us),
            Algorithm::FixedWindow { limit, window_us }
            | Algorithm::SlidingWindowLog { limit, window_us }
            | Algorithm::SlidingWindowCounter { limit, window_us } => {
                (u64::from(limit.get()), window_us)
            }
        }
    }

    /// True for the token and leaky buckets.
    pub fn is_bucket(&self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. }
        )
    }

    /// The most one request may cost: a request costing more could never pass.
    pub fn max_cost(&self) -> u32 {
        match self {
            Algorithm::TokenBucket { capacity, .. } | Algorithm::LeakyBucket { capacity, .. } => {
                capacity.get()
            }
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingWindowLog { limit, .. }
            | Algorithm::SlidingWindowCounter { limit, .. } => limit.get(),
        }
    }
}

/// One limit on a route: an algorithm and what one request costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub algorithm: Algorithm,
    /// Units one request spends; between 1 and [`Algorithm::max_cost`] (the config checks).
    pub cost: u32,
}

/// What one limit says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Capacity (buckets) or limit (windows): `X-RateLimit-Limit`.
    pub limit: u64,
    /// Units left after this request: `X-RateLimit-Remaining`.
    pub remaining: u64,
    /// Time until the budget is fully restored: `X-RateLimit-Reset` is now plus this.
    pub reset_after_us: u64,
    /// When denied, the time until the earliest retry that can pass; 0 when allowed.
    pub retry_after_us: u64,
    /// Leaky bucket only: how long to hold an admitted request before forwarding it.
    pub delay_us: u64,
}

/// The decision of all the limits of a route for one request, taken all-or-nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The time the decision was taken at (µs since the Unix epoch), by the store's clock.
    pub now_us: u64,
    /// The limit with the fewest remaining: the one whose figures go in the headers.
    pub headline: Decision,
    /// That limit's position in the route's list.
    pub headline_index: usize,
    pub allowed: bool,
    /// When denied, the longest wait among the limits that denied.
    pub retry_after_us: u64,
    /// When allowed, the longest leaky-bucket delay among the limits.
    pub delay_us: u64,
}

impl Verdict {
    /// Folds per-limit decisions (in route order) into one verdict. `decisions` must not be empty.
    pub fn from_decisions(now_us: u64, decisions: &[Decision]) -> Option<Verdict> {
        let mut headline = *decisions.first()?;
        let mut headline_index = 0;
        let mut allowed = true;
        let mut retry_after_us = 0;
        let mut delay_us = 0;
        for (i, d) in decisions.iter().enumerate() {
            if d.remaining < headline.remaining {
                headline = *d;
                headline_index = i;
            }
            allowed &= d.allowed;
            retry_after_us = retry_after_us.max(d.retry_after_us);
            delay_us = delay_us.max(d.delay_us);
        }
        Some(Verdict {
            now_us,
            headline,
            headline_index,
            allowed,
            retry_after_us: if allowed { 0 } else { retry_after_us },
            delay_us: if allowed { delay_us } else { 0 },
        })
    }

    /// `Retry-After` in whole seconds: the wait rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_us.div_ceil(1_000_000).max(1)
    }

    /// `X-RateLimit-Reset`: the Unix second by which the budget is fully restored, rounded up.
    pub fn reset_unix_secs(&self) -> u64 {
        (self.now_us + self.headline.reset_after_us).div_ceil(1_000_000)
    }
}

/// Why a store could not decide. The proxy answers these according to `storage.on_error`.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("limiter store timed out after {0:?}")]
    Timeout(Duration),
    #[error("limiter store unavailable: {0}")]
    Unavailable(String),
    #[error("limiter store answered something unexpected: {0}")]
    Protocol(String),
}

/// A source of wall-clock time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> u64;
}

/// The system clock, made monotonic: if the wall clock steps back, time stands still until it
/// catches up, so no state ever sees time move backwards.
#[derive(Debug, Default)]
pub struct SystemClock {
    last: AtomicU64,
}

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let previous = self.last.fetch_max(wall, Ordering::Relaxed);
        previous.max(wall)
    }
}

/// A clock that moves only when told to: for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `now_us`.
    pub fn new_for_test(now_us: u64) -> Self {
        ManualClock {
            now: AtomicU64::new(now_us),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_micros() as u64, Ordering::Relaxed);
    }

    /// Sets the clock.
    pub fn set(&self, now_us: u64) {
        self.now.store(now_us, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }
}

impl<C: Clock> Clock for std::sync::Arc<C> {
    fn now_us(&self) -> u64 {
        (**self).now_us()
    }
}

/// What a request gets when the limiter store cannot decide (`storage.on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Fail open: forward the request.
    Allow,
    /// Fail closed: answer 503 `rate_limiter_unavailable`.
    Deny,
    /// Decide with the in-process limiter instead.
    Local,
}

/// A decision, or what `on_error` made of a store failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// `None`: admit without limiting (no limits, or the store failed and `on_error` is `allow`).
    pub verdict: Option<Verdict>,
    /// The store failed and `on_error` decided (`allow`, or `local` with the in-process store).
    pub store_failed: bool,
}

/// What the proxy asks: a store, and what to do when it fails.
#[derive(Clone)]
pub enum Limiter {
    /// State in this process: never fails.
    Memory(Arc<MemoryStore>),
    /// State in Redis, behind the timeout, breaker and deny cache of [`guard::Guarded`].
    Redis(Arc<guard::Guarded>),
}

impl Limiter {
    /// Decides one request against all `limits`, all-or-nothing. `Err` means the store failed and
    /// `on_error` is `deny`; otherwise see [`Decided`].
    pub async fn decide(
        &self,
        key: &BudgetKey<'_>,
        limits: &[Limit],
        on_error: OnError,
    ) -> Result<Decided, LimiterError> {
        match self {
            Limiter::Memory(store) => Ok(Decided {
                verdict: store.decide(key, limits),
                store_failed: false,
            }),
            Limiter::Redis(guarded) => guarded.decide(key, limits, on_error).await,
        }
    }

    /// True when the store answers: `/readyz`.
    pub async fn is_ready(&self) -> bool {
        match self {
            Limiter::Memory(_) => true,
            Limiter::Redis(guarded) => guarded.is_ready().await,
        }
    }

    /// The in-process store (the fallback, for Redis), to sweep.
    pub fn memory(&self) -> Option<&Arc<MemoryStore>> {
        match self {
            Limiter::Memory(store) => Some(store),
            Limiter::Redis(guarded) => Some(guarded.local()),
        }
    }
}
