//! HTTP/1.1's header-read deadline (`timeouts.header_read`), kept per connection.
//!
//! hyper bounds the wait for each request head with a timer it asks of its [`Timer`]: a new
//! one per request (it drops the last once a head is read), which with tokio's timer is an
//! allocation, a place in the timer wheel taken and given back, and a timed park of the worker
//! thread: about 1,600 instructions a request, 8% of a refusal (`docs/performance.md`). A head
//! that takes that long is rare, so the deadline need not be a timer of its own:
//!
//! - [`HeadTimer`] hands hyper a [`HeadSleep`] that only notes its deadline on the
//!   connection's [`HeadClock`] and, when hyper polls it (a read that would wait), says whether
//!   the clock has marked that deadline passed. It registers no waker and reads no time.
//! - The connection's task has one tokio timer, its watchdog ([`HeadClock::check`]): it wakes
//!   the task at the pending head's deadline (or, when no head is awaited, one `header_read`
//!   later to look again) and marks a deadline it finds passed. The task then polls hyper's
//!   connection, hyper polls the [`HeadSleep`] with the read still waiting, and it is ready:
//!   hyper ends the connection with its header-timeout error, as with tokio's timer.
//!
//! The watchdog can never be late: it is set no later than one `header_read` after it last
//! looked, and a head awaited since then has its deadline one `header_read` after it began.
//! Outside a connection that keeps a [`HeadClock`] (see [`HeadClock::polled`]), the timer is
//! tokio's, as before.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};
use hyper_util::rt::TokioTimer;

thread_local! {
    /// The clock of the connection whose future this thread is polling, if it keeps one.
    static CURRENT: Cell<Option<Arc<HeadClock>>> = const { Cell::new(None) };
}

/// One connection's pending head deadline, as nanoseconds after `epoch` (0: none pending), and
/// the last deadline its watchdog found passed.
#[derive(Debug)]
pub struct HeadClock {
    epoch: Instant,
    deadline: AtomicU64,
    expired: AtomicU64,
}

impl HeadClock {
    pub fn new() -> Arc<HeadClock> {
        Arc::new(HeadClock {
            epoch: Instant::now(),
            deadline: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        })
    }

    /// The pending head's deadline, if a head is awaited.
    pub fn deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(self.epoch + Duration::from_nanos(nanos)),
        }
    }

    /// The watchdog's look at `now`, `header_read` being the connection's head deadline: marks
    /// a pending deadline that has passed (its [`HeadSleep`] is ready: the connection ends when
    /// it is polled next, which is now), and says when to look next: at the pending head's
    /// deadline if it is still ahead, else one `header_read` from `now`.
    pub fn check(&self, now: Instant, header_read: Duration) -> Instant {
        match self.deadline() {
            Some(deadline) if deadline > now => deadline,
            Some(_) => {
                let passed = self.deadline.load(Ordering::Acquire);
                self.expired.store(passed, Ordering::Release);
                now + header_read
            }
            None => now + header_read,
        }
    }

    /// `deadline`'s value in `self.deadline` (at least 1: 0 means none).
    fn nanos(&self, deadline: Instant) -> u64 {
        let nanos = deadline.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX).max(1)
    }

    /// Polls `conn`, a connection's future, with this clock as the one [`HeadTimer`] notes head
    /// deadlines on (hyper asks its timer while it is polled).
    pub fn polled<'a, F: Future>(self: &'a Arc<Self>, conn: Pin<&'a mut F>) -> Polled<'a, F> {
        Polled { clock: self, conn }
    }
}

/// A connection's future polled with its [`HeadClock`] ([`HeadClock::polled`]).
pub struct Polled<'a, F> {
    clock: &'a Arc<HeadClock>,
    conn: Pin<&'a mut F>,
}

impl<F: Future> Future for Polled<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let _restore = Restore(CURRENT.replace(Some(Arc::clone(this.clock))));
        this.conn.as_mut().poll(cx)
    }
}

/// Puts back the thread's previous clock when a poll ends, even by unwinding: a clock left
/// behind would take another connection's head deadlines, which its watchdog never sees.
struct Restore(Option<Arc<HeadClock>>);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.set(self.0.take());
    }
}

