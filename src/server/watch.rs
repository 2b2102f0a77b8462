//! What one client connection's requests tell the server about it: how many HTTP/2 streams are
//! open, when the last one ended, and how many the client abandoned before their response.
//! `server.rs` closes the connection on what it says:
//!
//! - **abandoned streams** (HTTP/2 rapid reset, CVE-2023-44487, paced or not): a stream the
//!   client resets before floodgate has answered it still cost a route match, a limiter decision
//!   and often an upstream request, and frees its concurrency slot at once. Each connection has a
//!   token bucket of such streams (`http2_max_resets_per_second`, burst twice that); past it the
//!   connection is closed (GOAWAY, then cut after a second). Streams that complete cost nothing
//!   here, so a multiplexing client is limited only by the routes' limits. hyper's own limits stay
//!   on top: streams reset before they are accepted (`max_pending_accept_reset_streams`) and
//!   resets floodgate's side provokes (`max_local_error_reset_streams`).
//! - **idle**: an HTTP/2 connection with no open stream for `timeouts.idle` is closed (GOAWAY),
//!   as nginx's `keepalive_timeout` closes it; keep-alive pings alone do not keep it open. An
//!   HTTP/1.1 connection is closed by hyper when the next request's head does not come within
//!   `timeouts.header_read`.
//! - optionally, **new streams** (`http2_max_streams_per_second`, no cap by default): streams
//!   past that rate are answered 429 at once, without routing or forwarding.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::Notify;

use crate::answer::{Body, BoxError};
use crate::limiter::algorithm::State;
use crate::limiter::{AlgorithmKind, Clock as _, Limit, MonotonicClock};
use crate::metrics::Metrics;

/// One client connection's watch, shared by its requests and the task serving it.
pub(super) struct ConnWatch {
    opened: Instant,
    /// HTTP/2 streams whose response has not ended.
    open: AtomicUsize,
    /// When the last stream ended (or the connection opened), in µs since `opened`.
    last_end_us: AtomicU64,
    /// Set at the first HTTP/1 request: hyper's header-read timeout then closes it when idle.
    http1: AtomicBool,
    resets: Bucket,
    streams: Option<Bucket>,
    /// Set once, when the connection ran out of resets.
    abusive: AtomicBool,
    abuse: Notify,
    metrics: Arc<Metrics>,
}

impl ConnWatch {
    pub(super) fn new(resets: Limit, streams: Option<Limit>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(ConnWatch {
            opened: Instant::now(),
            open: AtomicUsize::new(0),
            last_end_us: AtomicU64::new(0),
            http1: AtomicBool::new(false),
            resets: Bucket::new(resets),
            streams: streams.map(Bucket::new),
            abusive: AtomicBool::new(false),
            abuse: Notify::new(),
            metrics,
        })
    }

    /// Notes an HTTP/1 request on this connection.
    pub(super) fn saw_http1(&self) {
        if !self.http1.load(Ordering::Relaxed) {
            self.http1.store(true, Ordering::Relaxed);
        }
    }

    /// Spends one new stream of the optional stream budget; false when there is none left.
    pub(super) fn admit_stream(&self) -> bool {
        self.streams.as_ref().is_none_or(Bucket::take)
    }

    /// Since when this HTTP/2 connection has had no open stream, or `None` while one is open
    /// (or the connection speaks HTTP/1, whose idle time hyper bounds).
    pub(super) fn idle_since(&self) -> Option<Instant> {
        if self.http1.load(Ordering::Relaxed) || self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.opened + Duration::from_micros(self.last_end_us.load(Ordering::Relaxed)))
    }

    /// Completes once the connection has abandoned more streams than its budget allows.
    pub(super) async fn abusive(&self) {
        self.abuse.notified().await;
    }

    fn stream_ended(&self, answered: bool) {
        let since = u64::try_from(self.opened.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.last_end_us.store(since, Ordering::Relaxed);
        self.open.fetch_sub(1, Ordering::Release);
        if answered {
            return;
        }
        self.metrics.http2_reset();
        if !self.resets.take() && !self.abusive.swap(true, Ordering::AcqRel) {
            // Stored as a permit if the serving task is not waiting right now.
            self.abuse.notify_one();
        }
    }
}

