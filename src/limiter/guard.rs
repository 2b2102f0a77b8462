//! What stands between a request and a remote store (Redis or PostgreSQL): the `on_error`
//! policy, a circuit breaker, a deny cache, and this instance's leases.
//!
//! - **Timeout**: a decision waits at most `storage.timeout` for the store; past it, `on_error`.
//! - **Circuit breaker** (`guard/breaker.rs`): after [`FAILURES_TO_OPEN`] failures in a row the
//!   breaker opens, and for [`COOL_DOWN`] no request asks the store at all (an outage then costs
//!   no latency). Afterwards one request at a time probes it; the first success closes the
//!   breaker. An error reply about
//!   one request's keys ([`LimiterError::Refused`]) is not a failure of the store: it follows
//!   `on_error` for that request and leaves the breaker alone.
//! - **Deny cache** (`guard/deny_cache.rs`): a budget whose limit denied is remembered until that limit's retry instant,
//!   and any request spending it meanwhile is answered 429 locally, with no round trip: a flood
//!   from one client costs the store nothing, and neither does a flood of ever-new API keys behind one
//!   IP (its `per: ip` budget denies) or of ever-new clients against a spent `per: route` cap. This
//!   changes no decision: until that instant the store would deny it too, since denied requests
//!   spend nothing and other requests (or instances) can only spend more, never less. Concurrency
//!   limits are not remembered: a slot frees when a request ends, which no clock predicts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use super::Store;
use super::owned_key::{OwnedKey, borrowed};
use super::wire::Call;

mod breaker;
mod control;
mod deny_cache;
mod settle_retry;

pub use settle_retry::SettleRetries;

use super::{
    Admission, Ask, Clock, Decision, LeaseId, LimiterError, LocalUs, MemoryStore, MonotonicClock,
    OnError, Source,
};
use breaker::Breaker;
pub use breaker::{BreakerState, COOL_DOWN, FAILURES_TO_OPEN};
use deny_cache::DenyCache;

/// How often a store failure is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(1);

/// Counters of what the guard did. They are Prometheus counters (shared handles): the binary
/// registers these very counters, so `/metrics` reads them with no copy.
#[derive(Debug, Default)]
pub struct GuardStats {
    /// Decisions the store could not make (error or timeout), including probes.
    pub store_errors: Counter,
    /// Decisions skipped because the breaker was open.
    pub breaker_skips: Counter,
    /// Denials answered from the deny cache.
    pub deny_cache_hits: Counter,
    /// Times the breaker opened.
    pub breaker_opened: Counter,
    /// Round trips to the store (a batch of decisions is one).
    pub store_calls: Counter,
    /// Leased units, by what became of them.
    pub leases: super::lease::LeaseStats,
}

/// Microseconds, saturating.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Where an answer that comes after the request gave up goes: what it granted is owed back
/// (see `Leases::owe`), given back with the budget's next call; and if the call never left,
/// what it was to give back is put back for the next.
fn owe_late(leases: &Arc<super::lease::Leases>, debts: super::lease::Debts) -> super::batch::Late {
    let leases = leases.clone();
    Box::new(move |reply| match reply {
        Some(reply) => leases.owe(&debts.slots, &reply),
        None => leases.restore(&debts),
    })
}

/// `late` (what becomes of a late answer for the leases, if any), also giving back the reserves
/// of the settled limits among `asks` when the late answer admitted: the request had given up
/// on it (failed open, or was refused), so nothing will settle it, and the store must not keep
/// what it spent.
fn with_reserves_given_back(
    late: Option<super::batch::Late>,
    asks: &[Ask<'_>],
    retries: &Arc<SettleRetries>,
) -> Option<super::batch::Late> {
    if !asks.iter().any(|a| a.limit.is_settled()) {
        return late;
    }
    let keys: Vec<OwnedKey> = asks
        .iter()
        .filter(|a| a.limit.is_settled())
        .map(OwnedKey::of)
        .collect();
    let retries = retries.clone();
    Some(Box::new(move |reply| {
        if let Some(reply) = &reply
            && reply.verdict.allowed()
        {
            let at = reply.verdict.now_us;
            let settlements = keys
                .iter()
                .map(|k| super::Settlement::of(u64::from(k.limit.cost()), 0, at))
                .collect();
            tracing::debug!("a late answer spent reserves nobody will settle: giving them back");
            retries.push(keys, settlements, Source::Store);
        }
        if let Some(late) = late {
            late(reply);
        }
    }))
}

/// Tries the settlements `guarded` queued again as they fall due, in a task that ends when
/// `guarded` is dropped (a reload that built another store). No runtime: nothing.
pub fn spawn_settle_retries(guarded: &Arc<Guarded>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(guarded);
    runtime.spawn(async move {
        loop {
            let Some(guarded) = weak.upgrade() else {
                return;
            };
            for retry in guarded.retries.take_due(tokio::time::Instant::now()) {
                let settled = {
                    let asks = borrowed(&retry.keys);
                    guarded
                        .settle(&asks, &retry.settlements, retry.source)
                        .await
                };
                match settled {
                    Ok(()) => tracing::info!("a settlement that had failed has been made"),
                    Err(_) => guarded.retries.again(retry),
                }
            }
            let retries = guarded.retries.clone();
            let next = retries.next_due();
            drop(guarded);
            let queued = retries.queued();
            // Wakes at the next due retry, when one is queued, and at least every second to see
            // whether the store is still in use.
            let wait = next.map_or(Duration::from_secs(1), |at| {
                at.saturating_duration_since(tokio::time::Instant::now())
                    .min(Duration::from_secs(1))
            });
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = queued => {}
            }
        }
    });
}

