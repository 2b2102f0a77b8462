//! What a store answers: per limit a [`Decision`], per request a [`Verdict`] (all-or-nothing),
//! and what the limiter made of it, an [`Admission`].

use super::LeaseId;

/// Whether a request may pass, with what only that answer carries: a leaky bucket's delay
/// when allowed, the wait before a retry can pass when denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; held `delay_us` before forwarding (leaky bucket only; 0 otherwise).
    Allowed { delay_us: u64 },
    /// Refused; the earliest retry that can pass is `retry_after_us` from now.
    Denied { retry_after_us: u64 },
}

impl Outcome {
    pub fn allowed(self) -> bool {
        matches!(self, Outcome::Allowed { .. })
    }

    /// The wait before a retry can pass; 0 when allowed.
    pub fn retry_after_us(self) -> u64 {
        match self {
            Outcome::Denied { retry_after_us } => retry_after_us,
            Outcome::Allowed { .. } => 0,
        }
    }

    /// How long to hold an admitted request; 0 when denied.
    pub fn delay_us(self) -> u64 {
        match self {
            Outcome::Allowed { delay_us } => delay_us,
            Outcome::Denied { .. } => 0,
        }
    }
}

/// What a decision reports of its budget, whatever its outcome (the rate-limit headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Capacity (buckets) or limit (windows).
    pub limit: u64,
    /// Units left after this request.
    pub remaining: u64,
    /// Time until the budget is fully restored.
    pub reset_after_us: u64,
}

/// What one limit says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    /// Capacity (buckets) or limit (windows): `X-RateLimit-Limit`.
    pub limit: u64,
    /// Units left after this request: `X-RateLimit-Remaining`.
    pub remaining: u64,
    /// Time until the budget is fully restored: `X-RateLimit-Reset` is now plus this.
    pub reset_after_us: u64,
}

impl Decision {
    /// What a peek (a check that spends nothing) says was left before the request it checked:
    /// a check that allowed counted that request's `cost` in its `remaining`. `/budgets`, the
    /// usage endpoint and the rate-limit service's peeks report this.
    pub fn remaining_before(&self, cost: u32) -> u64 {
        let counted = if self.allowed() { u64::from(cost) } else { 0 };
        (self.remaining + counted).min(self.limit)
    }

    /// An allowing decision with nothing in it: a placeholder for fixed-size buffers.
    pub(crate) const EMPTY: Decision = Decision::allow(
        Figures {
            limit: 0,
            remaining: 0,
            reset_after_us: 0,
        },
        0,
    );

    /// An admission with these figures (held `delay_us` first: leaky bucket).
    pub const fn allow(figures: Figures, delay_us: u64) -> Self {
        Decision::new(Outcome::Allowed { delay_us }, figures)
    }

    /// A refusal with these figures, whose earliest retry can pass `retry_after_us` from now.
    pub const fn deny(figures: Figures, retry_after_us: u64) -> Self {
        Decision::new(Outcome::Denied { retry_after_us }, figures)
    }

    const fn new(outcome: Outcome, figures: Figures) -> Self {
        Decision {
            outcome,
            limit: figures.limit,
            remaining: figures.remaining,
            reset_after_us: figures.reset_after_us,
        }
    }

    pub fn allowed(&self) -> bool {
        self.outcome.allowed()
    }

    /// When denied, the time until the earliest retry that can pass; 0 when allowed.
    pub fn retry_after_us(&self) -> u64 {
        self.outcome.retry_after_us()
    }

    /// Leaky bucket only: how long to hold an admitted request before forwarding it.
    pub fn delay_us(&self) -> u64 {
        self.outcome.delay_us()
    }
}

/// Where one limit stands after a decision, as a rate-limit service's status reports it:
/// compact, since a verdict carries one per limit asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Standing {
    /// Units left (at most `u32::MAX`: the status's field is 32 bits).
    pub remaining: u32,
    /// Whole seconds until the budget is fully restored, rounded up.
    pub reset_secs: u32,
}

impl Standing {
    /// The standing a decision reports.
    pub fn of(d: &Decision) -> Standing {
        Standing {
            remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
            reset_secs: u32::try_from(d.reset_after_us.div_ceil(1_000_000)).unwrap_or(u32::MAX),
        }
    }
}

/// Where each limit asked stands (by its place in the list asked), for those the answer
/// reported: every limit when a store decided, the remembered one for the deny cache's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Standings {
    known: u16,
    each: [Standing; super::MAX_LIMITS],
}

impl Standings {
    /// Where the limit at `index` stands, if the answer said.
    pub fn get(&self, index: usize) -> Option<Standing> {
        (index < super::MAX_LIMITS && self.known & (1 << index) != 0).then(|| self.each[index])
    }

    /// Records where the limit at `index` stands (an index past the last limit is ignored).
    pub fn set(&mut self, index: usize, standing: Standing) {
        if index < super::MAX_LIMITS {
            self.known |= 1 << index;
            self.each[index] = standing;
        }
    }
}

/// What a verdict says of the request as a whole: the outcome and the limit that speaks for
/// it. This is what a refusal and the rate-limit headers carry, so it is kept small (a
/// request's decision is moved from future to future): where every other limit stands is the
/// [`Verdict`]'s, for the rate-limit service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ruling {
    /// The time the decision was taken at (µs since the Unix epoch), by the store's clock.
    pub now_us: u64,
    /// The limit with the fewest remaining: the one whose figures go in the headers.
    pub headline: Decision,
    /// That limit's position in the list asked.
    pub headline_index: usize,
    /// Allowed when every limit allowed (with the longest leaky-bucket delay among them); else
    /// denied, with the longest wait among the limits that denied.
    pub outcome: Outcome,
    /// Which limits denied: bit `i` for the i-th asked (at most [`MAX_LIMITS`](super::MAX_LIMITS)
    /// are asked). A denial remembered by the deny cache names only the limit it remembers.
    pub denied: u16,
}

