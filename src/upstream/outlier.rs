//! Passive health: an endpoint that fails `consecutive_failures` times in a row is taken out
//! (ejected) for a while, longer each time it happens again; a success in between starts the
//! count again. A pure state machine on an injected clock; the pool holds one per endpoint and
//! decides whether the pool may lose one more ([`may_eject`]).

use std::time::{Duration, Instant};

use super::spec::{MAX_EJECTION, OutlierSpec};

/// One endpoint's passive health.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// Failures since the last success.
    consecutive: u32,
    /// Ejections so far (the next lasts one more `ejection`), forgotten after a quiet spell.
    ejections: u32,
    /// Out until then.
    ejected_until: Option<Instant>,
    /// When it was last ejected.
    last_ejected: Option<Instant>,
}

impl Health {
    /// A response came (not 502/503/504): the count of failures starts again.
    pub fn success(&mut self) {
        self.consecutive = 0;
    }

    /// An attempt failed at `now`. Returns the ejection's length when this failure ejects the
    /// endpoint (`may_eject`: the pool can lose one more).
    pub fn failure(
        &mut self,
        now: Instant,
        spec: &OutlierSpec,
        may_eject: bool,
    ) -> Option<Duration> {
        self.consecutive = self.consecutive.saturating_add(1);
        if spec.consecutive_failures == 0
            || self.consecutive < spec.consecutive_failures
            || self.is_ejected(now)
            || !may_eject
        {
            return None;
        }
        // An endpoint that stayed in for twice the longest ejection starts afresh.
        if self
            .last_ejected
            .is_some_and(|at| now.duration_since(at) > MAX_EJECTION * 2)
        {
            self.ejections = 0;
        }
        self.ejections = self.ejections.saturating_add(1);
        let length = spec
            .ejection
            .saturating_mul(self.ejections)
            .min(MAX_EJECTION.max(spec.ejection));
        self.ejected_until = Some(now + length);
        self.last_ejected = Some(now);
        self.consecutive = 0;
        Some(length)
    }

    /// True while it is out.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|until| now < until)
    }

    /// Its ejections so far.
    pub fn ejections(&self) -> u32 {
        self.ejections
    }
}

/// True when a pool of `size` endpoints with `ejected` of them out may lose one more: at most
/// `max_ejected_percent` of it, and always one.
pub fn may_eject(size: usize, ejected: usize, max_ejected_percent: u32) -> bool {
    let cap = (size * max_ejected_percent as usize / 100).max(1);
    ejected < cap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> OutlierSpec {
        OutlierSpec {
            consecutive_failures: 3,
            ejection: Duration::from_secs(30),
            max_ejected_percent: 50,
        }
    }

    #[test]
    fn failures_in_a_row_eject_and_a_success_starts_the_count_again() {
        let t0 = Instant::now();
        let mut h = Health::default();
        assert_eq!(h.failure(t0, &spec(), true), None);
        assert_eq!(h.failure(t0, &spec(), true), None);
        h.success();
        assert_eq!(h.failure(t0, &spec(), true), None);
        assert_eq!(h.failure(t0, &spec(), true), None);
        assert_eq!(h.failure(t0, &spec(), true), Some(Duration::from_secs(30)));
        assert!(h.is_ejected(t0 + Duration::from_secs(29)));
        assert!(!h.is_ejected(t0 + Duration::from_secs(30)));
    }

    #[test]
    fn each_ejection_lasts_longer_up_to_five_minutes() {
        let mut now = Instant::now();
        let mut h = Health::default();
        let mut lengths = Vec::new();
        for _ in 0..12 {
            for _ in 0..2 {
                assert_eq!(h.failure(now, &spec(), true), None);
            }
            let length = h.failure(now, &spec(), true).expect("ejected");
            lengths.push(length.as_secs());
            now += length;
        }
        assert_eq!(&lengths[..4], [30, 60, 90, 120]);
        assert!(lengths.iter().all(|&l| l <= 300));
        assert_eq!(*lengths.last().unwrap(), 300);
        // Long in good health: the next ejection is the first again.
        now += Duration::from_secs(601);
        for _ in 0..2 {
            h.failure(now, &spec(), true);
        }
        assert_eq!(h.failure(now, &spec(), true), Some(Duration::from_secs(30)));
    }

    #[test]
    fn the_pool_keeps_its_share_and_one_may_always_go() {
        assert!(may_eject(2, 0, 50));
        assert!(!may_eject(2, 1, 50));
        assert!(may_eject(1, 0, 10), "one may always be ejected");
        assert!(may_eject(3, 0, 10));
        assert!(!may_eject(3, 1, 10));
        assert!(may_eject(10, 4, 50));
        assert!(!may_eject(10, 5, 50));
        let t0 = Instant::now();
        let mut h = Health::default();
        for _ in 0..10 {
            assert_eq!(
                h.failure(t0, &spec(), false),
                None,
                "not past the pool's cap"
            );
        }
    }
}
