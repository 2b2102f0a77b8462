//! The listeners: accepting connections, TLS termination (rustls; ALPN picks h2 or HTTP/1.1),
//! serving HTTP/1.1 and HTTP/2 (cleartext h2 by prior knowledge) with upgrades, the slowloris
//! guard, closing abusive and idle HTTP/2 connections (`server/watch.rs`), and graceful shutdown. The
//! admin listener is always plain HTTP.

mod head;
mod http3;
mod reload;
mod watch;

pub use reload::Reloader;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admin::{self, AdminState, Health};
use crate::config::{Config, ServiceConfig};
use crate::deadline::FirstByteDeadline;
use crate::limiter::Limit;
use crate::metrics::CloseReason;
use crate::proxy::Proxy;
use crate::proxy::body::Incoming;
use crate::service::Service;
use crate::service::server::ServiceState;
use watch::{ConnWatch, StreamGuard};

/// A proxy with its listeners bound, ready to serve.
pub struct Server {
    proxy: Arc<Proxy>,
    health: Arc<Health>,
    /// The proxy listener, bound (registered with the runtime that runs the server).
    listener: std::net::TcpListener,
    admin: Option<TcpListener>,
    /// The rate-limit service's listener and what it serves (`service:`).
    service: Option<(TcpListener, ServiceState)>,
    /// The HTTP/3 listener (`http3:`), and the `Alt-Svc` value that advertises it.
    http3: Option<(http3::Http3Listener, HeaderValue)>,
    max_connections: usize,
    /// How connections are served; a reload swaps it for new connections ([`Server::settings`]).
    settings: Arc<ArcSwap<Serving>>,
}

/// How new connections are served, as the config says: what a reload changes in the server
/// (the listening sockets and `max_connections` stay until a restart).
pub struct Serving {
    builder: Arc<auto::Builder<TokioExecutor>>,
    /// Set when the proxy listener terminates TLS (certificates read when the config was).
    tls: Option<TlsAcceptor>,
    /// The certificate's names: `Alt-Svc` is said only to a client that asked for one.
    names: Option<crate::config::TlsConfig>,
    /// New HTTP/3 connections' QUIC config (`http3:`), with the same certificate.
    quic: Option<Arc<quinn::ServerConfig>>,
    /// `http3.advertise`.
    advertise: bool,
    drain_timeout: Duration,
    /// What each connection is held to.
    per_connection: PerConnection,
}

impl Serving {
    /// The settings `config` gives connections.
    pub fn from_config(config: &Config) -> Serving {
        let timeouts = &config.timeouts;
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            // Head deadlines kept per connection (`head.rs`), not a tokio timer per request.
            .timer(head::HeadTimer)
            .header_read_timeout(timeouts.header_read)
            .max_buf_size(64 * 1024);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(256)
            .max_header_list_size(64 * 1024)
            // A peer that stops answering pings is gone: close its connection.
            .keep_alive_interval(Some(timeouts.idle / 3))
            .keep_alive_timeout(timeouts.idle / 3)
            // Resets the server answers for a misbehaving client count towards its limit too.
            .max_local_error_reset_streams(Some(1024))
            .max_pending_accept_reset_streams(Some(64));
        Serving {
            builder: Arc::new(builder),
            tls: config
                .tls
                .as_ref()
                .map(|tls| TlsAcceptor::from(tls.server_config())),
            names: config.tls.clone(),
            quic: match (&config.tls, &config.http3) {
                (Some(tls), Some(http3)) => match http3::quic_config(&tls.server_config(), http3) {
                    Ok(quic) => Some(quic),
                    Err(e) => {
                        tracing::error!(error = %e, "HTTP/3 cannot be served");
                        None
                    }
                },
                _ => None,
            },
            advertise: config.http3.as_ref().is_some_and(|h| h.advertise),
            drain_timeout: timeouts.drain,
            per_connection: PerConnection {
                resets: config.http2_resets,
                streams: config.http2_streams,
                idle: timeouts.idle,
                header_read: timeouts.header_read,
            },
        }
    }
}

/// The limits every client connection is served under.
#[derive(Clone, Copy)]
struct PerConnection {
    /// HTTP/2 streams abandoned before their response.
    resets: Limit,
    /// New HTTP/2 streams, if capped.
    streams: Option<Limit>,
    /// How long an HTTP/2 connection may have no open stream.
    idle: Duration,
    /// How long an HTTP/1.1 request head may take (`head.rs`).
    header_read: Duration,
}

impl Server {
    /// Binds the rate-limit service's listener (`service.listen`), to serve `service` beside the
    /// proxy; it drains and stops with the proxy.
    pub async fn bind_service(
        &mut self,
        config: Arc<ServiceConfig>,
        service: Arc<Service>,
    ) -> std::io::Result<()> {
        let listener = TcpListener::bind(config.listen).await?;
        self.service = Some((listener, ServiceState { service, config }));
        Ok(())
    }

