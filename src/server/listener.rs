//! One listener implementation for every TCP port floodgate serves (the proxy's, the admin
//! endpoints', the rate-limit service's), so that each gets the same limits: at most
//! `max_connections` open (past it, new ones wait in the kernel's backlog), the TLS handshake and
//! then every HTTP/1.1 request head within `timeouts.header_read` (a silent connection is
//! closed), HTTP/2 connections watched for abandoned streams and idleness (`watch.rs`), and a
//! drain that lets open requests finish. What a port answers is its [`Handler`]'s.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{HeaderValue, Request, Response};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::watch::{ConnWatch, StreamGuard};
use super::{Advertised, PerConnection, Serving, advertised, head, proxy_protocol};
use crate::answer::Body;
use crate::deadline::FirstByteDeadline;
use crate::metrics::{CloseReason, Metrics};
use crate::tls::PeerName;

/// What a port answers.
pub(super) trait Handler: Clone + Send + Sync + 'static {
    /// The answer to `req`, from the client at `peer`.
    fn handle(
        &self,
        req: Request<hyper::body::Incoming>,
        peer: SocketAddr,
    ) -> impl Future<Output = Response<Body>> + Send;

    /// The answer to an HTTP/2 stream opened past `http2_max_streams_per_second`.
    fn refuse_stream(&self, req: &Request<hyper::body::Incoming>) -> Response<Body>;
}

/// A port's TLS.
pub(super) enum Tls {
    Plain,
    /// The proxy's: the certificates the config in force names (a reload changes them).
    Serving,
    /// The port's own, read at start.
    Fixed(TlsAcceptor),
}

/// One bound TCP port and what it serves.
pub(super) struct Port<H> {
    pub listener: TcpListener,
    pub handler: H,
    pub tls: Tls,
    /// `Alt-Svc` for HTTP/3 (the proxy's port only).
    pub alt_svc: Option<HeaderValue>,
    /// Its open connections, each holding a permit until it ends.
    pub connections: Arc<Semaphore>,
    pub max_connections: usize,
    pub metrics: Arc<Metrics>,
    /// The gauge that counts its open connections, if one does.
    pub open: Option<Gauge>,
    /// Its name in the log.
    pub name: &'static str,
    /// Whether `proxy_protocol:` applies to it (the proxy's port only).
    pub proxy_protocol: bool,
}

impl<H: Handler> Port<H> {
    /// Accepts connections until `shutdown` completes, each served in a task of its own that
    /// watches `draining`; then stops accepting (the socket is closed).
    pub async fn accept(
        self,
        settings: Arc<ArcSwap<Serving>>,
        draining: tokio::sync::watch::Receiver<()>,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut last_full_warning: Option<std::time::Instant> = None;
        tokio::pin!(shutdown);
        loop {
            // At `max_connections`, stop accepting until one closes, and say so at most once a
            // minute.
            let permit = match self.connections.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    if last_full_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                        last_full_warning = Some(std::time::Instant::now());
                        tracing::warn!(
                            port = self.name,
                            max_connections = self.max_connections,
                            "max_connections reached: not accepting until a connection closes"
                        );
                    }
                    tokio::select! {
                        permit = self.connections.clone().acquire_owned() => match permit {
                            Ok(permit) => permit,
                            Err(_) => break,
                        },
                        () = &mut shutdown => break,
                    }
                }
            };
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(port = self.name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let serving = settings.load_full();
            let tls = match &self.tls {
                Tls::Plain => None,
                Tls::Serving => serving.tls.clone(),
                Tls::Fixed(acceptor) => Some(acceptor.clone()),
            };
            let proxy_from = (self.proxy_protocol)
                .then(|| serving.proxy_protocol.clone())
                .flatten();
            let mut connection = Connection {
                builder: serving.builder.clone(),
                draining: draining.clone(),
                handler: self.handler.clone(),
                peer,
                limits: serving.per_connection,
                metrics: self.metrics.clone(),
            };
            let alt_svc = self.alt_svc.clone();
            let open = self.open.clone();
            if let Some(open) = &open {
                open.inc();
            }
            tokio::spawn(async move {
                let _permit = permit;
                // Bounds the PROXY header, the TLS handshake, and then the connection's opening
                // bytes.
                let header_read = connection.limits.header_read;
                let mut stream = stream;
                let client = match &proxy_from {
                    None => Ok(peer),
                    Some(from) => {
                        proxy_protocol::client(&mut stream, peer, from, header_read).await
                    }
                };
                match (client, tls) {
                    (Err(why), _) => {
                        tracing::debug!(%peer, reason = %why, "connection closed unanswered");
                    }
                    (Ok(client), tls) => {
                        connection.peer = client;
                        connection
                            .serve_maybe_tls(stream, tls, serving, alt_svc)
                            .await;
                    }
                }
                if let Some(open) = open {
                    open.dec();
                }
            });
        }
    }
}

