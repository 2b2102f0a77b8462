//! Units held out of a token bucket until they are settled: the arithmetic the stores run on a
//! bucket's holds (Redis: `lua/gcra.lua`; PostgreSQL: `sql/gcra.sql`), kept here, in Rust, as
//! the model the lease property tests drive.
//!
//! A *hold* takes units out of a bucket (they are debited at once, as spent) and also keeps the
//! bucket from refilling past `capacity − held` until the hold ends or is released: the bucket's
//! tokens plus every outstanding hold never exceed its capacity. Whoever holds the units (an
//! instance's lease, later a request's reserved cost) may then spend them at any time before the
//! hold ends, and every admission is still one a single bucket would have made: the units were
//! spent, as far as the bucket can tell, the moment they were held, and the bucket cannot have
//! refilled into them meanwhile.
//!
//! A hold ends on the store's clock (`end`), so one whose holder died stops counting by itself;
//! one whose holder is done is *released* early, giving back what it left unspent.
//!
//! In GCRA terms (the stores keep a bucket as `tat`, the instant it is full again), a hold of
//! `h` µs worth of units until `end` means the bucket, refilling, stops `h` short of full until
//! `end` and refills the rest after it. So while the hold lasts the bucket's effective `tat` is
//! at least `now + h`, and once it has ended, at least `end + h` (the refill it missed, made up
//! after). With several holds, each missed the refill of every hold still out when it ended.

use super::algorithm::State;
use super::lease::LeaseAsk;
use super::{Decision, Limit};

/// One hold on a bucket: until `end` (store µs), `held_us` µs worth of units (units × cost ×
/// interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub end: u64,
    pub held_us: u64,
}

/// A bucket's holds, soonest end first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holds {
    holds: Vec<Hold>,
}

impl Holds {
    /// The bucket's `tat` at `now` with its holds applied, the holds that have ended by then
    /// folded into it and dropped (the result, stored, means the same at any later time).
    pub fn fold(&mut self, tat: u64, now: u64) -> u64 {
        let mut out = tat;
        let mut out_now: u64 = self.holds.iter().map(|h| h.held_us).sum();
        let ended = self.holds.iter().take_while(|h| h.end <= now).count();
        for h in &self.holds[..ended] {
            out = out.max(h.end + out_now);
            out_now -= h.held_us;
        }
        self.holds.drain(..ended);
        out.max(now + out_now)
    }

    /// Adds a hold (after a [`Holds::fold`] at the time it is taken).
    pub fn hold(&mut self, hold: Hold) {
        let at = self.holds.partition_point(|h| h.end <= hold.end);
        self.holds.insert(at, hold);
    }

    /// Releases the hold `hold` if it is still out (after a [`Holds::fold`]): true when it was.
    pub fn release(&mut self, hold: Hold) -> bool {
        match self.holds.iter().position(|h| *h == hold) {
            Some(at) => {
                self.holds.remove(at);
                true
            }
            None => false,
        }
    }

    /// When the last hold ends (0: none): a bucket's state lives at least until then.
    pub fn last_end(&self) -> u64 {
        self.holds.last().map_or(0, |h| h.end)
    }

    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }
}

/// Gives `back_us` µs worth of a released hold's unspent units back to a bucket whose folded
/// `tat` is `tat`: the bucket fills by that much (never past full, at `now`).
pub fn credit(tat: u64, back_us: u64, now: u64) -> u64 {
    tat.saturating_sub(back_us).max(now)
}

/// A token bucket as the stores keep it when it is leased from: its `tat` and its holds. The
/// reference for what `decide.lua` and `decide.sql` do with one token-bucket limit of a request
/// that leases: the property tests drive it as the store, the differential tests check the
/// stores against it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldBucket {
    pub tat: u64,
    pub holds: Holds,
}

