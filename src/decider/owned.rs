//! [`Core`]: what every decision is made with, owned once (the store, the bans and overrides,
//! the quota alerts, the budgets across regions, the metrics). The proxy, the rate-limit
//! service, the admin endpoints and replay each hold one, and ask it for the [`Decider`] of a
//! snapshot's rules: no front end reaches the store or the control list through another.

use std::sync::Arc;

use super::Decider;
use crate::alerts::Alerter;
use crate::control::SharedControl;
use crate::global::Global;
use crate::limiter::{Limiter, OnError};
use crate::metrics::Metrics;
use crate::policy::Policy;

/// The decider's owner (see the module's doc). Replay's has only a store.
#[derive(Clone)]
pub struct Core {
    limiter: Limiter,
    metrics: Option<Arc<Metrics>>,
    control: Option<SharedControl>,
    alerts: Option<Arc<Alerter>>,
    global: Option<Arc<Global>>,
}

impl Core {
    /// Decisions on `limiter` alone: no metrics, bans, alerts or global budgets (replay).
    pub fn new(limiter: Limiter) -> Core {
        Core {
            limiter,
            metrics: None,
            control: None,
            alerts: None,
            global: None,
        }
    }

    /// A live instance's: decisions timed in `metrics`, refused by the bans in `control`,
    /// told to `alerts`.
    pub fn live(
        limiter: Limiter,
        metrics: Arc<Metrics>,
        control: SharedControl,
        alerts: Arc<Alerter>,
    ) -> Core {
        Core {
            metrics: Some(metrics),
            control: Some(control),
            alerts: Some(alerts),
            ..Core::new(limiter)
        }
    }

    /// This core spending `scope: global` limits through `global`.
    pub fn with_global(self, global: Arc<Global>) -> Core {
        Core {
            global: Some(global),
            ..self
        }
    }

    /// The decider of `policy`'s rules, following `on_error` when the store fails.
    pub fn decider<'s>(&'s self, policy: Policy<'s>, on_error: OnError) -> Decider<'s> {
        Decider {
            policy,
            limiter: &self.limiter,
            on_error,
            metrics: self.metrics.as_deref(),
            control: self.control.as_deref(),
            alerts: self.alerts.as_deref(),
            global: self.global.as_deref(),
            report: false,
            undoable: false,
            penalizes: true,
        }
    }

    /// The store.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The quota alerts (a live instance's).
    pub fn alerts(&self) -> Option<&Arc<Alerter>> {
        self.alerts.as_ref()
    }

    /// The budgets across regions, if configured.
    pub fn global(&self) -> Option<&Arc<Global>> {
        self.global.as_ref()
    }
}
