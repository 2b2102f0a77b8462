//! The deny cache: a budget that denied is not asked again until its retry instant; the cached
//! denial answers (with the store's clock offset, so the headers stay true) without a round trip.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::Mutex;

use super::super::key::Prehashed;
use super::super::{AlgorithmKind, Ask, Decision, Figures, Outcome, Verdict};

/// The most budget sets the deny cache remembers at once.
const DENY_CACHE_CAPACITY: usize = 100_000;
const DENY_CACHE_SHARDS: usize = 16;

/// Denials remembered until their retry instant, by the budget that denied.
///
/// Keyed by a 64-bit hash of a budget key under a per-process random seed: two budgets whose
/// hashes collide (about n²/2⁶⁵ for n remembered denials, ≈ 3·10⁻¹⁰ at the 100 000 held at
/// most) would share a denial until its retry instant.
pub(super) struct DenyCache {
    shards: Box<[Mutex<HashMap<u64, CachedDenial, Prehashed>>]>,
    hasher: RandomState,
    /// How many times units were given back to remembered budgets ([`DenyCache::refunded`]):
    /// a denial decided across one may be stale, and is not remembered.
    refunds: std::sync::atomic::AtomicU64,
}

#[derive(Clone, Copy)]
struct CachedDenial {
    /// Local time (µs) of the earliest retry that can pass.
    retry_at: u64,
    /// Local time (µs) by which the budget is fully restored.
    reset_at: u64,
    /// The store's time (Unix µs: Redis `TIME`, PostgreSQL's clock) less local time, when it
    /// denied: a cached verdict's `now_us` is on the store's clock, as the store's own verdicts
    /// are, so `X-RateLimit-Reset` is a Unix time whichever answered.
    store_offset: i64,
    /// The limit's decision when it denied.
    decision: Decision,
}

/// Whether a limit's denials may be remembered: not a concurrency limit's (see the module docs).
fn rememberable(ask: &Ask<'_>) -> bool {
    ask.limit.algorithm().kind() != AlgorithmKind::Concurrency && !ask.limit.is_settled()
}

impl DenyCache {
    pub(super) fn new() -> Self {
        DenyCache {
            shards: (0..DENY_CACHE_SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            hasher: RandomState::new(),
            refunds: Default::default(),
        }
    }

    /// The count of refunds so far, read before a decision's store call and handed to
    /// [`DenyCache::insert`] with its answer.
    pub(super) fn refunds(&self) -> u64 {
        self.refunds.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Units were given back to the budgets of `asks` (the store has them): their denials are
    /// forgotten, and a denial whose decision was in flight meanwhile is not remembered (the
    /// store may have decided it before the units came back).
    pub(super) fn refunded(&self, asks: &[Ask<'_>]) {
        let keys: Vec<_> = asks
            .iter()
            .filter(|a| rememberable(a))
            .map(|a| a.key)
            .collect();
        if keys.is_empty() {
            return;
        }
        self.refunds
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.forget(&keys);
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, CachedDenial, Prehashed>> {
        self.shards[(key >> 60) as usize % DENY_CACHE_SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A denial of `asks` at `now` from the budgets remembered as denying (the one whose retry
    /// comes last when several are), if any retry instant is still ahead.
    pub(super) fn get(&self, asks: &[Ask<'_>], now: u64) -> Option<Verdict> {
        let mut found: Option<(usize, CachedDenial)> = None;
        for (i, ask) in asks.iter().enumerate().filter(|(_, a)| rememberable(a)) {
            let key = ask.key.hash_with(&self.hasher);
            let mut shard = self.shard(key);
            let Some(&cached) = shard.get(&key) else {
                continue;
            };
            if now >= cached.retry_at {
                shard.remove(&key);
            } else if found.is_none_or(|(_, f)| cached.retry_at > f.retry_at) {
                found = Some((i, cached));
            }
        }
        let (index, cached) = found?;
        let d = cached.decision;
        let retry_after_us = cached.retry_at - now;
        let headline = Decision::deny(
            Figures {
                limit: d.limit,
                remaining: d.remaining,
                reset_after_us: cached.reset_at.saturating_sub(now),
            },
            retry_after_us,
        );
        let mut standings = crate::limiter::Standings::default();
        standings.set(index, crate::limiter::Standing::of(&headline));
        Some(Verdict {
            ruling: crate::limiter::Ruling {
                now_us: now.saturating_add_signed(cached.store_offset),
                headline,
                headline_index: index,
                outcome: Outcome::Denied { retry_after_us },
                denied: 1u16.checked_shl(index as u32).unwrap_or(0),
            },
            standings,
        })
    }

    /// Forgets the denials of the budgets `keys` (they were reset).
    pub(super) fn forget(&self, keys: &[super::super::BudgetKey<'_>]) {
        for key in keys {
            let key = key.hash_with(&self.hasher);
            self.shard(key).remove(&key);
        }
    }

    /// Remembers every budget of `asks` whose limit denied (`decisions`, in the same order), at
    /// local time `now`, which the store called `store_now`, unless units were given back
    /// since the decision began (`refunds` then: [`DenyCache::refunds`]).
    pub(super) fn insert(
        &self,
        asks: &[Ask<'_>],
        decisions: &[Decision],
        (now, store_now): (u64, u64),
        refunds: u64,
    ) {
        if self.refunds() != refunds {
            return;
        }
        let store_offset =
            (store_now as i128 - now as i128).clamp(i64::MIN.into(), i64::MAX.into()) as i64;
        let per_shard = DENY_CACHE_CAPACITY / DENY_CACHE_SHARDS;
        for (ask, decision) in asks.iter().zip(decisions) {
            if decision.allowed() || !rememberable(ask) {
                continue;
            }
            let key = ask.key.hash_with(&self.hasher);
            let mut shard = self.shard(key);
            if shard.len() >= per_shard {
                shard.retain(|_, d| d.retry_at > now);
                if shard.len() >= per_shard {
                    continue;
                }
            }
            shard.insert(
                key,
                CachedDenial {
                    retry_at: now + decision.retry_after_us(),
                    reset_at: now + decision.reset_after_us,
                    store_offset,
                    decision: *decision,
                },
            );
        }
    }
}
