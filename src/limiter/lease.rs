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
//! - *token bucket* (GCRA): a bucket refills, and a lease held while the store's side refills
//!   would let the two together hold more than the capacity. So a lease **drains at the refill
//!   rate**: `t` after it was granted, it may hand out at most `units - t / (interval × cost)`
//!   requests (and never more than it has left). Then the store's tokens plus what all leases may
//!   still hand out never exceed what one bucket would hold: every sequence of admissions is one a
//!   single bucket would admit. A lease nobody spends is gone after its own refill time, exactly
//!   as if it had been spent at once, so a killed instance's lease heals on its own.
//! - *sliding window log*: the leased units are entered in the log when leased, stamped with the
//!   lease's end, so each counts from before it is spent until a window after: no window of
//!   admitted requests can hold more than the limit. The lease lasts at most one window.
//! - every other algorithm (the leaky bucket's delay, concurrency) is decided per request, and a
//!   request is served from leases only when every limit it asks holds one.
//!
//! **Whose clock.** A lease's time runs from when its request was *sent* (local clock), not
//! when the answer came back: the store granted it no earlier, so the lease ends, and a bucket's
//! lease drains, no later on the store's clock than the store's own figures assume, whatever the
//! round trip.
//!
//! **Giving back.** A lease that ends with units unspent gives them back with the next request
//! that budget sends to the store, in the same call ([`LeaseAsk::back`]): a bucket gets back what
//! the lease may still hand out one `ttl` later (nothing that drains before the store applies it),
//! a window only into the window the units were counted in, a log by removing the lease's entries.
//!
//! **What it costs.** Units an instance holds are not available to another instance's clients
//! (`X-RateLimit-Remaining` lags by them), and what no request gives back lapses (a bucket's lease
//! drains away, a window's is lost until the window ends): at most one lease per budget and
//! instance. A lease is at most half of what remains after its request (`decide.lua`), so it
//! shrinks to nothing as the budget nears exhaustion, where every request is decided in the store
//! again; and it is sized to what this instance spent from the budget in the previous
//! `lease_ttl`, so a budget spent rarely is never leased.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::memory::Prehashed;
use super::wire::Reply;
use super::{AlgorithmKind, Ask, ClockOffset, Decision, LocalUs, Parameters, StoreUs, Verdict};

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
    /// Requests' worth of an ended lease given back unspent.
    pub back: u64,
    /// The store's time that lease was granted at: a window takes units back only into the
    /// window they were counted in.
    pub back_at: StoreUs,
    /// How long (µs) a lease of this limit lasts at most: a sliding window log stamps leased units
    /// with the lease's end.
    pub lease_us: u64,
}

/// The `outcome` label of `floodgate_lease_units_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// Counters of leased units (in requests' worth): handles into one family, registered as
/// `floodgate_lease_units_total{outcome}`.
#[derive(Debug, Clone)]
pub struct LeaseStats {
    pub family: Family<OutcomeLabel, Counter>,
    pub granted: Counter,
    pub spent: Counter,
    /// Units given back to the store unspent when the lease ended.
    pub returned: Counter,
    pub lapsed: Counter,
}

impl Default for LeaseStats {
    fn default() -> Self {
        let family = Family::<OutcomeLabel, Counter>::default();
        let of = |outcome| family.get_or_create_owned(&OutcomeLabel { outcome });
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
}

struct Held {
    /// Requests' worth granted.
    units: u64,
    spent: u64,
    /// Token bucket: requests' worth drained before they were spent (written off).
    drained: u64,
    granted_at: LocalUs,
    expires_at: LocalUs,
    /// Token bucket: µs in which one request's worth drains; 0 for windows.
    drain_us: u64,
    /// Token bucket: how long after the grant the drain starts (the store's side can refill
    /// that long before it and the lease together could hold more than the capacity).
    headroom_us: u64,
    /// The store's clock less the local one when granted.
    store_offset: ClockOffset,
    /// The store's decision for the request that took the lease, `remaining` net of the lease.
    decision: Decision,
}

impl Held {
    /// Requests this lease may still hand out at `now`, with what has drained by then written
    /// off for good.
    ///
    /// A token bucket's lease may hold at most `units - elapsed / drain` unspent at any time:
    /// what exceeds that drains away and cannot be spent later, however much is spent meanwhile
    /// (the running maximum of `elapsed / drain - spent`, rounded up). Spending alone would not
    /// do: a lease spent late could then be spent together with what the store refilled
    /// meanwhile, beyond the capacity.
    fn usable(&mut self, now: LocalUs) -> u64 {
        if now >= self.expires_at {
            return 0;
        }
        if self.drain_us > 0 {
            // A request that read the clock before this lease was granted is served as of then.
            let drained = now
                .since(self.granted_at)
                .saturating_sub(self.headroom_us)
                .div_ceil(self.drain_us);
            self.drained = self.drained.max(drained.saturating_sub(self.spent));
        }
        self.units.saturating_sub(self.spent + self.drained)
    }