/// A remote store behind a timeout, a circuit breaker and a deny cache, with a local fallback.
/// Its intervals (cool-down, deny-cache expiry, log rate) run on `C`, a monotonic clock in
/// production, so a wall-clock step neither freezes nor skips them.
pub struct Guarded<C = MonotonicClock> {
    /// The store, whichever it is (Redis or PostgreSQL; a test's).
    store: Box<dyn Store>,
    /// `storage.timeout` in µs (a reload may change it).
    timeout_us: AtomicU64,
    clock: C,
    breaker: Breaker,
    deny_cache: DenyCache,
    local: Arc<MemoryStore>,
    stats: GuardStats,
    /// This instance's leases of shared budgets (`storage.leases`), if on (a reload may turn
    /// them on or off, or change their ttl: see [`Guarded::reconfigure`]).
    leases: arc_swap::ArcSwapOption<super::lease::Leases>,
    /// True when the store does not count its own round trips.
    count_calls: bool,
    /// When a store failure was last logged (µs on `clock`), 0 for never.
    last_warning: AtomicU64,
    /// Settlements to try again (see `guard/settle_retry.rs`).
    retries: Arc<SettleRetries>,
}

impl Guarded {
    /// Guards `store`; `local` decides when the store fails and `on_error` is `local`.
    pub fn new(store: Box<dyn Store>, timeout: Duration, local: Arc<MemoryStore>) -> Self {
        Guarded::with_clock(store, timeout, local, MonotonicClock::default())
    }
}

impl<C: Clock> Guarded<C> {
    /// [`Guarded::new`] on the given clock: for tests.
    pub fn with_clock(
        store: Box<dyn Store>,
        timeout: Duration,
        local: Arc<MemoryStore>,
        clock: C,
    ) -> Self {
        let stats = GuardStats::default();
        let count_calls = !store.count_calls(stats.store_calls.clone());
        Guarded {
            store,
            timeout_us: AtomicU64::new(micros(timeout)),
            clock,
            breaker: Breaker::default(),
            deny_cache: DenyCache::new(),
            local,
            stats,
            leases: arc_swap::ArcSwapOption::empty(),
            count_calls,
            last_warning: AtomicU64::new(0),
            retries: Arc::default(),
        }
    }

    /// This guard with leases of `ttl` (`storage.leases: auto`): budgets this instance spends
    /// fast are leased and spent here (see `lease.rs`).
    pub fn with_leases(self, ttl: Duration) -> Self {
        self.set_leases(Some(ttl));
        self
    }

    /// Applies a reloaded `storage` section: the decision timeout, batching, and leases (`None`:
    /// off). A changed lease ttl starts a new set of leases; the units the old ones hold lapse
    /// in the store when they end, as a stopped instance's would (at most one ttl).
    pub fn reconfigure(&self, timeout: Duration, batch: bool, lease_ttl: Option<Duration>) {
        self.timeout_us.store(micros(timeout), Ordering::Relaxed);
        self.store.set_batching(batch);
        let current = self.leases.load().as_ref().map(|l| l.ttl_us());
        if current != lease_ttl.map(micros) {
            self.set_leases(lease_ttl);
        }
        if let Some(leases) = self.leases.load().as_ref() {
            leases.set_timeout(micros(timeout));
        }
    }

    fn set_leases(&self, ttl: Option<Duration>) {
        self.leases.store(ttl.map(|ttl| {
            let leases = super::lease::Leases::new(micros(ttl), self.stats.leases.clone());
            leases.set_timeout(self.timeout_us.load(Ordering::Relaxed));
            Arc::new(leases)
        }));
    }

    /// How long a decision waits for the store (`storage.timeout`).
    pub fn timeout(&self) -> Duration {
        Duration::from_micros(self.timeout_us.load(Ordering::Relaxed))
    }

