//! What leases owe their store: a decision's grant whose answer came late (or never left), and
//! what a call takes to give back; settled with the next call that budget sends, or put back
//! for it when the call is never sent (see "Giving back" in `lease.rs`).

use super::*;

/// Where a decision's grant is owed back should its answer come late ([`Leases::owe`]).
#[derive(Debug, Clone, Copy)]
pub struct OweSlot {
    pub(super) key: u64,
    pub(super) sent: LocalUs,
    /// A token bucket's µs per request's worth.
    pub(super) bucket: Option<u64>,
}

/// What a call to the store leaves to settle should its answer come late, or never leave: where
/// each ask's grant is owed, and what the call gives back ([`Leases::wants_taking`]).
pub struct Debts {
    pub slots: Vec<Option<OweSlot>>,
    pub taken: Vec<Option<Owed>>,
}

/// Units owed back to a budget's store: a decision's grant that reached nobody (the request's
/// own requests' worth and the lease that came with it), or a give-back whose call was never
/// sent.
#[derive(Debug, Clone, Copy)]
pub struct Owed {
    /// Requests' worth to give back besides the decision's own.
    pub(super) back: u64,
    /// The lease they belong to (its hold is released), 0: none.
    pub(super) lent: u64,
    /// The store's time of the decision (or of the lease's grant).
    pub(super) at: StoreUs,
    /// The decision's own request's worth, when it is owed too.
    pub(super) own: Option<Own>,
}

/// A decision's own request's worth owed back. A window's always comes back whole. A token
/// bucket's, which nothing held in the store, cannot simply be credited back later: while a
/// bucket that never lost it would have stood full (and wasted its refill), the store's, short of
/// it, went on refilling. So it counts as drained once such a bucket could stand full, timed
/// from when the request was sent (which is earlier): a contended bucket (far from full) gets it
/// back, and a bucket full but for it loses at most that request's worth.
#[derive(Debug, Clone, Copy)]
pub(super) struct Own {
    pub(super) sent: LocalUs,
    /// A bucket's: how long after `sent` a bucket that never lost it could stand full.
    pub(super) headroom_us: Option<u64>,
}

impl Owed {
    /// Requests' worth the store may take back when it applies the give-back at local time
    /// `at` at the latest.
    pub(super) fn back_at(&self, at: LocalUs) -> u64 {
        let own = match self.own {
            None => 0,
            Some(Own {
                headroom_us: None, ..
            }) => 1,
            Some(Own {
                sent,
                headroom_us: Some(headroom),
            }) => u64::from(at.since(sent) <= headroom),
        };
        self.back + own
    }
}

impl Leases {
    /// Puts back what [`Leases::wants_taking`] took to give back, for a call that was never sent
    /// (its request gave up while it waited to leave in a batch): the next call gives it back.
    pub fn restore(&self, debts: &Debts) {
        for (slot, owed) in debts.slots.iter().zip(&debts.taken) {
            if let (Some(slot), Some(owed)) = (slot, owed) {
                self.shard(slot.key)
                    .entry(slot.key)
                    .or_default()
                    .owed
                    .push(*owed);
            }
        }
    }

    /// Records the answer to a decision abandoned at the timeout (`reply`, late): when the store
    /// allowed it, what it spent (the request's own requests' worth, and any lease with it) is
    /// owed back, and given back with the budget's next call to the store
    /// ([`Leases::wants_taking`]),
    /// so that a slow store costs latency, not budget. The lease itself is not taken up: its
    /// time ran from when the request was sent, most of it spent waiting.
    pub fn owe(&self, slots: &[Option<OweSlot>], reply: &Reply) {
        if !reply.verdict.allowed() {
            return;
        }
        for (i, slot) in slots.iter().enumerate() {
            let (Some(slot), Some(decision)) = (slot, reply.decisions.get(i)) else {
                continue;
            };
            let lent = reply.leased.get(i).copied().unwrap_or(0);
            // The store's side is full again `reset_after_us` after the decision; a bucket that
            // never lost this request's worth, a request's worth sooner.
            let own = Own {
                sent: slot.sent,
                headroom_us: slot
                    .bucket
                    .map(|drain_us| decision.reset_after_us.saturating_sub(drain_us)),
            };
            let mut shard = self.shard(slot.key);
            if !shard.contains_key(&slot.key) && shard.len() >= CAPACITY / SHARDS {
                continue;
            }
            shard.entry(slot.key).or_default().owed.push(Owed {
                back: lent,
                lent,
                at: StoreUs(reply.verdict.now_us),
                own: Some(own),
            });
        }
    }

    /// Where [`Leases::owe`] records each ask's debt (`None`: not leasable), for a decision sent
    /// at `sent`: taken when the decision is sent, for its answer to find should it come late.
    #[cfg(test)]
    pub fn slots(&self, asks: &[Ask<'_>], sent: LocalUs) -> Vec<Option<OweSlot>> {
        asks.iter()
            .map(|ask| {
                leasable(ask).then(|| self.owe_slot(ask, ask.key.hash_with(&self.hasher), sent))
            })
            .collect()
    }

    pub(super) fn owe_slot(&self, ask: &Ask<'_>, key: u64, sent: LocalUs) -> OweSlot {
        let cost = u64::from(ask.limit.cost());
        let bucket = match ask.limit.algorithm().parameters() {
            Parameters::Bucket { interval_us, .. } => Some(interval_us.saturating_mul(cost).max(1)),
            Parameters::Window { .. } => None,
        };
        OweSlot { key, sent, bucket }
    }

    /// How far ahead a give-back's effect is reckoned: the store applies it within the call's
    /// timeout (or the lease's ttl, if longer).
    pub(super) fn horizon_us(&self) -> u64 {
        self.ttl_us
            .max(self.timeout_us.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// `storage.timeout` in µs, which bounds when the store applies a give-back.
    pub fn set_timeout(&self, timeout_us: u64) {
        self.timeout_us
            .store(timeout_us, std::sync::atomic::Ordering::Relaxed);
    }

    /// True when one of `asks`' budgets has something to give back: its next request goes to
    /// the store even if a denial is cached (the give-back may be what it needs).
    pub fn owes(&self, asks: &[Ask<'_>], now: LocalUs) -> bool {
        asks.iter().filter(|ask| leasable(ask)).any(|ask| {
            let key = ask.key.hash_with(&self.hasher);
            self.shard(key).get(&key).is_some_and(|slot| {
                !slot.owed.is_empty()
                    || slot
                        .held
                        .as_ref()
                        .is_some_and(|h| h.usable(now) == 0 && h.spent < h.units)
            })
        })
    }
}
