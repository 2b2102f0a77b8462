//! Rate limiting without HTTP: the algorithms, their parameters, the decisions they make and the
//! stores that keep their state.
//!
//! The pieces are independent, as in `governor`: a [`Limit`] (algorithm × parameters × cost) says
//! what is allowed; [`algorithm::State`] holds one budget's state for one limit and decides as a
//! pure function of (state, now, parameters); a store keeps states per [`BudgetKey`]; a [`Clock`]
//! says what time it is. Nothing here knows about hyper or the config file.
//!
//! A request is decided by a list of [`Ask`]s, one per limit that applies to it, each naming the
//! budget that limit spends (the caller's identity, its IP, or the whole route). The stores
//! decide the list all-or-nothing: when one limit denies, nothing is spent from any of them.
//!
//! [`Algorithm`] and [`Limit`] cannot be built invalid: their fields are private and their
//! constructors check every bound the algorithms and the Redis scripts rely on (no zero
//! interval or window, no budget past 2^53 µs, no cost above what the budget holds).

pub mod algorithm;
pub mod batch;
pub mod guard;
pub mod lease;
pub mod memory;
pub mod postgres;
pub mod redis;
pub mod wire;

use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use memory::MemoryStore;

/// The most limits one request may be decided against (the config checks it per route), so the
/// stores can keep one request's working set on the stack.
pub const MAX_LIMITS: usize = 16;

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
}

impl AlgorithmKind {
    /// Every algorithm, in the order the docs list them.
    pub const ALL: [AlgorithmKind; 6] = [
        AlgorithmKind::TokenBucket,
        AlgorithmKind::LeakyBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindowLog,
        AlgorithmKind::SlidingWindowCounter,
        AlgorithmKind::Concurrency,
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
/// assert_eq!(bucket.parameters(), (20, 100_000));
/// assert_eq!(Algorithm::token_bucket(0, 10.0), Err(LimitError::ZeroUnits));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Algorithm {
    kind: AlgorithmKind,
    units: NonZeroU32,
    span_us: NonZeroU64,
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
        let reach = u64::from(units.get()).max(2).checked_mul(span_us.get());
        if reach.is_none_or(|r| r >= 1 << 53) {
            return Err(LimitError::SpanTooLong);
        }
        Ok(Algorithm {
            kind,
            units,
            span_us,
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

    /// The algorithm's two numbers: (capacity, interval µs) for the buckets, (limit, window µs)
    /// for the windows. A budget of `units` spans `units × span` µs (buckets) or `span` (windows).
    pub fn parameters(&self) -> (u64, u64) {
        (u64::from(self.units.get()), self.span_us.get())
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

/// One limit: an algorithm and what one request costs. Cannot be built with a cost the budget
/// could never pay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    algorithm: Algorithm,
    cost: NonZeroU32,
}

impl Limit {
    /// A limit whose requests each cost `cost` units, between 1 and [`Algorithm::max_cost`].
    pub fn new(algorithm: Algorithm, cost: u32) -> Result<Self, LimitError> {
        match NonZeroU32::new(cost) {
            Some(cost) if cost.get() <= algorithm.max_cost() => Ok(Limit { algorithm, cost }),
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
}

/// What a budget is keyed by, besides its route and limit: which kind of client value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// A raw API key (no `consumers:` section): hashed before it reaches any store.
    ApiKey,
    /// A known consumer, by name: all its keys share its budget.
    Consumer,
    /// A user id set by a trusted proxy.
    UserId,
    /// A client IP address (its octets).
    Ip,
    /// The whole route: one budget for every client (the value is empty).
    Route,
}

impl KeyKind {
    /// The name used in store keys, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::ApiKey => "api_key",
            KeyKind::Consumer => "consumer",
            KeyKind::UserId => "user_id",
            KeyKind::Ip => "ip",
            KeyKind::Route => "route",
        }
    }
}

/// Whose budget one limit spends, as the stores see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetKey<'a> {
    /// The limit's budget id: the route's name, the limit's position and a fingerprint of its
    /// parameters, so that a reload that changes a limit starts it afresh while unchanged limits
    /// keep their state.
    pub budget: &'a str,
    pub kind: KeyKind,
    /// The client value's bytes (IP addresses as their octets; empty for [`KeyKind::Route`]).
    pub value: &'a [u8],
}

impl BudgetKey<'_> {
    /// A 64-bit hash of the key under `hasher` (a per-process random seed, so clients cannot
    /// aim collisions). Separators keep `("ab", "c")` and `("a", "bc")` apart.
    pub fn hash_with(&self, hasher: &std::hash::RandomState) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = hasher.build_hasher();
        h.write(self.budget.as_bytes());
        h.write_u8(0xff);
        h.write_u8(self.kind as u8);
        h.write(self.value);
        h.finish()
    }
}

