//! The penalty box: denials counted per identity in the store, a ban when the count fills.

use super::*;

impl Decider<'_> {
    /// The penalty box: a denial by a limit with `penalty:` is counted, per identity, in the
    /// store (so every instance's denials count); the one that fills the count bans the
    /// identity on the route for `penalty.ban`.
    pub(super) async fn penalize(
        &self,
        route: &str,
        budget: &Budget,
        decided: &Decided,
        kind: KeyKind,
        id: &[u8],
    ) {
        let Some(control) = self.control else {
            return;
        };
        for (position, limit) in budget.limits.iter().enumerate() {
            let Some(penalty) = &limit.penalty else {
                continue;
            };
            if !decided.denied_by(Side::Enforced, position) {
                continue;
            }
            let full = penalty.first_denial_bans || {
                let ask = Ask {
                    limit: &penalty.counter,
                    key: crate::limiter::BudgetKey {
                        budget: &penalty.budget_id,
                        kind,
                        value: id,
                    },
                };
                matches!(
                    self.limiter.decide(&[ask], OnError::Allow).await,
                    Ok(Admission::Limited { verdict, .. }) if !verdict.allowed()
                )
            };
            if full {
                let now = crate::limiter::wall_clock_us();
                let until =
                    now.saturating_add(u64::try_from(penalty.ban.as_micros()).unwrap_or(u64::MAX));
                let ban = crate::control::Ban {
                    id: control.new_id("ban"),
                    route: Some(route.to_string()),
                    kind,
                    value: id.to_vec(),
                    until_us: until,
                    reason: format!("penalty of {}", limit.name()),
                    by: "penalty",
                };
                control.ban(ban.clone());
                tracing::info!(ban = %ban.id, %route, limit = limit.name(), ban_for = ?penalty.ban, "penalty box: identity banned");
                let id = ban.id.clone();
                // The penalty holds here whatever the store says (this instance counted the
                // denials); the other instances learn of it when the store takes it.
                let entry = crate::control::Entry::Ban(ban);
                if let Err(e) =
                    crate::control::share(self.limiter, &[(&id, Some(&entry))], &[]).await
                {
                    tracing::warn!(ban = %id, error = %e, "the penalty's ban could not be written to the store: it holds on this instance only");
                }
            }
        }
    }
}
