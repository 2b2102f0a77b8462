//! A client's request on a route (`Question::Request`): steps 1 to 5 of the module's list,
//! the budgets' asks built (each settled limit at its reserve) and decided.

use super::*;

impl Decider<'_> {
    /// A client's request on `route` (see [`Question::Request`]), steps 1 to 5.
    pub(super) async fn decide_request(
        &self,
        route: &RouteConfig,
        whose: &Whose<'_>,
        facts: &mut impl Facts,
        endpoints: Option<&mut (dyn Endpoints + Send)>,
    ) -> Decided {
        if !route.is_limited() {
            // Nothing to spend; a ban covers the route all the same.
            let mut buf = [0u8; 16];
            let id = whose.identity.key_bytes(&mut buf);
            let kind = KeyKind::from(whose.identity.kind());
            return match self.control.and_then(|c| c.banned(&route.name, kind, id)) {
                Some(wait_us) => Decided::banned(wait_us),
                None => Decided::of(DecisionLabel::Unlimited),
            };
        }
        if route.exempt.covers(whose.ip, &whose.identity, whose.tier) {
            return Decided::of(DecisionLabel::Exempt);
        }
        let (mut id_buf, mut ip_buf) = ([0u8; 16], [0u8; 16]);
        // (An API key or user id is borrowed from the request; only an IP needs these buffers.)
        let id = whose.identity.key_bytes(&mut id_buf);
        let ip = ip_octets(whose.ip, &mut ip_buf);
        let kind = KeyKind::from(whose.identity.kind());
        // A banned identity is refused before anything is asked; an identity with an override
        // spends the override's budgets in place of the route's enforced ones.
        let found = match self.control {
            Some(control) => control.find(&route.name, kind, id),
            None => Default::default(),
        };
        if let Some(wait_us) = found.banned_us {
            return Decided::banned(wait_us);
        }
        let budget = found.over.as_ref().map_or(&route.enforced, |o| &o.budget);
        // Both budgets' keys are built before either is decided (the access log records a
        // refused request's shadow keys too); most routes have no shadow limit.
        let shadow_keys = match route.shadow.is_empty() {
            true => RequestKeys::default(),
            false => facts.keys(&route.shadow, (kind, id), ip),
        };
        let request = Request {
            whose,
            id,
            ip,
            budgets: [budget, &route.shadow],
            keys: [facts.keys(budget, (kind, id), ip), shadow_keys],
        };
        let by_endpoint = [budget, &route.shadow]
            .iter()
            .any(|b| b.limits.iter().any(|l| l.per == Per::Endpoint));
        let decided = match endpoints {
            // Boxed: its search holds a decision beside the next one's future, and most routes
            // have no limit `per: endpoint`.
            Some(endpoints) if by_endpoint => {
                Box::pin(self.pass_over(&request, facts, endpoints)).await
            }
            _ => self.attempt(&request, facts, None).await,
        };
        // Boxed, and only where a limit has a penalty box: its store calls would otherwise
        // size every decision's future (and every refusal would allocate).
        if let Some(Refused::RateLimited(..)) = decided.refused
            && self.penalizes
            && self.control.is_some()
            && budget.limits.iter().any(|l| l.penalty.is_some())
        {
            Box::pin(self.penalize(&route.name, budget, &decided, kind, id)).await;
        }
        if let (Some(alerts), None, Some((verdict, LimitRef::Enforced(position)))) = (
            self.alerts.filter(|a| a.is_on()),
            &decided.refused,
            &decided.headline,
        ) && let Some(limit) = budget.limits.get(*position)
            && let Some(ask) = limit.ask(Some((kind, id)), Some(ip))
        {
            alerts.observe(&route.name, limit, ask.key, verdict);
        }
        decided
    }

    /// One decision of `request`'s budgets, for a request sent to `endpoint` (`None`: the
    /// limits `per: endpoint` are left out).
    pub(super) async fn attempt(
        &self,
        request: &Request<'_, '_>,
        facts: &mut impl Facts,
        endpoint: Option<&[u8]>,
    ) -> Decided {
        let Request {
            whose,
            id,
            ip,
            budgets: [budget, shadow_budget],
            keys: [enforced_keys, shadow_keys],
        } = request;
        let enforced = whose.asks(budget, id, ip, enforced_keys, endpoint);
        let enforced_costs = reserves(budget, &enforced, facts);
        let enforced_asks = costed(&enforced, &enforced_costs);
        let shadow = (!shadow_budget.is_empty())
            .then(|| whose.asks(shadow_budget, id, ip, shadow_keys, endpoint));
        let shadow_costs = match &shadow {
            Some(shadow) => reserves(shadow_budget, shadow, facts),
            None => Vec::new(),
        };
        let shadow_asks = shadow.as_ref().and_then(|s| costed(s, &shadow_costs));
        let shadow = match &shadow {
            Some(shadow) => BudgetAsks {
                asks: shadow_asks.as_deref().unwrap_or(&shadow.asks),
                positions: &shadow.positions[..shadow.asks.len()],
            },
            None => BudgetAsks {
                asks: &[],
                positions: &[],
            },
        };
        self.decide_asks(
            BudgetAsks {
                asks: enforced_asks.as_deref().unwrap_or(&enforced.asks),
                positions: &enforced.positions[..enforced.asks.len()],
            },
            shadow,
        )
        .await
    }

    /// The override of `kind`/`id`'s limits on `route`, if one is in force: its budget stands
    /// in for the route's enforced one ([`Decider::peek_route`] asks this).
    pub(super) fn override_of(
        &self,
        route: &str,
        kind: KeyKind,
        id: &[u8],
    ) -> Option<std::sync::Arc<crate::control::Override>> {
        self.control?.find(route, kind, id).over
    }
}

/// Per ask of `budget`, the limit costing what the request reserves, for a settled limit
/// (`None` for the others); nothing is allocated for a budget without one.
pub(super) fn reserves(
    budget: &Budget,
    asks: &Asks<'_>,
    facts: &mut impl Facts,
) -> Vec<Option<Limit>> {
    if !budget.limits.iter().any(|l| l.settled.is_some()) {
        return Vec::new();
    }
    asks.asks
        .iter()
        .zip(&asks.positions)
        .map(|(ask, &position)| {
            let limit = budget.limits.get(position)?;
            limit.settled.as_ref()?;
            Some(ask.limit.costing(facts.reserve(limit)))
        })
        .collect()
}

/// `asks` with each settled limit costing its reserve (`costs`, from [`reserves`]); `None` when
/// no limit is settled (the asks stand as they are).
pub(super) fn costed<'a>(asks: &Asks<'a>, costs: &'a [Option<Limit>]) -> Option<Vec<Ask<'a>>> {
    if costs.is_empty() {
        return None;
    }
    Some(
        asks.asks
            .iter()
            .zip(costs)
            .map(|(ask, cost)| match cost {
                Some(limit) => Ask {
                    limit,
                    key: ask.key,
                },
                None => *ask,
            })
            .collect(),
    )
}
