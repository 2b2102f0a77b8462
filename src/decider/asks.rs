//! Steps 3 and 4: the asks decided in the store (enforced all-or-nothing, then shadow), timed,
//! and what an admitted request holds kept (leases, reservations, what can be given back).

use super::*;

impl Decider<'_> {
    /// Steps 3 and 4 for a request's asks: the enforced ones all-or-nothing (a denial refuses,
    /// unless `shadow: true`; a store failure follows `on_error`), then, if it goes on, the
    /// shadow ones, which never refuse.
    pub(super) async fn decide_asks(
        &self,
        enforced: BudgetAsks<'_>,
        shadow: BudgetAsks<'_>,
    ) -> Decided {
        let mut phase = LimitPhase::new(&self.policy);
        let mut decided = Decided::of(DecisionLabel::Allowed);
        if !enforced.asks.is_empty() {
            let admission = match self.ask_enforced(enforced.asks, &mut decided).await {
                Ok(admission) => admission,
                Err(_) => {
                    decided.refused = Some(phase.store_unavailable());
                    return decided;
                }
            };
            self.keep(&mut decided, Side::Enforced, &enforced, &admission);
            if let Err(refused) = phase.enforced(
                admission.verdict().map(|v| v.ruling),
                enforced.positions,
                admission.store_failed(),
            ) {
                decided.refused = Some(refused);
                return decided;
            }
        }
        // A shadow budget's store failure only means "no shadow verdict".
        if !shadow.asks.is_empty()
            && let Ok(admission) = self.ask(shadow.asks, &mut decided).await
        {
            self.keep(&mut decided, Side::Shadow, &shadow, &admission);
            phase.shadow(admission.verdict().map(|v| v.ruling), shadow.positions);
        }
        decided.headline = phase.headline();
        decided.label = phase.label();
        decided
    }

    /// The enforced asks' decision: [`Decider::ask`] for a budget without a `scope: global`
    /// limit; otherwise the region's limits first and, if they admit, each global one through
    /// its region's slice ([`crate::global::Global::spend`]), folded into one verdict in the
    /// order asked. (A global limit that refuses leaves the region limits' units spent: the
    /// under-grant is theirs, never an over-grant of the global budget.)
    pub(super) async fn ask_enforced(
        &self,
        asks: &[Ask<'_>],
        decided: &mut Decided,
    ) -> Result<Admission, crate::limiter::LimiterError> {
        match self
            .global
            .filter(|_| asks.iter().any(|a| a.limit.is_global()))
        {
            None => self.ask(asks, decided).await,
            // Boxed: the global store's call would otherwise size every decision's future.
            Some(global) => Box::pin(self.ask_with_global(global, asks, decided)).await,
        }
    }

    /// One store decision, timed (a round trip is noted in `decided`). `Err` when the store
    /// failed and `on_error` is `deny`.
    pub(super) async fn ask(
        &self,
        asks: &[Ask<'_>],
        decided: &mut Decided,
    ) -> Result<Admission, crate::limiter::LimiterError> {
        let started = self.metrics.map(|_| Instant::now());
        let admission = self.limiter.decide(asks, self.on_error).await;
        if let (Some(metrics), Some(started)) = (self.metrics, started) {
            let took = started.elapsed();
            metrics.observe_limiter(took.as_secs_f64());
            if let Ok(Admission::Limited {
                round_trip: true, ..
            }) = admission
            {
                decided.store_calls.push((started, took));
            }
        }
        admission
    }

    /// Keeps what `admission` of one budget's asks holds (leases, a reservation) and which of
    /// its limits denied.
    pub(super) fn keep(
        &self,
        decided: &mut Decided,
        side: Side,
        budget: &BudgetAsks<'_>,
        admission: &Admission,
    ) {
        decided
            .leases
            .extend(self.limiter.hold(budget.asks, admission));
        if self.undoable {
            self.keep_spent(decided, side, budget, admission);
        }
        if let Some(reservation) = self.limiter.reserve(budget.asks, admission) {
            let positions = budget
                .asks
                .iter()
                .zip(budget.positions)
                .filter(|(ask, _)| ask.limit.is_settled())
                .map(|(_, &position)| position)
                .collect();
            decided.reservations.push(Reserved {
                reservation,
                side,
                positions,
            });
        }
        if let Some(verdict) = admission.verdict() {
            for (i, &position) in budget.positions.iter().enumerate() {
                if verdict.denied_by(i) && position < MAX_LIMITS {
                    decided.denied[side as usize] |= 1 << position;
                }
                if self.report
                    && let Some(standing) = verdict.standings.get(i)
                {
                    let report = decided.report.get_or_insert_default();
                    report.standings[side as usize].set(position, standing);
                }
            }
        }
    }

    /// Keeps in `decided.spent` what `admission` spent of `budget`'s asks that a refund can
    /// reach (see [`Spent`]), if it admitted.
    pub(super) fn keep_spent(
        &self,
        decided: &mut Decided,
        side: Side,
        budget: &BudgetAsks<'_>,
        admission: &Admission,
    ) {
        if !admission.verdict().is_some_and(|v| v.allowed()) {
            return;
        }
        // Only enforced limits are spent in the global store; without it (replay), and for
        // shadow limits, a global limit is decided in the region's store as any other.
        let global = self.global.filter(|_| side == Side::Enforced);
        let in_global = |ask: &Ask<'_>| global.is_some() && ask.limit.is_global();
        let spent = decided.spent.get_or_insert_default();
        spent
            .reservations
            .extend(self.limiter.reserve_where(budget.asks, admission, |ask| {
                !ask.limit.is_settled()
                    && ask.limit.algorithm().kind() != crate::limiter::AlgorithmKind::Concurrency
                    && !in_global(ask)
            }));
        if let Some(global) = global {
            let refunds = budget.asks.iter().filter(|a| a.limit.is_global());
            spent
                .global
                .extend(refunds.map(|ask| global.refund_of(ask)));
        }
    }
}
