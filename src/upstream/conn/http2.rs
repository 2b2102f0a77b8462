//! HTTP/2 upstream connections (`upstream_protocol: http2`, or `auto` when ALPN picks `h2`):
//! many requests in flight on each, as streams.
//!
//! Each connection is driven by a task of its own (its streams belong to many requests at
//! once), which also notes the upstream's current `SETTINGS_MAX_CONCURRENT_STREAMS`. No stream
//! is opened over that limit: until a connection's first SETTINGS arrive it is taken to allow
//! one stream (the limit is learned before a second one goes out). A request takes the first
//! connection to its upstream with a stream to spare; a new connection is dialled (one at a
//! time per upstream, at most [`MAX_CONNECTIONS`]) only when every one has learned its limit
//! and is full, or none is left; otherwise the request waits for a stream to end, a limit to be
//! learned or raised, or a dial to finish, within the route's upstream timeout, as nginx and
//! HAProxy queue such requests. A stream is counted from its request until its response body
//! ends or is dropped, so a long gRPC stream holds its place as long as it lives.
//!
//! A connection that the upstream closes, or that sent GOAWAY or refused a stream, takes no new
//! streams. A stream the upstream never processed (`REFUSED_STREAM`, or above the last stream
//! of a graceful GOAWAY: RFC 9113 §8.7) is [`PoolError::Unprocessed`], which the forwarder sends
//! once more. Flow control is end to end: the upstream's data is acknowledged (its window
//! reopened) only as the client's side reads it, so a slow client holds at most a stream window
//! of a fast upstream's data here. Connections with no stream for `idle_timeout` are closed
//! by a sweeper; a ping every 30 s finds upstreams that stopped answering.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::client::conn::http2;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::frames::{Inspected, PeerSettings};
use super::http1::{Io, Key, PoolError, dial, sweep};
use super::{Resend, Source};

type Sender<S> = http2::SendRequest<Resend<S>>;

/// The per-connection stream window floodgate grants an upstream: how much of one response it
/// may send before the client has read it.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 8 << 20;

/// The most HTTP/2 connections floodgate opens to one upstream; past them, requests wait for
/// a stream.
pub const MAX_CONNECTIONS: usize = 16;

/// What a connection is taken to allow before its SETTINGS say (RFC 9113 §6.5.2 leaves it
/// unlimited; one keeps the streams of a cold connection within any limit the upstream sets).
const STREAMS_BEFORE_SETTINGS: usize = 1;

/// HTTP/2 connections to upstreams, per scheme and authority.
pub struct Multiplex<S: Source> {
    connector: HttpsConnector<HttpConnector>,
    conns: Mutex<HashMap<Key, Vec<Conn<S>>>>,
    /// Per upstream: one dial at a time, and what requests waiting for a stream wait on.
    upstreams: Mutex<HashMap<Key, Arc<Upstream>>>,
    idle_timeout: Duration,
    started: Instant,
    /// Streams sent again because the upstream had not processed them.
    resent: AtomicU64,
}

/// One upstream's dialling and waiting.
#[derive(Default)]
struct Upstream {
    /// Held while a connection is dialled: requests that find every connection full wait for
    /// it instead of each opening one.
    dialing: tokio::sync::Mutex<()>,
    /// Woken when a stream may have come free: one ended, a connection learned or raised its
    /// limit, a dial finished, a connection closed.
    changed: Arc<tokio::sync::Notify>,
}

/// What a request finds among an upstream's connections.
enum Found<S: Source> {
    /// A stream, reserved.
    Stream(Conn<S>, StreamSlot<S>),
    /// None free, but one will or may come: a connection has not yet learned its limit, or
    /// there are [`MAX_CONNECTIONS`] already.
    Wait,
    /// None free, and a new connection is the way.
    Dial,
}

struct Conn<S: Source> {
    sender: Sender<S>,
    state: Arc<ConnState<S>>,
}

impl<S: Source> Clone for Conn<S> {
    fn clone(&self) -> Self {
        Conn {
            sender: self.sender.clone(),
            state: self.state.clone(),
        }
    }
}

type Connection<S> = http2::Connection<Inspected<Io>, Resend<S>, TokioExecutor>;

