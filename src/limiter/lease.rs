//! Exact leases (`storage.leases`): for a budget this instance spends fast, the store debits
//! several requests' worth of units in one call, and this instance spends them itself, with no
//! round trip, until they run out or the lease ends (`storage.lease_ttl`).
//!
//! **Never more than the budget.** A lease is taken *out of* the shared budget in the store
//! (Redis: `lua/decide.lua`; PostgreSQL: `sql/decide.sql`) before any of it is spent: to every
//! other instance those units are spent already. What keeps that exact over time depends on the
//! algorithm:
//!
//! - *fixed window* and *sliding window counter*: the units are counted in the window they were
//!   leased in, so a lease ends at that window's end at the latest; within it, every decision the
//!   store makes already counts them, and a counter's estimate only falls as its window goes on, so
//!   leased and store units together never exceed the limit.
//! - *token bucket*: a bucket refills, and a lease held while the store's side refilled to full
//!   would let the two together hold more than the capacity. So the store *holds* the leased
//!   units ([`super::hold`]): until the lease's hold ends on the store's clock (two `lease_ttl`s
//!   after the grant, the lease being spent here for one) or is released, the bucket refills
//!   only to its capacity less what leases hold. The store's tokens plus every lease's units never exceed one bucket's, so every sequence of
//!   admissions is one a single bucket would admit, and a full bucket can be leased as freely as
//!   a drained one. A killed instance's lease stops counting when it ends.
//! - *sliding window log*: the leased units are entered in the log when leased, stamped with the
//!   lease's end, so each counts from before it is spent until a window after: no window of
//!   admitted requests can hold more than the limit. The lease lasts at most one window.
//! - every other algorithm (the leaky bucket's delay, concurrency) is decided per request, and a
//!   request is served from leases only when every limit it asks holds one.
//!
//! **Whose clock.** A lease's time runs from when its request was *sent* (local clock), not
//! when the answer came back: the store granted it no earlier, so the lease ends no later on the
//! store's clock than the store's own figures (a window's end, a bucket's hold) assume, whatever
//! the round trip.
//!
//! **Giving back.** A lease that is spent or ends gives its unspent units back with the next
//! request that budget sends to the store, in the same call ([`LeaseAsk::back`]): a bucket's hold
//! is released (if it has not ended in the store already) and the bucket credited with what is
//! unspent, a window gets them back only into the window they were counted in, a log by removing
//! the lease's entries.
//!
//! **What it costs.** Units an instance holds are not available to another instance's clients
//! (`X-RateLimit-Remaining` lags by them), a bucket's hold keeps it from refilling into what a
//! lease has spent until the lease is released (at most `lease_ttl`), and what no request gives
//! back lapses (a bucket's when its hold ends, a window's until the window ends): at most one
//! lease per budget and instance. A lease is at most half of what remains after its request (`decide.lua`), so it
//! shrinks to nothing as the budget nears exhaustion, where every request is decided in the store
//! again; and it is sized to what this instance spent from the budget in the previous
//! `lease_ttl`, so a budget spent rarely is never leased.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::key::Prehashed;
use super::wire::Reply;
use super::{AlgorithmKind, Ask, ClockOffset, Decision, LocalUs, Parameters, StoreUs, Verdict};

mod debts;

pub use debts::{Debts, OweSlot, Owed};

const SHARDS: usize = 16;
/// The most budgets tracked at once (per shard: this / `SHARDS`); past it, new budgets are not
/// leased until old ones go quiet.
const CAPACITY: usize = 100_000;
/// The most requests' worth one lease asks for.
const MAX_WANT: u32 = 1_000;

/// What a request asks of the store about one limit's lease, beside its own decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseAsk {
    /// Requests' worth to lease beyond this request.
    pub want: u32,
    /// An ended (or spent) lease's requests' worth given back unspent.
    pub back: u64,
    /// That lease's size in requests' worth (0: no lease ends with this request): a bucket
    /// releases the hold it names.
    pub lent: u64,
    /// The store's time that lease was granted at: a window takes units back only into the
    /// window they were counted in, and a bucket's hold ends `lease_us` after it.
    pub back_at: StoreUs,
    /// How long (µs) a lease of this limit lasts at most: a sliding window log stamps leased units
    /// with the lease's end, a bucket's hold ends then.
    pub lease_us: u64,
}

/// The `outcome` label of `floodgate_lease_units_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct LeaseOutcomeLabel {
    pub outcome: &'static str,
}

/// Counters of leased units (in requests' worth): handles into one family, registered as
/// `floodgate_lease_units_total{outcome}`.
#[derive(Debug, Clone)]
pub struct LeaseStats {
    pub family: Family<LeaseOutcomeLabel, Counter>,
    pub granted: Counter,
    pub spent: Counter,
    /// Units given back to the store unspent when the lease ended.
    pub returned: Counter,
    pub lapsed: Counter,
}