    /// The store's name for metric labels: `redis` or `postgres`.
    pub fn store_name(&self) -> &'static str {
        self.store.name()
    }

    /// The counters.
    pub fn stats(&self) -> &GuardStats {
        &self.stats
    }

    /// The breaker's state: `closed`, `open` or `half_open`.
    pub fn breaker_state(&self) -> &'static str {
        self.breaker_now().as_str()
    }

    /// The breaker's state now.
    pub fn breaker_now(&self) -> BreakerState {
        self.breaker.state(self.clock.now_us())
    }

    /// The in-process fallback store.
    pub fn local(&self) -> &Arc<MemoryStore> {
        &self.local
    }

    /// Decides, or applies `on_error` when the store cannot. `Err` only under `on_error: deny`.
    pub async fn decide(
        &self,
        asks: &[Ask<'_>],
        lease: LeaseId,
        on_error: OnError,
    ) -> Result<Admission, LimiterError> {
        match self.decide_here(asks, lease, on_error) {
            Here::Decided(decided) => decided,
            Here::AskTheStore(trip) => self.decide_remotely(asks, lease, on_error, trip).await,
        }
    }

    /// What can be decided without the store: nothing asked, a lease's units, the deny cache, an
    /// open breaker's fallback. Otherwise what the round trip ([`Guarded::decide_remotely`])
    /// needs. Split so that a caller can keep the round trip's state (the store call's future,
    /// the largest part of a decision's) out of its own future: `Limiter::decide` boxes it, and
    /// a decision made here moves and allocates none of it.
    pub fn decide_here(&self, asks: &[Ask<'_>], lease: LeaseId, on_error: OnError) -> Here {
        if asks.is_empty() {
            return Here::Decided(Ok(Admission::Unlimited));
        }
        let now = self.clock.now_us();
        // An Arc, not a borrowed guard: it is held across the store call.
        let leases = self.leases.load_full();
        // The leases' clock is this process' own (the breaker and deny cache read it raw).
        let local = LocalUs(now);
        if let Some(verdict) = leases.as_ref().and_then(|l| l.spend(asks, local)) {
            return Here::Decided(Ok(Admission::Limited {
                verdict,
                source: Source::Store,
                lease,
                round_trip: false,
            }));
        }
        if let Some(verdict) = self.deny_cache.get(asks, now)
            && !leases.as_ref().is_some_and(|l| l.owes(asks, local))
        {
            self.stats.deny_cache_hits.inc();
            return Here::Decided(Ok(Admission::Limited {
                verdict,
                source: Source::Store,
                lease,
                round_trip: false,
            }));
        }
        if !self.breaker.allow(now) {
            self.stats.breaker_skips.inc();
            return Here::Decided(self.fallback(
                asks,
                lease,
                on_error,
                LimiterError::unavailable("circuit breaker open"),
            ));
        }
        Here::AskTheStore(RoundTrip { leases, local })
    }

    /// The store's decision (a round trip), after [`Guarded::decide_here`] found it needed:
    /// leases granted or owed, the deny cache filled, the breaker told; `on_error` when the
    /// store fails or takes longer than the timeout.
    pub async fn decide_remotely(
        &self,
        asks: &[Ask<'_>],
        lease: LeaseId,
        on_error: OnError,
        trip: RoundTrip,
    ) -> Result<Admission, LimiterError> {
        let RoundTrip { leases, local } = trip;
        let (wants, late) = match leases.as_ref() {
            Some(leases) => {
                let (wants, debts) = leases.wants_taking(asks, local);
                (wants, Some(owe_late(leases, debts)))
            }
            None => (Vec::new(), None),
        };
        let late = with_reserves_given_back(late, asks, &self.retries);
        let timeout = self.timeout();
        if self.count_calls {
            self.stats.store_calls.inc();
        }
        let refunds = self.deny_cache.refunds();
        let decided = self
            .store
            .invoke(asks, Call::Decide { lease }, &wants, late);
        let error = match tokio::time::timeout(timeout, decided).await {
            Ok(Ok(reply)) => {
                self.breaker.success();
                let verdict = reply.verdict;
                if !verdict.allowed() {
                    let at = (self.clock.now_us(), verdict.now_us);
                    self.deny_cache.insert(asks, &reply.decisions, at, refunds);
                } else if let Some(leases) = leases.as_ref()
                    && !reply.leased.is_empty()
                {
                    // Timed from before the call: see lease.rs, "Whose clock".
                    leases.grant(asks, &reply, local);
                }
                return Ok(Admission::Limited {
                    verdict,
                    source: Source::Store,
                    lease,
                    round_trip: true,
                });
            }
            Ok(Err(e)) => e,
            Err(_) => LimiterError::Timeout(timeout),
        };
        self.stats.store_errors.inc();
        match error.fault() {
            // The store answered: it is healthy, whatever this request's keys hold.
            super::Fault::Keys => self.breaker.success(),
            super::Fault::Store => {
                self.store.after_failure();
                if self.breaker.failure(self.clock.now_us()) {
                    self.stats.breaker_opened.inc();
                }
            }
        }
        self.fallback(asks, lease, on_error, error)
    }

    /// Gives back the concurrency leases named `lease`, in the store that granted them. A
    /// failure is only logged at debug level: the lease ends on its own.
    pub async fn release(&self, asks: &[Ask<'_>], lease: LeaseId, source: Source) {
        match source {
            Source::Fallback => self.local.release(asks, lease),
            Source::Store => {
                let timeout = self.timeout();
                let released = tokio::time::timeout(timeout, self.store.release(asks, lease));
                if let Ok(Err(e)) | Err(e) =
                    released.await.map_err(|_| LimiterError::Timeout(timeout))
                {
                    tracing::debug!(error = %e, "lease release failed; the lease will end on its own");
                }
            }
        }
    }

    /// Extends the concurrency leases named `lease`, in the store that granted them. A failure
    /// is logged at debug level: the next renewal tries again, and a lease never renewed ends
    /// on its own.
    pub async fn renew(&self, asks: &[Ask<'_>], lease: LeaseId, source: Source) {
        match source {
            Source::Fallback => self.local.renew(asks, lease),
            Source::Store => {
                let timeout = self.timeout();
                let renewed = tokio::time::timeout(timeout, self.store.renew(asks, lease));
                if let Ok(Err(e)) | Err(e) =
                    renewed.await.map_err(|_| LimiterError::Timeout(timeout))
                {
                    tracing::debug!(error = %e, "lease renewal failed; the next one tries again");
                }
            }
        }
    }

    /// Queues settlements that could not be made, to be tried again (see
    /// [`spawn_settle_retries`]).
    pub(crate) fn retry_settlement(
        &self,
        keys: Vec<OwnedKey>,
        settlements: Vec<super::Settlement>,
        source: Source,
    ) {
        self.retries.push(keys, settlements, source);
    }

    /// The settlements waiting to be tried again.
    pub fn settle_retries(&self) -> &SettleRetries {
        &self.retries
    }

    /// Settles reservations in the store that decided them (`source`), once: `Err` when the
    /// store failed or timed out (the caller queues it with `Guarded::retry_settlement`).
    pub async fn settle(
        &self,
        asks: &[Ask<'_>],
        settlements: &[super::Settlement],
        source: Source,
    ) -> Result<(), LimiterError> {
        match source {
            Source::Fallback => self.local.settle(asks, settlements),
            Source::Store => {
                let timeout = self.timeout();
                tokio::time::timeout(timeout, self.store.settle(asks, settlements))
                    .await
                    .map_err(|_| LimiterError::Timeout(timeout))??
            }
        }
        // A budget given units back no longer denies as it did: its cached denial goes once the
        // store has them, and so does one decided meanwhile (see `DenyCache::refunded`).
        let refunded: Vec<Ask<'_>> = (asks.iter().zip(settlements))
            .filter(|(_, s)| s.refund > 0)
            .map(|(ask, _)| *ask)
            .collect();
        self.deny_cache.refunded(&refunded);
        Ok(())
    }

    fn fallback(
        &self,
        asks: &[Ask<'_>],
        lease: LeaseId,
        on_error: OnError,
        error: LimiterError,
    ) -> Result<Admission, LimiterError> {
        self.warn(&error, on_error);
        match on_error {
            OnError::Allow => Ok(Admission::FailedOpen),
            OnError::Deny => Err(error),
            OnError::Local => Ok(match self.local.decide_leased(asks, lease) {
                Some(verdict) => Admission::Limited {
                    verdict,
                    source: Source::Fallback,
                    lease,
                    round_trip: false,
                },
                None => Admission::FailedOpen,
            }),
        }
    }

    /// Logs a store failure at most once per [`WARN_EVERY`].
    fn warn(&self, error: &LimiterError, on_error: OnError) {
        let now = self.clock.now_us();
        let last = self.last_warning.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_micros() as u64;
        if due
            && self
                .last_warning
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                %error,
                policy = ?on_error,
                breaker = self.breaker_state(),
                errors_total = self.stats.store_errors.get(),
                "limiter store failed; applying on_error (this message is rate-limited to one a second)"
            );
        }
    }

    /// What `asks` would decide now, per limit, spending nothing, within the timeout.
    pub async fn peek(&self, asks: &[Ask<'_>]) -> Result<Vec<Decision>, LimiterError> {
        let timeout = self.timeout();
        tokio::time::timeout(timeout, self.store.peek(asks))
            .await
            .map_err(|_| LimiterError::Timeout(timeout))?
    }

    /// Readies the store for its first decision ([`Store::prepare`]), waiting at most
    /// `within`; true when it is ready.
    pub async fn prepare(&self, within: Duration) -> bool {
        match tokio::time::timeout(within, self.store.prepare()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the limiter store is not ready");
                false
            }
            Err(_) => {
                tracing::warn!(waited = ?within, "the limiter store is not ready");
                false
            }
        }
    }

    /// True when the store answers a PING within the timeout (at least 200 ms).
    pub async fn is_ready(&self) -> bool {
        matches!(
            tokio::time::timeout(
                self.timeout().max(Duration::from_millis(200)),
                self.store.ping()
            )
            .await,
            Ok(Ok(()))
        )
    }
}

/// What [`Guarded::decide_here`] found.
#[allow(
    clippy::large_enum_variant,
    reason = "returned and matched at once, never stored: boxing the decision would cost the allocation this split saves"
)]
pub enum Here {
    /// Decided without the store (or by `on_error` while the breaker is open).
    Decided(Result<Admission, LimiterError>),
    /// The store must be asked: [`Guarded::decide_remotely`] with this.
    AskTheStore(RoundTrip),
}

/// What a round trip carries over from [`Guarded::decide_here`]: the leases in force when it
/// looked, and the time it looked at.
pub struct RoundTrip {
    leases: Option<Arc<super::lease::Leases>>,
    local: LocalUs,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU8;

    use super::*;
    use crate::limiter::StoreCall;
    use crate::limiter::wire::Reply;
    use crate::limiter::{Algorithm, BudgetKey, KeyKind, Limit, ManualClock};

    const T0: u64 = 1_700_000_000_000_000;

    /// What the scripted store does when asked.
    const ANSWER: u8 = 0;
    const FAIL: u8 = 1;
    const HANG: u8 = 2;
    const REFUSE: u8 = 3;

    /// A remote store that answers from its own in-process state, fails, or never answers, as the
    /// test says, and counts how often it was asked.
    struct Scripted {
        mode: AtomicU8,
        calls: AtomicU64,
        state: MemoryStore,
    }

    impl Scripted {
        fn new() -> Self {
            Scripted {
                mode: AtomicU8::new(ANSWER),
                calls: AtomicU64::new(0),
                state: MemoryStore::new(ManualClock::new(T0), 100),
            }
        }
    }

    impl Store for Arc<Scripted> {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn reset<'a>(&'a self, _asks: &'a [Ask<'a>]) -> StoreCall<'a, ()> {
            Box::pin(async move { Ok(()) })
        }
        fn release<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()> {
            Box::pin(async move {
                self.state.release(asks, lease);
                Ok(())
            })
        }

        fn renew<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()> {
            Box::pin(async move {
                self.state.renew(asks, lease);
                Ok(())
            })
        }

        fn settle_at<'a>(
            &'a self,
            asks: &'a [Ask<'a>],
            settlements: &'a [crate::limiter::Settlement],
            _now_us: Option<u64>,
        ) -> StoreCall<'a, ()> {
            Box::pin(async move {
                self.state.settle_at(asks, settlements, T0);
                Ok(())
            })
        }

        fn invoke<'a>(
            &'a self,
            asks: &'a [Ask<'a>],
            call: crate::limiter::wire::Call,
            _wants: &'a [crate::limiter::lease::LeaseAsk],
            _late: Option<crate::limiter::batch::Late>,
        ) -> StoreCall<'a, Reply> {
            Box::pin(async move {
                use crate::limiter::wire::Call;
                let Some(lease) = call.lease() else {
                    // A peek: what the state would decide, spending nothing.
                    let decisions = self.state.peek(asks);
                    let verdict = crate::limiter::Verdict::from_decisions(T0, &decisions)
                        .ok_or_else(|| LimiterError::protocol("no asks"))?;
                    return Ok(Reply {
                        verdict,
                        decisions,
                        leased: Vec::new(),
                    });
                };
                debug_assert!(matches!(call, Call::Decide { .. }));
                self.calls.fetch_add(1, Ordering::SeqCst);
                match self.mode.load(Ordering::SeqCst) {
                    FAIL => Err(LimiterError::unavailable("scripted failure")),
                    REFUSE => Err(LimiterError::refused("WRONGTYPE scripted")),
                    HANG => std::future::pending().await,
                    _ => {
                        let mut decisions = [Decision::EMPTY; crate::limiter::MAX_LIMITS];
                        // The store's own clock stands still at T0 (only the guard's moves).
                        let verdict = self
                            .state
                            .decide_into(asks, T0, lease, &mut decisions)
                            .ok_or_else(|| LimiterError::protocol("no asks"))?;
                        Ok(Reply {
                            verdict,
                            decisions: decisions[..asks.len()].to_vec(),
                            leased: Vec::new(),
                        })
                    }
                }
            })
        }

        fn ping(&self) -> StoreCall<'_, ()> {
            Box::pin(async move {
                match self.mode.load(Ordering::SeqCst) {
                    ANSWER => Ok(()),
                    _ => Err(LimiterError::unavailable("scripted failure")),
                }
            })
        }
    }

    struct Fixture {
        store: Arc<Scripted>,
        clock: Arc<ManualClock>,
        guard: Guarded<Arc<ManualClock>>,
        limit: Limit,
    }

    impl Fixture {
        /// A guard over a scripted store whose one limit is a token bucket of 1 at 1/s.
        fn new() -> Self {
            let store = Arc::new(Scripted::new());
            let clock = Arc::new(ManualClock::new(1_000_000));
            let local = Arc::new(MemoryStore::new(ManualClock::new(T0), 100));
            let guard = Guarded::with_clock(
                Box::new(store.clone()),
                Duration::from_millis(50),
                local,
                clock.clone(),
            );
            Fixture {
                store,
                clock,
                guard,
                limit: Limit::of(Algorithm::token_bucket(1, 1.0).unwrap()),
            }
        }

        /// The fixture's one ask: its limit, for one address.
        fn ask(&self) -> Ask<'_> {
            Ask {
                limit: &self.limit,
                key: BudgetKey {
                    budget: "r#0",
                    kind: KeyKind::Ip,
                    value: b"\x7f\0\0\x01",
                },
            }
        }

        async fn decide(&self, on_error: OnError) -> Result<Admission, LimiterError> {
            self.guard.decide(&[self.ask()], 7, on_error).await
        }

        /// Whether a decision (failing open) admits.
        async fn allows(&self) -> bool {
            let admission = self.decide(OnError::Allow).await.unwrap();
            admission.verdict().unwrap().allowed()
        }

        fn set(&self, mode: u8) {
            self.store.mode.store(mode, Ordering::SeqCst);
        }

        fn calls(&self) -> u64 {
            self.store.calls.load(Ordering::SeqCst)
        }

        fn stat(&self, counter: &Counter) -> u64 {
            counter.get()
        }
    }

    #[tokio::test]
    async fn the_breaker_opens_after_consecutive_failures_and_then_spares_the_store() {
        let f = Fixture::new();
        f.set(FAIL);
        for _ in 0..FAILURES_TO_OPEN {
            assert_eq!(
                f.decide(OnError::Allow).await.unwrap(),
                Admission::FailedOpen
            );
        }
        assert_eq!(f.guard.breaker_state(), "open");
        assert_eq!(f.stat(&f.guard.stats().breaker_opened), 1);
        assert_eq!(f.stat(&f.guard.stats().store_errors), 3);
        // Open: the store is not asked at all.
        assert_eq!(
            f.decide(OnError::Allow).await.unwrap(),
            Admission::FailedOpen
        );
        assert_eq!(f.calls(), 3);
        assert_eq!(f.stat(&f.guard.stats().breaker_skips), 1);
    }

    #[tokio::test]
    async fn a_success_resets_the_failure_count() {
        let f = Fixture::new();
        f.set(FAIL);
        f.decide(OnError::Allow).await.unwrap();
        f.decide(OnError::Allow).await.unwrap();
        f.set(ANSWER);
        f.decide(OnError::Allow).await.unwrap();
        f.set(FAIL);
        f.decide(OnError::Allow).await.unwrap();
        f.decide(OnError::Allow).await.unwrap();
        assert_eq!(f.guard.breaker_state(), "closed", "two in a row, not three");
    }

    #[tokio::test]
    async fn after_the_cool_down_a_failed_probe_reopens_and_a_good_one_closes() {
        let f = Fixture::new();
        f.set(FAIL);
        for _ in 0..FAILURES_TO_OPEN {
            f.decide(OnError::Allow).await.unwrap();
        }
        f.clock.advance(COOL_DOWN - Duration::from_micros(1));
        assert_eq!(f.guard.breaker_state(), "open", "one µs before the end");
        f.clock.advance(Duration::from_micros(1));
        assert_eq!(f.guard.breaker_state(), "half_open");
        // The probe fails: open again for a whole cool-down.
        f.decide(OnError::Allow).await.unwrap();
        assert_eq!(f.calls(), 4);
        assert_eq!(f.guard.breaker_state(), "open");
        assert_eq!(f.stat(&f.guard.stats().breaker_opened), 2);
        // The next probe succeeds: closed, and the store decides again.
        f.clock.advance(COOL_DOWN);
        f.set(ANSWER);
        let admission = f.decide(OnError::Allow).await.unwrap();
        assert!(
            matches!(admission, Admission::Limited { source: Source::Store, verdict, .. } if verdict.allowed())
        );
        assert_eq!(f.guard.breaker_state(), "closed");
    }

    #[test]
    fn a_half_open_breaker_lets_one_probe_through_at_a_time() {
        let breaker = Breaker::default();
        for _ in 0..FAILURES_TO_OPEN {
            breaker.failure(1_000);
        }
        let after = 1_000 + COOL_DOWN.as_micros() as u64;
        assert!(!breaker.allow(after - 1), "still cooling down");
        assert!(breaker.allow(after), "the probe");
        assert!(
            !breaker.allow(after),
            "a second request while the probe is out"
        );
        breaker.success();
        assert!(
            breaker.allow(after) && breaker.allow(after),
            "closed: everyone"
        );
    }

    /// Units given back (a refund: an abandoned request's, the service's `is_negative_hits`)
    /// make a budget that denied admit again: its cached denial is forgotten once the store has
    /// them, so the next request asks the store and is admitted with the unit given back.
    #[tokio::test]
    async fn a_refund_forgets_the_budget_s_cached_denial() {
        let f = Fixture::new();
        assert_eq!(
            [f.allows().await, f.allows().await, f.allows().await],
            [true, false, false]
        );
        assert_eq!(f.calls(), 2, "the third was the deny cache's");
        let asks = [f.ask()];
        let refund = [crate::limiter::Settlement::of(1, 0, T0)];
        f.guard.settle(&asks, &refund, Source::Store).await.unwrap();
        let again = f.decide(OnError::Allow).await.unwrap();
        assert!(
            again.verdict().unwrap().allowed(),
            "the unit given back admits"
        );
        assert_eq!(f.calls(), 3, "the store was asked");
    }

    #[tokio::test]
    async fn the_deny_cache_answers_until_the_retry_instant_without_asking_the_store() {
        let f = Fixture::new();
        assert!(f.allows().await);
        let denied = *f.decide(OnError::Allow).await.unwrap().verdict().unwrap();
        assert!(!denied.allowed());
        assert_eq!(denied.retry_after_us(), 1_000_000);
        assert_eq!(f.calls(), 2);
        // Half way to the retry instant: answered locally, with the wait counted down.
        f.clock.advance(Duration::from_millis(500));
        let cached = *f.decide(OnError::Allow).await.unwrap().verdict().unwrap();
        assert!(!cached.allowed());
        assert_eq!(cached.retry_after_us(), 500_000);
        // On the store's clock, as the store's own answer was: the budget is full again at the
        // same instant whichever answered (`X-RateLimit-Reset` is a Unix time from either).
        assert_eq!(
            cached.now_us + cached.headline.reset_after_us,
            denied.now_us + denied.headline.reset_after_us
        );
        assert_eq!(cached.now_us, denied.now_us + 500_000);
        assert_eq!(f.calls(), 2, "the store was not asked");
        assert_eq!(f.stat(&f.guard.stats().deny_cache_hits), 1);
        // At the retry instant the entry is gone and the store is asked again.
        f.clock.advance(Duration::from_millis(500));
        f.decide(OnError::Allow).await.unwrap();
        assert_eq!(f.calls(), 3);
    }

    /// The asks of one request from `client`: its own bucket of 100 and a route-wide cap.
    fn route_asks<'a>(own: &'a Limit, cap: &'a Limit, client: &'a [u8]) -> [Ask<'a>; 2] {
        [
            Ask {
                limit: own,
                key: BudgetKey {
                    budget: "r#0",
                    kind: KeyKind::ApiKey,
                    value: client,
                },
            },
            Ask {
                limit: cap,
                key: BudgetKey {
                    budget: "r#1",
                    kind: KeyKind::Route,
                    value: b"",
                },
            },
        ]
    }

    #[tokio::test]
    async fn a_spent_shared_budget_turns_away_new_clients_without_asking_the_store() {
        let f = Fixture::new();
        let own = Limit::of(Algorithm::token_bucket(100, 1.0).unwrap());
        let cap = Limit::of(Algorithm::fixed_window(1, Duration::from_secs(3600)).unwrap());
        let first = f
            .guard
            .decide(&route_asks(&own, &cap, b"key-0"), 1, OnError::Allow)
            .await
            .unwrap();
        assert!(first.verdict().unwrap().allowed());
        let denied = *f
            .guard
            .decide(&route_asks(&own, &cap, b"key-1"), 2, OnError::Allow)
            .await
            .unwrap()
            .verdict()
            .unwrap();
        assert!(!denied.allowed());
        assert_eq!(f.calls(), 2);
        // A flood of keys never seen before: the cap's denial answers each, locally, with the
        // cap's figures as the headline.
        for n in 2..50 {
            let client = format!("key-{n}");
            let v = *f
                .guard
                .decide(
                    &route_asks(&own, &cap, client.as_bytes()),
                    n,
                    OnError::Allow,
                )
                .await
                .unwrap()
                .verdict()
                .unwrap();
            assert!(!v.allowed());
            assert_eq!(v.headline_index, 1);
            assert_eq!(v.headline.limit, 1);
            assert_eq!(v.retry_after_us(), denied.retry_after_us());
        }
        assert_eq!(f.calls(), 2, "the store was not asked for the flood");
        // A request that does not spend the capped budget is not affected by its denial, and the
        // clients' own budgets, which allowed, were not remembered as denying.
        let elsewhere = [route_asks(&own, &cap, b"key-7")[0]];
        let v = f
            .guard
            .decide(&elsewhere, 99, OnError::Allow)
            .await
            .unwrap();
        assert!(v.verdict().unwrap().allowed());
        assert_eq!(f.calls(), 3);
    }

    #[tokio::test]
    async fn a_concurrency_denial_is_not_remembered() {
        let f = Fixture::new();
        let slots = Limit::of(Algorithm::concurrency(1, Duration::from_secs(60)).unwrap());
        let asks = [Ask {
            limit: &slots,
            key: BudgetKey {
                budget: "r#0",
                kind: KeyKind::Route,
                value: b"",
            },
        }];
        assert!(
            f.guard
                .decide(&asks, 1, OnError::Allow)
                .await
                .unwrap()
                .verdict()
                .unwrap()
                .allowed()
        );
        for lease in 2..5 {
            let v = f.guard.decide(&asks, lease, OnError::Allow).await.unwrap();
            assert!(!v.verdict().unwrap().allowed());
        }
        assert_eq!(
            f.calls(),
            4,
            "each denial asked the store: a slot may free at any time"
        );
        // The slot freed: the next request is admitted at once.
        f.guard.release(&asks, 1, Source::Store).await;
        let v = f.guard.decide(&asks, 9, OnError::Allow).await.unwrap();
        assert!(v.verdict().unwrap().allowed());
    }

    #[tokio::test]
    async fn each_on_error_policy_answers_a_failure_its_own_way() {
        let f = Fixture::new();
        f.set(FAIL);
        assert_eq!(
            f.decide(OnError::Allow).await.unwrap(),
            Admission::FailedOpen
        );
        assert!(matches!(
            f.decide(OnError::Deny).await,
            Err(LimiterError::Unavailable(_))
        ));
        // Local: the in-process store decides, and keeps limiting (capacity 1).
        let local = f.decide(OnError::Local).await.unwrap();
        assert!(local.store_failed());
        assert!(
            matches!(local, Admission::Limited { source: Source::Fallback, verdict, .. } if verdict.allowed())
        );
        let again = f.decide(OnError::Local).await.unwrap();
        assert!(
            !again.verdict().unwrap().allowed(),
            "the local budget is spent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_never_answers_is_abandoned_at_the_timeout() {
        let f = Fixture::new();
        f.set(HANG);
        let started = tokio::time::Instant::now();
        assert!(matches!(
            f.decide(OnError::Deny).await,
            Err(LimiterError::Timeout(_))
        ));
        // Paused time advances only through timers: exactly the 50 ms budget passed.
        assert_eq!(started.elapsed(), Duration::from_millis(50));
        assert_eq!(f.stat(&f.guard.stats().store_errors), 1);
    }

    #[tokio::test]
    async fn errors_about_one_requests_keys_never_open_the_breaker() {
        let f = Fixture::new();
        f.set(REFUSE);
        for _ in 0..10 {
            assert!(matches!(
                f.decide(OnError::Deny).await,
                Err(LimiterError::Refused(_))
            ));
        }
        assert_eq!(f.guard.breaker_state(), "closed");
        assert_eq!(f.stat(&f.guard.stats().breaker_opened), 0);
        assert_eq!(
            f.stat(&f.guard.stats().store_errors),
            10,
            "still counted as errors"
        );
        assert_eq!(f.calls(), 10, "every request still asked the store");
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_follows_the_store() {
        let f = Fixture::new();
        assert!(f.guard.is_ready().await);
        f.set(FAIL);
        assert!(!f.guard.is_ready().await);
    }
}
