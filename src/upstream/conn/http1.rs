//! The upstream connection pool: HTTP/1.1 keep-alive connections, each driven by the task of the
//! request that is using it.
//!
//! A general-purpose client (hyper-util's) gives every connection a task of its own: a request
//! hands its head to that task through a channel, and the response head and every body chunk come
//! back through more channels, a task wake-up (often on the other core) at each step. floodgate
//! sends one request at a time per connection and relays the response to the one client that
//! asked, so, as pingora does, the request's own task drives the connection: it polls the
//! connection until the response head arrives, and the response body polls it for each chunk
//! ([`PooledBody`]). A connection whose response was read to the end goes back to the pool; one
//! dropped earlier (the client went away) is closed, as its half-read response cannot be reused.
//!
//! An idle connection is polled by no one, so the pool checks it before reuse: one poll notices
//! an upstream that closed it meanwhile (its FIN is read) and lets the connection settle into
//! its idle state. Connections idle past `idle_timeout` are dropped, at checkout and by a sweeper.
//! WebSocket upgrades get a fresh connection on a task of their own, never pooled.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use super::{BoxError, Outgoing};

/// A connection to an upstream: TCP, or TLS over TCP.
pub type Io = MaybeHttpsStream<TokioIo<TcpStream>>;
type Driver<B> = Pin<Box<http1::Connection<Io, B>>>;

/// Which connections may serve a request: the upstream's scheme and `host:port`.
pub type Key = (Scheme, Authority);

/// A connection: the handle requests are sent through, and the connection state machine that
/// reads and writes the socket when polled.
/// A connection ready for one request ([`Pool::connection`]), and whether it served one before.
pub struct Connection<B: Outgoing> {
    conn: Conn<B>,
    /// It served an earlier request (the upstream may close it just as it is reused).
    pub reused: bool,
    key: Key,
}

struct Conn<B: Outgoing> {
    sender: http1::SendRequest<B>,
    driver: Driver<B>,
}

impl<B: Outgoing> Conn<B> {
    /// Polls the idle connection once, without a waker: `false` if it has ended (the upstream
    /// closed it, or its last response asked to close) or cannot take a request.
    fn settle(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        if self.driver.as_mut().poll(&mut cx).is_ready() {
            return false;
        }
        matches!(self.sender.poll_ready(&mut cx), Poll::Ready(Ok(())))
    }
}

struct Idle<B: Outgoing> {
    conn: Conn<B>,
    since: Instant,
}

/// Why a request got no response.
#[derive(Debug)]
pub enum PoolError {
    /// No connection could be made (refused, timed out, TLS handshake failed).
    Connect(BoxError),
    /// The connection failed while the request was sent or its response head read. `reused`:
    /// the connection had served an earlier request (so the upstream may have closed it just
    /// as it was reused).
    Request { error: hyper::Error, reused: bool },
    /// The connection ended before it answered, with no error of its own to say why.
    Closed { reused: bool },
    /// An HTTP/2 upstream refused the stream without processing it (it may be sent again).
    Unprocessed(hyper::Error),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::Connect(e) => write!(f, "cannot connect to the upstream: {e}"),
            PoolError::Request { error, .. } => write!(f, "{error}"),
            PoolError::Closed { .. } => write!(f, "the upstream closed the connection"),
            PoolError::Unprocessed(error) => write!(f, "the upstream refused the stream: {error}"),
        }
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Connect(e) => Some(e.as_ref()),
            PoolError::Request { error, .. } => Some(error),
            PoolError::Closed { .. } => None,
            PoolError::Unprocessed(error) => Some(error),
        }
    }
}

/// The pool's map hasher: FNV-1a. Its keys are the routes' upstreams, from the configuration,
/// not from clients, so a keyed hash (std's SipHash, about 2,400 instructions a request for a
/// checkout and a checkin) buys nothing here.
type Fnv = std::hash::BuildHasherDefault<FnvHasher>;

struct FnvHasher(u64);