/// What requests and the connection's task know of one connection.
struct ConnState<S: Source> {
    /// Streams floodgate has open on it.
    open: AtomicUsize,
    /// The connection, polled by its task, and asked by requests for the upstream's current
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` (the lock is held for a poll or a read: h2's own
    /// connection runs in a task of its own, so the poll only hands requests over).
    connection: Mutex<Connection<S>>,
    /// Set when it ended, sent GOAWAY or refused a stream: no new streams.
    refusing: AtomicBool,
    /// What the upstream's SETTINGS said, read off the wire (`frames.rs`, which
    /// also wakes the waiting requests when they come).
    settings: Arc<PeerSettings>,
    /// The upstream's waiters.
    changed: Arc<tokio::sync::Notify>,
    /// When the pool started: what `last_end_us` counts from.
    epoch: Instant,
    /// When its last stream ended, in µs since the pool started.
    last_end_us: AtomicU64,
}

impl<S: Source> Conn<S> {
    /// Takes a stream on this connection if it has one to spare.
    fn reserve(&self) -> Option<StreamSlot<S>> {
        let state = &self.state;
        if state.refusing.load(Ordering::Acquire) || self.sender.is_closed() {
            return None;
        }
        // h2's own figure is the upstream's once its SETTINGS came (h2's default of 100 when
        // they set none); before, one stream.
        let max = if state.settings.received() {
            state
                .connection
                .lock()
                .map_or(0, |c| c.current_max_send_streams())
        } else {
            STREAMS_BEFORE_SETTINGS
        };
        state
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < max).then_some(open + 1)
            })
            .ok()?;
        Some(StreamSlot {
            state: state.clone(),
        })
    }

    fn usable(&self) -> bool {
        !self.state.refusing.load(Ordering::Acquire) && !self.sender.is_closed()
    }
}

/// One stream's place on its connection, given back when dropped.
struct StreamSlot<S: Source> {
    state: Arc<ConnState<S>>,
}

impl<S: Source> Drop for StreamSlot<S> {
    fn drop(&mut self) {
        let now = u64::try_from(self.state.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.state.last_end_us.store(now, Ordering::Relaxed);
        self.state.open.fetch_sub(1, Ordering::AcqRel);
        self.state.changed.notify_waiters();
    }
}

impl<S: Source> Multiplex<S> {
    /// A pool dialling through `connector` (which offers ALPN `h2` on `https://`). Within a
    /// Tokio runtime it also starts the sweeper of idle connections.
    pub fn new(connector: HttpsConnector<HttpConnector>, idle_timeout: Duration) -> Arc<Self> {
        let pool = Arc::new(Multiplex {
            connector,
            conns: Mutex::new(HashMap::new()),
            upstreams: Mutex::new(HashMap::new()),
            idle_timeout,
            started: Instant::now(),
            resent: AtomicU64::new(0),
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(sweep(
                Arc::downgrade(&pool),
                idle_timeout,
                Multiplex::evict_idle,
            ));
        }
        pool
    }

    /// Sends `req` (absolute URI, no `Host`) on a stream of a connection to `key`'s upstream,
    /// `fresh` when the caller dialled it already (ALPN chose `h2`), and returns the response
    /// head; its body holds the stream until it ends.
    ///
    /// A stream the upstream did not process is sent again on another stream, at most
    /// [`ATTEMPTS`] times in all, while its body so far was small enough to keep: a fresh
    /// connection's first streams go out before the upstream's SETTINGS say how many it takes,
    /// and those past its limit come back `REFUSED_STREAM`.
    pub async fn send(
        &self,
        key: &Key,
        req: Request<Resend<S>>,
        mut fresh: Option<Box<Io>>,
    ) -> Result<Response<MultiplexBody<S>>, PoolError> {
        let head = copy_head(&req);
        let resend = req.body().handle();
        let mut req = req;
        let mut attempt = 1;
        loop {
            let error = match self.send_once(key, req, fresh.take()).await {
                Err(PoolError::Unprocessed(error)) => error,
                other => return other,
            };
            let again = (attempt < ATTEMPTS).then(|| resend.again()).flatten();
            let Some(body) = again else {
                return Err(PoolError::Unprocessed(error));
            };
            tracing::debug!(%error, attempt, "the upstream did not process a stream; sending it again");
            self.resent.fetch_add(1, Ordering::Relaxed);
            attempt += 1;
            req = copy_head(&head).map(|()| body);
        }
    }

    async fn send_once(
        &self,
        key: &Key,
        req: Request<Resend<S>>,
        fresh: Option<Box<Io>>,
    ) -> Result<Response<MultiplexBody<S>>, PoolError> {
        let (conn, slot) = match fresh {
            Some(io) => {
                let conn = self.handshake(key, *io).await?;
                let slot = conn.reserve().ok_or(PoolError::Closed { reused: false })?;
                (conn, slot)
            }
            None => self.checkout(key).await?,
        };
        let mut sender = conn.sender.clone();
        match sender.send_request(req).await {
            Ok(response) => Ok(response.map(|body| MultiplexBody { body, _slot: slot })),
            Err(error) => match unprocessed(&error) {
                Some(Unprocessed::Refused) => Err(PoolError::Unprocessed(error)),
                Some(Unprocessed::GoingAway) => {
                    conn.state.refusing.store(true, Ordering::Release);
                    Err(PoolError::Unprocessed(error))
                }
                None => Err(PoolError::Request {
                    error,
                    reused: true,
                }),
            },
        }
    }

    /// A connection with a stream to spare: one that has it, or a new one when every one has
    /// learned its limit and is full; else waits until a stream may have come free. The
    /// forwarder's timeout bounds the wait.
    async fn checkout(&self, key: &Key) -> Result<(Conn<S>, StreamSlot<S>), PoolError> {
        let upstream = {
            let mut upstreams = self.upstreams.lock().unwrap_or_else(|p| p.into_inner());
            upstreams.entry(key.clone()).or_default().clone()
        };
        loop {
            // Registered before looking, so that a change between the look and the wait is
            // not missed.
            let changed = upstream.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.find(key) {
                Found::Stream(conn, slot) => return Ok((conn, slot)),
                Found::Wait => {
                    changed.await;
                    continue;
                }
                Found::Dial => {}
            }
            let Ok(_dialing) = upstream.dialing.try_lock() else {
                // Another request is dialling: its connection, or a freed stream, will do.
                changed.await;
                continue;
            };
            let io = dial(&self.connector, &key.0, &key.1).await?;
            let conn = self.handshake(key, io).await?;
            if let Some(slot) = conn.reserve() {
                return Ok((conn, slot));
            }
        }
    }

    /// The first usable connection to `key` with a stream to spare; ended ones are dropped.
    fn find(&self, key: &Key) -> Found<S> {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let Some(list) = conns.get_mut(key) else {
            return Found::Dial;
        };
        list.retain(Conn::<S>::usable);
        if let Some((conn, slot)) = list
            .iter()
            .find_map(|conn| conn.reserve().map(|slot| (conn.clone(), slot)))
        {
            return Found::Stream(conn, slot);
        }
        let learning = list.iter().any(|c| !c.state.settings.received());
        if learning || list.len() >= MAX_CONNECTIONS {
            Found::Wait
        } else {
            Found::Dial
        }
    }

    /// Opens HTTP/2 on `io`, starts the task that drives it and adds it to the pool.
    async fn handshake(&self, key: &Key, io: Io) -> Result<Conn<S>, PoolError> {
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20))
            .max_header_list_size(64 * 1024);
        let changed = {
            let mut upstreams = self.upstreams.lock().unwrap_or_else(|p| p.into_inner());
            upstreams.entry(key.clone()).or_default().changed.clone()
        };
        let settings = Arc::new(PeerSettings::new(changed.clone()));
        let io = Inspected::new(io, settings.clone());
        let (sender, connection) =
            builder
                .handshake(io)
                .await
                .map_err(|error| PoolError::Request {
                    error,
                    reused: false,
                })?;
        let state = Arc::new(ConnState {
            open: AtomicUsize::new(0),
            connection: Mutex::new(connection),
            epoch: self.started,
            refusing: AtomicBool::new(false),
            settings,
            changed,
            last_end_us: AtomicU64::new(
                u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX),
            ),
        });
        tokio::spawn(Driven {
            state: state.clone(),
            authority: key.1.clone(),
        });
        let conn = Conn { sender, state };
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .push(conn.clone());
        conn.state.changed.notify_waiters();
        Ok(conn)
    }

    /// Closes connections that have had no stream for `idle_timeout` (dropping the last sender
    /// ends the connection with a GOAWAY).
    fn evict_idle(&self) {
        let now = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let idle_us = u64::try_from(self.idle_timeout.as_micros()).unwrap_or(u64::MAX);
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        for list in conns.values_mut() {
            list.retain(|c| {
                c.usable()
                    && (c.state.open.load(Ordering::Acquire) > 0
                        || now.saturating_sub(c.state.last_end_us.load(Ordering::Relaxed))
                            < idle_us)
            });
        }
        conns.retain(|_, list| !list.is_empty());
    }

    /// How many connections the pool holds (tests).
    #[cfg(test)]
    fn connections(&self) -> usize {
        self.conns
            .lock()
            .map_or(0, |c| c.values().map(Vec::len).sum())
    }
}

