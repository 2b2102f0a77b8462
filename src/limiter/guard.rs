//! What stands between a request and a remote store: the `on_error` policy, a circuit breaker,
//! and a deny cache.
//!
//! - **Timeout**: a decision waits at most `storage.timeout` for Redis; past it, `on_error`.
//! - **Circuit breaker**: after [`FAILURES_TO_OPEN`] failures in a row the breaker opens, and for
//!   [`COOL_DOWN`] no request asks Redis at all (an outage then costs no latency). Afterwards one
//!   request at a time probes Redis; the first success closes the breaker.
//! - **Deny cache**: an identity Redis denied is answered 429 locally until its `Retry-After`
//!   instant, with no round trip, so a flood from one client costs Redis nothing. This changes no
//!   decision: until that instant Redis would deny it too, and denied requests spend nothing.
//!   (Another instance's budget changes cannot shorten the wait; they can only lengthen it.)

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::memory::Prehashed;
use super::redis::RedisStore;
use super::{
    BudgetKey, Clock, Decided, Decision, Limit, LimiterError, MemoryStore, OnError, SystemClock,
    Verdict,
};

/// Failures in a row that open the breaker.
pub const FAILURES_TO_OPEN: u32 = 3;
/// How long an open breaker keeps requests away from Redis before probing it again.
pub const COOL_DOWN: Duration = Duration::from_millis(500);
/// The most identities the deny cache remembers at once.
const DENY_CACHE_CAPACITY: usize = 100_000;
const DENY_CACHE_SHARDS: usize = 16;

/// Counters of what the guard did, for metrics and tests.
#[derive(Debug, Default)]
pub struct GuardStats {
    /// Decisions Redis could not make (error or timeout), including probes.
    pub store_errors: AtomicU64,
    /// Decisions skipped because the breaker was open.
    pub breaker_skips: AtomicU64,
    /// Denials answered from the deny cache.
    pub deny_cache_hits: AtomicU64,
    /// Times the breaker opened.
    pub breaker_opened: AtomicU64,
}

/// A remote store behind a timeout, a circuit breaker and a deny cache, with a local fallback.
pub struct Guarded {
    store: RedisStore,
    timeout: Duration,
    breaker: Breaker,
    deny_cache: DenyCache,
    local: Arc<MemoryStore>,
    stats: GuardStats,
    last_warning: Mutex<Option<Instant>>,
}

impl Guarded {
    /// Guards `store`; `local` decides when the store fails and `on_error` is `local`.
    pub fn new(store: RedisStore, timeout: Duration, local: Arc<MemoryStore>) -> Self {
        Guarded {
            store,
            timeout,
            breaker: Breaker::default(),
            deny_cache: DenyCache::new(),
            local,
            stats: GuardStats::default(),
            last_warning: Mutex::new(None),
        }
    }

    /// The counters.
    pub fn stats(&self) -> &GuardStats {
        &self.stats
    }

    /// The breaker's state: `closed`, `open` or `half_open`.
    pub fn breaker_state(&self) -> &'static str {
        self.breaker.state(self.breaker.clock.now_us())
    }

    /// The in-process fallback store.
    pub fn local(&self) -> &Arc<MemoryStore> {
        &self.local
    }

    /// The remote store.
    pub fn store(&self) -> &RedisStore {
        &self.store
    }

    /// Decides, or applies `on_error` when the store cannot. `Ok(None)`: admit unlimited.
    pub async fn decide(
        &self,
        key: &BudgetKey<'_>,
        limits: &[Limit],
        on_error: OnError,
    ) -> Result<Decided, LimiterError> {
        let local_now = self.breaker.clock.now_us();
        let cache_key = self.deny_cache.key(key);
        if let Some(verdict) = self.deny_cache.get(cache_key, local_now) {
            self.stats.deny_cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Decided {
                verdict: Some(verdict),
                store_failed: false,
            });
        }
        if !self.breaker.allow(local_now) {
            self.stats.breaker_skips.fetch_add(1, Ordering::Relaxed);
            return self.fallback(
                key,
                limits,
                on_error,
                LimiterError::Unavailable("circuit breaker open".into()),
            );
        }
        let error = match tokio::time::timeout(self.timeout, self.store.decide(key, limits)).await {
            Ok(Ok(verdict)) => {
                self.breaker.success();
                if let Some(v) = verdict
                    && !v.allowed
                {
                    self.deny_cache
                        .insert(cache_key, &v, self.breaker.clock.now_us());
                }
                return Ok(Decided {
                    verdict,
                    store_failed: false,
                });
            }
            Ok(Err(e)) => e,
            Err(_) => LimiterError::Timeout(self.timeout),
        };
        self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
        if self.breaker.failure(self.breaker.clock.now_us()) {
            self.stats.breaker_opened.fetch_add(1, Ordering::Relaxed);
        }
        self.fallback(key, limits, on_error, error)
    }

    fn fallback(
        &self,
        key: &BudgetKey<'_>,
        limits: &[Limit],
        on_error: OnError,
        error: LimiterError,
    ) -> Result<Decided, LimiterError> {
        self.warn(&error, on_error);
        let verdict = match on_error {
            OnError::Allow => None,
            OnError::Deny => return Err(error),
            OnError::Local => self.local.decide(key, limits),
        };
        Ok(Decided {
            verdict,
            store_failed: true,
        })
    }

    /// Logs a store failure at most once a second.
    fn warn(&self, error: &LimiterError, on_error: OnError) {
        let mut last = self.last_warning.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            *last = Some(Instant::now());
            tracing::warn!(
                %error,
                policy = ?on_error,
                breaker = self.breaker_state(),
                errors_total = self.stats.store_errors.load(Ordering::Relaxed),
                "limiter store failed; applying on_error (this message is rate-limited to one a second)"
            );
        }
    }

    /// True when Redis answers a PING within the timeout.
    pub async fn is_ready(&self) -> bool {
        matches!(
            tokio::time::timeout(
                self.timeout.max(Duration::from_millis(200)),
                self.store.ping()
            )
            .await,
            Ok(Ok(()))
        )
    }
}

