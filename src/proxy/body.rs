//! Bodies in flight, with the limits nginx operators expect: a request body may go silent for at
//! most `timeouts.client_body` (nginx `client_body_timeout`) and may be at most `max_body_size`
//! (nginx `client_max_body_size`, 413); a response body may go silent for at most
//! `timeouts.upstream_body` (nginx `proxy_read_timeout`). A request body that fails also says why
//! ([`BodyFault`]), so a client's malformed chunked body is answered as the client's error (400),
//! not as an upstream failure.

use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// Why a request body stopped, if it did: shared between the body (which the upstream client
/// reads) and the proxy (which answers the client).
#[derive(Debug, Default)]
pub struct BodyFault(AtomicU8);

/// What went wrong with a request body: the client's fault, whether the body was being read
/// whole (`read_whole`) or forwarded (`forward.rs`); `Rejection::from` says how it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFault {
    /// The client's framing was invalid (a bad chunk size, a short chunk) or it went away.
    Malformed,
    /// More than `max_body_size` bytes.
    TooLarge,
    /// No byte for `timeouts.client_body`.
    Idle,
}

impl BodyFault {
    fn set(&self, fault: ClientFault) {
        let code = match fault {
            ClientFault::Malformed => 1,
            ClientFault::TooLarge => 2,
            ClientFault::Idle => 3,
        };
        let _ = self
            .0
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The first fault, if any.
    pub fn get(&self) -> Option<ClientFault> {
        match self.0.load(Ordering::Acquire) {
            1 => Some(ClientFault::Malformed),
            2 => Some(ClientFault::TooLarge),
            3 => Some(ClientFault::Idle),
            _ => None,
        }
    }
}

/// The error a limited body ends with.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is larger than max_body_size ({0} bytes)")]
    TooLarge(u64),
    #[error("no body data for {0:?}")]
    Idle(Duration),
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    /// The body of a request that came over HTTP/3 failed (the stream was reset, the
    /// connection lost).
    #[error("HTTP/3: {0}")]
    Http3(BoxError),
    #[error(transparent)]
    Superseded(#[from] crate::upstream::conn::Superseded),
}

/// A body that must keep moving: once floodgate waits for a frame, it must come within `idle`.
///
/// The timer is made and armed only when a body makes floodgate wait: most bodies are small and
/// arrive whole (or are empty), and then cost no allocation and no timer-wheel entry.
struct Watchdog {
    idle: Duration,
    /// When the current wait began: `None` right after a frame, until the next wait.
    waiting_since: Option<Instant>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Watchdog {
    fn new(idle: Duration) -> Self {
        Watchdog {
            idle,
            waiting_since: None,
            sleep: None,
        }
    }

    /// A frame arrived: the next wait starts the clock anew.
    fn fed(&mut self) {
        self.waiting_since = None;
    }

    /// Called when the body has nothing yet: true once this wait has lasted `idle`.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = *self.waiting_since.get_or_insert_with(Instant::now) + self.idle;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}

/// Any error, boxed: what another transport's body fails with.
pub use crate::upstream::conn::BoxError;

/// A body from another transport than hyper's (HTTP/3's request streams), boxed.
pub type OtherBody = Pin<Box<dyn HttpBody<Data = Bytes, Error = BoxError> + Send + Sync>>;

/// A client's request body as a listener hands it to the pipeline: hyper's, for HTTP/1.1 and
/// HTTP/2 over TCP, or another transport's (HTTP/3, `server/http3.rs`). One type, so that
/// every transport goes through the one pipeline; hyper's stays unboxed, as it was.
pub enum Incoming {
    Hyper(hyper::body::Incoming),
    Other(OtherBody),
}

/// Whether a request's client has left, for a front end that can tell without reading the
/// body: the HTTP/3 listener puts one in a request's extensions (a stream its client reset).
/// The proxy asks it once, just before forwarding, while nothing reads the body; a request
/// whose client has left is then not forwarded and its units are given back, and its answer
/// carries [`Abandoned`].
#[derive(Clone)]
pub struct ClientLeft(std::sync::Arc<dyn Fn() -> bool + Send + Sync>);

impl ClientLeft {
    pub fn new(left: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        ClientLeft(std::sync::Arc::new(left))
    }

    /// True when the client has left.
    pub fn left(&self) -> bool {
        (self.0)()
    }
}

/// In the extensions of the answer to a request whose client left before it was forwarded
/// ([`ClientLeft`]): nobody will read it, and the front end cancels the stream instead.
#[derive(Clone, Copy, Debug)]
pub struct Abandoned;

impl From<hyper::body::Incoming> for Incoming {
    fn from(body: hyper::body::Incoming) -> Self {
        Incoming::Hyper(body)
    }
}

impl HttpBody for Incoming {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Incoming::Hyper(body) => Pin::new(body).poll_frame(cx).map_err(BodyError::Hyper),
            Incoming::Other(body) => body.as_mut().poll_frame(cx).map_err(BodyError::Http3),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Incoming::Hyper(body) => body.is_end_stream(),
            Incoming::Other(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Incoming::Hyper(body) => body.size_hint(),
            Incoming::Other(body) => body.size_hint(),
        }
    }
}

/// A client's request body as the pipeline holds it: still on its way from the client, or read
/// whole by a phase that needed it before the decision (a `json:` key).
pub enum ClientBody {
    Streaming(Incoming),
    Read(Bytes),
}

impl ClientBody {
    /// True when nothing more will come.
    pub fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Streaming(b) => HttpBody::is_end_stream(b),
            ClientBody::Read(_) => true,
        }
    }
}

