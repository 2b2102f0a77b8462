//! The limit phase, without IO: what a request's budgets' answers mean. The proxy and `floodgate
//! replay` both ask their store (Redis, PostgreSQL, memory; or replay's own memory store on the
//! log's clock) and hand the answers here, so they cannot disagree on what was denied, what was
//! only logged, which limit speaks for the request, or how it is labelled.
//!
//! In order: the route's enforced budget is asked first ([`LimitPhase::enforced`]); a denial
//! refuses the request (unless `shadow: true`), a store failure under `on_error: deny` too
//! ([`LimitPhase::store_unavailable`]); otherwise the shadow budget is asked
//! ([`LimitPhase::shadow`]), which never refuses. [`LimitPhase::label`] is the decision's label,
//! derived here and nowhere else.

use crate::limiter::Ruling;
use crate::metrics::DecisionLabel;

use super::Policy;

/// One limit of a route: in its enforced budget or in its shadow one, and its position there
/// (its index in `limits:` among the enforced, or the shadow, limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitRef {
    Enforced(usize),
    Shadow(usize),
}

impl LimitRef {
    /// Its index among all the route's limits, enforced first, then shadow (as the IETF
    /// headers' policy names are numbered).
    pub fn index(self, enforced: usize) -> usize {
        match self {
            LimitRef::Enforced(position) => position,
            LimitRef::Shadow(position) => enforced + position,
        }
    }
}

/// Why the limit phase refuses a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// An enforced limit denied it (429); the verdict and the limit that speaks for it.
    RateLimited(Ruling, LimitRef),
    /// The store failed and `on_error` is `deny` (503).
    StoreUnavailable,
    /// The identity is banned on the route for this many more microseconds (429 `banned`).
    Banned(u64),
}

/// One request's limit phase, fed the store's answers.
#[derive(Debug, Clone, Copy)]
pub struct LimitPhase {
    shadow_mode: bool,
    store_failed: bool,
    shadow_denied: bool,
    /// The verdict whose figures the response's headers carry, and its limit: the one with the
    /// fewest remaining among those asked.
    headline: Option<(Ruling, LimitRef)>,
}

impl LimitPhase {
    /// The phase under `policy` (its `shadow:` switch).
    pub fn new(policy: &Policy<'_>) -> Self {
        LimitPhase {
            shadow_mode: policy.shadow,
            store_failed: false,
            shadow_denied: false,
            headline: None,
        }
    }

    /// The enforced budget's answer: its verdict (`None` when no limit applied, or the store
    /// failed and `on_error` forwarded it unlimited), `positions` mapping each ask to its
    /// limit's position, and whether the store failed (`on_error` answered). `Err` refuses the
    /// request; `Ok` goes on to the shadow budget.
    pub fn enforced(
        &mut self,
        verdict: Option<Ruling>,
        positions: &[usize],
        store_failed: bool,
    ) -> Result<(), Refused> {
        self.store_failed = store_failed;
        let Some(v) = verdict else {
            return Ok(());
        };
        let limit = LimitRef::Enforced(positions[v.headline_index]);
        if !v.allowed() {
            // Under `shadow: true` an enforced denial is only logged.
            if !self.shadow_mode {
                return Err(Refused::RateLimited(v, limit));
            }
            self.shadow_denied = true;
        }
        self.headline = Some((v, limit));
        Ok(())
    }

    /// The store failed deciding the enforced budget and `on_error` is `deny`.
    pub fn store_unavailable(&mut self) -> Refused {
        self.store_failed = true;
        Refused::StoreUnavailable
    }

    /// The shadow budget's answer (`None`: no limit applied, or the store could not say): it
    /// never refuses; a denial is counted, and its figures go in the headers when it has fewer
    /// remaining.
    pub fn shadow(&mut self, verdict: Option<Ruling>, positions: &[usize]) {
        let Some(v) = verdict else {
            return;
        };
        if !v.allowed() {
            self.shadow_denied = true;
        }
        let fewer = self
            .headline
            .is_none_or(|(h, _)| v.headline.remaining < h.headline.remaining);
        if fewer {
            self.headline = Some((v, LimitRef::Shadow(positions[v.headline_index])));
        }
    }

    /// The label of a request this phase let through: a store failure wins (the limits could
    /// not all be asked), then a denial that was only logged.
    pub fn label(&self) -> DecisionLabel {
        if self.store_failed {
            DecisionLabel::StoreError
        } else if self.shadow_denied {
            DecisionLabel::ShadowDenied
        } else {
            DecisionLabel::Allowed
        }
    }

    /// The verdict the response's rate-limit headers speak for, and its limit.
    pub fn headline(&self) -> Option<(Ruling, LimitRef)> {
        self.headline
    }
}
