//! The retry budget (Linkerd's and Envoy's): retries may add at most a share of a route's
//! requests over the last ten seconds, plus a floor every second, so that a pool failing
//! everywhere sees at most that much extra load and never a retry storm.
//!
//! Counted in one-second slots of a ten-second ring: recording a request is two relaxed atomic
//! operations; a slot whose second has passed is cleared by whoever finds it first (a count
//! that races the clearing may land in the old second: the budget is approximate by a few
//! requests, never unbounded).

use std::sync::atomic::{AtomicU64, Ordering};

use super::spec::RETRY_FLOOR_PER_SECOND;

/// Seconds the budget looks back over.
const WINDOW: usize = 10;

/// A route's retry budget.
#[derive(Debug, Default)]
pub struct RetryBudget {
    /// Per slot: the second it counts (`second + 1`, 0: never), its requests and retries.
    slots: [Slot; WINDOW],
}

#[derive(Debug, Default)]
struct Slot {
    second: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

impl RetryBudget {
    fn slot(&self, second: u64) -> &Slot {
        let slot = &self.slots[(second % WINDOW as u64) as usize];
        let tag = second + 1;
        let seen = slot.second.load(Ordering::Relaxed);
        if seen != tag
            && slot
                .second
                .compare_exchange(seen, tag, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            slot.requests.store(0, Ordering::Relaxed);
            slot.retries.store(0, Ordering::Relaxed);
        }
        slot
    }

    /// A request of the route at `second` (any monotonic count of seconds).
    pub fn request(&self, second: u64) {
        self.slot(second).requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry at `second` if the budget has one: fewer retries over the window than
    /// `percent` of its requests plus the floor.
    pub fn try_retry(&self, second: u64, percent: u32) -> bool {
        let (mut requests, mut retries) = (0u64, 0u64);
        for back in 0..WINDOW as u64 {
            let Some(s) = second.checked_sub(back) else {
                break;
            };
            let slot = &self.slots[(s % WINDOW as u64) as usize];
            if slot.second.load(Ordering::Relaxed) == s + 1 {
                requests += slot.requests.load(Ordering::Relaxed);
                retries += slot.retries.load(Ordering::Relaxed);
            }
        }
        let allowed =
            requests * u64::from(percent) / 100 + u64::from(RETRY_FLOOR_PER_SECOND) * WINDOW as u64;
        if retries >= allowed {
            return false;
        }
        self.slot(second).retries.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stay_within_the_share_plus_the_floor() {
        let budget = RetryBudget::default();
        let (mut sent, mut refused) = (0u64, 0u64);
        // 30 s at 1,000 requests a second, every one failing and asking to be retried.
        for second in 100..130 {
            for _ in 0..1000 {
                budget.request(second);
                if budget.try_retry(second, 20) {
                    sent += 1;
                } else {
                    refused += 1;
                }
            }
        }
        // At most 20% of the requests plus 10 a second (over any 10 s: 2,000 + 100).
        assert!(sent <= 30 * (200 + 10) + 100, "{sent}");
        assert!(sent >= 30 * 200, "the budget is used: {sent}");
        assert!(refused > 0);
    }

    #[test]
    fn a_quiet_route_has_the_floor() {
        let budget = RetryBudget::default();
        let sent = (0..500).filter(|_| budget.try_retry(7, 20)).count();
        assert_eq!(sent, 100, "10 a second over the 10 s window");
        // Ten seconds later the window has moved on.
        assert!(budget.try_retry(18, 20));
    }
}
