//! What is allowed: the algorithms ([`AlgorithmKind`]), their checked parameters
//! ([`Algorithm`]) and a limit's cost per request ([`Limit`]).

use super::calendar::{Calendar, period_of_us};
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

/// The rate-limiting algorithms, without their parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmKind {
    /// Bursts up to a capacity, refilled at a steady rate (GCRA).
    TokenBucket,
    /// A queue drained at a steady rate: admitted requests are delayed so they leave evenly
    /// spaced; one that would not fit in the queue is rejected (GCRA, keeping the delay).
    LeakyBucket,
    /// At most `limit` per window aligned to the Unix epoch.
    FixedWindow,
    /// At most `limit` in any span one window long (one timestamp kept per admitted unit).
    SlidingWindowLog,
    /// The current aligned window's count plus the previous one's, weighted by how much of the
    /// previous window still overlaps the sliding window.
    SlidingWindowCounter,
    /// At most `limit` requests in flight at once. Each admitted request holds a lease until it
    /// finishes (released by the proxy) or until the lease runs out (a crashed instance's
    /// leases free themselves).
    Concurrency,
    /// At most `limit` per calendar period (a day, a week from Monday, a month from the 1st) in
    /// a time zone: a fixed window whose bounds come from the calendar (`calendar.rs`).
    Quota,
}

impl AlgorithmKind {
    /// Every algorithm, in the order the docs list them.
    pub const ALL: [AlgorithmKind; 7] = [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::LeakyBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindowLog,
        AlgorithmKind::SlidingWindowCounter,
        AlgorithmKind::Concurrency,
        AlgorithmKind::Quota,
    ];

    /// The name used in the config file, logs and store keys.
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmKind::TokenBucket => "token_bucket",
            AlgorithmKind::LeakyBucket => "leaky_bucket",
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindowLog => "sliding_window_log",
            AlgorithmKind::SlidingWindowCounter => "sliding_window_counter",
            AlgorithmKind::Concurrency => "concurrency",
            AlgorithmKind::Quota => "quota",
        }
    }

    /// True for the token and leaky buckets, whose span is a per-unit interval rather than a
    /// window.
    pub fn is_bucket(self) -> bool {
        matches!(
            self,
            AlgorithmKind::TokenBucket | AlgorithmKind::LeakyBucket
        )
    }
}

/// Why a limit's parameters cannot be used. [`LimitError::field`] says which parameter is wrong,
/// so the config can name it by path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("must be > 0")]
    ZeroUnits,
    #[error("must be > 0")]
    RateNotPositive,
    #[error("must be at most 1000000 per second")]
    RateTooHigh,
    #[error("must be at least 1ms")]
    WindowTooShort,
    #[error("the budget spans too long (more than about 285 years of microseconds)")]
    SpanTooLong,
    #[error("must be between 1 and {max} (a request costing more could never pass)")]
    Cost { max: u32 },
}

/// Which parameter a [`LimitError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitField {
    /// `capacity` (buckets) or `limit` (windows).
    Units,
    /// `refill_rate` or `leak_rate`.
    Rate,
    /// `window`.
    Window,
    /// `cost`.
    Cost,
    /// The limit as a whole.
    Whole,
}

impl LimitError {
    /// The parameter this error is about.
    pub fn field(&self) -> LimitField {
        match self {
            LimitError::ZeroUnits => LimitField::Units,
            LimitError::RateNotPositive | LimitError::RateTooHigh => LimitField::Rate,
            LimitError::WindowTooShort => LimitField::Window,
            LimitError::SpanTooLong => LimitField::Whole,
            LimitError::Cost { .. } => LimitField::Cost,
        }
    }
}

/// A rate-limiting algorithm with its parameters, in the units the algorithms compute in: a
/// count of units (capacity or limit) and a span in microseconds (the interval between two units
/// of a bucket's rate, or a window's length).
///
/// Rates are stored as that interval rounded up to whole microseconds, so every algorithm runs
/// on integers (and the Lua scripts mirror them exactly). Rounding up means a configured rate is
/// never exceeded; the rate actually enforced is `1e6 / ceil(1e6 / rate)` per second, e.g.
/// 2 999 991/s for 3 000 000/s, and exact for every rate that divides a million.
///
/// ```
/// use floodgate::limiter::{Algorithm, LimitError};
/// let bucket = Algorithm::token_bucket(20, 10.0).unwrap();
/// assert_eq!(
///     bucket.parameters(),
///     floodgate::limiter::Parameters::Bucket { capacity: 20, interval_us: 100_000 }
/// );
/// assert_eq!(Algorithm::token_bucket(0, 10.0), Err(LimitError::ZeroUnits));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Algorithm {
    kind: AlgorithmKind,
    units: NonZeroU32,
    span_us: NonZeroU64,
    /// A quota's period and time zone (`None` for every other algorithm).
    calendar: Option<Calendar>,
}

impl Algorithm {
    /// A token bucket of `capacity` tokens refilled at `refill_per_second`.
    pub fn token_bucket(capacity: u32, refill_per_second: f64) -> Result<Self, LimitError> {
        Self::bucket(AlgorithmKind::TokenBucket, capacity, refill_per_second)
    }

