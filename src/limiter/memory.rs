//! The embedded store: limiter state in this process, sharded so that concurrent requests for
//! different identities rarely meet on one lock.
//!
//! Memory: one entry per (route, identity) that has been seen and is not yet back to a full
//! budget, about 100 bytes plus 8 bytes per sliding-log timestamp. [`MemoryStore::sweep`] drops
//! entries whose state says nothing a fresh one would not (a full bucket, a past window), so the
//! map holds only identities active within their longest window. A million distinct identities
//! active at once cost roughly 100 MB; past `max_keys` the store stops tracking *new* identities
//! until sweeping makes room, and admits their requests unlimited (it fails open, and counts it),
//! because forgetting existing identities would hand the heaviest clients a fresh budget.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::algorithm::State;
use super::{Clock, Decision, Limit, Verdict};

const SHARDS: usize = 64;

/// Whose budget a request spends, as the stores see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetKey<'a> {
    /// The route's budget id: its name plus a fingerprint of its limits, so that a reload that
    /// changes a route's limits starts it afresh while unchanged routes keep their state.
    pub route: &'a str,
    /// `api_key`, `user_id` or `ip`.
    pub kind: &'static str,
    /// The identity's bytes (IP addresses as their octets).
    pub value: &'a [u8],
}

impl BudgetKey<'_> {
    /// A 64-bit hash of the key under `hasher` (a per-process random seed, so clients cannot
    /// aim collisions). Separators keep `("ab", "c")` and `("a", "bc")` apart.
    pub fn hash_with(&self, hasher: &RandomState) -> u64 {
        let mut h = hasher.build_hasher();
        h.write(self.route.as_bytes());
        h.write_u8(0xff);
        h.write(self.kind.as_bytes());
        h.write_u8(0xff);
        h.write(self.value);
        h.finish()
    }
}

/// The in-process limiter store.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Box<dyn Clock>,
    max_keys: usize,
    len: AtomicUsize,
    untracked: AtomicU64,
}

type Shard = HashMap<u64, Entry, Prehashed>;

/// A map hasher for keys that are already [`BudgetKey::hash_with`] outputs.
pub(crate) type Prehashed = BuildHasherDefault<PrehashedKey>;

struct Entry {
    states: Vec<State>,
    expires_at: u64,
}

/// Keys are already SipHash outputs under a per-process random seed: hash them no further.
#[derive(Default)]
pub(crate) struct PrehashedKey(u64);

impl Hasher for PrehashedKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl MemoryStore {
    /// An empty store reading time from `clock`, tracking at most `max_keys` identities.
    pub fn new(clock: impl Clock, max_keys: usize) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            clock: Box::new(clock),
            max_keys,
            len: AtomicUsize::new(0),
            untracked: AtomicU64::new(0),
        }
    }

    fn hash(&self, key: &BudgetKey<'_>) -> u64 {
        key.hash_with(&self.hasher)
    }

    /// Decides one request against all `limits`, all-or-nothing: if any limit denies, nothing is
    /// spent from the others. Returns `None` only when `limits` is empty.
    pub fn decide(&self, key: &BudgetKey<'_>, limits: &[Limit]) -> Option<Verdict> {
        let now = self.clock.now_us();
        self.decide_at(key, limits, now)
    }

    /// [`MemoryStore::decide`] at a given time: for the Redis fallback, and tests.
    pub fn decide_at(&self, key: &BudgetKey<'_>, limits: &[Limit], now: u64) -> Option<Verdict> {
        if limits.is_empty() {
            return None;
        }
        let hash = self.hash(key);
        let shard = &self.shards[(hash >> 58) as usize % SHARDS];
        // A poisoned lock means another request panicked mid-update; the state is still plain
        // data, so keep serving with it rather than failing every later request.
        let mut map = shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = match map.get_mut(&hash) {
            Some(entry) => entry,
            None => {
                if self.len.load(Ordering::Relaxed) >= self.max_keys {
                    drop(map);
                    self.untracked.fetch_add(1, Ordering::Relaxed);
                    return Some(Verdict::untracked(now, limits));
                }
                self.len.fetch_add(1, Ordering::Relaxed);
                map.entry(hash).or_insert_with(|| Entry {
                    states: limits.iter().map(|l| State::new(&l.algorithm)).collect(),
                    expires_at: 0,
                })
            }
        };
        if entry.states.len() != limits.len() {
            entry.states = limits.iter().map(|l| State::new(&l.algorithm)).collect();
        }
        let mut decisions = [Decision::EMPTY; 8];
        let mut many = Vec::new();
        let decisions: &mut [Decision] = if limits.len() <= decisions.len() {
            &mut decisions[..limits.len()]
        } else {
            many.resize(limits.len(), Decision::EMPTY);
            &mut many
        };
        for ((state, limit), slot) in entry
            .states
            .iter_mut()
            .zip(limits)
            .zip(decisions.iter_mut())
        {
            *slot = state.check(limit, now);
        }
        let verdict = Verdict::from_decisions(now, decisions)?;
        if verdict.allowed {
            for (state, limit) in entry.states.iter_mut().zip(limits) {
                state.commit(limit, now);
            }
        }
        entry.expires_at = entry
            .states
            .iter()
            .zip(limits)
            .map(|(s, l)| s.expires_at(l))
            .max()
            .unwrap_or(0);
        Some(verdict)
    }

    /// Drops every entry whose budget is fully restored. Returns how many were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_us();
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut map = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let before = map.len();
            map.retain(|_, entry| entry.expires_at > now);
            dropped += before - map.len();
        }
        self.len.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// How many identities the store tracks now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True when no identity is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many requests were admitted untracked because the store was full.
    pub fn untracked_total(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }
}

