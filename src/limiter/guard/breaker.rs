//! The circuit breaker: after [`FAILURES_TO_OPEN`] store failures in a row, no request asks the
//! store for [`COOL_DOWN`]; then one probe does, and its answer closes or reopens it. A dead store
//! then costs requests nothing but the `on_error` answer.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Failures in a row that open the breaker.
pub const FAILURES_TO_OPEN: u32 = 3;
/// How long an open breaker keeps requests away from the store before probing it again.
pub const COOL_DOWN: Duration = Duration::from_millis(500);
/// The breaker's three states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests ask the store.
    Closed,
    /// Cooling down: no request asks the store.
    Open,
    /// Cool-down over: one probe at a time may ask the store.
    HalfOpen,
}

impl BreakerState {
    /// The metric label and log value.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// Every state, for metrics.
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ];
}

/// A consecutive-failure circuit breaker; times are µs on the guard's clock.
#[derive(Default)]
pub(super) struct Breaker {
    failures: AtomicU32,
    /// 0 when closed; otherwise when the cool-down ends (µs).
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    pub(super) fn state(&self, now: u64) -> BreakerState {
        match self.open_until.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            until if now < until => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// May this request ask the store? While half-open, only one probe at a time may.
    pub(super) fn allow(&self, now: u64) -> bool {
        match self.open_until.load(Ordering::Acquire) {
            0 => true,
            until if now < until => false,
            _ => self
                .probing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok(),
        }
    }

    pub(super) fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open_until.store(0, Ordering::Release);
        self.probing.store(false, Ordering::Release);
    }

    /// Records a failure; true when this failure opened (or re-opened) the breaker.
    pub(super) fn failure(&self, now: u64) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let was_probing = self.probing.swap(false, Ordering::AcqRel);
        if failures >= FAILURES_TO_OPEN || was_probing {
            self.open_until
                .store(now + COOL_DOWN.as_micros() as u64, Ordering::Release);
            return true;
        }
        false
    }
}