    /// The rate-limit service's address, if there is one.
    pub fn service_addr(&self) -> Option<SocketAddr> {
        self.service.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// Binds the proxy listener and, if configured, the admin and HTTP/3 listeners.
    pub async fn bind(config: &Config, proxy: Arc<Proxy>) -> std::io::Result<Server> {
        let listener = bind(config.listen)?;
        let admin = match config.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let serving = Serving::from_config(config);
        let http3 = match (&config.http3, &serving.quic) {
            (Some(http3), Some(quic)) => {
                let listener = http3::Http3Listener::bind(http3.listen, quic.clone())?;
                let port = listener.local_addr()?.port();
                let alt_svc = HeaderValue::try_from(format!("h3=\":{port}\"; ma=86400"))
                    .map_err(std::io::Error::other)?;
                Some((listener, alt_svc))
            }
            _ => None,
        };
        Ok(Server {
            proxy,
            health: Arc::new(Health::default()),
            listener,
            admin,
            service: None,
            http3,
            max_connections: config.max_connections,
            settings: Arc::new(ArcSwap::from_pointee(serving)),
        })
    }

    /// The HTTP/3 listener's (UDP) address, if there is one.
    pub fn http3_addr(&self) -> Option<SocketAddr> {
        self.http3.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// How new connections are served: store a new [`Serving`] to apply a reload (TLS
    /// certificates, timeouts and HTTP/2 limits; connections already open keep theirs).
    pub fn settings(&self) -> Arc<ArcSwap<Serving>> {
        self.settings.clone()
    }

    /// The proxy listener's address (with the real port when the config said port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The admin listener's address, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then stops accepting, lets in-flight requests finish
    /// (for at most the drain timeout) and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        // Every connection task holds one of these permits until it ends, and watches `drain`:
        // a drain tells each to finish what it has, then waits for all the permits.
        let (drain, draining) = tokio::sync::watch::channel(());

        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = self.settings.load_full();
        let admin_task = self.admin.map(|admin| {
            let state = AdminState {
                proxy: self.proxy.clone(),
                health: self.health.clone(),
            };
            tokio::spawn(admin::serve(
                admin,
                state,
                serving.per_connection.header_read,
                serving.drain_timeout,
                async move {
                    let _ = admin_stopped.await;
                },
            ))
        });

        let (service_stop, service_stopped) = tokio::sync::oneshot::channel::<()>();
        let service_task = self.service.map(|(listener, state)| {
            tokio::spawn(crate::service::server::serve(
                listener,
                state,
                serving.per_connection.header_read,
                serving.drain_timeout,
                async move {
                    let _ = service_stopped.await;
                },
            ))
        });

        let listener = match TcpListener::from_std(self.listener) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(error = %e, "cannot accept on the proxy listener");
                return;
            }
        };
        let connections = Arc::new(tokio::sync::Semaphore::new(self.max_connections));
        // HTTP/3 shares `max_connections` and the drain with the TCP listener.
        let (http3_task, alt_svc) = match self.http3 {
            Some((listener, alt_svc)) => (
                Some(tokio::spawn(listener.run(
                    self.proxy.clone(),
                    self.settings.clone(),
                    connections.clone(),
                    draining.clone(),
                ))),
                Some(alt_svc),
            ),
            None => (None, None),
        };
        let mut last_full_warning: Option<std::time::Instant> = None;
        tokio::pin!(shutdown);
        loop {
            // At `max_connections`, stop accepting until one closes (new ones wait in the
            // kernel's backlog), and say so, at most once a minute.
            let permit = match connections.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    if last_full_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                        last_full_warning = Some(std::time::Instant::now());
                        tracing::warn!(
                            max_connections = self.max_connections,
                            "max_connections reached: not accepting until a connection closes"
                        );
                    }
                    tokio::select! {
                        permit = connections.clone().acquire_owned() => match permit {
                            Ok(permit) => permit,
                            Err(_) => break,
                        },
                        () = &mut shutdown => break,
                    }
                }
            };
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let proxy = self.proxy.clone();
            let serving = self.settings.load_full();
            let builder = serving.builder.clone();
            let draining = draining.clone();
            let tls = serving.tls.clone();
            let alt_svc = alt_svc.clone();
            // Bounds the TLS handshake, and then the connection's opening bytes.
            let header_read = serving.per_connection.header_read;
            let limits = serving.per_connection;
            let open = self.proxy.metrics().open_connections().clone();
            open.inc();
            tokio::spawn(async move {
                let _permit = permit;
                match tls {
                    None => {
                        let stream = FirstByteDeadline::new(stream, header_read);
                        serve_connection(&builder, draining, stream, proxy, peer, limits, None)
                            .await
                    }
                    // The handshake runs here, not in the accept loop, so a slow client cannot
                    // hold up others; the header-read timeout bounds it like a slow request head.
                    Some(acceptor) => {
                        // The address the client dialled: what it names when it sends no SNI.
                        let local = stream.local_addr().ok();
                        match tokio::time::timeout(header_read, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => {
                                let advertise = advertised(&serving, alt_svc, &stream, local);
                                let stream = FirstByteDeadline::new(stream, header_read);
                                serve_connection(
                                    &builder, draining, stream, proxy, peer, limits, advertise,
                                )
                                .await
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, %peer, "TLS handshake failed")
                            }
                            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                        }
                    }
                }
                open.dec();
            });
        }

        self.health.start_draining();
        drop(listener);
        let drain_timeout = self.settings.load().drain_timeout;
        tracing::info!(timeout = ?drain_timeout, "draining in-flight requests");
        let _ = drain.send(());
        let endpoint = match http3_task {
            Some(task) => task.await.ok(),
            None => None,
        };
        let all = u32::try_from(self.max_connections).unwrap_or(u32::MAX);
        if tokio::time::timeout(drain_timeout, connections.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!("drain timeout reached; closing remaining connections");
        }
        if let Some(endpoint) = endpoint {
            http3::close(endpoint, Duration::from_secs(1)).await;
        }
        // The service drains with the proxy.
        let _ = service_stop.send(());
        if let Some(task) = service_task {
            let _ = task.await;
        }
        // The admin listener answered `/readyz` 503 through the drain; now it stops too.
        let _ = admin_stop.send(());
        if let Some(task) = admin_task {
            let _ = task.await;
        }
    }
}