/// One HTTP/2 stream in flight: open from its request until its response body ends or is
/// dropped. Dropped before [`StreamGuard::answered`], the stream was abandoned by the client.
pub(super) struct StreamGuard {
    watch: Arc<ConnWatch>,
    answered: bool,
}

impl StreamGuard {
    pub(super) fn open(watch: &Arc<ConnWatch>) -> Self {
        watch.open.fetch_add(1, Ordering::AcqRel);
        StreamGuard {
            watch: watch.clone(),
            answered: false,
        }
    }

    /// floodgate has its response: the stream stays open until the body ends.
    pub(super) fn answered(mut self, response: Response<Body>) -> Response<Body> {
        self.answered = true;
        response.map(|inner| {
            Tracked {
                inner,
                _stream: self,
            }
            .boxed_unsync()
        })
    }
}

impl StreamGuard {
    /// The answer was sent whole (an HTTP/3 stream's, which is sent by the listener itself).
    pub(super) fn answered_whole(mut self) {
        self.answered = true;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.watch.stream_ended(self.answered);
    }
}

/// A response body that keeps its stream counted as open until it ends.
struct Tracked {
    inner: Body,
    _stream: StreamGuard,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A token bucket of one connection's (the same algorithm the limits use).
struct Bucket {
    limit: Limit,
    state: Mutex<State>,
    clock: MonotonicClock,
}

impl Bucket {
    fn new(limit: Limit) -> Self {
        Bucket {
            limit,
            state: Mutex::new(State::new(AlgorithmKind::TokenBucket)),
            clock: MonotonicClock::default(),
        }
    }

    /// Spends one unit; false when there is none left.
    fn take(&self) -> bool {
        let now = self.clock.now_us();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let decision = state.check(&self.limit, now);
        if decision.allowed() {
            state.commit(&self.limit, now, 0);
        }
        decision.allowed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(resets: u32) -> Arc<ConnWatch> {
        let limit = Limit::of(crate::limiter::Algorithm::token_bucket(resets, 0.001).unwrap());
        ConnWatch::new(limit, None, Arc::new(Metrics::new()))
    }

    fn ok() -> Response<Body> {
        Response::new(
            http_body_util::Empty::new()
                .map_err(BoxError::from)
                .boxed_unsync(),
        )
    }

    #[tokio::test]
    async fn streams_answered_never_count_as_resets() {
        let watch = watch(2);
        for _ in 0..100 {
            drop(StreamGuard::open(&watch).answered(ok()));
        }
        assert!(!watch.abusive.load(Ordering::Acquire));
        assert!(watch.idle_since().is_some());
    }

    #[tokio::test]
    async fn abandoning_more_streams_than_the_budget_marks_the_connection() {
        let watch = watch(2);
        drop(StreamGuard::open(&watch));
        drop(StreamGuard::open(&watch));
        assert!(
            !watch.abusive.load(Ordering::Acquire),
            "two are within the burst"
        );
        drop(StreamGuard::open(&watch));
        assert!(watch.abusive.load(Ordering::Acquire));
        // The permit waits for the serving task.
        tokio::time::timeout(Duration::from_secs(1), watch.abusive())
            .await
            .expect("notified");
    }

    #[tokio::test]
    async fn a_connection_is_idle_only_with_no_open_stream_and_never_for_http1() {
        let watch = watch(2);
        let stream = StreamGuard::open(&watch);
        assert_eq!(watch.idle_since(), None, "a stream is open");
        let response = stream.answered(ok());
        assert_eq!(watch.idle_since(), None, "its body is still open");
        let before = Instant::now();
        drop(response);
        assert!(
            watch
                .idle_since()
                .is_some_and(|since| since >= before - Duration::from_millis(1))
        );
        watch.saw_http1();
        assert_eq!(watch.idle_since(), None);
    }
}