/// Reads `body` whole, at most `limit` bytes and with at most `idle` between two pieces (an
/// HTTP/1 client's body past the limit is read on and discarded, as [`RequestBody`] does).
pub async fn read_whole(
    body: Incoming,
    limit: NonZeroU64,
    idle: Duration,
    http1: bool,
) -> Result<Bytes, ClientFault> {
    use http_body_util::BodyExt;
    let fault = Arc::new(BodyFault::default());
    let body = RequestBody::new(
        ClientBody::Streaming(body),
        Some(limit),
        idle,
        fault.clone(),
        http1,
    );
    match body.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(_) => Err(fault.get().unwrap_or(ClientFault::Malformed)),
    }
}

/// A client's request body on its way upstream (`None`: an empty body, for a retry; `read`: a
/// body read whole before, sent as one piece).
pub struct RequestBody {
    read: Option<Bytes>,
    inner: Option<Incoming>,
    limit: Option<NonZeroU64>,
    seen: u64,
    watchdog: Watchdog,
    fault: Arc<BodyFault>,
    /// An HTTP/1 client's body: refused for its size, the rest is read and discarded
    /// ([`linger`]) so that the client reads the 413 instead of a reset connection.
    linger: bool,
    /// The route's names its trailers may not carry ([`RequestBody::deny_trailers`]).
    trailers_denied: Option<Arc<[http::HeaderName]>>,
}

/// What no request trailer carries to the upstream, whatever the route: fields that frame,
/// route, authenticate or forward a message (RFC 9110 §6.5.1), which floodgate read or set from
/// the head and which a trailer must not replace.
const NEVER_IN_TRAILERS: [http::HeaderName; 15] = {
    use http::header::*;
    [
        AUTHORIZATION,
        PROXY_AUTHORIZATION,
        COOKIE,
        HOST,
        CONTENT_LENGTH,
        CONTENT_TYPE,
        CONTENT_ENCODING,
        TRANSFER_ENCODING,
        TE,
        TRAILER,
        CONNECTION,
        UPGRADE,
        FORWARDED,
        VIA,
        http::HeaderName::from_static("x-forwarded-for"),
    ]
};

/// Removes from request `trailers` what none may carry, what `denied` names, `X-Forwarded-*`,
/// pseudo-header-like names and names with `_`.
fn filter_trailers(trailers: &mut http::HeaderMap, denied: &[http::HeaderName]) {
    let drop = |name: &http::HeaderName| {
        let text = name.as_str();
        NEVER_IN_TRAILERS.contains(name)
            || denied.contains(name)
            || text.starts_with("x-forwarded-")
            || text.contains('_')
    };
    if !trailers.keys().any(drop) {
        return;
    }
    let names: Vec<http::HeaderName> = trailers.keys().filter(|n| drop(n)).cloned().collect();
    for name in names {
        trailers.remove(name);
    }
}

