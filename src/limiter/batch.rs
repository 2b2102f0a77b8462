//! Batched decisions (`storage.batch`), whatever the store: the decisions waiting for a store
//! leave together.
//!
//! One driver task per store. It sends at most `in_flight` calls at a time; while they are out,
//! the decisions that arrive wait in a channel, and when one returns, all that wait (up to
//! [`MAX_BATCH`]) leave in the next call. An idle store therefore adds no wait (a lone decision
//! leaves at once, alone), and a busy one pays one call and one round trip for many decisions.
//! Redis runs one call at a time whatever floodgate does, so its driver keeps one in flight;
//! PostgreSQL runs calls on several connections at once, so its driver keeps as many in flight
//! as its pool has connections, and batches only what would otherwise wait for one.
//!
//! The caller's `storage.timeout` still bounds each decision (the guard drops its receiver when
//! it gives up): a decision whose caller has gone is left out of the next batch, and a late
//! batch's answer to a decision that had left goes to the decision's [`Late`] handler, if it has
//! one (the guard's leases owe back what it granted): whether the caller had gone before the
//! answer came, or gave up with it delivered but unread ([`Delivery`]). How a batch is sent, and
//! how one decision's error is kept from the others, is the store's (`redis/batch.rs`,
//! `postgres/batch.rs`).

use std::future::Future;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::LimiterError;
use super::wire::Reply;

/// The most decisions one call carries. 64 decisions of up to 8 limits stay far below what
/// either store takes in one command, and keep one call's time in the store short (about
/// 64 × 10 µs in Redis).
pub const MAX_BATCH: usize = 64;

/// Whether a store batches now (`storage.batch`, which a reload may turn on or off), and the
/// driver's queue once it was started (the first time batching was turned on; it stays).
pub struct Batching<T> {
    queue: std::sync::OnceLock<mpsc::UnboundedSender<Pending<T>>>,
    on: std::sync::atomic::AtomicBool,
}