/// One limit asked about one request: the limit and the budget it spends.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub limit: &'a Limit,
    pub key: BudgetKey<'a>,
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

impl Decision {
    /// An allowing decision with nothing in it: a placeholder for fixed-size buffers.
    pub(crate) const EMPTY: Decision = Decision {
        allowed: true,
        limit: 0,
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
        delay_us: 0,
    };
}

/// The decision of all the limits asked about one request, taken all-or-nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The time the decision was taken at (µs since the Unix epoch), by the store's clock.
    pub now_us: u64,
    /// The limit with the fewest remaining: the one whose figures go in the headers.
    pub headline: Decision,
    /// That limit's position in the list asked.
    pub headline_index: usize,
    pub allowed: bool,
    /// When denied, the longest wait among the limits that denied.
    pub retry_after_us: u64,
    /// When allowed, the longest leaky-bucket delay among the limits.
    pub delay_us: u64,
}

impl Verdict {
    /// Folds per-limit decisions (in the order asked) into one verdict. `None` when empty.
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
    /// The store is up but refused this request (an error reply for its keys, such as a script
    /// error on corrupt data). It says nothing about the store's health, so it does not count
    /// towards the circuit breaker.
    #[error("limiter store refused the request: {0}")]
    Refused(String),
}

/// A source of time in microseconds. The stores read wall time (µs since the Unix epoch, to agree
/// with Redis and with logs); the guard's intervals read a monotonic clock.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> u64;
}

/// The system's wall clock, made non-decreasing: if it steps back, time stands still until it
/// catches up, so no limiter state ever sees time move backwards. (Standing still also freezes
/// every budget for as long as the step: the stores use [`AnchoredClock`] instead.)
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

/// Wall time read once, then advanced by a monotonic clock: µs since the Unix epoch that never
/// step. The in-process store runs on it, so a wall-clock step (NTP, a VM restore) neither
/// freezes limiting (a step back: [`SystemClock`] would stand still until the wall clock caught
/// up, and every budget with it) nor refills every bucket at once (a step forward). It drifts
/// from the wall clock only as much as the machine's oscillator does between restarts; only
/// `X-RateLimit-Reset` (Unix seconds) shows that.
#[derive(Debug, Clone, Copy)]
pub struct AnchoredClock {
    wall_at_start_us: u64,
    start: Instant,
}

impl AnchoredClock {
    /// A clock reading `wall_us` now.
    pub fn starting_at(wall_us: u64) -> Self {
        AnchoredClock {
            wall_at_start_us: wall_us,
            start: Instant::now(),
        }
    }
}

impl Default for AnchoredClock {
    fn default() -> Self {
        AnchoredClock::starting_at(SystemClock::default().now_us())
    }
}

impl Clock for AnchoredClock {
    fn now_us(&self) -> u64 {
        self.wall_at_start_us + self.start.elapsed().as_micros() as u64
    }
}

/// Microseconds since this clock was made, from [`Instant`]: unaffected by wall-clock steps.
/// For intervals (breaker cool-down, deny-cache expiry), never for limiter state.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        // Starts at 1 s, so that 0 can mean "never" in the structures that read it.
        self.origin.elapsed().as_micros() as u64 + 1_000_000
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

impl<C: Clock> Clock for Arc<C> {
    fn now_us(&self) -> u64 {
        (**self).now_us()
    }
}

/// What a request gets when the limiter store cannot decide (`storage.on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Fail open: forward the request.
    Allow,
    /// Fail closed: answer 503 `rate_limiter_unavailable`.
    Deny,
    /// Decide with the in-process limiter instead.
    Local,
}

