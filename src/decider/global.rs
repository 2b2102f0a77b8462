//! `scope: global` limits: the region's limits decided in its store, then each global one
//! spent through the region's slice, folded into one verdict in the order asked.

use super::*;

impl Decider<'_> {
    /// [`Decider::ask_enforced`] for asks among which some are `scope: global`.
    pub(super) async fn ask_with_global(
        &self,
        global: &crate::global::Global,
        asks: &[Ask<'_>],
        decided: &mut Decided,
    ) -> Result<Admission, crate::limiter::LimiterError> {
        let region: Vec<Ask<'_>> = asks
            .iter()
            .filter(|a| !a.limit.is_global())
            .copied()
            .collect();
        let region_at: Vec<usize> = (0..asks.len())
            .filter(|&i| !asks[i].limit.is_global())
            .collect();
        let (region_verdict, lease, source, round_trip) = if region.is_empty() {
            (
                None,
                crate::limiter::next_lease(),
                crate::limiter::Source::Store,
                false,
            )
        } else {
            match self.ask(&region, decided).await? {
                Admission::Limited {
                    verdict,
                    source,
                    lease,
                    round_trip,
                } => (Some(verdict), lease, source, round_trip),
                other => return Ok(other),
            }
        };
        let mut decisions = vec![crate::limiter::Decision::EMPTY; asks.len()];
        let mut now_us = crate::limiter::wall_clock_us();
        if let Some(verdict) = &region_verdict {
            now_us = verdict.now_us;
            // The region verdict names its headline and which limits denied; the others
            // allowed with at least the headline's figures.
            for (j, &i) in region_at.iter().enumerate() {
                decisions[i] = match (j == verdict.headline_index, verdict.denied_by(j)) {
                    (true, _) => verdict.headline,
                    (false, true) => crate::limiter::Decision::deny(
                        figures(&verdict.headline),
                        verdict.retry_after_us(),
                    ),
                    (false, false) => {
                        crate::limiter::Decision::allow(figures(&verdict.headline), 0)
                    }
                };
            }
            if !verdict.allowed() {
                return Ok(Admission::Limited {
                    verdict: remapped(verdict, &region_at),
                    source,
                    lease,
                    round_trip,
                });
            }
        }
        for (i, ask) in asks.iter().enumerate().filter(|(_, a)| a.limit.is_global()) {
            match global.spend(ask).await {
                Ok(decision) => decisions[i] = decision,
                Err(e) => {
                    tracing::debug!(error = %e, "global budget undecided");
                    match self.on_error {
                        crate::limiter::OnError::Allow => return Ok(Admission::FailedOpen),
                        // No local stand-in can keep a budget shared across regions: `local`
                        // refuses as `deny` does.
                        _ => {
                            return Err(crate::limiter::LimiterError::unavailable(
                                crate::limiter::Cause::from_error(e),
                            ));
                        }
                    }
                }
            }
            if !decisions[i].allowed() {
                break;
            }
        }
        // (`None` only for no asks at all, which never reach here.)
        let Some(verdict) = crate::limiter::Verdict::from_decisions(now_us, &decisions) else {
            return Ok(Admission::Unlimited);
        };
        Ok(Admission::Limited {
            verdict,
            source,
            lease,
            round_trip,
        })
    }
}

/// A decision's figures.
pub(super) fn figures(d: &crate::limiter::Decision) -> crate::limiter::Figures {
    crate::limiter::Figures {
        limit: d.limit,
        remaining: d.remaining,
        reset_after_us: d.reset_after_us,
    }
}

/// `verdict` of the asks at `at` (their positions among all asked), in all the asks' terms.
pub(super) fn remapped(verdict: &crate::limiter::Verdict, at: &[usize]) -> crate::limiter::Verdict {
    let mut denied = 0u16;
    let mut standings = crate::limiter::Standings::default();
    for (j, &i) in at.iter().enumerate() {
        if verdict.denied_by(j) && i < 16 {
            denied |= 1 << i;
        }
        if let Some(standing) = verdict.standings.get(j) {
            standings.set(i, standing);
        }
    }
    crate::limiter::Verdict {
        ruling: crate::limiter::Ruling {
            headline_index: at.get(verdict.headline_index).copied().unwrap_or(0),
            denied,
            ..verdict.ruling
        },
        standings,
    }
}
