//! Limits `per: endpoint`: the endpoints offered one at a time until one's budget admits.

use super::*;

impl Decider<'_> {
    /// The request's decision with its limits `per: endpoint` (a replica's budget): the
    /// endpoints `endpoints` offers, in the balancer's order, one at a time until one's budget
    /// admits; an endpoint whose budget is spent (only limits `per: endpoint` refused) is passed
    /// over. When every one is spent, the refusal that can be retried soonest. A refusal by any
    /// other limit, or a store failure, ends the search: no endpoint would change it. Each try
    /// is all-or-nothing (a refused one spends nothing), so the search never over-admits.
    pub(super) async fn pass_over(
        &self,
        request: &Request<'_, '_>,
        facts: &mut impl Facts,
        endpoints: &mut (dyn Endpoints + Send),
    ) -> Decided {
        let mut soonest: Option<(u64, Decided)> = None;
        while let Some(endpoint) = endpoints.next() {
            let decided = self.attempt(request, facts, Some(endpoint)).await;
            let retry_us = match &decided.refused {
                Some(Refused::RateLimited(verdict, _))
                    if only_per_endpoint(request.budgets[0], decided.denied[0]) =>
                {
                    verdict.retry_after_us()
                }
                _ => return decided,
            };
            if soonest
                .as_ref()
                .is_none_or(|(soonest, _)| retry_us < *soonest)
            {
                soonest = Some((retry_us, decided));
            }
        }
        match soonest {
            Some((_, decided)) => decided,
            // No endpoint at all: the other limits decide (the forward answers 503 `no_upstream`).
            None => self.attempt(request, facts, None).await,
        }
    }
}

/// True when the limits that denied (`denied`, bits by position in `budget`) are all
/// `per: endpoint` ones: another endpoint may still admit.
pub(super) fn only_per_endpoint(budget: &Budget, denied: u16) -> bool {
    denied != 0
        && budget
            .limits
            .iter()
            .enumerate()
            .all(|(p, l)| p >= MAX_LIMITS || denied & (1 << p) == 0 || l.per == Per::Endpoint)
}