/// The token that names one request's concurrency leases, so it can release them. Unique within
/// a process; the stores combine it with nothing else, so tokens of different instances sharing
/// one Redis start from a random point (64 bits: collisions are negligible).
pub type LeaseId = u64;

/// A new lease token.
pub fn next_lease() -> LeaseId {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::OnceLock;
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new(RandomState::new().hash_one(0u8) >> 1))
        .fetch_add(1, Ordering::Relaxed)
}

/// What the limiter answered for one request. A store failure under `on_error: deny` is not an
/// admission: [`Limiter::decide`] returns the error instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Nothing was asked: no limits apply.
    Unlimited,
    /// A store decided (allowed or denied). An allowed request holds the concurrency leases
    /// named `lease` until [`Limiter::release`].
    Limited {
        verdict: Verdict,
        source: Source,
        lease: LeaseId,
    },
    /// The store failed and `on_error: allow` let the request through unlimited.
    FailedOpen,
}

/// Which store a [`Admission::Limited`] verdict came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The configured store.
    Store,
    /// The in-process fallback, because the store failed and `on_error` is `local`.
    Fallback,
}

impl Admission {
    /// The verdict, if a store decided.
    pub fn verdict(&self) -> Option<&Verdict> {
        match self {
            Admission::Limited { verdict, .. } => Some(verdict),
            _ => None,
        }
    }

    /// True when the configured store failed and `on_error` answered.
    pub fn store_failed(&self) -> bool {
        matches!(
            self,
            Admission::FailedOpen
                | Admission::Limited {
                    source: Source::Fallback,
                    ..
                }
        )
    }
}

/// What the proxy asks: a store, and what to do when it fails.
#[derive(Clone)]
pub enum Limiter {
    /// State in this process: never fails.
    Memory(Arc<MemoryStore>),
    /// State in Redis, behind the timeout, breaker and deny cache of [`guard::Guarded`].
    Redis(Arc<guard::Guarded<redis::RedisStore>>),
    /// State in PostgreSQL, behind the same guard.
    Postgres(Arc<guard::Guarded<postgres::PostgresStore>>),
}

/// `$remote` for either remote store (the guard is generic over the store, so each needs its own
/// arm), `$memory` for the memory store.
macro_rules! by_store {
    ($limiter:expr, $store:ident => $memory:expr, $guarded:ident => $remote:expr) => {
        match $limiter {
            Limiter::Memory($store) => $memory,
            Limiter::Redis($guarded) => $remote,
            Limiter::Postgres($guarded) => $remote,
        }
    };
}