/// How many times a stream the upstream did not process is sent at most.
const ATTEMPTS: u32 = 3;

/// Why the upstream did not process a stream.
enum Unprocessed {
    /// `REFUSED_STREAM`: this stream only (the connection was at its limit).
    Refused,
    /// A graceful GOAWAY below it, or the connection closed before it was handed over: the
    /// connection takes no new streams.
    GoingAway,
}

/// Whether `error` says the upstream never processed the stream (RFC 9113 §8.7), so that it
/// can be sent again, and why.
fn unprocessed(error: &hyper::Error) -> Option<Unprocessed> {
    if error.is_canceled() {
        return Some(Unprocessed::GoingAway);
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
                return Some(Unprocessed::Refused);
            }
            let graceful = h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR);
            return (graceful && h2.is_remote()).then_some(Unprocessed::GoingAway);
        }
        source = e.source();
    }
    None
}

/// A copy of `request`'s head (method, URI, version, headers), to send it again.
pub fn copy_head<B>(request: &Request<B>) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = request.method().clone();
    *head.uri_mut() = request.uri().clone();
    *head.version_mut() = request.version();
    *head.headers_mut() = request.headers().clone();
    head
}

/// A connection's driving task: polls it, and notes its end.
struct Driven<S: Source> {
    state: Arc<ConnState<S>>,
    authority: http::uri::Authority,
}