impl Default for LeaseStats {
    fn default() -> Self {
        let family = Family::<LeaseOutcomeLabel, Counter>::default();
        let of = |outcome| family.get_or_create_owned(&LeaseOutcomeLabel { outcome });
        LeaseStats {
            granted: of("granted"),
            spent: of("spent"),
            returned: of("returned"),
            lapsed: of("lapsed"),
            family,
        }
    }
}

/// This instance's leases, by budget.
pub struct Leases {
    ttl_us: u64,
    timeout_us: std::sync::atomic::AtomicU64,
    shards: Box<[Mutex<HashMap<u64, Slot, Prehashed>>]>,
    hasher: RandomState,
    stats: LeaseStats,
}

/// One budget's demand here and its lease, if any.
#[derive(Default)]
struct Slot {
    /// Requests spending the budget in the current `ttl`-long period, and in the one before.
    period_start: LocalUs,
    demand: u32,
    previous: u32,
    held: Option<Held>,
    /// A lease has been asked for and not granted yet (until then, or for at most a `ttl`, no
    /// other request asks: concurrent asks would replace each other's leases).
    asking_until: LocalUs,
    /// What to give back besides an ended lease (see [`Leases::owe`]).
    owed: Vec<Owed>,
}

struct Held {
    /// Requests' worth granted.
    units: u64,
    spent: u64,
    granted_at: LocalUs,
    expires_at: LocalUs,
    /// The store's time of the grant (a bucket's hold is named by it).
    granted_store: StoreUs,
    /// The store's clock less the local one when granted.
    store_offset: ClockOffset,
    /// The store's decision for the request that took the lease, `remaining` net of the lease.
    decision: Decision,
}

impl Held {
    /// Requests this lease may still hand out at `now`.
    fn usable(&self, now: LocalUs) -> u64 {
        if now >= self.expires_at {
            return 0;
        }
        self.units - self.spent
    }
}

/// Whether a limit's units can be leased.
fn leasable(ask: &Ask<'_>) -> bool {
    !ask.limit.is_settled()
        && matches!(
            ask.limit.algorithm().kind(),
            AlgorithmKind::TokenBucket
                | AlgorithmKind::FixedWindow
                | AlgorithmKind::SlidingWindowCounter
                | AlgorithmKind::SlidingWindowLog
                | AlgorithmKind::Quota
        )
}

impl Leases {
    /// Leases that last at most `ttl_us` (local µs), counted in `stats`.
    pub fn new(ttl_us: u64, stats: LeaseStats) -> Self {
        Leases {
            ttl_us: ttl_us.max(1),
            timeout_us: std::sync::atomic::AtomicU64::new(0),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            hasher: RandomState::new(),
            stats,
        }
    }

    /// The longest a lease lasts (`storage.lease_ttl`), in local µs.
    pub fn ttl_us(&self) -> u64 {
        self.ttl_us
    }