/// hyper's timer on the proxy's listeners: head deadlines on the connection's [`HeadClock`]
/// when there is one, tokio's timer otherwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeadTimer;

impl Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        let clock = CURRENT.take();
        CURRENT.set(clock.clone());
        match clock {
            Some(clock) => {
                let nanos = clock.nanos(deadline);
                clock.deadline.store(nanos, Ordering::Release);
                Box::pin(HeadSleep { clock, nanos })
            }
            None => TokioTimer::new().sleep_until(deadline),
        }
    }
}

/// A head deadline noted on its connection's clock: ready once the clock's watchdog has found
/// it passed. It registers no waker: the watchdog wakes the task at the deadline (see the
/// module's doc).
pub struct HeadSleep {
    clock: Arc<HeadClock>,
    nanos: u64,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        match self.clock.expired.load(Ordering::Acquire) == self.nanos {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    }
}

impl Sleep for HeadSleep {}

impl Drop for HeadSleep {
    fn drop(&mut self) {
        // The head came (or the connection ended): no deadline pending, unless a newer one
        // took this one's place.
        let _ = self.clock.deadline.compare_exchange(
            self.nanos,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_notes_its_deadline_on_the_polled_connections_clock_until_dropped() {
        let clock = HeadClock::new();
        let header_read = Duration::from_secs(10);
        let now = Instant::now();
        // No head awaited: the watchdog looks again one header_read later.
        assert_eq!(clock.deadline(), None);
        assert_eq!(clock.check(now, header_read), now + header_read);
        let deadline = now + Duration::from_secs(3);
        let sleep = {
            // A future standing for hyper's connection, which asks its timer when polled.
            let mut sleep = None;
            let mut conn = std::pin::pin!(std::future::poll_fn(|_| {
                sleep = Some(HeadTimer.sleep_until(deadline));
                Poll::Ready(())
            }));
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let polled = std::pin::pin!(clock.polled(conn.as_mut())).poll(&mut cx);
            assert!(polled.is_ready());
            sleep.expect("the connection asked for a sleep")
        };
        let noted = clock.deadline().expect("a head deadline is pending");
        // (Kept in whole nanoseconds after the clock's epoch: exact.)
        assert_eq!(noted, deadline);
        // The watchdog wakes at the deadline, not later; the sleep is not ready before.
        let mut sleep = sleep;
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert_eq!(clock.check(now, header_read), noted);
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        // Past it, the watchdog marks it (the sleep is ready: the connection ends when polled)
        // and looks again a header_read on.
        let later = deadline + Duration::from_secs(1);
        assert_eq!(clock.check(later, header_read), later + header_read);
        assert!(sleep.as_mut().poll(&mut cx).is_ready());
        drop(sleep);
        assert_eq!(clock.deadline(), None);
    }

    #[test]
    fn only_the_deadline_found_passed_is_ready_and_a_newer_one_outlives_an_older() {
        let clock = HeadClock::new();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let now = Instant::now();
        CURRENT.set(Some(Arc::clone(&clock)));
        let mut older = HeadTimer.sleep_until(now + Duration::from_secs(1));
        let mut newer = HeadTimer.sleep_until(now + Duration::from_secs(60));
        CURRENT.set(None);
        // The clock holds the newer deadline: found passed at 61 s, only it is ready.
        let _ = clock.check(now + Duration::from_secs(61), Duration::from_secs(10));
        assert!(newer.as_mut().poll(&mut cx).is_ready());
        assert!(older.as_mut().poll(&mut cx).is_pending());
        // Dropping the older sleep leaves the newer one's deadline noted.
        drop(older);
        assert!(clock.deadline().is_some());
        drop(newer);
        assert_eq!(clock.deadline(), None);
    }

    #[test]
    fn outside_a_connections_clock_the_timer_is_tokios() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let started = tokio::time::Instant::now();
            HeadTimer.sleep(Duration::from_secs(5)).await;
            assert!(started.elapsed() >= Duration::from_secs(5));
        });
    }
}