/// A consecutive-failure circuit breaker on the local clock.
#[derive(Default)]
struct Breaker {
    clock: SystemClock,
    failures: AtomicU32,
    /// 0 when closed; otherwise when the cool-down ends (µs).
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    fn state(&self, now: u64) -> &'static str {
        match self.open_until.load(Ordering::Acquire) {
            0 => "closed",
            until if now < until => "open",
            _ => "half_open",
        }
    }

    /// May this request ask the store? While half-open, only one probe at a time may.
    fn allow(&self, now: u64) -> bool {
        match self.open_until.load(Ordering::Acquire) {
            0 => true,
            until if now < until => false,
            _ => self
                .probing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok(),
        }
    }

    fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open_until.store(0, Ordering::Release);
        self.probing.store(false, Ordering::Release);
    }

    /// Records a failure; true when this failure opened (or re-opened) the breaker.
    fn failure(&self, now: u64) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let was_probing = self.probing.swap(false, Ordering::AcqRel);
        if failures >= FAILURES_TO_OPEN || was_probing {
            self.open_until
                .store(now + COOL_DOWN.as_micros() as u64, Ordering::Release);
            return true;
        }
        false
    }
}

/// Denials remembered until their retry instant, by budget key.
struct DenyCache {
    shards: Box<[Mutex<HashMap<u64, CachedDenial, Prehashed>>]>,
    hasher: RandomState,
}

#[derive(Clone, Copy)]
struct CachedDenial {
    /// Local time (µs) of the earliest retry that can pass.
    retry_at: u64,
    /// Local time (µs) by which the budget is fully restored.
    reset_at: u64,
    headline: Decision,
    headline_index: usize,
}

impl DenyCache {
    fn new() -> Self {
        DenyCache {
            shards: (0..DENY_CACHE_SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            hasher: RandomState::new(),
        }
    }

    fn key(&self, key: &BudgetKey<'_>) -> u64 {
        key.hash_with(&self.hasher)
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, CachedDenial, Prehashed>> {
        self.shards[(key >> 60) as usize % DENY_CACHE_SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The cached denial for `key`, re-timed to `now`, if its retry instant is still ahead.
    fn get(&self, key: u64, now: u64) -> Option<Verdict> {
        let mut shard = self.shard(key);
        let cached = *shard.get(&key)?;
        if now >= cached.retry_at {
            shard.remove(&key);
            return None;
        }
        Some(Verdict {
            now_us: now,
            headline: Decision {
                reset_after_us: cached.reset_at.saturating_sub(now),
                retry_after_us: cached.retry_at - now,
                ..cached.headline
            },
            headline_index: cached.headline_index,
            allowed: false,
            retry_after_us: cached.retry_at - now,
            delay_us: 0,
        })
    }

    fn insert(&self, key: u64, verdict: &Verdict, now: u64) {
        let per_shard = DENY_CACHE_CAPACITY / DENY_CACHE_SHARDS;
        let mut shard = self.shard(key);
        if shard.len() >= per_shard {
            shard.retain(|_, d| d.retry_at > now);
            if shard.len() >= per_shard {
                return;
            }
        }
        shard.insert(
            key,
            CachedDenial {
                retry_at: now + verdict.retry_after_us,
                reset_at: now + verdict.headline.reset_after_us,
                headline: verdict.headline,
                headline_index: verdict.headline_index,
            },
        );
    }
}