impl Default for FnvHasher {
    fn default() -> Self {
        FnvHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Keep-alive connections to upstreams, per scheme and authority.
pub struct Pool<B: Outgoing> {
    connector: HttpsConnector<HttpConnector>,
    idle: Mutex<HashMap<Key, Vec<Idle<B>>, Fnv>>,
    max_idle_per_host: usize,
    idle_timeout: Duration,
}

impl<B: Outgoing> Pool<B> {
    /// A pool connecting through `connector`. Within a Tokio runtime it also starts the sweeper
    /// of idle connections, which ends with the pool (outside one, idle connections are still
    /// dropped when found expired at checkout).
    pub fn new(
        connector: HttpsConnector<HttpConnector>,
        max_idle_per_host: usize,
        idle_timeout: Duration,
    ) -> Arc<Self> {
        let pool = Arc::new(Pool {
            connector,
            idle: Mutex::new(HashMap::default()),
            max_idle_per_host,
            idle_timeout,
        });
        if tokio::runtime::Handle::try_current().is_ok() {
            let weak = Arc::downgrade(&pool);
            tokio::spawn(sweep(weak, idle_timeout, Pool::evict_expired));
        }
        pool
    }

    /// Sends `req` (origin-form URI, `Host` set) to `scheme://authority` on a pooled connection,
    /// or a new one (`fresh`, when the caller dialled it already: ALPN chose HTTP/1.1), and
    /// returns the response head; its body drives the connection on.
    pub async fn send(
        self: &Arc<Self>,
        scheme: &Scheme,
        authority: &Authority,
        req: Request<B>,
        fresh: Option<Box<Io>>,
    ) -> Result<Response<PooledBody<B>>, PoolError> {
        let connection = self.connection(scheme, authority, fresh).await?;
        self.send_on(connection, req).await
    }

    /// A connection to `scheme://authority`: a pooled one, or a new one (`fresh`, when the
    /// caller dialled it already). A failure here is a connect failure: the request was not
    /// sent, so the caller still has it (to try another endpoint).
    pub async fn connection(
        self: &Arc<Self>,
        scheme: &Scheme,
        authority: &Authority,
        fresh: Option<Box<Io>>,
    ) -> Result<Connection<B>, PoolError> {
        let key = (scheme.clone(), authority.clone());
        // A new connection's dial and handshake are boxed: they happen once per connection, and
        // inline they would grow every request's future (which hyper moves into place).
        let (conn, reused) = match fresh {
            Some(io) => (Box::pin(Self::handshake(*io)).await?, false),
            None => match self.checkout(&key) {
                Some(conn) => (conn, true),
                None => (Box::pin(self.connect(scheme, authority)).await?, false),
            },
        };
        Ok(Connection { conn, reused, key })
    }

    /// Sends `req` on `connection` and returns the response head; its body drives the
    /// connection on, and puts it back in the pool once read to its end.
    pub async fn send_on(
        self: &Arc<Self>,
        connection: Connection<B>,
        req: Request<B>,
    ) -> Result<Response<PooledBody<B>>, PoolError> {
        let Connection {
            mut conn,
            reused,
            key,
        } = connection;
        let response = conn.sender.send_request(req);
        let mut response = std::pin::pin!(response);
        let mut conn = Some(conn);
        let head = poll_fn(|cx| {
            // The connection first (it writes the request, reads the response head and hands
            // it over), then the request's future, which then holds what the connection did.
            let Some(open) = conn.as_mut() else {
                return Poll::Ready(Err(PoolError::Closed { reused }));
            };
            let ended = open.driver.as_mut().poll(cx).is_ready();
            if ended {
                // Dropping an ended connection fails a request it never took (the upstream
                // closed it first), so the request's future holds why.
                conn = None;
            }
            match response.as_mut().poll(cx) {
                Poll::Ready(result) => {
                    Poll::Ready(result.map_err(|error| PoolError::Request { error, reused }))
                }
                Poll::Pending if ended => Poll::Ready(Err(PoolError::Closed { reused })),
                Poll::Pending => Poll::Pending,
            }
        })
        .await?;
        Ok(head.map(|body| PooledBody {
            body,
            conn,
            pool: Arc::downgrade(self),
            key: Some(key),
            done: false,
        }))
    }

    /// Sends `req` on a new connection driven by a task of its own, with upgrades enabled: for a
    /// WebSocket handshake, whose connection becomes the client's tunnel and is never pooled.
    pub async fn send_upgrade(
        &self,
        scheme: &Scheme,
        authority: &Authority,
        req: Request<B>,
    ) -> Result<Response<Incoming>, PoolError> {
        let io = dial(&self.connector, scheme, authority).await?;
        let (mut sender, driver) =
            http1::handshake(io)
                .await
                .map_err(|error| PoolError::Request {
                    error,
                    reused: false,
                })?;
        tokio::spawn(async move {
            if let Err(e) = driver.with_upgrades().await {
                tracing::debug!(error = %e, "upstream upgrade connection ended");
            }
        });
        sender
            .send_request(req)
            .await
            .map_err(|error| PoolError::Request {
                error,
                reused: false,
            })
    }

    /// The newest idle connection to `key` that is still usable; the others met on the way are
    /// closed.
    fn checkout(&self, key: &Key) -> Option<Conn<B>> {
        loop {
            // The lock is held to pop only: the check reads the socket.
            let Idle { mut conn, since } = self.idle.lock().ok()?.get_mut(key)?.pop()?;
            if since.elapsed() < self.idle_timeout && conn.settle() {
                return Some(conn);
            }
        }
    }

    /// Gives back a connection whose response was read to the end. It is not polled here:
    /// [`Pool::checkout`] polls it before it is used and finds then whatever ended it meanwhile
    /// (a connection whose response asked to close has mostly ended while its body was read,
    /// and is not given back), so one poll a request does for both (polled here as well, an
    /// allowed request cost about 1,050 instructions more: callgrind, 2026-12-04).
    fn checkin(&self, key: Key, conn: Conn<B>) {
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        let stack = idle.entry(key).or_default();
        if stack.len() < self.max_idle_per_host {
            stack.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// A new connection to `scheme://authority`.
    async fn connect(&self, scheme: &Scheme, authority: &Authority) -> Result<Conn<B>, PoolError> {
        Self::handshake(dial(&self.connector, scheme, authority).await?).await
    }

    async fn handshake(io: Io) -> Result<Conn<B>, PoolError> {
        let (sender, driver) = http1::handshake(io)
            .await
            .map_err(|error| PoolError::Request {
                error,
                reused: false,
            })?;
        Ok(Conn {
            sender,
            driver: Box::pin(driver),
        })
    }

    /// Drops the connections idle for `idle_timeout` or more.
    fn evict_expired(&self) {
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        for stack in idle.values_mut() {
            // Oldest first: the stack is pushed and popped at its end.
            let expired = stack
                .iter()
                .take_while(|i| i.since.elapsed() >= self.idle_timeout)
                .count();
            stack.drain(..expired);
        }
        idle.retain(|_, stack| !stack.is_empty());
    }

    /// How many idle connections the pool holds (tests).
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map_or(0, |i| i.values().map(Vec::len).sum())
    }
}

/// A TCP (and, for `https`, TLS with the connector's ALPN offer) connection to the upstream.
pub async fn dial(
    connector: &HttpsConnector<HttpConnector>,
    scheme: &Scheme,
    authority: &Authority,
) -> Result<Io, PoolError> {
    let uri = Uri::builder()
        .scheme(scheme.clone())
        .authority(authority.clone())
        .path_and_query("/")
        .build()
        .map_err(|e| PoolError::Connect(e.into()))?;
    connector
        .clone()
        .call(uri)
        .await
        .map_err(PoolError::Connect)
}

/// Every `idle_timeout / 2` (at least a second), runs `evict` on `pool`, until the pool is
/// gone: the sweeper of idle connections, for both pools.
pub async fn sweep<P>(pool: Weak<P>, idle_timeout: Duration, evict: fn(&P)) {
    let every = (idle_timeout / 2).max(Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        match pool.upgrade() {
            Some(pool) => evict(&pool),
            None => return,
        }
    }
}

/// An upstream response body that drives its connection while it is read, and gives the
/// connection back to the pool once read to the end.
pub struct PooledBody<B: Outgoing> {
    body: Incoming,
    /// `None` once the connection has ended (nothing to give back).
    conn: Option<Conn<B>>,
    pool: Weak<Pool<B>>,
    key: Option<Key>,
    /// True once the body was read to its end.
    done: bool,
}

impl<B: Outgoing> HttpBody for PooledBody<B> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        // The connection reads the socket and feeds the body; poll it first, then the body.
        if let Some(conn) = this.conn.as_mut()
            && conn.driver.as_mut().poll(cx).is_ready()
        {
            this.conn = None;
        }
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.done = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B: Outgoing> Drop for PooledBody<B> {
    fn drop(&mut self) {
        // A body the server stopped reading before its end (the client went away) leaves the
        // rest of the response on the connection: it is closed.
        if !(self.done || self.body.is_end_stream()) {
            return;
        }
        if let (Some(conn), Some(key), Some(pool)) =
            (self.conn.take(), self.key.take(), self.pool.upgrade())
        {
            pool.checkin(key, conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::crypto_provider;
    use http_body_util::{BodyExt, Empty};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A keep-alive upstream answering every request `hello`; each connection is closed by the
    /// upstream `close_after` its last response, if given. Returns its address and counts of
    /// the connections it accepted and of those it closed.
    async fn upstream(
        close_after: Option<Duration>,
    ) -> (Authority, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (count, closes) = (accepted.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let closes = closes.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        let read = match close_after {
                            Some(after) => tokio::time::timeout(after, stream.read(&mut chunk))
                                .await
                                .unwrap_or(Ok(0)),
                            None => stream.read(&mut chunk).await,
                        };
                        let Ok(n @ 1..) = read else {
                            drop(stream);
                            closes.fetch_add(1, Ordering::SeqCst);
                            return;
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
                            if stream.write_all(reply).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr.to_string().parse().unwrap(), accepted, closed)
    }

    fn pool(idle_timeout: Duration) -> Arc<Pool<Empty<Bytes>>> {
        let tls = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(HttpConnector::new());
        Pool::new(connector, 8, idle_timeout)
    }

    fn get(authority: &Authority) -> Request<Empty<Bytes>> {
        Request::builder()
            .uri("/")
            .header(http::header::HOST, authority.as_str())
            .body(Empty::new())
            .unwrap()
    }

    /// Sends one GET and reads its body to the end.
    async fn fetch(
        pool: &Arc<Pool<Empty<Bytes>>>,
        authority: &Authority,
    ) -> Result<Bytes, PoolError> {
        let response = pool
            .send(&Scheme::HTTP, authority, get(authority), None)
            .await?;
        Ok(response.into_body().collect().await.unwrap().to_bytes())
    }

    #[tokio::test]
    async fn sequential_requests_share_one_connection() {
        let (authority, accepted, _) = upstream(None).await;
        let pool = pool(Duration::from_secs(30));
        for _ in 0..5 {
            assert_eq!(fetch(&pool, &authority).await.unwrap(), "hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_while_idle_is_not_reused() {
        // The upstream closes each connection 50 ms after its last response; the next request
        // goes once it has (and 50 ms more, for the FIN to cross loopback).
        let (authority, accepted, closed) = upstream(Some(Duration::from_millis(50))).await;
        let pool = pool(Duration::from_secs(30));
        assert_eq!(fetch(&pool, &authority).await.unwrap(), "hello");
        let deadline = Instant::now() + Duration::from_secs(10);
        while closed.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the upstream never closed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(fetch(&pool, &authority).await.unwrap(), "hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_whose_response_asked_to_close_is_not_reused() {
        // Each connection answers one request with `connection: close`, then is closed.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority: Authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let Ok(n @ 1..) = stream.read(&mut chunk).await else {
                            return;
                        };
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let reply =
                        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 5\r\n\r\nhello";
                    let _ = stream.write_all(reply).await;
                });
            }
        });
        let pool = pool(Duration::from_secs(30));
        for _ in 0..3 {
            assert_eq!(fetch(&pool, &authority).await.unwrap(), "hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let (authority, accepted, _) = upstream(None).await;
        let pool = pool(Duration::from_secs(30));
        let response = pool
            .send(&Scheme::HTTP, &authority, get(&authority), None)
            .await
            .unwrap();
        drop(response);
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(fetch(&pool, &authority).await.unwrap(), "hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn connections_idle_past_the_timeout_are_dropped() {
        let (authority, accepted, _) = upstream(None).await;
        let pool = pool(Duration::from_millis(50));
        assert_eq!(fetch(&pool, &authority).await.unwrap(), "hello");
        assert_eq!(pool.idle_count(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        pool.evict_expired();
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(fetch(&pool, &authority).await.unwrap(), "hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let authority: Authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        drop(listener);
        let pool = pool(Duration::from_secs(30));
        assert!(matches!(
            fetch(&pool, &authority).await,
            Err(PoolError::Connect(_))
        ));
    }
}