impl Decision {
    const EMPTY: Decision = Decision {
        allowed: true,
        limit: 0,
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
        delay_us: 0,
    };
}

impl Verdict {
    /// An admission the store could not track: full budget shown, nothing delayed.
    fn untracked(now_us: u64, limits: &[Limit]) -> Verdict {
        let limit = u64::from(
            limits
                .iter()
                .map(|l| l.algorithm.max_cost())
                .min()
                .unwrap_or(0),
        );
        let headline = Decision {
            limit,
            remaining: limit,
            ..Decision::EMPTY
        };
        Verdict {
            now_us,
            headline,
            headline_index: 0,
            allowed: true,
            retry_after_us: 0,
            delay_us: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::limiter::{Algorithm, ManualClock};

    const T0: u64 = 1_700_000_000_000_000;

    fn key(value: &[u8]) -> BudgetKey<'_> {
        BudgetKey {
            route: "r#0",
            kind: "api_key",
            value,
        }
    }

    fn token_bucket(capacity: u32, interval_us: u64) -> Limit {
        Limit {
            algorithm: Algorithm::TokenBucket {
                capacity: NonZeroU32::new(capacity).unwrap(),
                interval_us,
            },
            cost: 1,
        }
    }

    fn fixed_window(limit: u32, window_us: u64) -> Limit {
        Limit {
            algorithm: Algorithm::FixedWindow {
                limit: NonZeroU32::new(limit).unwrap(),
                window_us,
            },
            cost: 1,
        }
    }

    #[test]
    fn a_denying_limit_spends_nothing_from_the_others() {
        let store = MemoryStore::new(ManualClock::new_for_test(T0), 100);
        // A generous bucket and a tight window: once the window denies, the bucket must stay put.
        let limits = [token_bucket(10, 1_000_000), fixed_window(2, 3_600_000_000)];
        let remaining: Vec<_> = (0..5)
            .map(|_| store.decide(&key(b"k"), &limits).unwrap())
            .map(|v| (v.allowed, v.headline.remaining))
            .collect();
        assert_eq!(
            remaining,
            vec![(true, 1), (true, 0), (false, 0), (false, 0), (false, 0)]
        );
        // The bucket was spent twice, not five times: its theoretical arrival time moved 2 s.
        let hash = store.hash(&key(b"k"));
        let map = store.shards[(hash >> 58) as usize % SHARDS].lock().unwrap();
        assert_eq!(
            map[&hash].states[0],
            State::Gcra {
                tat: T0 + 2_000_000
            }
        );
    }

    #[test]
    fn the_headline_is_the_limit_with_the_fewest_remaining() {
        let store = MemoryStore::new(ManualClock::new_for_test(T0), 100);
        let limits = [token_bucket(10, 1_000_000), fixed_window(3, 60_000_000)];
        let v = store.decide(&key(b"k"), &limits).unwrap();
        assert_eq!((v.headline.limit, v.headline.remaining), (3, 2));
    }

    #[test]
    fn identities_and_routes_have_separate_budgets() {
        let store = MemoryStore::new(ManualClock::new_for_test(T0), 100);
        let limits = [token_bucket(1, 1_000_000)];
        assert!(store.decide(&key(b"a"), &limits).unwrap().allowed);
        assert!(!store.decide(&key(b"a"), &limits).unwrap().allowed);
        assert!(store.decide(&key(b"b"), &limits).unwrap().allowed);
        let other_kind = BudgetKey {
            kind: "user_id",
            ..key(b"a")
        };
        assert!(store.decide(&other_kind, &limits).unwrap().allowed);
        let other_route = BudgetKey {
            route: "r#1",
            ..key(b"a")
        };
        assert!(store.decide(&other_route, &limits).unwrap().allowed);
    }

    #[test]
    fn sweeping_forgets_full_budgets_only() {
        let clock = Arc::new(ManualClock::new_for_test(T0));
        let store = MemoryStore::new(clock.clone(), 100);
        store.decide(&key(b"short"), &[token_bucket(5, 1_000_000)]);
        store.decide(&key(b"long"), &[token_bucket(5, 60_000_000)]);
        assert_eq!(store.len(), 2);
        clock.advance(Duration::from_secs(2));
        assert_eq!(
            store.sweep(),
            1,
            "the one-second refill is complete, the minute one is not"
        );
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_full_store_admits_new_identities_untracked_and_counts_them() {
        let store = MemoryStore::new(ManualClock::new_for_test(T0), 2);
        let limits = [token_bucket(1, 1_000_000)];
        store.decide(&key(b"a"), &limits);
        store.decide(&key(b"b"), &limits);
        for _ in 0..3 {
            assert!(store.decide(&key(b"c"), &limits).unwrap().allowed);
        }
        assert_eq!(store.untracked_total(), 3);
        assert!(
            !store.decide(&key(b"a"), &limits).unwrap().allowed,
            "tracked identities keep their state"
        );
    }

    #[test]
    fn concurrent_requests_never_overspend_one_key() {
        let store = Arc::new(MemoryStore::new(ManualClock::new_for_test(T0), 100));
        let limits = [token_bucket(50, 1_000_000)];
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let store = store.clone();
                    s.spawn(move || {
                        (0..100)
                            .filter(|_| store.decide(&key(b"hot"), &limits).unwrap().allowed)
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            admitted, 50,
            "the clock stands still: exactly the capacity passes"
        );
    }
}