impl RequestBody {
    /// `inner`, cut off past `limit` bytes (if any) or after `idle` without data; faults are
    /// recorded in `fault`. `linger`: the client speaks HTTP/1 (see [`linger`]).
    pub fn new(
        inner: ClientBody,
        limit: Option<NonZeroU64>,
        idle: Duration,
        fault: Arc<BodyFault>,
        linger: bool,
    ) -> Self {
        let (read, inner) = match inner {
            ClientBody::Streaming(inner) => (None, Some(inner)),
            ClientBody::Read(bytes) => (Some(bytes).filter(|b| !b.is_empty()), None),
        };
        RequestBody {
            read,
            inner,
            limit,
            seen: 0,
            watchdog: Watchdog::new(idle),
            fault,
            linger,
            trailers_denied: None,
        }
    }

    /// Request trailers lose, besides what no trailer may carry, the route's `denied` names.
    pub fn deny_trailers(mut self, denied: Arc<[http::HeaderName]>) -> Self {
        self.trailers_denied = Some(denied);
        self
    }

    /// An empty body: a retried request's, whose body was empty the first time.
    pub fn empty() -> Self {
        RequestBody {
            read: None,
            inner: None,
            limit: None,
            seen: 0,
            watchdog: Watchdog::new(Duration::from_secs(3600)),
            fault: Arc::default(),
            linger: false,
            trailers_denied: None,
        }
    }
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if let Some(read) = this.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.watchdog.fed();
                let frame = match frame.into_trailers() {
                    Ok(mut trailers) => {
                        let denied = this.trailers_denied.as_deref().unwrap_or(&[]);
                        filter_trailers(&mut trailers, denied);
                        Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                };
                if let Some(data) = frame.data_ref() {
                    this.seen += data.len() as u64;
                    if let Some(limit) = this.limit
                        && this.seen > limit.get()
                    {
                        this.fault.set(ClientFault::TooLarge);
                        if this.linger
                            && let Some(rest) = this.inner.take()
                        {
                            tokio::spawn(linger(rest));
                        }
                        return Poll::Ready(Some(Err(BodyError::TooLarge(limit.get()))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.fault.set(ClientFault::Malformed);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending if this.watchdog.expired(cx) => {
                this.fault.set(ClientFault::Idle);
                Poll::Ready(Some(Err(BodyError::Idle(this.watchdog.idle))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.read, &self.inner) {
            (Some(read), _) => SizeHint::with_exact(read.len() as u64),
            (None, Some(inner)) => inner.size_hint(),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

/// How long [`linger`] reads at most, in all, and while no byte comes (nginx's
/// `lingering_time` and `lingering_timeout`), and how many bytes it reads at most.
const LINGER_TIME: Duration = Duration::from_secs(30);
const LINGER_IDLE: Duration = Duration::from_secs(5);
const LINGER_BYTES: u64 = 64 << 20;

/// Reads and discards what is left of a request body that floodgate answered without reading
/// (a 413, 429, 401, 503…), for at most `LINGER_TIME` (30 s) and `LINGER_BYTES` (64 MiB), so that the HTTP/1
/// connection is not closed while the client is still sending: closing a socket with unread
/// data resets it, and the client's stack may then discard the answer before it is read (nginx's
/// `lingering_close`). When the body is read to its end, the connection may even be kept alive.
pub async fn linger(body: Incoming) {
    use http_body_util::BodyExt as _;
    let started = Instant::now();
    let mut body = body;
    let mut read = 0u64;
    while started.elapsed() < LINGER_TIME && read <= LINGER_BYTES {
        match tokio::time::timeout(LINGER_IDLE, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            // The end, the client's error, or silence: the connection may close now.
            Ok(None | Some(Err(_))) | Err(_) => return,
        }
    }
}

/// An upstream's response body on its way to the client, cut off after `idle` without data (the
/// client then sees the response end early, as with nginx's `proxy_read_timeout`).
///
/// When the upstream ends the body early (closes before its `Content-Length`, or mid-chunk), the
/// client is sent the bytes that came and then the connection is cut, as nginx does: the error is
/// held back for one poll, so that hyper flushes the head and the data it has buffered before it
/// aborts the connection (it drops its write buffer on a body error). The early end is logged
/// with the route.
pub struct ResponseBody<B> {
    inner: B,
    watchdog: Watchdog,
    route: Arc<str>,
    relayed: u64,
    /// The upstream's error, held back for one poll.
    failed: Option<BodyError>,
    /// The endpoint's count of requests in flight, held until the body is dropped.
    _held: Option<crate::upstream::InFlight>,
}

impl<B> ResponseBody<B> {
    pub fn new(
        inner: B,
        idle: Duration,
        route: Arc<str>,
        held: Option<crate::upstream::InFlight>,
    ) -> Self {
        ResponseBody {
            inner,
            watchdog: Watchdog::new(idle),
            route,
            relayed: 0,
            failed: None,
            _held: held,
        }
    }
}

impl<B> HttpBody for ResponseBody<B>
where
    B: HttpBody<Data = Bytes, Error = hyper::Error> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if let Some(error) = this.failed.take() {
            return Poll::Ready(Some(Err(error)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.watchdog.fed();
                if let Some(data) = frame.data_ref() {
                    this.relayed += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                tracing::warn!(
                    route = &*this.route,
                    relayed_bytes = this.relayed,
                    %error,
                    "the upstream ended the response body early; the client's connection is cut after the bytes that came"
                );
                this.failed = Some(error.into());
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending if this.watchdog.expired(cx) => {
                // An error, not an end: hyper then aborts the client's connection, so a
                // truncated body never looks complete (a clean end would send the last chunk).
                tracing::debug!(route = &*this.route, idle = ?this.watchdog.idle, "upstream body went silent; aborting the response");
                Poll::Ready(Some(Err(BodyError::Idle(this.watchdog.idle))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    fn expired(watchdog: &mut Watchdog) -> bool {
        watchdog.expired(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_expires_after_idle_and_a_frame_starts_the_next_anew() {
        let mut watchdog = Watchdog::new(Duration::from_secs(10));
        // Long before any wait: the clock only starts when a wait does.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!expired(&mut watchdog), "the first wait has just begun");
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(!expired(&mut watchdog));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(expired(&mut watchdog), "10 s of waiting");
        watchdog.fed();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!expired(&mut watchdog), "a frame ended the wait");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(expired(&mut watchdog));
    }

    /// A body from another transport: its frames, in order.
    fn frames(frames: Vec<Frame<Bytes>>) -> Incoming {
        struct Frames(std::collections::VecDeque<Frame<Bytes>>);
        impl HttpBody for Frames {
            type Data = Bytes;
            type Error = BoxError;
            fn poll_frame(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
                Poll::Ready(self.get_mut().0.pop_front().map(Ok))
            }
        }
        Incoming::Other(Box::pin(Frames(frames.into())))
    }

    /// Trailers come after the head was edited: none may carry what the route sets or
    /// removes, credentials, cookies or forwarding fields to the upstream.
    #[tokio::test]
    async fn request_trailers_lose_what_the_head_was_edited_and_checked_for() {
        use http_body_util::BodyExt as _;
        let mut trailers = http::HeaderMap::new();
        for (name, value) in [
            ("x-consumer", "forged"),
            ("authorization", "Bearer forged"),
            ("cookie", "session=forged"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-host", "forged.example"),
            ("x_consumer", "forged"),
            ("x-checksum", "kept"),
        ] {
            trailers.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_static(value),
            );
        }
        let body = frames(vec![
            Frame::data(Bytes::from_static(b"data")),
            Frame::trailers(trailers),
        ]);
        let body = RequestBody::new(
            ClientBody::Streaming(body),
            None,
            Duration::from_secs(10),
            Arc::default(),
            false,
        )
        .deny_trailers(Arc::from([http::HeaderName::from_static("x-consumer")]));
        let collected = body.collect().await.expect("body");
        let seen = collected.trailers().expect("trailers").clone();
        assert_eq!(collected.to_bytes(), "data");
        let names: Vec<&str> = seen.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-checksum"], "{seen:?}");
    }
}
