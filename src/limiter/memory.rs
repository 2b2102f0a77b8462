//! The embedded store: limiter state in this process, sharded so that concurrent requests for
//! different budgets rarely meet on one lock.
//!
//! One entry per budget (a limit of a route × a client value) that has been seen and is not yet
//! back to full: about 100 bytes plus 8 bytes per sliding-log timestamp. [`MemoryStore::sweep`]
//! drops entries whose state says nothing a fresh one would not (a full bucket, a past window), so
//! the map holds only budgets active within their longest window. A million budgets active at
//! once cost roughly 100 MB.
//!
//! **Past `max_keys`** the store stops tracking *new* budgets until sweeping makes room. A budget
//! it cannot track is replaced by its limit's **overflow budget**, one per limit and always
//! tracked, which every untracked client of that limit shares: a client rotating identities past
//! the cap is still limited (together with the others, so a full table errs towards denying),
//! and every budget already tracked keeps deciding as before. Each such request is counted in
//! `floodgate_memory_untracked_admissions_total`. Forgetting existing budgets instead would hand
//! the heaviest clients a fresh one.
//!
//! **Approximation**: entries are keyed by a 64-bit SipHash of the budget key under a per-process
//! random seed, not by the key itself. Two budgets whose hashes collide share one entry. With a
//! million live budgets the chance that any two collide is about n²/2⁶⁵ ≈ 3·10⁻⁸; a client
//! cannot aim for a collision without the seed.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::algorithm::State;
use super::batch::Late;
use super::key::Prehashed;
use super::lease::LeaseAsk;
use super::store::{Store, StoreCall, answered};
use super::wire::{Call, Reply};
use super::{
    AlgorithmKind, Ask, BudgetKey, Clock, Decision, LeaseId, Limit, LimiterError, MAX_LIMITS,
    Settlement, Verdict,
};

const SHARDS: usize = 64;

/// The client value of a limit's overflow budget: what every budget the full table cannot track
/// shares. No client can send it (header values cannot hold a NUL, addresses are 4 or 16 bytes).
const OVERFLOW: &[u8] = b"\0overflow";

/// A first attempt at a decision: made, or the table was full for these asks.
enum Attempt {
    Decided(Option<Verdict>),
    Full([bool; MAX_LIMITS]),
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

struct Entry {
    state: State,
    expires_at: u64,
}

fn shard_of(hash: u64) -> usize {
    (hash >> 58) as usize % SHARDS
}

impl MemoryStore {
    /// An empty store reading time from `clock`, tracking at most `max_keys` budgets.
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