    /// Requests' worth this lease could give back at local time `at`, the store applying it no
    /// earlier (what drains by then is not given back). Expiry aside, as `usable`.
    fn unspent_at(&self, at: LocalUs) -> u64 {
        let mut drained = self.drained;
        if self.drain_us > 0 {
            let by_then = at
                .since(self.granted_at)
                .saturating_sub(self.headroom_us)
                .div_ceil(self.drain_us);
            drained = drained.max(by_then.saturating_sub(self.spent));
        }
        self.units.saturating_sub(self.spent + drained)
    }
}

/// Whether a limit's units can be leased.
fn leasable(ask: &Ask<'_>) -> bool {
    matches!(
        ask.limit.algorithm().kind(),
        AlgorithmKind::TokenBucket
            | AlgorithmKind::FixedWindow
            | AlgorithmKind::SlidingWindowCounter
            | AlgorithmKind::SlidingWindowLog
    )
}

impl Leases {
    /// Leases that last at most `ttl_us` (local µs), counted in `stats`.
    pub fn new(ttl_us: u64, stats: LeaseStats) -> Self {
        Leases {
            ttl_us: ttl_us.max(1),
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

    /// How long a lease of `ask`'s limit may last: `ttl`, and a log's at most one window (its
    /// units count until a window after the lease's end).
    fn lifetime(&self, ask: &Ask<'_>) -> u64 {
        match ask.limit.algorithm().kind() {
            AlgorithmKind::SlidingWindowLog => self.ttl_us.min(window_us(ask)).max(1),
            _ => self.ttl_us,
        }
    }

    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Slot, Prehashed>> {
        self.shards[(key >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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

    /// Counts this request's demand on each leasable limit and says, per ask, how many more
    /// requests' worth to lease with it (what this instance spent from the budget in the last
    /// `ttl`, when that is at least 2: a budget spent rarely is not leased), and gives back what
    /// an ended lease left unspent (a request goes to the store only when its lease is spent,
    /// drained or ended). A token bucket's units are counted as of one `ttl` later: the store
    /// applies them within the request's timeout, and must not get back what has drained.
    pub fn wants(&self, asks: &[Ask<'_>], now: LocalUs) -> Vec<LeaseAsk> {
        asks.iter()
            .map(|ask| {
                let mut out = LeaseAsk::default();
                if !leasable(ask) {
                    return out;
                }
                out.lease_us = self.lifetime(ask);
                let key = ask.key.hash_with(&self.hasher);
                let mut shard = self.shard(key);
                if !shard.contains_key(&key) && shard.len() >= CAPACITY / SHARDS {
                    let ttl = self.ttl_us;
                    let lapsed = &self.stats.lapsed;
                    shard.retain(|_, slot| {
                        let live = slot.held.as_mut().is_some_and(|h| h.usable(now) > 0)
                            || now.since(slot.period_start) < 2 * ttl;
                        if !live && let Some(held) = &slot.held {
                            lapsed.inc_by(held.units.saturating_sub(held.spent));
                        }
                        live
                    });
                    if shard.len() >= CAPACITY / SHARDS {
                        return out;
                    }
                }
                let slot = shard.entry(key).or_default();
                self.note_demand(slot, now);
                if let Some(held) = slot.held.as_mut()
                    && held.usable(now) == 0
                {
                    out.back = held.unspent_at(now.plus(self.ttl_us));
                    out.back_at = held.store_offset.to_store(held.granted_at);
                    self.stats.returned.inc_by(out.back);
                    self.stats
                        .lapsed
                        .inc_by(held.units.saturating_sub(held.spent + out.back));
                    slot.held = None;
                }
                // A limit that still holds units (the request came here for another limit's sake)
                // asks for no more: a new lease would replace this one and lapse its units.
                let holding = slot.held.as_mut().is_some_and(|h| h.usable(now) > 0);
                if holding || slot.previous < 2 || slot.asking_until > now {
                    return out;
                }
                slot.asking_until = now.plus(self.ttl_us);
                out.want = slot.previous.min(MAX_WANT);
                out
            })
            .collect()
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
            let (drain_us, headroom_us, lifetime) = match ask.limit.algorithm().kind() {
                AlgorithmKind::TokenBucket => {
                    let Parameters::Bucket {
                        capacity,
                        interval_us: interval,
                    } = ask.limit.algorithm().parameters()
                    else {
                        continue;
                    };
                    let drain_us = interval.saturating_mul(cost).max(1);
                    // The store held `remaining` after this request, before the lease (rounded
                    // down: up to one token more): it can refill at least
                    // `capacity - remaining - 1` before store and lease together could exceed
                    // the capacity (whole requests' worth, rounded down).
                    let headroom = capacity.saturating_sub(decision.remaining + 1) / cost;
                    (drain_us, headroom.saturating_mul(drain_us), self.ttl_us)
                }
                AlgorithmKind::SlidingWindowLog => (0, 0, self.lifetime(ask)),
                // A window's units count in that window only: the lease ends with it, on the
                // store's clock.
                _ => {
                    let window = window_us(ask);
                    let left = window - reply.verdict.now_us % window.max(1);
                    (0, 0, self.ttl_us.min(left))
                }
            };
            let store_offset = ClockOffset::between(StoreUs(reply.verdict.now_us), now);
            let held = Held {
                units,
                spent: 0,
                drained: 0,
                granted_at: now,
                expires_at: now.plus(lifetime),
                drain_us,
                headroom_us,
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
    fn a_token_bucket_lease_drains_at_the_refill_rate_once_the_store_could_refill_past_it() {
        // 10 per second (a token every 100 ms), capacity 100.
        let limit = Limit::of(Algorithm::token_bucket(100, 10.0).unwrap());
        let asks = [ask(&limit, b"k")];
        let (leases, _) = leases();
        // The store had 99 left after the request (99.x: `remaining` is rounded down): it may be
        // full again at once, and the lease drains a request's worth every 100 ms from the start.
        leases.grant(&asks, &reply(4, 99, 0), LocalUs(0));
        // 150 ms on, two have drained (rounded up): two of the four are left, and spending them
        // does not bring back what drained.
        for _ in 0..2 {
            assert!(leases.spend(&asks, LocalUs(150 * MS)).is_some());
        }
        assert!(leases.spend(&asks, LocalUs(150 * MS)).is_none());
        assert!(leases.spend(&asks, LocalUs(220 * MS)).is_none());
        // With room below the capacity (50 left: 5 s of refill), nothing drains within the ttl.
        leases.grant(&asks, &reply(4, 50, 0), LocalUs(1_000 * MS));
        for _ in 0..4 {
            assert!(leases.spend(&asks, LocalUs(1_240 * MS)).is_some());
        }
        assert!(leases.spend(&asks, LocalUs(1_240 * MS)).is_none());
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

        /// The exactness claim for token buckets: whatever the timing, every request admitted by
        /// two instances (each serving from its own lease when it can, else asking the store,
        /// giving back what an ended lease left and leasing what it wants up to half of what
        /// remains, as the guard and decide.lua do) is one a single bucket, seeing the same
        /// admissions in the same order, would have admitted.
        #[test]
        fn store_and_leases_together_never_admit_what_one_bucket_would_not(
            capacity in 2u32..40,
            per_second in 1u32..200,
            // Half the steps are 0: bursts at one instant, where a lease spent together with
            // what the store refilled meanwhile would show.
            events in proptest::collection::vec(
                (proptest::prop_oneof![proptest::strategy::Just(0u64), 0u64..40_000], proptest::bool::ANY),
                1..300,
            ),
        ) {
            use crate::limiter::algorithm::State;
            let limit = Limit::of(Algorithm::token_bucket(capacity, f64::from(per_second)).unwrap());
            let (mut store, mut reference) = (
                State::new(AlgorithmKind::TokenBucket),
                State::new(AlgorithmKind::TokenBucket),
            );
            let asks = [ask(&limit, b"k")];
            let instances = [
                Leases::new(250 * MS, LeaseStats::default()),
                Leases::new(250 * MS, LeaseStats::default()),
            ];
            let mut now = 0u64;
            for (step, second) in events {
                now += step;
                let leases = &instances[usize::from(second)];
                let admitted = leases.spend(&asks, LocalUs(now)).is_some() || {
                    // As decide.lua: take back an ended lease's unspent units first, then
                    // decide, then lease at most `want` and half of what remains.
                    let ask = leases.wants(&asks, LocalUs(now))[0];
                    if ask.back > 0
                        && let State::Gcra { tat } = &mut store
                    {
                        let interval = limit.algorithm().span_us();
                        let back = tat.saturating_sub(ask.back * interval);
                        *tat = if back <= now { 0 } else { back };
                    }
                    let d = store.check(&limit, now);
                    if d.allowed() {
                        let extra = (d.remaining / 2).min(u64::from(ask.want));
                        let big = Limit::new(*limit.algorithm(), 1 + extra as u32).unwrap();
                        let extra = if extra > 0 && store.check(&big, now).allowed() {
                            store.commit(&big, now, 0);
                            extra
                        } else {
                            store.commit(&limit, now, 0);
                            0
                        };
                        leases.grant(&asks, &reply(extra, d.remaining, d.reset_after_us), LocalUs(now));
                    }
                    d.allowed()
                };
                if admitted {
                    let r = reference.check(&limit, now);
                    proptest::prop_assert!(r.allowed(), "admitted at {} µs what one bucket would not", now);
                    reference.commit(&limit, now, 0);
                }
            }
        }
    }
}