    /// How long the store keeps what a lease of `ask`'s limit holds (`LeaseAsk::lease_us`): a
    /// log's entries are stamped with the lease's end (`ttl`, at most one window: its units count
    /// until a window after it); a bucket holds a lease **two** `ttl`s, though it is spent here
    /// for one: the lease's give-back comes with the next request after it ends, and must find
    /// its hold still out to be credited (after the hold ends, a bucket that is not refilling
    /// would never get those units back).
    fn lifetime(&self, ask: &Ask<'_>) -> u64 {
        match ask.limit.algorithm().kind() {
            AlgorithmKind::SlidingWindowLog => self.ttl_us.min(window_us(ask)).max(1),
            AlgorithmKind::TokenBucket => self.ttl_us.saturating_mul(2),
            _ => self.ttl_us,
        }
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Slot, Prehashed>> {
        self.shards[(key >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Drops this instance's leases of the budgets `keys`, and what it owed them: they were
    /// reset, and what the store held for the leases went with their state.
    pub fn forget(&self, keys: &[super::BudgetKey<'_>]) {
        for key in keys {
            let key = key.hash_with(&self.hasher);
            self.shard(key).remove(&key);
        }
    }

    /// Counts one request of demand on `slot` at `now`.
    fn note_demand(&self, slot: &mut Slot, now: LocalUs) {
        let age = now.since(slot.period_start);
        if age >= self.ttl_us {
            slot.previous = if age < 2 * self.ttl_us {
                slot.demand
            } else {
                0
            };
            slot.demand = 0;
            slot.period_start = now;
        }
        slot.demand = slot.demand.saturating_add(1);
    }

    /// Serves a request from this instance's leases at local time `now`: when every limit of
    /// `asks` holds a lease with a request's worth left, spends one from each and returns the
    /// verdict; else spends nothing and returns `None`.
    pub fn spend(&self, asks: &[Ask<'_>], now: LocalUs) -> Option<Verdict> {
        if asks.is_empty() || !asks.iter().all(leasable) {
            return None;
        }
        let keys: Vec<u64> = asks.iter().map(|a| a.key.hash_with(&self.hasher)).collect();
        let mut decisions = Vec::with_capacity(asks.len());
        let mut store_now = None;
        for (i, &key) in keys.iter().enumerate() {
            let mut shard = self.shard(key);
            let taken = shard.get_mut(&key).and_then(|slot| {
                let held = slot.held.as_mut()?;
                let usable = held.usable(now);
                if usable == 0 {
                    return None;
                }
                held.spent += 1;
                let cost = u64::from(asks[i].limit.cost());
                let d = held.decision;
                let decision = Decision {
                    remaining: (d.remaining + (usable - 1) * cost).min(d.limit),
                    reset_after_us: d.reset_after_us.saturating_sub(now.since(held.granted_at)),
                    ..d
                };
                let at = held.store_offset.to_store(now);
                self.note_demand(slot, now);
                Some((decision, at))
            });
            drop(shard);
            match taken {
                Some((decision, at)) => {
                    decisions.push(decision);
                    store_now.get_or_insert(at);
                }
                None => {
                    // Give back what the earlier limits spent: all or nothing.
                    for &earlier in &keys[..i] {
                        if let Some(held) = self
                            .shard(earlier)
                            .get_mut(&earlier)
                            .and_then(|s| s.held.as_mut())
                        {
                            held.spent -= 1;
                        }
                    }
                    return None;
                }
            }
        }
        // A request's worth from each limit's lease, as `granted` counts them.
        self.stats.spent.inc_by(asks.len() as u64);
        Verdict::from_decisions(store_now?.0, &decisions)
    }

    /// [`Leases::wants_taking`]'s answer alone, for tests.
    #[cfg(test)]
    pub fn wants(&self, asks: &[Ask<'_>], now: LocalUs) -> Vec<LeaseAsk> {
        self.wants_taking(asks, now).0
    }

    /// For a call sent at `now`: counts this request's demand on each leasable limit and says,
    /// per ask, how many more requests' worth to lease with it (what this instance spent from
    /// the budget in the last `ttl`, when that is at least 2: a budget spent rarely is not
    /// leased), and gives back what an ended lease left unspent (a request goes to the store
    /// only when its lease is spent, or ended); also says where a late answer's grant is owed
    /// ([`Leases::owe`]) and what the call gives back, for [`Leases::restore`] to put back
    /// should it never be sent.
    pub fn wants_taking(&self, asks: &[Ask<'_>], now: LocalUs) -> (Vec<LeaseAsk>, Debts) {
        let mut wants = Vec::with_capacity(asks.len());
        let mut debts = Debts {
            slots: Vec::with_capacity(asks.len()),
            taken: Vec::with_capacity(asks.len()),
        };
        for ask in asks {
            let (want, slot, taken) = self.want(ask, now);
            wants.push(want);
            debts.slots.push(slot);
            debts.taken.push(taken);
        }
        (wants, debts)
    }

    /// One ask's part of [`Leases::wants_taking`]: what it asks of the store, where a late
    /// answer's grant is owed, and what it gives back.
    fn want(&self, ask: &Ask<'_>, now: LocalUs) -> (LeaseAsk, Option<OweSlot>, Option<Owed>) {
        let mut out = LeaseAsk::default();
        if !leasable(ask) {
            return (out, None, None);
        }
        out.lease_us = self.lifetime(ask);
        let key = ask.key.hash_with(&self.hasher);
        let owe = Some(self.owe_slot(ask, key, now));
        let mut shard = self.shard(key);
        if !shard.contains_key(&key) && shard.len() >= CAPACITY / SHARDS {
            let ttl = self.ttl_us;
            let lapsed = &self.stats.lapsed;
            shard.retain(|_, slot| {
                let live = slot.held.as_ref().is_some_and(|h| h.usable(now) > 0)
                    || now.since(slot.period_start) < 2 * ttl
                    || !slot.owed.is_empty();
                if !live && let Some(held) = &slot.held {
                    lapsed.inc_by(held.units.saturating_sub(held.spent));
                }
                live
            });
            if shard.len() >= CAPACITY / SHARDS {
                return (out, owe, None);
            }
        }
        let slot = shard.entry(key).or_default();
        self.note_demand(slot, now);
        let mut taken = None;
        if let Some(held) = slot.held.as_ref()
            && held.usable(now) == 0
        {
            out.back = held.units - held.spent;
            out.lent = held.units;
            out.back_at = held.granted_store;
            taken = Some(Owed {
                back: out.back,
                lent: out.lent,
                at: out.back_at,
                own: None,
            });
            self.stats.returned.inc_by(out.back);
            self.stats
                .lapsed
                .inc_by(held.units.saturating_sub(held.spent + out.back));
            slot.held = None;
        } else if let Some(owed) = slot.owed.pop() {
            // One give-back a call: an abandoned decision's, when no lease ends. The store
            // applies it within this call's timeout (see `horizon_us`).
            out.back = owed.back_at(now.plus(self.horizon_us()));
            out.lent = owed.lent;
            out.back_at = owed.at;
            taken = Some(owed);
        }
        // A limit that still holds units (the request came here for another limit's sake) asks
        // for no more: a new lease would replace this one and lapse its units.
        let holding = slot.held.as_ref().is_some_and(|h| h.usable(now) > 0);
        if holding || slot.previous < 2 || slot.asking_until > now {
            return (out, owe, taken);
        }
        slot.asking_until = now.plus(self.ttl_us);
        out.want = slot.previous.min(MAX_WANT);
        (out, owe, taken)
    }

    /// Takes the leases the store granted with a request (`reply.leased`), the request having
    /// been sent at local time `now` (see "Whose clock" above). A lease this replaces lapses.
    pub fn grant(&self, asks: &[Ask<'_>], reply: &Reply, now: LocalUs) {
        for (i, ask) in asks.iter().enumerate() {
            let units = reply.leased.get(i).copied().unwrap_or(0);
            let Some(&decision) = reply.decisions.get(i) else {
                continue;
            };
            if units == 0 || !leasable(ask) {
                continue;
            }
            let cost = u64::from(ask.limit.cost());
            let lifetime = match ask.limit.algorithm().kind() {
                // A bucket's lease is spent here for `ttl` (the store holds it twice as long).
                AlgorithmKind::TokenBucket => self.ttl_us,
                AlgorithmKind::SlidingWindowLog => self.lifetime(ask),
                // A quota's units count in their calendar period only.
                AlgorithmKind::Quota => self.ttl_us.min(decision.reset_after_us),
                // A window's units count in that window only: the lease ends with it, on the
                // store's clock.
                _ => {
                    let window = window_us(ask);
                    let left = window - reply.verdict.now_us % window.max(1);
                    self.ttl_us.min(left)
                }
            };
            let store_offset = ClockOffset::between(StoreUs(reply.verdict.now_us), now);
            let held = Held {
                units,
                spent: 0,
                granted_at: now,
                expires_at: now.plus(lifetime),
                granted_store: StoreUs(reply.verdict.now_us),
                store_offset,
                decision: Decision {
                    remaining: decision.remaining.saturating_sub(units * cost),
                    ..decision
                },
            };
            let key = ask.key.hash_with(&self.hasher);
            let mut shard = self.shard(key);
            let slot = shard.entry(key).or_default();
            slot.asking_until = LocalUs(0);
            if let Some(old) = slot.held.replace(held) {
                self.stats
                    .lapsed
                    .inc_by(old.units.saturating_sub(old.spent));
            }
            self.stats.granted.inc_by(units);
        }
    }
}

/// A window limit's window, in µs (a bucket's budget span, for any other).
fn window_us(ask: &Ask<'_>) -> u64 {
    match ask.limit.algorithm().parameters() {
        Parameters::Window { window_us, .. } => window_us,
        Parameters::Bucket { .. } => ask.limit.algorithm().budget_span_us(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, BudgetKey, Figures, KeyKind, Limit};

    const MS: u64 = 1_000;

    fn ask<'a>(limit: &'a Limit, client: &'a [u8]) -> Ask<'a> {
        Ask {
            limit,
            key: BudgetKey {
                budget: "r#0",
                kind: KeyKind::ApiKey,
                value: client,
            },
        }
    }

    fn reply(leased: u64, remaining: u64, reset_after_us: u64) -> Reply {
        let decision = Decision::allow(
            Figures {
                limit: 100,
                remaining,
                reset_after_us,
            },
            0,
        );
        Reply {
            verdict: Verdict::from_decisions(1_700_000_000_000_000, &[decision]).unwrap(),
            decisions: vec![decision],
            leased: vec![leased],
        }
    }

    /// The store's reply at `now_us` with `decision`, leasing `leased`.
    fn reply_of(now_us: u64, decision: Decision, leased: u64) -> Reply {
        Reply {
            verdict: Verdict::from_decisions(now_us, &[decision]).unwrap(),
            decisions: vec![decision],
            leased: vec![leased],
        }
    }

    /// A reply as `reply`, decided at the store's time `now_us`.
    fn reply_at(now_us: u64, leased: u64, remaining: u64) -> Reply {
        let mut r = reply(leased, remaining, 0);
        r.verdict = Verdict::from_decisions(now_us, &r.decisions).unwrap();
        r
    }

    fn leases() -> (Leases, LeaseStats) {
        let stats = LeaseStats::default();
        (Leases::new(250 * MS, stats.clone()), stats)
    }

    #[test]
    fn a_window_lease_hands_out_exactly_its_units_and_ends_with_its_window() {
        // Windows of 100 ms; the store's clock in `reply` is at a window's start.
        let limit =
            Limit::of(Algorithm::fixed_window(100, std::time::Duration::from_millis(100)).unwrap());
        let asks = [ask(&limit, b"k")];
        let (leases, stats) = leases();
        assert!(leases.spend(&asks, LocalUs(0)).is_none(), "no lease yet");
        // The window ends 100 ms from the store's now: the lease ends there, before its ttl.
        leases.grant(&asks, &reply(5, 80, 100 * MS), LocalUs(0));
        for n in 0..5 {
            let v = leases
                .spend(&asks, LocalUs(10 * MS))
                .unwrap_or_else(|| panic!("unit {n}"));
            assert!(v.allowed());
            assert_eq!(
                v.headline.remaining,
                75 + 4 - n,
                "the store's 75 plus what is left here"
            );
        }
        assert!(
            leases.spend(&asks, LocalUs(10 * MS)).is_none(),
            "five units, five requests"
        );
        leases.grant(&asks, &reply(5, 70, 100 * MS), LocalUs(20 * MS));
        assert!(leases.spend(&asks, LocalUs(119 * MS)).is_some());
        assert!(
            leases.spend(&asks, LocalUs(120 * MS)).is_none(),
            "the window has ended"
        );
        assert_eq!((stats.granted.get(), stats.spent.get()), (10, 6));
    }

    #[test]
    fn a_token_bucket_lease_lasts_its_ttl_whatever_the_refill_and_releases_its_hold_when_done() {
        // 10 per second (a token every 100 ms), capacity 100; the store had 99 left (full).
        let limit = Limit::of(Algorithm::token_bucket(100, 10.0).unwrap());
        let asks = [ask(&limit, b"k")];
        let (leases, stats) = leases();
        leases.grant(&asks, &reply_at(5_000, 4, 99), LocalUs(0));
        // Nothing drains: the store holds the units out of the bucket until the lease ends.
        for _ in 0..3 {
            assert!(leases.spend(&asks, LocalUs(240 * MS)).is_some());
        }
        // Ended at 250 ms with one unspent: the next request gives it back and names the hold.
        assert!(leases.spend(&asks, LocalUs(250 * MS)).is_none());
        let ask = leases.wants(&asks, LocalUs(250 * MS))[0];
        assert_eq!(
            (ask.back, ask.lent, ask.back_at, ask.lease_us),
            (1, 4, StoreUs(5_000), 500 * MS),
            "held in the store two ttls: the give-back finds its hold"
        );
        assert_eq!((stats.returned.get(), stats.lapsed.get()), (1, 0));
        // A lease spent to the end releases its hold too, with nothing to give back.
        leases.grant(&asks, &reply_at(9_000, 2, 99), LocalUs(300 * MS));
        for _ in 0..2 {
            assert!(leases.spend(&asks, LocalUs(300 * MS)).is_some());
        }
        let ask = leases.wants(&asks, LocalUs(301 * MS))[0];
        assert_eq!((ask.back, ask.lent, ask.back_at), (0, 2, StoreUs(9_000)));
    }

    #[test]
    fn a_request_is_served_locally_only_when_every_limit_holds_a_lease() {
        let own = Limit::of(Algorithm::token_bucket(100, 10.0).unwrap());
        let cap =
            Limit::of(Algorithm::fixed_window(100, std::time::Duration::from_secs(60)).unwrap());
        let asks = [ask(&own, b"k"), ask(&cap, b"")];
        let (leases, stats) = leases();
        leases.grant(&asks[..1], &reply(3, 50, 0), LocalUs(0));
        assert!(
            leases.spend(&asks, LocalUs(0)).is_none(),
            "the cap holds no lease"
        );
        // Nothing was spent from the bucket's lease by the refused request.
        assert!(leases.spend(&asks[..1], LocalUs(0)).is_some());
        assert!(leases.spend(&asks[..1], LocalUs(0)).is_some());
        assert!(leases.spend(&asks[..1], LocalUs(0)).is_some());
        assert!(leases.spend(&asks[..1], LocalUs(0)).is_none());
        assert_eq!(stats.spent.get(), 3);
        // The cap holds no lease and the bucket's is spent: a request with both goes to the
        // store, and with demand behind it asks the bucket for a new lease.
        for _ in 0..3 {
            leases.wants(&asks, LocalUs(300 * MS));
        }
        leases.grant(&asks[..1], &reply(3, 50, 0), LocalUs(600 * MS));
        assert_eq!(
            leases.wants(&asks, LocalUs(600 * MS))[0].want,
            0,
            "the bucket's lease still has units: no new one to replace it"
        );
        // Both limits leased: a request spends a unit of each.
        leases.grant(&asks[1..], &reply(3, 50, 60_000 * MS), LocalUs(0));
        leases.grant(&asks[..1], &reply(3, 50, 0), LocalUs(0));
        assert!(leases.spend(&asks, LocalUs(0)).is_some());
        assert_eq!(stats.spent.get(), 5);
        // A leaky bucket is never leased: its delay is decided per request.
        let leaky = Limit::of(Algorithm::leaky_bucket(100, 10.0).unwrap());
        for _ in 0..3 {
            leases.wants(&[ask(&leaky, b"k")], LocalUs(0));
        }
        assert_eq!(
            leases.wants(&[ask(&leaky, b"k")], LocalUs(300 * MS))[0].want,
            0
        );
    }

    #[test]
    fn a_log_lease_lasts_at_most_a_window_from_when_its_request_was_sent() {
        let (leases, _) = leases();
        // A window of 100 ms, shorter than the ttl: the lease lasts 100 ms, and decide.lua
        // stamps its entries with that end (`lease_us`).
        let log = Limit::of(
            Algorithm::sliding_window_log(100, std::time::Duration::from_millis(100)).unwrap(),
        );
        let asks = [ask(&log, b"k")];
        for _ in 0..3 {
            leases.wants(&asks, LocalUs(0));
        }
        let wanted = leases.wants(&asks, LocalUs(300 * MS))[0];
        assert_eq!((wanted.want, wanted.lease_us), (3, 100 * MS));
        // Sent at 300 ms, answered later: the lease's time runs from 300 ms all the same.
        leases.grant(&asks, &reply(3, 50, 100 * MS), LocalUs(300 * MS));
        assert!(leases.spend(&asks, LocalUs(399 * MS)).is_some());
        assert!(
            leases.spend(&asks, LocalUs(400 * MS)).is_none(),
            "the lease has ended"
        );
        // A long window: the lease lasts the ttl.
        let long = Limit::of(
            Algorithm::sliding_window_log(100, std::time::Duration::from_secs(60)).unwrap(),
        );
        assert_eq!(
            leases.wants(&[ask(&long, b"k")], LocalUs(0))[0].lease_us,
            250 * MS
        );
    }

    #[test]
    fn a_request_that_read_the_clock_before_the_lease_was_granted_is_served() {
        let limit = Limit::of(Algorithm::token_bucket(100, 10.0).unwrap());
        let asks = [ask(&limit, b"k")];
        let (leases, _) = leases();
        leases.grant(&asks, &reply(4, 50, 0), LocalUs(10 * MS));
        assert!(leases.spend(&asks, LocalUs(9 * MS)).is_some());
    }

    #[test]
    fn a_budget_is_leased_only_once_it_is_spent_often_here() {
        let limit = Limit::of(Algorithm::token_bucket(100, 10.0).unwrap());
        let asks = [ask(&limit, b"k")];
        let (leases, _) = leases();
        assert_eq!(leases.wants(&asks, LocalUs(0))[0].want, 0);
        for _ in 0..9 {
            leases.wants(&asks, LocalUs(MS));
        }
        // The next period wants what the last one spent, once: until that lease arrives, other
        // requests ask for none.
        assert_eq!(leases.wants(&asks, LocalUs(260 * MS))[0].want, 10);
        assert_eq!(leases.wants(&asks, LocalUs(261 * MS))[0].want, 0);
        // A period of silence in between: nothing to go on.
        assert_eq!(leases.wants(&asks, LocalUs(2_000 * MS))[0].want, 0);
    }

    proptest::proptest! {
        /// The exactness claim for the sliding window log: whatever the timing and the round
        /// trip (each request to the store is decided `d1` after it was sent and answered `d2`
        /// later), no window of requests admitted by two instances holds more than the limit.
        /// The store is modelled as decide.lua and sliding_window_log.lua run it: leased entries
        /// stamped with the lease's end, unspent ones given back by name.
        #[test]
        fn no_window_of_requests_admitted_through_log_leases_holds_more_than_the_limit(
            limit in 2u64..40,
            window_ms in proptest::prop_oneof![
                proptest::strategy::Just(50u64),
                proptest::strategy::Just(400u64),
                proptest::strategy::Just(1_000u64),
            ],
            events in proptest::collection::vec(
                (
                    proptest::prop_oneof![proptest::strategy::Just(0u64), 0u64..40_000],
                    proptest::bool::ANY,
                    0u64..3_000,
                    // Up to 30 ms back: long enough, against windows as short as 50 ms, that a
                    // lease timed from the answer rather than the request would show.
                    0u64..30_000,
                ),
                1..300,
            ),
        ) {
            let window = window_ms * MS;
            let log = Limit::of(
                Algorithm::sliding_window_log(limit as u32, std::time::Duration::from_millis(window_ms))
                    .unwrap(),
            );
            let asks = [ask(&log, b"k")];
            let instances = [
                Leases::new(250 * MS, LeaseStats::default()),
                Leases::new(250 * MS, LeaseStats::default()),
            ];
            // The store's log: (stamp, the grant time of the lease it belongs to, if leased).
            let mut store: Vec<(u64, Option<u64>)> = Vec::new();
            let mut admitted: Vec<u64> = Vec::new();
            let mut now = 0u64;
            for (step, second, d1, d2) in events {
                now += step;
                let leases = &instances[usize::from(second)];
                // When the request was admitted, on the store's clock (the model's only clock):
                // spent from a lease now, or decided by the store.
                let mut at = now;
                let served = leases.spend(&asks, LocalUs(now)).is_some() || {
                    let ask = leases.wants(&asks, LocalUs(now))[0];
                    let decided = now + d1;
                    if ask.back > 0 {
                        let mut left = ask.back;
                        store.retain(|&(stamp, tag)| {
                            let theirs = tag == Some(ask.back_at.0) && stamp == ask.back_at.0 + ask.lease_us;
                            let keep = !(theirs && left > 0);
                            if !keep {
                                left -= 1;
                            }
                            keep
                        });
                    }
                    store.retain(|&(stamp, _)| stamp + window > decided);
                    let count = store.len() as u64;
                    let allowed = count < limit;
                    if allowed {
                        let remaining = limit - count - 1;
                        let extra = (remaining / 2).min(u64::from(ask.want));
                        store.push((decided, None));
                        for _ in 0..extra {
                            store.push((decided + ask.lease_us, Some(decided)));
                        }
                        leases.grant(&asks, &reply_at(decided, extra, remaining), LocalUs(now));
                    }
                    // The answer arrives d2 after the decision.
                    at = decided;
                    now = decided + d2;
                    allowed
                };
                if served {
                    admitted.push(at);
                    let in_window = admitted.iter().filter(|&&t| t + window > at).count() as u64;
                    proptest::prop_assert!(
                        in_window <= limit,
                        "{} admitted in the window ending at {} µs, limit {}", in_window, at, limit
                    );
                }
            }
        }

        /// The exactness claim for token buckets: whatever the timing and the round trip (each
        /// request to the store is decided `d1` after it was sent, answered `d2` later), every
        /// request admitted by three instances, some of them killed along the way with their
        /// leases, is one a single bucket, seeing the same admissions in the same order, would
        /// have admitted ([`drive_bucket`]).
        #[test]
        fn store_and_leases_together_never_admit_what_one_bucket_would_not(
            capacity in 2u32..40,
            per_second in 1u32..2_000,
            events in proptest::collection::vec(
                (
                    // Half the steps are 0: bursts at one instant, where a lease spent together
                    // with what the store refilled meanwhile would show; now and then a pause of
                    // about a lease's ttl.
                    proptest::prop_oneof![
                        10 => proptest::strategy::Just(0u64),
                        10 => 0u64..40_000,
                        1 => 200_000u64..300_000,
                    ],
                    0usize..3,
                    0u64..3_000,
                    0u64..30_000,
                    // One event in 50 kills the instance before it acts: its lease is never
                    // spent or given back.
                    proptest::prop_oneof![49 => proptest::strategy::Just(false), 1 => proptest::strategy::Just(true)],
                    // One in 10 store answers comes after the request gave up (refused, on_error:
                    // deny): what it granted is owed back.
                    proptest::prop_oneof![9 => proptest::strategy::Just(false), 1 => proptest::strategy::Just(true)],
                ),
                1..300,
            ),
        ) {
            if let Err(at) = drive_bucket(capacity, per_second, &events) {
                proptest::prop_assert!(false, "admitted at {} µs what one bucket would not", at);
            }
        }
    }

    /// One event of [`drive_bucket`]: a step of time (µs), the instance that gets a request, the
    /// store's delay in deciding it and in answering (µs), whether that instance was killed (and
    /// restarted with no leases) first, and whether the answer came too late for the request.
    type Event = (u64, usize, u64, u64, bool, bool);

    /// Drives three instances' leases and a store modelled as decide.lua runs it
    /// ([`crate::limiter::hold::HeldBucket`]) through `events`, each instance serving from its
    /// own lease when it can, else asking the store, giving back what an ended lease left and
    /// leasing what it wants up to half of what remains. Checks
    /// every admission against a reference bucket; Err(µs) names the first it would not make.
    fn drive_bucket(capacity: u32, per_second: u32, events: &[Event]) -> Result<(), u64> {
        use crate::limiter::algorithm::State;
        let limit = Limit::of(Algorithm::token_bucket(capacity, f64::from(per_second)).unwrap());
        let mut reference = State::new(AlgorithmKind::TokenBucket);
        let mut store = crate::limiter::hold::HeldBucket::default();
        let asks = [ask(&limit, b"k")];
        let mut instances: Vec<Leases> = (0..3)
            .map(|_| Leases::new(250 * MS, LeaseStats::default()))
            .collect();
        let mut now = 0u64;
        for &(step, which, d1, d2, kill, late) in events {
            now += step;
            if kill {
                instances[which] = Leases::new(250 * MS, LeaseStats::default());
            }
            let leases = &instances[which];
            let mut at = now;
            let admitted = leases.spend(&asks, LocalUs(now)).is_some() || {
                let (sent, ask) = (now, leases.wants(&asks, LocalUs(now))[0]);
                let decided = now + d1;
                let (d, extra) = store.decide(&limit, decided, &ask);
                at = decided;
                now = decided + d2;
                if late {
                    // Refused at the timeout; the store's grant is owed back.
                    if d.allowed() {
                        let slots = leases.slots(&asks, LocalUs(sent));
                        leases.owe(&slots, &reply_of(decided, d, extra));
                    }
                    false
                } else {
                    if d.allowed() {
                        leases.grant(&asks, &reply_of(decided, d, extra), LocalUs(sent));
                    }
                    d.allowed()
                }
            };
            if admitted {
                if !reference.check(&limit, at).allowed() {
                    return Err(at);
                }
                reference.commit(&limit, at, 0);
            }
        }
        Ok(())
    }

    #[test]
    fn a_late_answer_is_given_back_only_while_a_bucket_without_it_could_not_stand_full() {
        // 2 tokens, one per 500 ms; no leases (half of what remains is never a whole request).
        // At 0 instance 0 spends one. At 100 ms (instance 0) and 567 ms (instance 1) requests are
        // refused at the timeout, but the store had allowed both. Without the first, the bucket
        // would have stood full from 500 ms on, wasting its refill, while the store's went on
        // refilling: at 597 ms instance 0 must not get it back. At 630 ms instance 1 gets the
        // second back (it came while the bucket was still short of full), and at 1,001 ms one
        // more request comes.
        let ev = |step: u64, which: usize, late: bool| (step * MS, which, 0, 0, false, late);
        let events: Vec<Event> = vec![
            ev(0, 0, false),
            ev(100, 0, true),
            ev(467, 1, true),
            ev(30, 0, false),
            ev(33, 1, false),
            ev(371, 0, false),
        ];
        assert_eq!(drive_bucket(2, 2, &events), Ok(()));
    }

    #[test]
    fn a_lease_spent_at_the_last_moment_leaves_the_bucket_as_one_bucket_would() {
        // 10 tokens, one a millisecond. Instance 0 spends 6 through the store at 0 and 1 ms
        // (leasing nothing yet), then at 300 ms is leased 4 (half of what remains), and spends
        // them at 549 ms, the last moment of its lease here (the store holds them until 800 ms).
        // Nobody asks the store meanwhile: the bucket stood at its capacity less the hold from
        // 310 ms. Instance 1 then asks for 10 at once at 551 ms: the store has 6 to give.
        let mut events: Vec<Event> = vec![(0, 0, 0, 0, false, false); 3];
        events.extend([(MS, 0, 0, 0, false, false); 3]);
        events.push((299 * MS, 0, 0, 0, false, false));
        events.push((249 * MS, 0, 0, 0, false, false));
        events.extend([(0, 0, 0, 0, false, false); 3]);
        events.push((2 * MS, 1, 0, 0, false, false));
        events.extend([(0, 1, 0, 0, false, false); 9]);
        assert_eq!(drive_bucket(10, 1_000, &events), Ok(()));
    }
}