impl<H: Handler> Connection<H> {
    /// Serves `stream`, through a TLS handshake first when the port has `tls`.
    async fn serve_maybe_tls(
        self,
        stream: tokio::net::TcpStream,
        tls: Option<TlsAcceptor>,
        serving: Arc<Serving>,
        alt_svc: Option<HeaderValue>,
    ) {
        let connection = self;
        let peer = connection.peer;
        let header_read = connection.limits.header_read;
        match tls {
            None => {
                let stream = FirstByteDeadline::new(stream, header_read);
                connection.serve(stream, None, None).await
            }
            // The handshake runs here, not in the accept loop, so a slow client cannot
            // hold up others; the header-read timeout bounds it like a slow request head.
            Some(acceptor) => {
                // The address the client dialled: what it names when it sends no SNI.
                let local = stream.local_addr().ok();
                let handshake = handshake(stream, acceptor, &serving);
                match tokio::time::timeout(header_read, handshake).await {
                    Ok(Ok(None)) => {
                        tracing::debug!(%peer, "answered an ACME TLS-ALPN-01 challenge");
                    }
                    Ok(Ok(Some(stream))) => {
                        let advertise = advertised(&serving, alt_svc, &stream, local);
                        // A certificate the handshake verified (`tls.client_auth`).
                        let peer_name = (stream.get_ref().1.peer_certificates())
                            .and_then(|chain| chain.first())
                            .and_then(PeerName::of);
                        let stream = FirstByteDeadline::new(stream, header_read);
                        connection.serve(stream, advertise, peer_name).await
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, %peer, "TLS handshake failed")
                    }
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            }
        }
    }
}

/// The TLS handshake on `stream`. With ACME's TLS-ALPN-01 (`serving.alpn_challenges`), the
/// hello is read first: one that offers only `acme-tls/1` gets the challenge's certificate and
/// nothing else (`None`: the connection is done), any other the listener's config.
async fn handshake(
    stream: tokio::net::TcpStream,
    acceptor: TlsAcceptor,
    serving: &Serving,
) -> std::io::Result<Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>> {
    let (Some(challenges), Some(config), true) = (
        &serving.challenges,
        &serving.server_config,
        serving.alpn_challenges,
    ) else {
        return acceptor.accept(stream).await.map(Some);
    };
    let start =
        tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await?;
    let hello = start.client_hello();
    let only_acme = hello.alpn().is_some_and(|mut protocols| {
        protocols.next() == Some(crate::acme::challenge::ACME_TLS_ALPN)
            && protocols.next().is_none()
    });
    if !only_acme {
        return start.into_stream(config.clone()).await.map(Some);
    }
    let name = hello.server_name().map(str::to_owned);
    let answer = match name {
        Some(name) => challenges.alpn_config(&name).await,
        None => None,
    };
    if let Some(answer) = answer {
        // The handshake is the answer: the CA reads the certificate and closes.
        let _ = start.into_stream(answer).await?;
    }
    Ok(None)
}

impl<H: Handler> Port<H> {
    /// A port that drains on its own: [`Port::accept`] until `shutdown`, then its open
    /// connections are told to finish and given the drain timeout to.
    pub async fn run(self, settings: Arc<ArcSwap<Serving>>, shutdown: impl Future<Output = ()>) {
        let (drain, draining) = tokio::sync::watch::channel(());
        let (connections, max) = (self.connections.clone(), self.max_connections);
        self.accept(settings.clone(), draining, shutdown).await;
        let _ = drain.send(());
        drained(&connections, max, settings.load().drain_timeout).await;
    }
}

