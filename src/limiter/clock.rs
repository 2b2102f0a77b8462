//! Where time comes from: the stores read wall time in µs since the Unix epoch (to agree with
//! Redis, PostgreSQL and logs), the guard's intervals a monotonic clock, tests and replay a
//! clock they set.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// An instant on this process' own clock (the guard's monotonic one), in µs: when a lease was
/// granted here, when it ends. Not comparable with a [`StoreUs`]: a lease converts between the
/// two with the [`ClockOffset`] it measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalUs(pub u64);

/// An instant on the store's clock (Redis `TIME`, PostgreSQL's `clock_timestamp()`), in µs
/// since the Unix epoch: what the store decided at, and what it is told about its own past.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreUs(pub u64);

/// How far the store's clock is ahead of this process' (negative: behind), as measured by one
/// reply: converts a local instant to the store's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockOffset(i64);

impl LocalUs {
    /// The µs from `earlier` to this instant (0 when `earlier` is later).
    pub fn since(self, earlier: LocalUs) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The instant `us` later.
    pub fn plus(self, us: u64) -> LocalUs {
        LocalUs(self.0.saturating_add(us))
    }
}

impl ClockOffset {
    /// The offset between the store's clock reading `store` and the local one reading `local`
    /// at (about) the same moment.
    pub fn between(store: StoreUs, local: LocalUs) -> ClockOffset {
        ClockOffset(
            (i128::from(store.0) - i128::from(local.0)).clamp(i64::MIN.into(), i64::MAX.into())
                as i64,
        )
    }

    /// `local` on the store's clock.
    pub fn to_store(self, local: LocalUs) -> StoreUs {
        StoreUs(local.0.saturating_add_signed(self.0))
    }
}

/// The wall clock now, in µs since the Unix epoch (0 before it): what floodgate works a quota's
/// calendar period out from before a remote store decides it on its own clock.
pub fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A source of time in microseconds. The stores read wall time (µs since the Unix epoch, to agree
/// with Redis and with logs); the guard's intervals read a monotonic clock.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> u64;
}

/// The system's wall clock, made non-decreasing: if it steps back, time stands still until it
/// catches up, so no limiter state ever sees time move backwards. (Standing still also freezes
/// every budget for as long as the step: the stores use [`AnchoredClock`] instead.)
#[derive(Debug, Default)]
pub struct SystemClock {
    last: AtomicU64,
}

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let previous = self.last.fetch_max(wall, Ordering::Relaxed);
        previous.max(wall)
    }
}

/// Wall time read once, then advanced by a monotonic clock: µs since the Unix epoch that never
/// step. The in-process store runs on it, so a wall-clock step (NTP, a VM restore) neither
/// freezes limiting (a step back: [`SystemClock`] would stand still until the wall clock caught
/// up, and every budget with it) nor refills every bucket at once (a step forward). It drifts
/// from the wall clock only as much as the machine's oscillator does between restarts; only
/// `X-RateLimit-Reset` (Unix seconds) shows that.
#[derive(Debug, Clone, Copy)]
pub struct AnchoredClock {
    wall_at_start_us: u64,
    start: Instant,
}

impl AnchoredClock {
    /// A clock reading `wall_us` now.
    pub fn starting_at(wall_us: u64) -> Self {
        AnchoredClock {
            wall_at_start_us: wall_us,
            start: Instant::now(),
        }
    }
}

impl Default for AnchoredClock {
    fn default() -> Self {
        AnchoredClock::starting_at(SystemClock::default().now_us())
    }
}

impl Clock for AnchoredClock {
    fn now_us(&self) -> u64 {
        self.wall_at_start_us + self.start.elapsed().as_micros() as u64
    }
}

/// Microseconds since this clock was made, from [`Instant`]: unaffected by wall-clock steps.
/// For intervals (breaker cool-down, deny-cache expiry), never for limiter state.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now_us(&self) -> u64 {
        // Starts at 1 s, so that 0 can mean "never" in the structures that read it.
        self.origin.elapsed().as_micros() as u64 + 1_000_000
    }
}

/// A clock that moves only when told to: for tests, and for `floodgate replay`, which runs on
/// the log's own time.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `now_us`.
    pub fn new(now_us: u64) -> Self {
        ManualClock {
            now: AtomicU64::new(now_us),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_micros() as u64, Ordering::Relaxed);
    }

    /// Sets the clock.
    pub fn set(&self, now_us: u64) {
        self.now.store(now_us, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now_us(&self) -> u64 {
        (**self).now_us()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchored_clock_reads_the_wall_once_then_only_moves_forward_with_real_time() {
        // Anchored far from the real wall clock: what it reads is that anchor plus elapsed time,
        // whatever the system clock does meanwhile (a step back cannot stop it).
        let clock = AnchoredClock::starting_at(5_000_000);
        let first = clock.now_us();
        std::thread::sleep(Duration::from_millis(2));
        let second = clock.now_us();
        assert!((5_000_000..6_000_000).contains(&first), "{first}");
        // At least the 2 ms slept (sleep never returns early); the upper bound is loose because
        // a loaded machine can delay the thread.
        assert!(second >= first + 2_000, "{first} -> {second}");
        assert!(second < first + 5_000_000);
    }
}