impl<T> Default for Batching<T> {
    fn default() -> Self {
        Batching {
            queue: std::sync::OnceLock::new(),
            on: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl<T> Batching<T> {
    /// Turns batching on (starting the driver with `start` the first time) or off.
    pub fn set(&self, on: bool, start: impl FnOnce() -> mpsc::UnboundedSender<Pending<T>>) {
        if on {
            self.queue.get_or_init(start);
        }
        self.on.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The queue decisions go to while batching is on.
    pub fn queue(&self) -> Option<&mpsc::UnboundedSender<Pending<T>>> {
        if self.on.load(std::sync::atomic::Ordering::Relaxed) {
            self.queue.get()
        } else {
            None
        }
    }
}

/// One decision waiting for a batch: what the store needs to send it, and where its answer goes.
pub struct Pending<T> {
    pub job: T,
    pub reply: oneshot::Sender<Delivery>,
    /// What to do with an answer that came after the caller gave up.
    pub late: Option<Late>,
}

/// A decision's answer on its way to the caller. An answer the caller never reads (it gave up
/// before the answer came, or just after: a timeout firing with the answer in the channel) goes
/// to the decision's [`Late`] handler as it is dropped, so what the store granted is never lost.
pub struct Delivery {
    answer: Option<Result<Reply, LimiterError>>,
    late: Option<Late>,
}

impl Delivery {
    /// The answer, read: it no longer goes to the late handler.
    fn take(mut self) -> Option<Result<Reply, LimiterError>> {
        self.answer.take()
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let (Some(Ok(reply)), Some(late)) = (self.answer.take(), self.late.take()) {
            late(Some(reply));
        }
    }
}

/// Takes the store's answer to a decision whose caller had given up (timed out) after the
/// decision was sent, or `None` for one that was never sent because its caller had given up.
pub type Late = Box<dyn FnOnce(Option<Reply>) + Send + Sync>;

/// Starts a driver that hands the decisions sent on the returned channel to `send`, a batch at a
/// time, with at most `in_flight` batches out at once, until the sender is dropped. `send` must
/// answer every decision of its batch ([`answer`]).
pub fn start<T, F, Fut>(in_flight: usize, send: F) -> mpsc::UnboundedSender<Pending<T>>
where
    T: Send + 'static,
    F: Fn(Vec<Pending<T>>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (sender, mut receiver) = mpsc::unbounded_channel::<Pending<T>>();
    let in_flight = in_flight.max(1);
    tokio::spawn(async move {
        let mut out = JoinSet::new();
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            while out.try_join_next().is_some() {}
            if out.len() >= in_flight {
                out.join_next().await;
                continue;
            }
            if receiver.recv_many(&mut batch, MAX_BATCH).await == 0 {
                break;
            }
            // Callers that gave up (their timeout passed while they waited) are not decided for.
            for gone in batch.extract_if(.., |p: &mut Pending<T>| p.reply.is_closed()) {
                if let Some(late) = gone.late {
                    late(None);
                }
            }
            if batch.is_empty() {
                continue;
            }
            let call = send(std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH)));
            if in_flight == 1 {
                // No task of its own: nothing else could leave meanwhile anyway.
                call.await;
            } else {
                out.spawn(call);
            }
        }
        while out.join_next().await.is_some() {}
    });
    sender
}

/// Hands `job` to a driver and waits for its answer (an answer that comes after this future was
/// dropped goes to `late`).
pub async fn decide<T>(
    driver: &mpsc::UnboundedSender<Pending<T>>,
    job: T,
    late: Option<Late>,
) -> Result<Reply, LimiterError> {
    let stopped = || LimiterError::unavailable("the batch driver has stopped");
    let (reply, answer) = oneshot::channel();
    driver
        .send(Pending { job, reply, late })
        .map_err(|_| stopped())?;
    let delivery = answer.await.map_err(|_| stopped())?;
    delivery.take().unwrap_or_else(|| Err(stopped()))
}

/// Sends each decision of `batch` its answer: its own, or the call's error.
pub fn answer<T>(
    batch: Vec<Pending<T>>,
    answers: Result<Vec<Result<Reply, LimiterError>>, LimiterError>,
) {
    match answers {
        Ok(answers) => {
            for (pending, answer) in batch.into_iter().zip(answers) {
                // A caller that has gone drops the delivery here, or later unread: either
                // way an answer that granted goes to `late`.
                let _ = pending.reply.send(Delivery {
                    answer: Some(answer),
                    late: pending.late,
                });
            }
        }
        Err(e) => {
            // Each decision of the failed call hears the same error (its cause shared).
            for pending in batch {
                let _ = pending.reply.send(Delivery {
                    answer: Some(Err(e.clone())),
                    late: None,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Poll;

    fn reply() -> Reply {
        Reply::from_ints(&[1, 7, 1, 10, 9, 100, 0, 0, 0], 1).unwrap()
    }

    #[tokio::test]
    async fn decisions_that_wait_while_a_call_is_out_leave_together_in_the_next() {
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (release, gate) = tokio::sync::watch::channel(false);
        let seen = calls.clone();
        let driver = start(1, move |batch: Vec<Pending<u32>>| {
            seen.lock()
                .unwrap()
                .push(batch.iter().map(|p| p.job).collect::<Vec<_>>());
            let mut gate = gate.clone();
            async move {
                let _ = gate.wait_for(|open| *open).await;
                let n = batch.len();
                answer(batch, Ok((0..n).map(|_| Ok(reply())).collect()));
            }
        });
        let first = tokio::spawn({
            let driver = driver.clone();
            async move { decide(&driver, 0, None).await }
        });
        // The first call is out (held at the gate); three more arrive meanwhile.
        while calls.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (1..4)
            .map(|job| {
                let driver = driver.clone();
                tokio::spawn(async move { decide(&driver, job, None).await })
            })
            .collect();
        tokio::task::yield_now().await;
        release.send(true).unwrap();
        assert!(first.await.unwrap().is_ok());
        for r in rest {
            assert!(r.await.unwrap().is_ok());
        }
        assert_eq!(*calls.lock().unwrap(), vec![vec![0], vec![1, 2, 3]]);
    }

    /// A late handler that records what it is given.
    fn recording() -> (Arc<std::sync::Mutex<Vec<Option<Reply>>>>, Late) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        (seen, Box::new(move |reply| log.lock().unwrap().push(reply)))
    }

    /// A driver whose calls wait for `gate`, then answer every decision allowed; `calls` counts
    /// the calls sent.
    fn gated(
        gate: tokio::sync::watch::Receiver<bool>,
        calls: Arc<AtomicUsize>,
    ) -> mpsc::UnboundedSender<Pending<u32>> {
        start(1, move |batch: Vec<Pending<u32>>| {
            let mut gate = gate.clone();
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ = gate.wait_for(|open| *open).await;
                let n = batch.len();
                answer(batch, Ok((0..n).map(|_| Ok(reply())).collect()));
            }
        })
    }

    /// The caller gives up with the answer delivered but unread (a timeout that fires after the
    /// answer came, before the caller looked): the answer goes to the late handler all the
    /// same, and only once.
    #[tokio::test]
    async fn an_answer_delivered_but_never_read_goes_to_the_late_handler() {
        let (release, gate) = tokio::sync::watch::channel(false);
        let driver = gated(gate, Arc::default());
        let (seen, late) = recording();
        let mut caller = Box::pin(decide(&driver, 0, Some(late)));
        // Polled once: the decision goes to the driver, whose call waits at the gate.
        let first = std::future::poll_fn(|cx| Poll::Ready(caller.as_mut().poll(cx))).await;
        assert!(first.is_pending());
        release.send(true).unwrap();
        // The answer is in the caller's channel once a second decision, sent after, is answered.
        assert!(decide(&driver, 1, None).await.is_ok());
        assert!(
            seen.lock().unwrap().is_empty(),
            "not late while it may still be read"
        );
        drop(caller);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert!(seen[0].as_ref().is_some_and(|r| r.verdict.allowed()));
    }

    /// The caller gives up before its decision leaves: the late handler hears `None` (nothing
    /// was decided); before the answer comes: it hears the answer; a caller that reads its
    /// answer leaves its handler unheard.
    #[tokio::test]
    async fn a_caller_gone_before_its_answer_hands_the_late_handler_what_was_decided() {
        let (release, gate) = tokio::sync::watch::channel(false);
        let calls = Arc::new(AtomicUsize::new(0));
        let driver = gated(gate, calls.clone());
        // The first decision's call waits at the gate; its caller gives up while it is out.
        let (answered_late, late) = recording();
        let mut first = Box::pin(decide(&driver, 0, Some(late)));
        let polled = std::future::poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await;
        assert!(polled.is_pending());
        while calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        drop(first);
        // The second waits for the next batch, and gives up there.
        let (never_sent, late) = recording();
        let mut waiting = Box::pin(decide(&driver, 1, Some(late)));
        let polled = std::future::poll_fn(|cx| Poll::Ready(waiting.as_mut().poll(cx))).await;
        assert!(polled.is_pending());
        drop(waiting);
        // The third waits for the next batch too, and reads its answer.
        let (read, late) = recording();
        let mut third = Box::pin(decide(&driver, 2, Some(late)));
        let polled = std::future::poll_fn(|cx| Poll::Ready(third.as_mut().poll(cx))).await;
        assert!(polled.is_pending());
        release.send(true).unwrap();
        assert!(third.await.is_ok());
        let answered_late = answered_late.lock().unwrap();
        assert_eq!(answered_late.len(), 1);
        assert!(
            answered_late[0]
                .as_ref()
                .is_some_and(|r| r.verdict.allowed())
        );
        let never_sent = never_sent.lock().unwrap();
        assert_eq!(never_sent.len(), 1);
        assert!(never_sent[0].is_none());
        assert!(read.lock().unwrap().is_empty(), "the third read its answer");
    }

    #[tokio::test]
    async fn a_failed_call_fails_each_of_its_decisions_with_its_kind_of_error() {
        let driver = start(4, |batch: Vec<Pending<()>>| async move {
            answer(batch, Err(LimiterError::unavailable("down")));
        });
        let e = decide(&driver, (), None).await.unwrap_err();
        assert!(matches!(e, LimiterError::Unavailable(m) if m.to_string().contains("down")));
    }

    #[tokio::test]
    async fn several_calls_may_be_out_at_once_when_the_store_runs_them_in_parallel() {
        let out = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (o, m) = (out.clone(), most.clone());
        let driver = start(3, move |batch: Vec<Pending<()>>| {
            let (o, m) = (o.clone(), m.clone());
            async move {
                let now = o.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                o.fetch_sub(1, Ordering::SeqCst);
                let n = batch.len();
                answer(batch, Ok((0..n).map(|_| Ok(reply())).collect()));
            }
        });
        // Decisions arrive one by one (the driver takes each before the next comes): each
        // leaves at once while fewer than three calls are out, and waits otherwise.
        let mut tasks = Vec::new();
        for _ in 0..12 {
            let driver = driver.clone();
            tasks.push(tokio::spawn(async move { decide(&driver, (), None).await }));
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
        for t in tasks {
            assert!(t.await.unwrap().is_ok());
        }
        assert_eq!(most.load(Ordering::SeqCst), 3, "calls out at once");
    }
}
