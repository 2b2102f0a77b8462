//! Settlements that could not be made (`cost: {reserve, actual}`): the store was down, or did not
//! answer within `storage.timeout`, when the response ended. Each is tried again with backoff
//! until it lands or no longer matters (its budget has refilled or its window has turned past
//! what it would change), from a bounded queue: a long outage costs memory for at most
//! [`MAX_PENDING`] settlements, the oldest given up first.
//!
//! The same queue gives back what a decision spent when its answer came after the request had
//! given up (the request failed open, or was refused under `on_error: deny`): that request
//! reserved nothing the proxy knows of, so the store must not keep its reserve.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::limiter::owned_key::OwnedKey;
use crate::limiter::{Settlement, Source, wall_clock_us};

/// The most settlements waiting to be tried again.
pub const MAX_PENDING: usize = 10_000;
/// The wait before the first retry; each failure doubles it, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One reservation's settlements, waiting to be tried again.
pub(crate) struct Retry {
    pub keys: Vec<OwnedKey>,
    pub settlements: Vec<Settlement>,
    pub source: Source,
    due: Instant,
    backoff: Duration,
    /// After this wall-clock instant (µs) the settlement changes nothing: given up.
    until_us: u64,
}

/// The queue, shared by the guard (which fills it) and its worker (which empties it).
#[derive(Default)]
pub struct SettleRetries {
    queue: Mutex<VecDeque<Retry>>,
    wake: tokio::sync::Notify,
}

impl SettleRetries {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Retry>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `settlements` of `keys` (made in the store `source` says) to be tried again.
    pub(crate) fn push(&self, keys: Vec<OwnedKey>, settlements: Vec<Settlement>, source: Source) {
        // A settlement matters while its budget can still hold what it changes: a bucket until
        // it has refilled from empty, a window until the one after it has ended (a sliding
        // window counter weighs the previous window), a quota until its period ends.
        let until_us = keys
            .iter()
            .zip(&settlements)
            .map(|(k, s)| {
                s.at_us
                    .saturating_add(2 * k.limit.algorithm().budget_span_us())
            })
            .max()
            .unwrap_or(0);
        let retry = Retry {
            keys,
            settlements,
            source,
            due: Instant::now() + FIRST_BACKOFF,
            backoff: FIRST_BACKOFF,
            until_us,
        };
        let mut queue = self.lock();
        if queue.len() >= MAX_PENDING {
            queue.pop_front();
            tracing::warn!(
                pending = MAX_PENDING,
                "too many settlements waiting for the store: the oldest is given up"
            );
        }
        queue.push_back(retry);
        drop(queue);
        self.wake.notify_one();
    }

    /// The settlements due by `now`, taken out of the queue.
    pub(crate) fn take_due(&self, now: Instant) -> Vec<Retry> {
        let mut queue = self.lock();
        let (due, later): (VecDeque<Retry>, VecDeque<Retry>) =
            queue.drain(..).partition(|r| r.due <= now);
        *queue = later;
        due.into()
    }

    /// A retry that failed again: queued with twice the backoff, or given up once it no longer
    /// matters.
    pub(crate) fn again(&self, mut retry: Retry) {
        if wall_clock_us() >= retry.until_us {
            tracing::warn!(
                "a settlement could not be made before its budget moved past it: given up"
            );
            return;
        }
        retry.backoff = (retry.backoff * 2).min(MAX_BACKOFF);
        retry.due = Instant::now() + retry.backoff;
        let mut queue = self.lock();
        if queue.len() < MAX_PENDING {
            queue.push_back(retry);
        }
    }

    /// When the next retry is due, if any is waiting.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.lock().iter().map(|r| r.due).min()
    }

    /// How many settlements wait.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Resolves when a settlement is queued.
    pub(crate) fn queued(&self) -> tokio::sync::futures::Notified<'_> {
        self.wake.notified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Ask, BudgetKey, KeyKind, Limit};

    fn key(window_secs: u64) -> OwnedKey {
        let limit = Limit::new(
            Algorithm::fixed_window(10, Duration::from_secs(window_secs)).unwrap(),
            1,
        )
        .unwrap();
        OwnedKey::of(&Ask {
            limit: &limit,
            key: BudgetKey {
                budget: "b",
                kind: KeyKind::ApiKey,
                value: b"k",
            },
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_is_due_after_its_backoff_and_given_up_once_it_no_longer_matters() {
        let retries = SettleRetries::default();
        let now_us = wall_clock_us();
        retries.push(
            vec![key(60)],
            vec![Settlement::of(5, 1, now_us)],
            Source::Store,
        );
        assert!(retries.take_due(Instant::now()).is_empty(), "not due yet");
        tokio::time::advance(FIRST_BACKOFF).await;
        let due = retries.take_due(Instant::now());
        assert_eq!(due.len(), 1);
        assert!(retries.is_empty());
        // Failed again: back, due after twice the wait.
        retries.again(due.into_iter().next().unwrap());
        assert_eq!(retries.len(), 1);
        tokio::time::advance(FIRST_BACKOFF).await;
        assert!(retries.take_due(Instant::now()).is_empty());
        tokio::time::advance(FIRST_BACKOFF).await;
        assert_eq!(retries.take_due(Instant::now()).len(), 1);

        // A settlement of a window two windows gone changes nothing: given up.
        let long_ago = now_us - 3 * 60_000_000;
        retries.push(
            vec![key(60)],
            vec![Settlement::of(5, 1, long_ago)],
            Source::Store,
        );
        tokio::time::advance(FIRST_BACKOFF).await;
        let due = retries.take_due(Instant::now());
        retries.again(due.into_iter().next().unwrap());
        assert!(retries.is_empty());
    }

    #[tokio::test]
    async fn the_queue_is_bounded_and_gives_up_the_oldest() {
        let retries = SettleRetries::default();
        let now_us = wall_clock_us();
        for i in 0..MAX_PENDING as u64 + 5 {
            retries.push(
                vec![key(60)],
                vec![Settlement::of(5, 1, now_us + i)],
                Source::Store,
            );
        }
        assert_eq!(retries.len(), MAX_PENDING);
        let oldest = retries.lock().front().map(|r| r.settlements[0].at_us);
        assert_eq!(oldest, Some(now_us + 5));
    }
}