impl Limiter {
    /// Decides one request against all `asks`, all-or-nothing. `Err` means the store failed and
    /// `on_error` is `deny`.
    pub async fn decide(
        &self,
        asks: &[Ask<'_>],
        on_error: OnError,
    ) -> Result<Admission, LimiterError> {
        let lease = next_lease();
        by_store!(self,
            store => Ok(match store.decide_leased(asks, lease) {
                Some(verdict) => Admission::Limited {
                    verdict,
                    source: Source::Store,
                    lease,
                },
                None => Admission::Unlimited,
            }),
            guarded => guarded.decide(asks, lease, on_error).await
        )
    }

    /// Gives back the concurrency leases `lease` holds in `asks` (those of other algorithms are
    /// skipped), in the store that granted them. Never fails: a lease that cannot be released
    /// runs out on its own.
    pub async fn release(&self, asks: &[Ask<'_>], lease: LeaseId, source: Source) {
        by_store!(self,
            store => store.release(asks, lease),
            guarded => guarded.release(asks, lease, source).await
        )
    }

    /// What `asks` would decide now, per limit (in the order asked), spending nothing.
    pub async fn peek(&self, asks: &[Ask<'_>]) -> Result<Vec<Decision>, LimiterError> {
        by_store!(self,
            store => Ok(store.peek(asks)),
            guarded => guarded.peek(asks).await
        )
    }

    /// Readies a remote store for its first decision (connects, loads its scripts or schema),
    /// waiting at most `within`: true when it is ready. The memory store always is.
    pub async fn prepare(&self, within: Duration) -> bool {
        by_store!(self, _store => true, guarded => guarded.prepare(within).await)
    }

    /// True when the store answers: `/readyz`.
    pub async fn is_ready(&self) -> bool {
        by_store!(self, _store => true, guarded => guarded.is_ready().await)
    }

    /// The in-process store (the fallback, for a remote store).
    pub fn memory(&self) -> &Arc<MemoryStore> {
        by_store!(self, store => store, guarded => guarded.local())
    }

    /// The guard's counters, when there is a remote store.
    /// The store's name for metric labels: `memory`, `redis` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Limiter::Memory(_) => "memory",
            Limiter::Redis(_) => "redis",
            Limiter::Postgres(_) => "postgres",
        }
    }

    pub fn guard_stats(&self) -> Option<&guard::GuardStats> {
        by_store!(self, _store => None, guarded => Some(guarded.stats()))
    }

    /// The breaker's state, when there is a remote store.
    pub fn breaker_state(&self) -> Option<guard::BreakerState> {
        by_store!(self, _store => None, guarded => Some(guarded.breaker_now()))
    }
}

/// A budget key that owns its bytes: for leases held past the request's borrow.
#[derive(Debug, Clone)]
struct OwnedKey {
    limit: Limit,
    budget: String,
    kind: KeyKind,
    value: Vec<u8>,
}

/// The concurrency leases one admitted request holds. Dropping it gives them back (at once on
/// the memory store, in a spawned task on a remote store), so the proxy ties it to the response body:
/// every way a request can end (body sent, upstream error or timeout, client gone, a panic
/// unwinding the task) drops it.
pub struct HeldLeases {
    limiter: Limiter,
    keys: Vec<OwnedKey>,
    lease: LeaseId,
    source: Source,
}

impl Limiter {
    /// The leases `admission` granted in `asks`, if it allowed and any ask is a concurrency limit.
    pub fn hold(&self, asks: &[Ask<'_>], admission: &Admission) -> Option<HeldLeases> {
        let Admission::Limited {
            verdict,
            source,
            lease,
        } = *admission
        else {
            return None;
        };
        if !verdict.allowed {
            return None;
        }
        let keys: Vec<OwnedKey> = asks
            .iter()
            .filter(|a| a.limit.algorithm().kind() == AlgorithmKind::Concurrency)
            .map(|a| OwnedKey {
                limit: *a.limit,
                budget: a.key.budget.to_string(),
                kind: a.key.kind,
                value: a.key.value.to_vec(),
            })
            .collect();
        (!keys.is_empty()).then(|| HeldLeases {
            limiter: self.clone(),
            keys,
            lease,
            source,
        })
    }
}

fn borrowed(keys: &[OwnedKey]) -> Vec<Ask<'_>> {
    keys.iter()
        .map(|k| Ask {
            limit: &k.limit,
            key: BudgetKey {
                budget: &k.budget,
                kind: k.kind,
                value: &k.value,
            },
        })
        .collect()
}

impl Drop for HeldLeases {
    fn drop(&mut self) {
        match &self.limiter {
            Limiter::Memory(store) => store.release(&borrowed(&self.keys), self.lease),
            Limiter::Redis(_) | Limiter::Postgres(_) => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return; // no runtime (process exit): the leases end on their own
                };
                let limiter = self.limiter.clone();
                let keys = std::mem::take(&mut self.keys);
                let (lease, source) = (self.lease, self.source);
                runtime.spawn(async move {
                    limiter.release(&borrowed(&keys), lease, source).await;
                });
            }
        }
    }
}

#[cfg(test)]
mod clock_tests {
    use super::*;

    #[test]
    fn an_anchored_clock_reads_the_wall_once_then_only_moves_forward_with_real_time() {
        // Anchored far from the real wall clock: what it reads is that anchor plus elapsed time,
        // whatever the system clock does meanwhile (a step back cannot stop it).
        let clock = AnchoredClock::starting_at(5_000_000);
        let first = clock.now_us();
        std::thread::sleep(Duration::from_millis(2));
        let second = clock.now_us();
        assert!((5_000_000..6_000_000).contains(&first), "{first}");
        // At least the 2 ms slept (sleep never returns early); the upper bound is loose because
        // a loaded machine can delay the thread.
        assert!(second >= first + 2_000, "{first} -> {second}");
        assert!(second < first + 5_000_000);
    }
}
