//! What a request would be told, spending nothing: `/budgets` and the usage endpoint.

use super::*;

impl Decider<'_> {
    /// What `who` would be told now on `route`, spending nothing, for every limit that applies
    /// to its tier (enforced, an override's in their place for an identity that has one; then
    /// shadow ones, with `shadow`): the one peek behind `/budgets` and the usage endpoint.
    /// Composite keys read `who.view` as the proxy reads a request; a limit whose client the
    /// caller does not name (an admin query that names only an address) has no figures, and
    /// the limits `per: endpoint` none either (no endpoint is chosen by a peek).
    pub async fn peek_route(
        &self,
        route: &RouteConfig,
        who: &Peek<'_>,
        shadow: bool,
    ) -> Result<Vec<Peeked>, crate::limiter::LimiterError> {
        let over = who
            .identity
            .and_then(|(kind, id)| self.override_of(&route.name, kind, id));
        let enforced = over.as_ref().map_or(&route.enforced, |o| &o.budget);
        let mut out = Vec::new();
        let budgets = [(enforced, false), (&route.shadow, true)];
        for (budget, is_shadow) in budgets.into_iter().take(1 + usize::from(shadow)) {
            let keys = match who.identity {
                Some(identity) => {
                    RequestKeys::of(budget, who.view, identity, who.ip.unwrap_or(&[]))
                }
                None => RequestKeys::default(),
            };
            let asks =
                crate::policy::asks_with(budget, who.tier, who.identity, who.ip, &keys, None);
            let positions = &asks.positions[..asks.asks.len()];
            let decisions = self.peek(&asks.asks).await?;
            for (position, limit) in budget.limits.iter().enumerate() {
                if !limit.applies_to(who.tier) {
                    continue;
                }
                let at = positions.iter().position(|&p| p == position);
                let figures = at
                    .and_then(|i| decisions.get(i))
                    .map(|d| (d.remaining_before(limit.limit.cost()), d.reset_after_us));
                let slice = match (limit.limit.is_global(), at) {
                    (true, Some(i)) => self.slice(&asks.asks[i]).await,
                    _ => None,
                };
                out.push(Peeked {
                    algorithm: limit.limit.algorithm().name(),
                    per: limit.per.as_str(),
                    limit: u64::from(limit.limit.algorithm().units()),
                    shadow: is_shadow,
                    global: limit.limit.is_global(),
                    figures,
                    slice,
                });
            }
        }
        Ok(out)
    }

    /// What `asks` would be told now, per limit asked, spending nothing.
    pub async fn peek(
        &self,
        asks: &[Ask<'_>],
    ) -> Result<Vec<crate::limiter::Decision>, crate::limiter::LimiterError> {
        if asks.is_empty() {
            return Ok(Vec::new());
        }
        let Some(global) = self
            .global
            .filter(|_| asks.iter().any(|a| a.limit.is_global()))
        else {
            return self.limiter.peek(asks).await;
        };
        // The region's limits in its store; each global one as its region sees it.
        let region: Vec<Ask<'_>> = asks
            .iter()
            .filter(|a| !a.limit.is_global())
            .copied()
            .collect();
        let mut region = match region.is_empty() {
            true => Vec::new(),
            false => self.limiter.peek(&region).await?,
        }
        .into_iter();
        let mut decisions = Vec::with_capacity(asks.len());
        for ask in asks {
            decisions.push(match ask.limit.is_global() {
                true => {
                    global
                        .peek(ask)
                        .await
                        .map_err(|e| {
                            crate::limiter::LimiterError::unavailable(
                                crate::limiter::Cause::from_error(e),
                            )
                        })?
                        .0
                }
                false => region.next().unwrap_or(crate::limiter::Decision::EMPTY),
            });
        }
        Ok(decisions)
    }

    /// What this region's slice of a `scope: global` limit's budget holds (`/budgets`):
    /// the region and its units, if global budgets are on.
    pub async fn slice(&self, ask: &Ask<'_>) -> Option<(String, u64)> {
        let global = self.global?;
        let (_, held) = global.peek(ask).await.ok()?;
        Some((global.region().to_string(), held))
    }
}