impl<S: Source> Future for Driven<S> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let polled = match this.state.connection.lock() {
            Ok(mut connection) => Pin::new(&mut *connection).poll(cx),
            Err(_) => Poll::Ready(Ok(())),
        };
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                this.state.refusing.store(true, Ordering::Release);
                this.state.changed.notify_waiters();
                if let Err(e) = result {
                    tracing::debug!(error = %e, upstream = %this.authority, "upstream HTTP/2 connection ended");
                }
                Poll::Ready(())
            }
        }
    }
}

/// An upstream's HTTP/2 response body (data, then trailers), holding its stream's place on the
/// connection until it ends or is dropped.
pub struct MultiplexBody<S: Source> {
    body: Incoming,
    _slot: StreamSlot<S>,
}

impl<S: Source> HttpBody for MultiplexBody<S> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Superseded;
    use super::*;

    /// What the tests send: any body, boxed.
    type TestBody = http_body_util::combinators::BoxBody<Bytes, TestError>;

    /// A test body's error: a client's body that failed, or one a retry superseded.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct TestError(String);

    impl From<Superseded> for TestError {
        fn from(e: Superseded) -> Self {
            TestError(e.to_string())
        }
    }

    fn empty() -> TestBody {
        http_body_util::Empty::new().map_err(|e| match e {}).boxed()
    }
    use crate::tls::crypto_provider;
    use http::uri::Scheme;
    use http_body_util::BodyExt;
    use hyper_util::rt::TokioIo;
    use std::sync::atomic::AtomicUsize;
    use tokio::net::TcpListener;

    /// An h2c upstream that answers each request after `delay`, with at most `max_streams`
    /// streams per connection; returns its authority and the count of connections it accepted.
    async fn upstream(
        max_streams: u32,
        delay: Duration,
    ) -> (http::uri::Authority, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req| async move {
                        tokio::time::sleep(delay).await;
                        let body = http_body_util::Full::new(Bytes::from_static(b"hi"));
                        Ok::<_, std::convert::Infallible>(Response::new(body))
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .max_concurrent_streams(max_streams)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr.to_string().parse().unwrap(), accepted)
    }

    fn pool() -> Arc<Multiplex<TestBody>> {
        let tls = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http2()
            .wrap_connector(HttpConnector::new());
        Multiplex::new(connector, Duration::from_secs(30))
    }

    async fn fetch(pool: Arc<Multiplex<TestBody>>, key: Key) -> Bytes {
        let uri = format!("http://{}/", key.1);
        let req = Request::builder()
            .uri(uri)
            .version(http::Version::HTTP_2)
            .body(Resend::new(empty()))
            .unwrap();
        let response = pool.send(&key, req, None).await.unwrap();
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_connection() {
        let (authority, accepted) = upstream(100, Duration::from_millis(50)).await;
        let pool = pool();
        let key = (Scheme::HTTP, authority);
        let mut all = tokio::task::JoinSet::new();
        for _ in 0..20 {
            all.spawn(fetch(pool.clone(), key.clone()));
        }
        for body in all.join_all().await {
            assert_eq!(body, "hi");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.connections(), 1);
    }

    #[tokio::test]
    async fn no_stream_is_opened_over_the_upstreams_limit_and_the_rest_wait() {
        // One stream per connection, each answer held 200 ms, 24 requests at once on a cold
        // pool: none is refused (each connection's SETTINGS are learned before a second stream
        // goes out), at most MAX_CONNECTIONS connections are opened, and the requests beyond
        // them wait for a stream instead of failing.
        let (authority, accepted) = upstream(1, Duration::from_millis(200)).await;
        let pool = pool();
        let key = (Scheme::HTTP, authority);
        let mut all = tokio::task::JoinSet::new();
        for _ in 0..24 {
            all.spawn(fetch(pool.clone(), key.clone()));
        }
        for body in all.join_all().await {
            assert_eq!(body, "hi");
        }
        assert_eq!(
            pool.resent.load(Ordering::SeqCst),
            0,
            "no stream was refused"
        );
        let opened = accepted.load(Ordering::SeqCst);
        assert!(
            (2..=MAX_CONNECTIONS).contains(&opened),
            "{opened} connections"
        );
    }

    #[tokio::test]
    async fn a_full_connection_makes_the_pool_open_another() {
        // Two streams per connection, and each answer held 200 ms: six requests at once need
        // three connections. The first request learns the first connection's limit; a new
        // connection's first streams go out before its SETTINGS arrive, and those it refuses
        // are sent again on the next connection, never a fourth.
        let (authority, accepted) = upstream(2, Duration::from_millis(200)).await;
        let pool = pool();
        let key = (Scheme::HTTP, authority);
        assert_eq!(fetch(pool.clone(), key.clone()).await, "hi");
        let mut all = tokio::task::JoinSet::new();
        for _ in 0..6 {
            all.spawn(fetch(pool.clone(), key.clone()));
        }
        for body in all.join_all().await {
            assert_eq!(body, "hi");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    /// A raw h2 upstream on its own task: `serve` handles each stream (its number on the
    /// connection, from 0, and its request and respond handle).
    async fn raw_upstream<F, Fut>(serve: F) -> http::uri::Authority
    where
        F: Fn(usize, Request<h2::RecvStream>, h2::server::SendResponse<Bytes>) -> Fut
            + Clone
            + Send
            + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let serve = serve.clone();
                tokio::spawn(async move {
                    let mut conn = h2::server::handshake(stream).await.unwrap();
                    let mut n = 0;
                    while let Some(Ok((request, respond))) = conn.accept().await {
                        tokio::spawn(serve.clone()(n, request, respond));
                        n += 1;
                    }
                });
            }
        });
        addr.to_string().parse().unwrap()
    }

    /// A request whose body comes through `body`'s channel, as a client's would.
    fn post(
        authority: &http::uri::Authority,
        body: hyper::body::Incoming,
    ) -> Request<Resend<TestBody>> {
        let body: TestBody = body.map_err(|e| TestError(e.to_string())).boxed();
        Request::builder()
            .method("POST")
            .uri(format!("http://{authority}/"))
            .version(http::Version::HTTP_2)
            .body(Resend::new(body))
            .unwrap()
    }

    /// A real `Incoming` body holding `bytes`: a hyper HTTP/1 server hands it to `take`.
    async fn incoming(bytes: &'static [u8]) -> hyper::body::Incoming {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = std::sync::Mutex::new(Some(tx));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                if let Some(tx) = tx.lock().unwrap().take() {
                    let _ = tx.send(req.into_body());
                }
                async {
                    Ok::<_, std::convert::Infallible>(Response::new(
                        http_body_util::Empty::<Bytes>::new(),
                    ))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        tokio::spawn(async move {
            let req = Request::post("/")
                .header("host", "x")
                .body(http_body_util::Full::new(Bytes::from_static(bytes)))
                .unwrap();
            let _ = sender.send_request(req).await;
        });
        rx.await.unwrap()
    }

    #[tokio::test]
    async fn a_refused_stream_is_sent_again_with_its_body() {
        // The upstream refuses its first stream; the second must carry the same body.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let bodies = seen.clone();
        let authority = raw_upstream(move |n, request, mut respond| {
            let bodies = bodies.clone();
            async move {
                if n == 0 {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                    return;
                }
                let mut body = request.into_body();
                let mut got = Vec::new();
                while let Some(Ok(chunk)) = body.data().await {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    got.extend_from_slice(&chunk);
                }
                bodies.lock().unwrap().push(got);
                let mut send = respond.send_response(Response::new(()), false).unwrap();
                send.send_data(Bytes::from_static(b"done"), true).unwrap();
            }
        })
        .await;
        let pool = pool();
        let key = (Scheme::HTTP, authority.clone());
        let response = pool
            .send(
                &key,
                post(&authority, incoming(b"the whole body").await),
                None,
            )
            .await
            .unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "done");
        assert_eq!(*seen.lock().unwrap(), [b"the whole body".to_vec()]);
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_holds_back_a_fast_upstream_at_the_stream_window() {
        // The upstream sends 8 MiB as fast as flow control lets it; nobody reads the response.
        // What it managed to send is what floodgate would hold for the client: the stream
        // window (1 MiB), not the 8 MiB.
        let sent = Arc::new(AtomicUsize::new(0));
        let counter = sent.clone();
        let authority = raw_upstream(move |_, _request, mut respond| {
            let counter = counter.clone();
            async move {
                let mut send = respond.send_response(Response::new(()), false).unwrap();
                let chunk = Bytes::from(vec![0u8; 16 * 1024]);
                for _ in 0..512 {
                    send.reserve_capacity(chunk.len());
                    let mut granted = 0;
                    while granted < chunk.len() {
                        match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                            Some(Ok(n)) => granted = n,
                            _ => return,
                        }
                    }
                    if send.send_data(chunk.clone(), false).is_err() {
                        return;
                    }
                    counter.fetch_add(chunk.len(), Ordering::SeqCst);
                }
                let _ = send.send_data(Bytes::new(), true);
            }
        })
        .await;
        let pool = pool();
        let key = (Scheme::HTTP, authority.clone());
        let uri = format!("http://{authority}/");
        let req = Request::builder()
            .uri(uri)
            .version(http::Version::HTTP_2)
            .body(Resend::new(empty()))
            .unwrap();
        let response = pool.send(&key, req, None).await.unwrap();
        // Long enough for 8 MiB to cross loopback many times over, were nothing holding it.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = sent.load(Ordering::SeqCst);
        assert!(
            held <= STREAM_WINDOW as usize + 64 * 1024,
            "the upstream sent {held} bytes nobody read"
        );
        // Reading it lets the rest come.
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 8 << 20);
    }
}