    /// A leaky bucket queueing up to `capacity` requests, drained at `leak_per_second`.
    pub fn leaky_bucket(capacity: u32, leak_per_second: f64) -> Result<Self, LimitError> {
        Self::bucket(AlgorithmKind::LeakyBucket, capacity, leak_per_second)
    }

    /// At most `limit` per aligned `window`.
    pub fn fixed_window(limit: u32, window: Duration) -> Result<Self, LimitError> {
        Self::window(AlgorithmKind::FixedWindow, limit, window)
    }

    /// At most `limit` in any span `window` long, exactly.
    pub fn sliding_window_log(limit: u32, window: Duration) -> Result<Self, LimitError> {
        Self::window(AlgorithmKind::SlidingWindowLog, limit, window)
    }

    /// At most about `limit` in any span `window` long, estimated from two counters.
    pub fn sliding_window_counter(limit: u32, window: Duration) -> Result<Self, LimitError> {
        Self::window(AlgorithmKind::SlidingWindowCounter, limit, window)
    }

    /// At most `limit` requests in flight, each lease lasting at most `lease`.
    pub fn concurrency(limit: u32, lease: Duration) -> Result<Self, LimitError> {
        Self::window(AlgorithmKind::Concurrency, limit, lease)
    }

    /// At most `limit` per calendar period.
    pub fn quota(limit: u32, calendar: Calendar) -> Result<Self, LimitError> {
        let mut quota = Self::from_parts(
            AlgorithmKind::Quota,
            u64::from(limit),
            calendar.period().nominal_us(),
        )?;
        quota.calendar = Some(calendar);
        Ok(quota)
    }

    fn bucket(kind: AlgorithmKind, capacity: u32, per_second: f64) -> Result<Self, LimitError> {
        let interval = Self::interval_for_rate(per_second)?;
        Self::from_parts(kind, u64::from(capacity), interval)
    }

    fn window(kind: AlgorithmKind, limit: u32, window: Duration) -> Result<Self, LimitError> {
        if window < Duration::from_millis(1) {
            return Err(LimitError::WindowTooShort);
        }
        let window_us = u64::try_from(window.as_micros()).map_err(|_| LimitError::SpanTooLong)?;
        Self::from_parts(kind, u64::from(limit), window_us)
    }

    /// The algorithm from its integer form: (capacity, interval µs) for the buckets, (limit,
    /// window µs) for the windows. Checks what every constructor checks, except the windows'
    /// 1 ms minimum (a config bound, not an arithmetic one): for tests and replay.
    pub fn from_parts(kind: AlgorithmKind, units: u64, span_us: u64) -> Result<Self, LimitError> {
        let units = u32::try_from(units)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or(LimitError::ZeroUnits)?;
        let span_us = NonZeroU64::new(span_us).ok_or(if kind.is_bucket() {
            LimitError::RateTooHigh
        } else {
            LimitError::WindowTooShort
        })?;
        // Both stores compute in microseconds; the Redis scripts in doubles, exact below 2^53.
        // The windows' sliding counter keeps two windows, so their bound is on twice the span.
        // A fixed window and a quota count in one window (or calendar period) and multiply no
        // span by their limit: a month of 100,000 requests is fine.
        let factor = match kind {
            AlgorithmKind::Quota | AlgorithmKind::FixedWindow => 2,
            _ => u64::from(units.get()).max(2),
        };
        let reach = factor.checked_mul(span_us.get());
        if reach.is_none_or(|r| r >= 1 << 53) {
            return Err(LimitError::SpanTooLong);
        }
        let calendar = match kind {
            // A quota made from its parts alone (replay, tests) counts UTC days.
            AlgorithmKind::Quota => Some(Calendar::utc(period_of_us(span_us.get()))),
            _ => None,
        };
        Ok(Algorithm {
            kind,
            units,
            span_us,
            calendar,
        })
    }