    /// Sweeps the whole table every `every`, one shard at a time spread evenly over it, for as
    /// long as the store is alive: no request ever waits on more than one shard's sweep, and the
    /// work never comes in one burst.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) {
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every / SHARDS as u32);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            for shard in (0..SHARDS).cycle() {
                tick.tick().await;
                let Some(store) = store.upgrade() else { return };
                let _ = tokio::task::spawn_blocking(move || store.sweep_shard(shard)).await;
            }
        });
    }

    /// Drops the full budgets of one shard. Returns how many were dropped.
    pub fn sweep_shard(&self, shard: usize) -> usize {
        let now = self.clock.now_us();
        let mut map = self.shards[shard % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let before = map.len();
        map.retain(|_, entry| entry.expires_at > now);
        let dropped = before - map.len();
        drop(map);
        self.len.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// Decides one request against all `asks`, all-or-nothing: if any limit denies, nothing is
    /// spent from any budget. Returns `None` only when `asks` is empty.
    pub fn decide(&self, asks: &[Ask<'_>]) -> Option<Verdict> {
        self.decide_leased(asks, 0)
    }

    /// [`MemoryStore::decide`], naming the request's concurrency leases `lease`.
    pub fn decide_leased(&self, asks: &[Ask<'_>], lease: LeaseId) -> Option<Verdict> {
        let now = self.clock.now_us();
        self.decide_at(asks, now, lease)
    }

    /// [`MemoryStore::decide_leased`] at a given time: for replay and tests.
    pub fn decide_at(&self, asks: &[Ask<'_>], now: u64, lease: LeaseId) -> Option<Verdict> {
        self.decide_into(asks, now, lease, &mut [Decision::EMPTY; MAX_LIMITS])
    }

    /// [`MemoryStore::decide_at`], leaving each limit's own decision in `decisions` (in the order
    /// asked): for replay, which counts denials per limit.
    pub fn decide_into(
        &self,
        asks: &[Ask<'_>],
        now: u64,
        lease: LeaseId,
        decisions: &mut [Decision; MAX_LIMITS],
    ) -> Option<Verdict> {
        match self.try_decide(asks, now, lease, decisions, &[false; MAX_LIMITS]) {
            Attempt::Decided(verdict) => verdict,
            Attempt::Full(untracked) => {
                // The table is full: each budget it cannot track is replaced by its limit's
                // shared overflow budget (always tracked), and the request decided again. No
                // lock is held between the two attempts and nothing was spent in the first.
                self.untracked.fetch_add(1, Ordering::Relaxed);
                let asks: Vec<Ask<'_>> = asks
                    .iter()
                    .zip(&untracked)
                    .map(|(ask, &overflow)| {
                        let mut ask = *ask;
                        if overflow {
                            ask.key.value = OVERFLOW;
                        }
                        ask
                    })
                    .collect();
                match self.try_decide(&asks, now, lease, decisions, &untracked) {
                    Attempt::Decided(verdict) => verdict,
                    Attempt::Full(_) => None, // cannot happen: overflow budgets always fit
                }
            }
        }
    }

    fn try_decide(
        &self,
        asks: &[Ask<'_>],
        now: u64,
        lease: LeaseId,
        decisions: &mut [Decision; MAX_LIMITS],
        force: &[bool; MAX_LIMITS],
    ) -> Attempt {
        let asks = &asks[..asks.len().min(MAX_LIMITS)];
        let mut hashes = [0u64; MAX_LIMITS];
        // The distinct shards this request touches, ascending, and each ask's place among them.
        let mut shards = [0usize; MAX_LIMITS];
        let mut distinct = 0;
        for (ask, hash) in asks.iter().zip(hashes.iter_mut()) {
            *hash = self.hash(&ask.key);
            let shard = shard_of(*hash);
            if let Err(at) = shards[..distinct].binary_search(&shard) {
                shards.copy_within(at..distinct, at + 1);
                shards[at] = shard;
                distinct += 1;
            }
        }
        let mut slots = [0usize; MAX_LIMITS];
        for (slot, hash) in slots.iter_mut().zip(&hashes[..asks.len()]) {
            *slot = shards[..distinct]
                .binary_search(&shard_of(*hash))
                .unwrap_or(0);
        }
        // Locked in ascending shard order (so two requests never wait on each other crosswise):
        // the check-then-commit below is atomic across budgets. A poisoned lock means another
        // request panicked mid-update; the state is still plain data, so keep serving with it.
        let mut guards: [Option<MutexGuard<'_, Shard>>; MAX_LIMITS] = Default::default();
        for (guard, &shard) in guards.iter_mut().zip(&shards[..distinct]) {
            *guard = Some(self.shards[shard].lock().unwrap_or_else(|p| p.into_inner()));
        }
        let mut tracked = [false; MAX_LIMITS];
        let mut untracked = [false; MAX_LIMITS];
        for (i, ask) in asks.iter().enumerate() {
            let Some(map) = guards[slots[i]].as_mut() else {
                continue; // locked above: unreachable
            };
            let entry = match map.get_mut(&hashes[i]) {
                Some(entry) => entry,
                None if force[i] || self.len.load(Ordering::Relaxed) < self.max_keys => {
                    self.len.fetch_add(1, Ordering::Relaxed);
                    map.entry(hashes[i]).or_insert(Entry {
                        state: State::new(ask.limit.algorithm().kind()),
                        expires_at: 0,
                    })
                }
                None => {
                    untracked[i] = true;
                    continue;
                }
            };
            tracked[i] = true;
            decisions[i] = entry.state.check(ask.limit, now);
        }
        if untracked.iter().any(|&u| u) {
            return Attempt::Full(untracked);
        }
        let Some(verdict) = Verdict::from_decisions(now, &decisions[..asks.len()]) else {
            return Attempt::Decided(None);
        };
        for (i, ask) in asks.iter().enumerate() {
            if !tracked[i] {
                continue;
            }
            let Some(entry) = guards[slots[i]]
                .as_mut()
                .and_then(|map| map.get_mut(&hashes[i]))
            else {
                continue;
            };
            if verdict.allowed() {
                entry.state.commit(ask.limit, now, lease);
            }
            entry.expires_at = entry.state.expires_at(ask.limit);
        }
        Attempt::Decided(Some(verdict))
    }

    /// What `asks` would decide now, per limit, spending nothing and creating no state: a budget
    /// the store does not track is a fresh one. For `/budgets`.
    pub fn peek(&self, asks: &[Ask<'_>]) -> Vec<Decision> {
        let now = self.clock.now_us();
        asks.iter()
            .map(|ask| {
                let hash = self.hash(&ask.key);
                let mut state = {
                    let map = self.shards[shard_of(hash)]
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    map.get(&hash).map(|e| e.state.clone())
                }
                .unwrap_or_else(|| State::new(ask.limit.algorithm().kind()));
                state.check(ask.limit, now)
            })
            .collect()
    }

    /// Settles the reservations of `asks` (`settlements[i]` for `asks[i]`), now.
    pub fn settle(&self, asks: &[Ask<'_>], settlements: &[Settlement]) {
        self.settle_at(asks, settlements, self.clock.now_us());
    }

    /// [`MemoryStore::settle`] at a given time: for tests. A budget the store no longer holds
    /// (it refilled and was swept) is made afresh for a charge (a debt must count; when the
    /// table is full, its limit's overflow budget takes it, as a decision would) and left alone
    /// for a refund.
    pub fn settle_at(&self, asks: &[Ask<'_>], settlements: &[Settlement], now: u64) {
        for (ask, settle) in asks.iter().zip(settlements) {
            if settle.is_even() {
                continue;
            }
            let overflow = BudgetKey {
                value: OVERFLOW,
                ..ask.key
            };
            let hash = self.hash(&ask.key);
            let mut map = self.shards[shard_of(hash)]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let entry = match map.get_mut(&hash) {
                Some(entry) => entry,
                None if settle.charge > 0 && self.len.load(Ordering::Relaxed) < self.max_keys => {
                    self.len.fetch_add(1, Ordering::Relaxed);
                    map.entry(hash).or_insert(Entry {
                        state: State::new(ask.limit.algorithm().kind()),
                        expires_at: 0,
                    })
                }
                // Nothing to refund: the budget refilled past it and was swept.
                None if settle.charge == 0 => continue,
                None => {
                    // A full table: the debt goes where this budget would be decided now.
                    drop(map);
                    let hash = self.hash(&overflow);
                    let mut map = self.shards[shard_of(hash)]
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if let Some(entry) = map.get_mut(&hash) {
                        entry.state.settle(ask.limit, now, settle);
                        entry.expires_at = entry.state.expires_at(ask.limit);
                    }
                    continue;
                }
            };
            entry.state.settle(ask.limit, now, settle);
            entry.expires_at = entry.state.expires_at(ask.limit);
        }
    }

    /// Extends the concurrency leases named `lease` in `asks`' budgets to a lease span from now.
    pub fn renew(&self, asks: &[Ask<'_>], lease: LeaseId) {
        let now = self.clock.now_us();
        self.each_lease_budget(asks, |state, limit| {
            state.renew(lease, now + limit.algorithm().span_us());
        });
    }

    /// Gives back the concurrency leases named `lease` in `asks`' budgets.
    pub fn release(&self, asks: &[Ask<'_>], lease: LeaseId) {
        self.each_lease_budget(asks, |state, _| state.release(lease));
    }

    /// Runs `change` on the state of each concurrency budget of `asks` where a request's leases
    /// are: the budget itself, or (when the table was full at admission) its limit's overflow
    /// budget. The lease token is the request's own, so nothing else is changed.
    fn each_lease_budget(&self, asks: &[Ask<'_>], mut change: impl FnMut(&mut State, &Limit)) {
        for ask in asks {
            if ask.limit.algorithm().kind() != AlgorithmKind::Concurrency {
                continue;
            }
            let overflow = BudgetKey {
                value: OVERFLOW,
                ..ask.key
            };
            for key in [ask.key, overflow] {
                let hash = self.hash(&key);
                let mut map = self.shards[shard_of(hash)]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if let Some(entry) = map.get_mut(&hash) {
                    change(&mut entry.state, ask.limit);
                    entry.expires_at = entry.state.expires_at(ask.limit);
                    break;
                }
            }
        }
    }

    /// Forgets the budgets `keys`: each is fresh (full) at its next decision (`POST /reset`).
    pub fn forget(&self, keys: &[BudgetKey<'_>]) {
        for key in keys {
            let hash = self.hash(key);
            let removed = self.shards[shard_of(hash)]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&hash);
            if removed.is_some() {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops every entry whose budget is fully restored. Returns how many were dropped.
    pub fn sweep(&self) -> usize {
        (0..SHARDS).map(|shard| self.sweep_shard(shard)).sum()
    }

    /// How many budgets the store tracks now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True when no budget is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many requests had a limit the store could not track because it was full.
    pub fn untracked_total(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }

    /// What one wire call answers, decided here and now.
    fn reply(&self, asks: &[Ask<'_>], call: Call) -> Result<Reply, LimiterError> {
        let nothing = || LimiterError::protocol("nothing to decide");
        let (now, lease) = match call {
            Call::Decide { lease } => (self.clock.now_us(), lease),
            Call::DecideAt { lease, now_us } => (now_us, lease),
            Call::Peek => {
                let decisions = self.peek(asks);
                let verdict =
                    Verdict::from_decisions(self.clock.now_us(), &decisions).ok_or_else(nothing)?;
                return Ok(Reply {
                    verdict,
                    decisions,
                    leased: Vec::new(),
                });
            }
        };
        let mut decisions = [Decision::EMPTY; MAX_LIMITS];
        let verdict = (self.decide_into(asks, now, lease, &mut decisions)).ok_or_else(nothing)?;
        Ok(Reply {
            verdict,
            decisions: decisions[..asks.len().min(MAX_LIMITS)].to_vec(),
            leased: Vec::new(),
        })
    }
}

/// The in-process store as every store is: each call answered at once. The request path does
/// not come this way (it decides with [`MemoryStore::decide_leased`] and owes no future); replay,
/// the tests that hold every store to one body, and whoever holds a `dyn Store` do.
impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn invoke<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        call: Call,
        _wants: &'a [LeaseAsk],
        _late: Option<Late>,
    ) -> StoreCall<'a, Reply> {
        answered(self.reply(asks, call))
    }
    fn settle_at<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        settlements: &'a [Settlement],
        now_us: Option<u64>,
    ) -> StoreCall<'a, ()> {
        let now = now_us.unwrap_or_else(|| self.clock.now_us());
        MemoryStore::settle_at(self, asks, settlements, now);
        answered(Ok(()))
    }
    fn release<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()> {
        MemoryStore::release(self, asks, lease);
        answered(Ok(()))
    }
    fn renew<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()> {
        MemoryStore::renew(self, asks, lease);
        answered(Ok(()))
    }
    fn reset<'a>(&'a self, asks: &'a [Ask<'a>]) -> StoreCall<'a, ()> {
        let keys: Vec<BudgetKey<'_>> = asks.iter().map(|a| a.key).collect();
        self.forget(&keys);
        answered(Ok(()))
    }
    fn ping(&self) -> StoreCall<'_, ()> {
        answered(Ok(()))
    }
    /// Any time is the store's to decide at: its clock is only where "now" comes from.
    fn reads_callers_clock(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limiter::{Algorithm, KeyKind, Limit, ManualClock};

    const T0: u64 = 1_700_000_000_000_000;
    const BUDGETS: [&str; 4] = ["r#0", "r#1", "r#2", "r#3"];

    /// One ask per limit, each limit's budget `r#{position}`, all spent by `value`.
    fn asks<'a>(limits: &'a [Limit], kind: KeyKind, value: &'a [u8]) -> Vec<Ask<'a>> {
        limits
            .iter()
            .enumerate()
            .map(|(i, limit)| Ask {
                limit,
                key: BudgetKey {
                    budget: BUDGETS[i],
                    kind,
                    value,
                },
            })
            .collect()
    }

    fn decide(store: &MemoryStore, limits: &[Limit], value: &[u8]) -> Verdict {
        store
            .decide(&asks(limits, KeyKind::ApiKey, value))
            .expect("limits given")
    }

    fn token_bucket(capacity: u32, interval_us: u64) -> Limit {
        Limit::of(
            Algorithm::from_parts(
                crate::limiter::AlgorithmKind::TokenBucket,
                u64::from(capacity),
                interval_us,
            )
            .unwrap(),
        )
    }

    fn fixed_window(limit: u32, window_us: u64) -> Limit {
        Limit::of(
            Algorithm::from_parts(
                crate::limiter::AlgorithmKind::FixedWindow,
                u64::from(limit),
                window_us,
            )
            .unwrap(),
        )
    }

    fn state_of(store: &MemoryStore, key: &BudgetKey<'_>) -> Option<State> {
        let hash = store.hash(key);
        let map = store.shards[shard_of(hash)].lock().unwrap();
        map.get(&hash).map(|e| e.state.clone())
    }

    #[test]
    fn a_denying_limit_spends_nothing_from_the_others() {
        let store = MemoryStore::new(ManualClock::new(T0), 100);
        // A generous bucket and a tight window: once the window denies, the bucket must stay put.
        let limits = [token_bucket(10, 1_000_000), fixed_window(2, 3_600_000_000)];
        let remaining: Vec<_> = (0..5)
            .map(|_| decide(&store, &limits, b"k"))
            .map(|v| (v.allowed(), v.headline.remaining))
            .collect();
        assert_eq!(
            remaining,
            vec![(true, 1), (true, 0), (false, 0), (false, 0), (false, 0)]
        );
        // The bucket was spent twice, not five times: its theoretical arrival time moved 2 s.
        let bucket = asks(&limits, KeyKind::ApiKey, b"k")[0].key;
        assert_eq!(
            state_of(&store, &bucket),
            Some(State::Gcra {
                tat: T0 + 2_000_000
            })
        );
    }

    #[test]
    fn a_route_wide_denial_spends_nothing_from_the_callers_own_budget() {
        let store = MemoryStore::new(ManualClock::new(T0), 100);
        let own = token_bucket(10, 1_000_000);
        let route_cap = fixed_window(3, 3_600_000_000);
        let ask = |value: &'static [u8]| {
            [
                Ask {
                    limit: &own,
                    key: BudgetKey {
                        budget: "r#0",
                        kind: KeyKind::Ip,
                        value,
                    },
                },
                Ask {
                    limit: &route_cap,
                    key: BudgetKey {
                        budget: "r#1",
                        kind: KeyKind::Route,
                        value: b"",
                    },
                },
            ]
        };
        // Three clients spend the route's three; the fourth is denied by the route cap and
        // keeps its whole bucket.
        for client in [b"a", b"b", b"c"] {
            assert!(store.decide(&ask(client)).unwrap().allowed());
        }
        let denied = store.decide(&ask(b"d")).unwrap();
        assert!(!denied.allowed());
        assert_eq!(denied.headline_index, 1, "the route cap is the headline");
        assert_eq!(
            state_of(&store, &ask(b"d")[0].key),
            Some(State::Gcra { tat: T0 }),
            "checked (normalised to now) but not charged"
        );
    }

    #[test]
    fn the_headline_is_the_limit_with_the_fewest_remaining() {
        let store = MemoryStore::new(ManualClock::new(T0), 100);
        let limits = [token_bucket(10, 1_000_000), fixed_window(3, 60_000_000)];
        let v = decide(&store, &limits, b"k");
        assert_eq!((v.headline.limit, v.headline.remaining), (3, 2));
    }

    #[test]
    fn identities_kinds_and_budgets_are_separate() {
        let store = MemoryStore::new(ManualClock::new(T0), 100);
        let limits = [token_bucket(1, 1_000_000)];
        assert!(decide(&store, &limits, b"a").allowed());
        assert!(!decide(&store, &limits, b"a").allowed());
        assert!(decide(&store, &limits, b"b").allowed());
        let other_kind = asks(&limits, KeyKind::UserId, b"a");
        assert!(store.decide(&other_kind).unwrap().allowed());
        let mut other_budget = asks(&limits, KeyKind::ApiKey, b"a");
        other_budget[0].key.budget = "r#9";
        assert!(store.decide(&other_budget).unwrap().allowed());
    }

    #[test]
    fn sweeping_forgets_full_budgets_only() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = MemoryStore::new(clock.clone(), 100);
        decide(&store, &[token_bucket(5, 1_000_000)], b"short");
        decide(&store, &[token_bucket(5, 60_000_000)], b"long");
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
    fn a_full_store_limits_new_budgets_together_and_counts_them() {
        let store = MemoryStore::new(ManualClock::new(T0), 2);
        let limits = [token_bucket(1, 1_000_000)];
        decide(&store, &limits, b"a");
        decide(&store, &limits, b"b");
        // The table is full: c, d and e share one overflow bucket of 1.
        let rotating: Vec<bool> = [b"c", b"d", b"e"]
            .iter()
            .map(|k| decide(&store, &limits, *k).allowed())
            .collect();
        assert_eq!(rotating, vec![true, false, false]);
        assert_eq!(store.untracked_total(), 3);
        assert!(
            !decide(&store, &limits, b"a").allowed(),
            "tracked budgets keep their state"
        );
        assert_eq!(store.len(), 3, "two budgets and one overflow budget");
    }

    #[test]
    fn a_lease_taken_in_the_overflow_budget_is_released_there() {
        let store = MemoryStore::new(ManualClock::new(T0), 1);
        let slots = Limit::of(
            Algorithm::from_parts(crate::limiter::AlgorithmKind::Concurrency, 1, 60_000_000)
                .unwrap(),
        );
        let ask = |value: &'static [u8]| Ask {
            limit: &slots,
            key: BudgetKey {
                budget: "r#0",
                kind: KeyKind::ApiKey,
                value,
            },
        };
        assert!(
            store.decide_leased(&[ask(b"a")], 1).unwrap().allowed(),
            "fills the table"
        );
        // b cannot be tracked: its lease goes to the overflow budget of one slot.
        assert!(store.decide_leased(&[ask(b"b")], 2).unwrap().allowed());
        assert!(
            !store.decide_leased(&[ask(b"c")], 3).unwrap().allowed(),
            "overflow slot taken"
        );
        store.release(&[ask(b"b")], 2);
        assert!(
            store.decide_leased(&[ask(b"c")], 4).unwrap().allowed(),
            "b's release freed the overflow slot"
        );
    }

    #[test]
    fn a_tracked_route_budget_still_holds_when_the_table_is_full() {
        let store = MemoryStore::new(ManualClock::new(T0), 2);
        let own = token_bucket(100, 1_000_000);
        let route_cap = fixed_window(5, 3_600_000_000);
        let mut admitted = 0;
        for n in 0u32..50 {
            let value = n.to_be_bytes();
            let asks = [
                Ask {
                    limit: &route_cap,
                    key: BudgetKey {
                        budget: "r#1",
                        kind: KeyKind::Route,
                        value: b"",
                    },
                },
                Ask {
                    limit: &own,
                    key: BudgetKey {
                        budget: "r#0",
                        kind: KeyKind::ApiKey,
                        value: &value,
                    },
                },
            ];
            admitted += usize::from(store.decide(&asks).unwrap().allowed());
        }
        assert_eq!(
            admitted, 5,
            "50 rotating keys, a full table, the cap of 5 holds"
        );
        assert!(store.untracked_total() > 0);
    }

    #[test]
    fn concurrent_requests_never_overspend_one_key() {
        let store = Arc::new(MemoryStore::new(ManualClock::new(T0), 100));
        let limits = [token_bucket(50, 1_000_000)];
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let store = store.clone();
                    s.spawn(move || {
                        (0..100)
                            .filter(|_| decide(&store, &limits, b"hot").allowed())
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