/// The decision of all the limits asked about one request, taken all-or-nothing: its
/// [`Ruling`] (read through it: `verdict.headline`, `verdict.allowed()`), and where each limit
/// asked stands after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub ruling: Ruling,
    pub standings: Standings,
}

impl std::ops::Deref for Verdict {
    type Target = Ruling;

    fn deref(&self) -> &Ruling {
        &self.ruling
    }
}

impl Verdict {
    /// Folds per-limit decisions (in the order asked) into one verdict. `None` when empty.
    pub fn from_decisions(now_us: u64, decisions: &[Decision]) -> Option<Verdict> {
        let mut headline = *decisions.first()?;
        let mut headline_index = 0;
        let mut allowed = true;
        let mut retry_after_us = 0;
        let mut delay_us = 0;
        let mut denied = 0u16;
        let mut standings = Standings::default();
        for (i, d) in decisions.iter().enumerate() {
            standings.set(i, Standing::of(d));
            if d.remaining < headline.remaining {
                headline = *d;
                headline_index = i;
            }
            if !d.allowed() {
                denied |= 1u16.checked_shl(i as u32).unwrap_or(0);
            }
            allowed &= d.allowed();
            retry_after_us = retry_after_us.max(d.retry_after_us());
            delay_us = delay_us.max(d.delay_us());
        }
        Some(Verdict {
            ruling: Ruling {
                now_us,
                headline,
                headline_index,
                outcome: if allowed {
                    Outcome::Allowed { delay_us }
                } else {
                    Outcome::Denied { retry_after_us }
                },
                denied,
            },
            standings,
        })
    }
}

impl Ruling {
    /// True when the limit asked at `index` denied.
    pub fn denied_by(&self, index: usize) -> bool {
        index < 16 && self.denied & (1 << index) != 0
    }

    pub fn allowed(&self) -> bool {
        self.outcome.allowed()
    }

    /// When denied, the longest wait among the limits that denied; 0 when allowed.
    pub fn retry_after_us(&self) -> u64 {
        self.outcome.retry_after_us()
    }

    /// When allowed, the longest leaky-bucket delay among the limits; 0 when denied.
    pub fn delay_us(&self) -> u64 {
        self.outcome.delay_us()
    }

    /// `Retry-After` in whole seconds: the wait rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_us().div_ceil(1_000_000).max(1)
    }

    /// `X-RateLimit-Reset`: the Unix second by which the budget is fully restored, rounded up.
    pub fn reset_unix_secs(&self) -> u64 {
        (self.now_us + self.headline.reset_after_us).div_ceil(1_000_000)
    }
}

/// What the limiter answered for one request. A store failure under `on_error: deny` is not an
/// admission: [`Limiter::decide`](super::Limiter::decide) returns the error instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a Verdict carries each limit's standing (for the rate-limit service's statuses); moved, never allocated"
)]
pub enum Admission {
    /// Nothing was asked: no limits apply.
    Unlimited,
    /// A store decided (allowed or denied). An allowed request holds the concurrency leases
    /// named `lease` until [`Limiter::release`](super::Limiter::release).
    Limited {
        verdict: Verdict,
        source: Source,
        lease: LeaseId,
        /// The answer waited on a round trip to a remote store (not a lease, the deny cache,
        /// or the in-process store): what a trace's store span stands for.
        round_trip: bool,
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

/// What settling one limit's reservation does to its budget (`cost: {reserve, actual}`): the
/// reserve was spent when the store decided at `at_us` (its clock); the actual cost is now
/// known. One of `refund` and `charge` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settlement {
    /// Units held beyond the actual cost, given back.
    pub refund: u64,
    /// Units spent beyond the reserve, taken now (into debt if need be).
    pub charge: u64,
    /// When the reserve was decided, on the store's clock.
    pub at_us: u64,
}

impl Settlement {
    /// The settlement of a reserve of `reserved` units decided at `at_us` that cost `actual`.
    pub fn of(reserved: u64, actual: u64, at_us: u64) -> Settlement {
        Settlement {
            refund: reserved.saturating_sub(actual),
            charge: actual.saturating_sub(reserved),
            at_us,
        }
    }

    /// Its refund, charge and time as a store applies them to a limit of `units`: a refund is
    /// at most a reserve (which is at most the limit) and a charge at most the limit, whatever
    /// the figure read, so no arithmetic a store does with them can overflow or wrap.
    pub fn bounded(&self, units: u64) -> (u64, u64, u64) {
        (self.refund.min(units), self.charge.min(units), self.at_us)
    }

    /// True when it changes nothing.
    pub fn is_even(&self) -> bool {
        self.refund == 0 && self.charge == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(limit: u64, remaining: u64) -> Figures {
        Figures {
            limit,
            remaining,
            reset_after_us: 0,
        }
    }

    #[test]
    fn a_peek_that_allowed_gives_back_what_it_counted_and_never_past_the_limit() {
        assert_eq!(Decision::allow(figures(10, 6), 0).remaining_before(3), 9);
        assert_eq!(Decision::allow(figures(10, 9), 0).remaining_before(3), 10);
        // A refusal counted nothing.
        assert_eq!(Decision::deny(figures(10, 2), 1).remaining_before(3), 2);
    }
}
