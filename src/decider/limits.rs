//! [`Question::Limits`]: asks a caller found itself (the rate-limit service's descriptors),
//! each taken as it says. In order:
//!
//! 1. the asks to give back are given back (whatever is decided after);
//! 2. the asks to check are looked at, in one peek that spends nothing; an enforced one with no
//!    room for one more refuses the request, and then nothing is spent (all or nothing across
//!    checked and spent asks); a store that cannot be asked refuses it as unavailable;
//! 3. the asks to spend are decided all-or-nothing, enforced then shadow (`asks.rs`): at most
//!    [`MAX_LIMITS`] a side, which the caller sees to (the service refuses a request with more).
//!
//! Positions (the [`LimitRef`]s, [`Decided::denied_by`], the standings) are each side's: its
//! spent asks in the order asked, then (for a check that refuses) its checked ones.

use super::*;
use crate::limiter::Decision;

impl Decider<'_> {
    /// Decides `asks` as [`Question::Limits`] says.
    pub(super) async fn decide_limits(&self, asks: &[Taken<'_>]) -> Decided {
        for taken in asks.iter().filter(|t| t.take == Take::GiveBack) {
            self.give_back(&taken.ask).await;
        }
        let mut sides: [Vec<Ask<'_>>; 2] = [Vec::new(), Vec::new()];
        for taken in asks.iter().filter(|t| t.take == Take::Spend) {
            sides[taken.side as usize].push(taken.ask);
        }
        let checks: Vec<&Taken<'_>> = asks.iter().filter(|t| t.take == Take::Check).collect();
        let checked = match checks.is_empty() {
            true => Vec::new(),
            false => {
                let looked: Vec<Ask<'_>> = checks.iter().map(|t| t.ask).collect();
                match self.peek(&looked).await {
                    Ok(decisions) => decisions,
                    Err(_) => {
                        let mut decided = Decided::of(DecisionLabel::StoreError);
                        decided.refused = Some(Refused::StoreUnavailable);
                        return decided;
                    }
                }
            }
        };
        let over = (checks.iter().zip(&checked))
            .position(|(taken, decision)| taken.side == Side::Enforced && !decision.allowed());
        let mut decided = match over {
            None => {
                let [enforced, shadow] = &sides;
                let budget = |asks| BudgetAsks {
                    asks,
                    positions: &POSITIONS[..asks.len().min(MAX_LIMITS)],
                };
                self.decide_asks(budget(enforced), budget(shadow)).await
            }
            Some(at) => Decided::checked_over(&checks, &checked, at, sides[0].len()),
        };
        if self.report {
            let report = decided.report.get_or_insert_default();
            report.spent = over.is_none();
            report.checks = checked;
        }
        decided
    }
}

impl Decided {
    /// The refusal of a request whose enforced check `at` (of `checks`, found as `checked`)
    /// has no room: nothing was spent. Its position is after the `spent` enforced asks.
    fn checked_over(checks: &[&Taken<'_>], checked: &[Decision], at: usize, spent: usize) -> Self {
        let enforced_before = checks[..at]
            .iter()
            .filter(|t| t.side == Side::Enforced)
            .count();
        let position = spent + enforced_before;
        let mut decided = Decided::of(DecisionLabel::Denied);
        let now = crate::limiter::wall_clock_us();
        if let Some(verdict) = crate::limiter::Verdict::from_decisions(now, &checked[at..=at]) {
            decided.refused = Some(Refused::RateLimited(
                verdict.ruling,
                LimitRef::Enforced(position),
            ));
        }
        if position < MAX_LIMITS {
            decided.denied[Side::Enforced as usize] |= 1 << position;
        }
        decided
    }
}

/// The positions of a side's spent asks: the first `n` of these.
const POSITIONS: [usize; MAX_LIMITS] = {
    let mut p = [0; MAX_LIMITS];
    let mut i = 0;
    while i < MAX_LIMITS {
        p[i] = i;
        i += 1;
    }
    p
};