/// Waits until every connection holding a permit of `connections` (`max` in all) has ended,
/// for at most `timeout`: false when some were still open.
pub(super) async fn drained(connections: &Semaphore, max: usize, timeout: Duration) -> bool {
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    tokio::time::timeout(timeout, connections.acquire_many(all))
        .await
        .is_ok()
}

/// One accepted connection and what serving it needs.
struct Connection<H> {
    builder: Arc<auto::Builder<TokioExecutor>>,
    draining: tokio::sync::watch::Receiver<()>,
    handler: H,
    peer: SocketAddr,
    limits: PerConnection,
    metrics: Arc<Metrics>,
}

impl<H: Handler> Connection<H> {
    /// Serves HTTP/1.1 or HTTP/2 (whichever the client speaks) on `stream`, plain or TLS, until
    /// it closes, a drain ends it, or its [`ConnWatch`] says to close it. Each HTTP/1.1 request
    /// head is bounded by `limits.header_read` (`head.rs`: the connection's timer below wakes it
    /// at a pending head's deadline).
    async fn serve<S>(self, stream: S, alt_svc: Option<Advertised>, peer_name: Option<PeerName>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            builder,
            mut draining,
            handler,
            peer,
            limits,
            metrics,
        } = self;
        let watch = ConnWatch::new(limits.resets, limits.streams, metrics.clone());
        let streams = watch.clone();
        let service = service_fn(move |mut req: Request<hyper::body::Incoming>| {
            let handler = handler.clone();
            if let Some(name) = &peer_name {
                req.extensions_mut().insert(name.clone());
            }
            let stream = if req.version() == http::Version::HTTP_2 {
                Some(StreamGuard::open(&streams))
            } else {
                streams.saw_http1();
                None
            };
            let admitted = stream.is_none() || streams.admit_stream();
            let alt_svc = alt_svc.as_ref().and_then(|a| a.for_request(&req));
            async move {
                let mut response = match admitted {
                    true => handler.handle(req, peer).await,
                    false => handler.refuse_stream(&req),
                };
                if let Some(value) = alt_svc {
                    response.headers_mut().insert(http::header::ALT_SVC, value);
                }
                Ok::<_, Infallible>(match stream {
                    Some(stream) => stream.answered(response),
                    None => response,
                })
            }
        });
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        tokio::pin!(conn);
        // One timer looks after both deadlines a connection waits on without a request in
        // service: an HTTP/2 connection idle for `limits.idle`, an HTTP/1.1 head awaited for
        // `header_read` (`head.rs`: the timer wakes the task at the head's deadline).
        let clock = head::HeadClock::new();
        let timer = tokio::time::sleep(limits.header_read.min(limits.idle));
        tokio::pin!(timer);
        // After a GOAWAY for abuse, how long the client has before the connection is cut.
        let cut = tokio::time::sleep(Duration::MAX / 4);
        tokio::pin!(cut);
        let (mut closing, mut cutting) = (false, false);
        loop {
            tokio::select! {
                result = clock.polled(conn.as_mut()) => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                    return;
                }
                _ = draining.changed(), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = watch.abusive(), if !closing => {
                    tracing::warn!(%peer, "closing an HTTP/2 connection that abandoned streams faster than http2_max_resets_per_second");
                    metrics.connection_closed(CloseReason::Resets);
                    (closing, cutting) = (true, true);
                    conn.as_mut().graceful_shutdown();
                    cut.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(1));
                }
                // (A head deadline found passed ends the connection when it is polled, next.)
                () = &mut timer => {
                    let now = std::time::Instant::now();
                    let mut next = clock.check(now, limits.header_read);
                    match watch.idle_since() {
                        _ if closing => {}
                        Some(since) if now >= since + limits.idle => {
                            tracing::debug!(%peer, "closing an HTTP/2 connection with no open stream");
                            metrics.connection_closed(CloseReason::Idle);
                            closing = true;
                            conn.as_mut().graceful_shutdown();
                        }
                        Some(since) => next = next.min(since + limits.idle),
                        None => next = next.min(now + limits.idle),
                    }
                    timer.as_mut().reset(next.into());
                }
                () = &mut cut, if cutting => return,
            }
        }
    }
}