    /// The interval between two units of a `per_second` rate, in microseconds, rounded up.
    pub fn interval_for_rate(per_second: f64) -> Result<u64, LimitError> {
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(LimitError::RateNotPositive);
        }
        if per_second > 1e6 {
            return Err(LimitError::RateTooHigh);
        }
        let interval = (1e6 / per_second).ceil();
        if interval >= 1e15 {
            return Err(LimitError::SpanTooLong);
        }
        Ok(interval as u64)
    }

    /// Which algorithm.
    pub fn kind(&self) -> AlgorithmKind {
        self.kind
    }

    /// The name used in the config file, logs and store keys.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Capacity (buckets) or limit (windows): what `X-RateLimit-Limit` says.
    pub fn units(&self) -> u32 {
        self.units.get()
    }

    /// The interval between two units (buckets) or the window's length (windows), in µs.
    pub fn span_us(&self) -> u64 {
        self.span_us.get()
    }

    /// The algorithm's parameters, by its shape.
    pub fn parameters(&self) -> Parameters {
        let (units, span_us) = self.wire();
        if self.is_bucket() {
            Parameters::Bucket {
                capacity: units,
                interval_us: span_us,
            }
        } else {
            Parameters::Window {
                limit: units,
                window_us: span_us,
            }
        }
    }

    /// The two numbers the stores' scripts and functions take for every algorithm: the units
    /// (capacity or limit) and the span in µs (a bucket's interval, or a window).
    pub fn wire(&self) -> (u64, u64) {
        (u64::from(self.units.get()), self.span_us.get())
    }

    /// [`Algorithm::wire`] for a decision at `now_us` (µs since the epoch): a quota's second
    /// number is the end of the calendar period `now_us` falls in (the stores count a quota in
    /// the period that ends there: `calendar.rs`); the other algorithms' do not depend on time.
    pub fn wire_at(&self, now_us: u64) -> (u64, u64) {
        match &self.calendar {
            Some(calendar) => (u64::from(self.units.get()), calendar.bounds(now_us).1),
            None => self.wire(),
        }
    }

    /// The counted window `now_us` (µs since the epoch) falls in, as `[start, end)`: a fixed
    /// window's (aligned to the epoch, as every store counts it) or a quota's calendar period;
    /// `None` for the algorithms that count no window of their own.
    pub fn period_at(&self, now_us: u64) -> Option<(u64, u64)> {
        match (&self.calendar, self.kind) {
            (Some(calendar), _) => Some(calendar.bounds(now_us)),
            (None, AlgorithmKind::FixedWindow) => {
                let span = self.span_us.get();
                let start = now_us - now_us % span;
                Some((start, start.saturating_add(span)))
            }
            _ => None,
        }
    }

    /// A quota's calendar.
    pub fn calendar(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// How long the whole budget spans: a bucket's time to refill from empty, or its window.
    pub fn budget_span_us(&self) -> u64 {
        match self.parameters() {
            Parameters::Bucket {
                capacity,
                interval_us,
            } => capacity * interval_us,
            Parameters::Window { window_us, .. } => window_us,
        }
    }

    /// True for the token and leaky buckets.
    pub fn is_bucket(&self) -> bool {
        self.kind.is_bucket()
    }

    /// The most one request may cost: a request costing more could never pass.
    pub fn max_cost(&self) -> u32 {
        self.units.get()
    }
}

/// An algorithm's parameters, in the units the algorithms compute in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parameters {
    /// The token and leaky buckets: `capacity` units, one more every `interval_us`.
    Bucket { capacity: u64, interval_us: u64 },
    /// The windows and concurrency: `limit` units per `window_us` (a concurrency lease's
    /// longest life).
    Window { limit: u64, window_us: u64 },
}

/// One limit: an algorithm and what one request costs. Cannot be built with a cost the budget
/// could never pay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    cost: NonZeroU32,
    /// Its cost is reserved per request and settled after the response (`cost: {reserve,
    /// actual}`): no two requests need cost the same, so nothing may assume they do.
    settled: bool,
    /// One budget for every region (`scope: global`): spent through the region's slices of
    /// it (`global.rs`), not the region's store alone.
    global: bool,
}

impl Limit {
    /// A limit whose requests each cost `cost` units, between 1 and [`Algorithm::max_cost`].
    pub fn new(algorithm: Algorithm, cost: u32) -> Result<Self, LimitError> {
        match NonZeroU32::new(cost) {
            Some(cost) if cost.get() <= algorithm.max_cost() => Ok(Limit {
                algorithm,
                cost,
                settled: false,
                global: false,
            }),
            _ => Err(LimitError::Cost {
                max: algorithm.max_cost(),
            }),
        }
    }

    /// A limit costing one unit per request.
    pub fn of(algorithm: Algorithm) -> Self {
        Limit {
            algorithm,
            cost: NonZeroU32::MIN,
            settled: false,
            global: false,
        }
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// Units one request spends.
    pub fn cost(&self) -> u32 {
        self.cost.get()
    }

    /// This limit with its cost settled after the response ([`Limit::is_settled`]).
    pub fn settled(self) -> Self {
        Limit {
            settled: true,
            ..self
        }
    }

    /// This limit as one budget for every region (`scope: global`).
    pub fn global(self) -> Self {
        Limit {
            global: true,
            ..self
        }
    }

    /// True for a `scope: global` limit.
    pub fn is_global(&self) -> bool {
        self.global
    }

    /// True when each request reserves its own cost, settled after the response: leases (units
    /// counted in requests' worth) and the deny cache (a denial of one reserve says nothing of a
    /// smaller one) leave it alone.
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// This limit costing `units` for one request (a reserve), at least 1 and at most the
    /// limit's units.
    pub fn costing(self, units: u32) -> Self {
        let most = self.algorithm.max_cost();
        Limit {
            cost: NonZeroU32::new(units.clamp(1, most)).unwrap_or(NonZeroU32::MIN),
            ..self
        }
    }
}

/// The most limits one request may be decided against (the config checks it per route), so the
/// stores can keep one request's working set on the stack.
pub const MAX_LIMITS: usize = 16;