/// The listen backlog asked for (the kernel caps it at `net.core.somaxconn`): room for a burst
/// of connections (a flood that reconnects as fast as it is cut off) while the accept loop
/// catches up, so that legitimate clients' SYNs are not dropped (a one-second stall each).
const BACKLOG: u32 = 4096;

/// Binds `addr` with a backlog of [`BACKLOG`] (tokio's own `bind` asks for 1,024).
fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)?.into_std()
}

/// Serves HTTP/1.1 or HTTP/2 (whichever the client speaks) on one accepted connection, plain or
/// TLS, until it closes, a drain ends it, or its [`ConnWatch`] says to close it. Each HTTP/1.1
/// request head is bounded by `limits.header_read` (`head.rs`: the connection's timer below
/// wakes it at a pending head's deadline).
async fn serve_connection<S>(
    builder: &auto::Builder<TokioExecutor>,
    mut draining: tokio::sync::watch::Receiver<()>,
    stream: S,
    proxy: Arc<Proxy>,
    peer: SocketAddr,
    limits: PerConnection,
    alt_svc: Option<Advertised>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let metrics = proxy.metrics().clone();
    let watch = ConnWatch::new(limits.resets, limits.streams, metrics.clone());
    let streams = watch.clone();
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let proxy = proxy.clone();
        let stream = if req.version() == http::Version::HTTP_2 {
            Some(StreamGuard::open(&streams))
        } else {
            streams.saw_http1();
            None
        };
        let admitted = stream.is_none() || streams.admit_stream();
        let alt_svc = alt_svc.as_ref().and_then(|a| a.for_request(&req));
        async move {
            let mut response = if admitted {
                proxy.handle(req.map(Incoming::Hyper), peer).await
            } else {
                proxy.refuse_stream(&req)
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
    // One timer looks after both deadlines a connection waits on without a request in service:
    // an HTTP/2 connection idle for `limits.idle`, an HTTP/1.1 head awaited for `header_read`
    // (`head.rs`: the timer wakes the task at the head's deadline).
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

/// `Alt-Svc` for one TLS connection: the value, and the name the client asked for (its SNI),
/// which the certificate serves.
struct Advertised {
    value: HeaderValue,
    name: String,
}

impl Advertised {
    /// The value for `req`, when it names the host the connection was opened for (a request for
    /// another host, which the certificate may not serve, is told nothing).
    fn for_request<B>(&self, req: &http::Request<B>) -> Option<HeaderValue> {
        let host = crate::config::request_host(req.uri(), req.headers())?;
        host.eq_ignore_ascii_case(&self.name)
            .then(|| self.value.clone())
    }
}

/// What a new TLS connection is told of HTTP/3: `alt_svc` when `http3.advertise` is on and the
/// client named a host the certificate serves: the name it sent (SNI), or, when it sent none
/// (a client that dials an address sends no SNI: RFC 6066 §3 allows only names), the address
/// it dialled, `local`, when the certificate has it among its IP addresses.
fn advertised<S>(
    serving: &Serving,
    alt_svc: Option<HeaderValue>,
    stream: &tokio_rustls::server::TlsStream<S>,
    local: Option<std::net::SocketAddr>,
) -> Option<Advertised> {
    let value = alt_svc.filter(|_| serving.advertise)?;
    let name = match stream.get_ref().1.server_name() {
        Some(name) => name.to_ascii_lowercase(),
        None => local?.ip().to_canonical().to_string(),
    };
    serving
        .names
        .as_ref()
        .is_some_and(|tls| tls.serves(&name))
        .then_some(Advertised { value, name })
}