impl HeldBucket {
    /// One request at `now` on `limit` (a token bucket), asking `ask` of its lease: the ended
    /// lease's hold is released and its unspent units credited (or, with no lease, a decision's
    /// units given back), the request decided, and if it
    /// is allowed, at most `ask.want` and half of what remains leased and held until
    /// `now + ask.lease_us`. Returns the decision and the requests' worth leased.
    pub fn decide(&mut self, limit: &Limit, now: u64, ask: &LeaseAsk) -> (Decision, u64) {
        let cost = u64::from(limit.cost());
        let span = limit.algorithm().span_us();
        self.tat = self.holds.fold(self.tat, now);
        let ended = Hold {
            end: ask.back_at.0 + ask.lease_us,
            held_us: ask.lent * cost * span,
        };
        // A lease's unspent units come back only while its hold is out (after its end the
        // bucket has refilled past it); a decision's own, which nothing held, always.
        if (ask.lent > 0 && self.holds.release(ended)) || (ask.lent == 0 && ask.back > 0) {
            // Never past what the holds still out allow.
            let credited = credit(self.tat, ask.back * cost * span, now);
            self.tat = self.holds.fold(credited, now);
        }
        let mut state = State::Gcra { tat: self.tat };
        let d = state.check(limit, now);
        if !d.allowed() {
            return (d, 0);
        }
        let mut extra = (d.remaining / cost / 2).min(u64::from(ask.want));
        let bigger = u32::try_from(cost * (1 + extra))
            .ok()
            .and_then(|c| Limit::new(*limit.algorithm(), c).ok());
        match bigger {
            Some(big) if extra > 0 && state.clone().check(&big, now).allowed() => {
                state.check(&big, now);
                state.commit(&big, now, 0);
                self.holds.hold(Hold {
                    end: now + ask.lease_us,
                    held_us: extra * cost * span,
                });
            }
            _ => {
                extra = 0;
                state.commit(limit, now, 0);
            }
        }
        if let State::Gcra { tat } = state {
            self.tat = tat;
        }
        (d, extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn a_hold_keeps_the_bucket_short_of_full_until_it_ends_then_refills_the_rest() {
        // A bucket with tat in the past (full); 3 s worth held until t = 10 s.
        let mut holds = Holds::default();
        holds.hold(Hold {
            end: 10 * S,
            held_us: 3 * S,
        });
        // At 5 s: full but for the hold.
        assert_eq!(holds.fold(0, 5 * S), 8 * S);
        // At 12 s: the hold ended at 10 s; the bucket refills its 3 s from then, full at 13 s.
        let mut later = holds.clone();
        assert_eq!(later.fold(0, 12 * S), 13 * S);
        assert!(later.is_empty());
        // A tat already later than the hold's end plus the hold: the hold changes nothing.
        assert_eq!(holds.clone().fold(20 * S, 12 * S), 20 * S);
    }

    #[test]
    fn each_ended_hold_missed_the_refill_of_every_hold_still_out() {
        let mut holds = Holds::default();
        holds.hold(Hold {
            end: 20 * S,
            held_us: 2 * S,
        });
        holds.hold(Hold {
            end: 10 * S,
            held_us: S,
        });
        // Until 10 s, 3 s short; from 10 to 20 s, 2 s short; after 20 s the 2 s refill:
        // full at 22 s.
        assert_eq!(holds.clone().fold(0, 5 * S), 8 * S);
        assert_eq!(holds.clone().fold(0, 15 * S), 17 * S);
        assert_eq!(holds.clone().fold(0, 21 * S), 22 * S);
        // Folding at 15 s and again at 21 s gives what one fold at 21 s gives.
        let mut twice = holds.clone();
        let tat = twice.fold(0, 15 * S);
        assert_eq!(twice.fold(tat, 21 * S), 22 * S);
    }

    #[test]
    fn releasing_a_hold_early_lifts_its_cap_and_credits_what_it_left() {
        let mut holds = Holds::default();
        let hold = Hold {
            end: 10 * S,
            held_us: 4 * S,
        };
        holds.hold(hold);
        let tat = holds.fold(0, S);
        assert_eq!(tat, 5 * S);
        assert!(holds.release(hold));
        assert!(!holds.release(hold), "once");
        // 1 s worth unspent given back: full again at 4 s instead of 5 s.
        let tat = credit(tat, S, S);
        assert_eq!(holds.fold(tat, S), 4 * S);
    }
}
