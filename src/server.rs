//! The listeners: accepting connections, TLS termination (rustls; ALPN picks h2 or HTTP/1.1),
//! serving HTTP/1.1 and HTTP/2 (cleartext h2 by prior knowledge) with upgrades, the slowloris
//! guard, closing abusive and idle HTTP/2 connections (`server/watch.rs`), and graceful shutdown,
//! by one implementation for the proxy's, the admin and the service's ports
//! (`server/listener.rs`); HTTP/3 in `server/http3.rs`. The admin listener is always plain HTTP.

mod head;
mod http3;
mod listener;
mod proxy_protocol;
mod reload;
mod watch;

pub use reload::Reloader;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::acme::Challenges;
use crate::admin::{self, AdminState, Readiness};
use crate::config::{Config, ServiceConfig};
use crate::limiter::Limit;
use crate::proxy::Proxy;
use crate::proxy::body::Incoming;
use crate::service::Service;
use crate::service::server::ServiceState;
use crate::tls::certs::Issued;
use listener::Tls;
use tokio::sync::Semaphore;

/// A proxy with its listeners bound, ready to serve.
pub struct Server {
    proxy: Arc<Proxy>,
    health: Arc<Readiness>,
    /// The proxy listener, bound (registered with the runtime that runs the server).
    listener: std::net::TcpListener,
    admin: Option<TcpListener>,
    /// `http_listen`: ACME's HTTP-01 answers, and a 308 to https for the rest.
    http_listen: Option<TcpListener>,
    /// The rate-limit service's listener and what it serves (`service:`).
    service: Option<(TcpListener, ServiceState)>,
    /// The HTTP/3 listener (`http3:`), and the `Alt-Svc` value that advertises it.
    http3: Option<(http3::Http3Listener, HeaderValue)>,
    max_connections: usize,
    /// How connections are served; a reload swaps it for new connections ([`Server::settings`]).
    settings: Arc<ArcSwap<Serving>>,
    /// What `providers.docker` found, for the admin listener's `GET /discovered`.
    discovery: Arc<crate::provider::Status>,
}

/// How new connections are served, as the config says: what a reload changes in the server
/// (the listening sockets and `max_connections` stay until a restart).
pub struct Serving {
    builder: Arc<auto::Builder<TokioExecutor>>,
    /// Set when the proxy listener terminates TLS (certificates read when the config was).
    tls: Option<TlsAcceptor>,
    /// The certificates' names: `Alt-Svc` is said only to a client that asked for one.
    names: Option<crate::config::TlsConfig>,
    /// The certificates ACME issued, shared by every config loaded after (`src/acme.rs`).
    issued: Issued,
    /// ACME's challenges under way, carried to every config loaded after.
    challenges: Option<Arc<Challenges>>,
    /// `tls.acme.challenge: tls-alpn-01`: each handshake's hello is read first, and one that
    /// offers only `acme-tls/1` is answered from `challenges`.
    alpn_challenges: bool,
    /// The listener's rustls config (what `tls` accepts with), for the hello read first.
    server_config: Option<Arc<rustls::ServerConfig>>,
    /// New HTTP/3 connections' QUIC config (`http3:`), with the same certificate.
    quic: Option<Arc<quinn::ServerConfig>>,
    /// `http3.advertise`.
    advertise: bool,
    drain_timeout: Duration,
    /// What each connection is held to.
    per_connection: PerConnection,
    /// `proxy_protocol.from`, on the proxy's port.
    proxy_protocol: Option<Arc<[ipnet::IpNet]>>,
}

impl Serving {
    /// What a reload carries over from this to the next: ACME's issued certificates and
    /// challenges.
    pub(super) fn carried(&self) -> (Issued, Option<Arc<Challenges>>) {
        (self.issued.clone(), self.challenges.clone())
    }

    /// Every name served with a certificate now and when that certificate expires (seconds
    /// since the epoch), files first: what the expiry gauge shows.
    pub fn certificates(&self) -> Vec<(String, i64)> {
        let Some(tls) = &self.names else {
            return Vec::new();
        };
        let issued = self.issued.load();
        (tls.file_certificates().iter())
            .chain(issued.certificates())
            .flat_map(|c| {
                let names: Vec<String> = match c.names().is_empty() {
                    true => vec![c.label().to_owned()],
                    false => c.names().to_vec(),
                };
                names.into_iter().map(|n| (n, c.not_after()))
            })
            .collect()
    }

    /// The settings `config` gives connections, with the certificates in `issued` beside the
    /// config's own.
    pub fn from_config(
        config: &Config,
        issued: Issued,
        challenges: Option<Arc<Challenges>>,
    ) -> Serving {
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
        let server_config = config.tls.as_ref().map(|tls| tls.server_config(&issued));
        let alpn_challenges = (config.tls.as_ref())
            .and_then(|t| t.acme.as_ref())
            .is_some_and(|a| a.challenge == crate::config::AcmeChallenge::TlsAlpn01);
        Serving {
            builder: Arc::new(builder),
            tls: server_config.clone().map(TlsAcceptor::from),
            server_config,
            alpn_challenges,
            challenges,
            names: config.tls.clone(),
            quic: match (&config.tls, &config.http3) {
                (Some(tls), Some(http3)) => {
                    match http3::quic_config(&tls.server_config(&issued), http3) {
                        Ok(quic) => Some(quic),
                        Err(e) => {
                            tracing::error!(error = %e, "HTTP/3 cannot be served");
                            None
                        }
                    }
                }
                _ => None,
            },
            issued,
            advertise: config.http3.as_ref().is_some_and(|h| h.advertise),
            drain_timeout: timeouts.drain,
            proxy_protocol: config.proxy_protocol.clone(),
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

    /// Binds the proxy listener and, if configured, the admin, HTTP/3 and plain HTTP
    /// (`http_listen`, answering ACME's `challenges`) listeners.
    pub async fn bind(
        config: &Config,
        proxy: Arc<Proxy>,
        challenges: Option<Arc<Challenges>>,
    ) -> std::io::Result<Server> {
        let listener = bind(config.listen)?;
        let http_listen = match config.http_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let admin = match config.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let serving = Serving::from_config(config, Issued::default(), challenges);
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
            health: Arc::new(Readiness::default()),
            listener,
            http_listen,
            admin,
            service: None,
            http3,
            max_connections: config.max_connections,
            settings: Arc::new(ArcSwap::from_pointee(serving)),
            discovery: Arc::default(),
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

    /// The certificates ACME issues into, served beside the config's.
    pub fn issued(&self) -> Issued {
        self.settings.load().issued.clone()
    }

    /// The plain HTTP listener's address (`http_listen`), if there is one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_listen.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// What the container provider writes and `GET /discovered` reads.
    pub fn discovery(&self) -> Arc<crate::provider::Status> {
        self.discovery.clone()
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
    /// (for at most the drain timeout) and returns. Every port is served by one listener
    /// implementation (`listener.rs`), under the same limits.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (metrics, max) = (self.proxy.metrics().clone(), self.max_connections);
        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin_task = self.admin.map(|listener| {
            let settings = self.settings.clone();
            let admin = AdminState {
                certificates: Arc::new(move || settings.load().certificates()),
                proxy: self.proxy.clone(),
                health: self.health.clone(),
                discovery: self.discovery.clone(),
            };
            let port = side_port(listener, "admin", admin, Tls::Plain, max, &metrics);
            tokio::spawn(port.run(self.settings.clone(), async move {
                let _ = admin_stopped.await;
            }))
        });
        let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
        let http_task = self.http_listen.map(|listener| {
            let plain = PlainHttp {
                challenges: self.settings.load().challenges.clone(),
                https_port: self.listener.local_addr().map_or(443, |a| a.port()),
            };
            let port = side_port(listener, "http", plain, Tls::Plain, max, &metrics);
            tokio::spawn(port.run(self.settings.clone(), async move {
                let _ = http_stopped.await;
            }))
        });
        let (service_stop, service_stopped) = tokio::sync::oneshot::channel::<()>();
        let service_task = self.service.map(|(listener, state)| {
            let tls = match state.config.tls.as_ref() {
                Some(tls) => Tls::Fixed(tls.acceptor()),
                None => Tls::Plain,
            };
            let port = side_port(listener, "service", state, tls, max, &metrics);
            tokio::spawn(port.run(self.settings.clone(), async move {
                let _ = service_stopped.await;
            }))
        });

        let listener = match TcpListener::from_std(self.listener) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(error = %e, "cannot accept on the proxy listener");
                return;
            }
        };
        // Every connection task holds one of these permits until it ends, and watches `drain`:
        // a drain tells each to finish what it has, then waits for all the permits. HTTP/3
        // shares `max_connections` and the drain with the TCP listener.
        let (drain, draining) = tokio::sync::watch::channel(());
        let connections = Arc::new(Semaphore::new(self.max_connections));
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
        let proxy = listener::Port {
            listener,
            handler: ProxyPort(self.proxy.clone()),
            tls: Tls::Serving,
            alt_svc,
            connections: connections.clone(),
            max_connections: self.max_connections,
            open: Some(metrics.open_connections().clone()),
            metrics,
            name: "proxy",
            proxy_protocol: true,
        };
        proxy
            .accept(self.settings.clone(), draining, shutdown)
            .await;

        self.health.start_draining();
        let drain_timeout = self.settings.load().drain_timeout;
        tracing::info!(timeout = ?drain_timeout, "draining in-flight requests");
        let _ = drain.send(());
        let endpoint = match http3_task {
            Some(task) => task.await.ok(),
            None => None,
        };
        if !listener::drained(&connections, self.max_connections, drain_timeout).await {
            tracing::warn!("drain timeout reached; closing remaining connections");
        }
        if let Some(endpoint) = endpoint {
            http3::close(endpoint, Duration::from_secs(1)).await;
        }
        // The service and the plain HTTP port drain with the proxy.
        let _ = http_stop.send(());
        if let Some(task) = http_task {
            let _ = task.await;
        }
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

/// A port beside the proxy's (admin, service), with `max` connections of its own.
fn side_port<H: listener::Handler>(
    listener: TcpListener,
    name: &'static str,
    handler: H,
    tls: Tls,
    max: usize,
    metrics: &Arc<crate::metrics::Metrics>,
) -> listener::Port<H> {
    listener::Port {
        listener,
        handler,
        tls,
        alt_svc: None,
        connections: Arc::new(Semaphore::new(max)),
        max_connections: max,
        metrics: metrics.clone(),
        open: None,
        name,
        proxy_protocol: false,
    }
}

/// The proxy's port: requests go through the pipeline.
#[derive(Clone)]
struct ProxyPort(Arc<Proxy>);

impl listener::Handler for ProxyPort {
    /// A request floodgate answers without waiting (`Proxy::begin`: a refusal, a cache hit)
    /// is answered here; the rest go on in a box of their own, so that the future hyper holds
    /// and moves is small whatever the request waits on.
    fn handle(
        &self,
        req: http::Request<hyper::body::Incoming>,
        peer: SocketAddr,
    ) -> impl Future<Output = http::Response<crate::answer::Body>> + Send {
        let proxy = &*self.0;
        async move {
            match proxy.begin(req.map(Incoming::Hyper), peer) {
                crate::proxy::Step::Answered(response) => response,
                // Written into its box (not made here and copied in: the future is as
                // large as a forward's state).
                crate::proxy::Step::Going(going) => {
                    Box::into_pin(Box::write(Box::new_uninit(), proxy.go_on(going))).await
                }
            }
        }
    }

    fn refuse_stream(
        &self,
        req: &http::Request<hyper::body::Incoming>,
    ) -> http::Response<crate::answer::Body> {
        self.0.refuse_stream(req)
    }
}

impl listener::Handler for AdminState {
    async fn handle(
        &self,
        req: http::Request<hyper::body::Incoming>,
        _peer: SocketAddr,
    ) -> http::Response<crate::answer::Body> {
        admin::handle(req, self).await
    }

    fn refuse_stream(
        &self,
        req: &http::Request<hyper::body::Incoming>,
    ) -> http::Response<crate::answer::Body> {
        self.proxy.refuse_stream(req)
    }
}

/// `http_listen`: ACME's HTTP-01 answers; a 308 to https for everything else.
#[derive(Clone)]
struct PlainHttp {
    challenges: Option<Arc<Challenges>>,
    https_port: u16,
}

impl listener::Handler for PlainHttp {
    async fn handle(
        &self,
        req: http::Request<hyper::body::Incoming>,
        _peer: SocketAddr,
    ) -> http::Response<crate::answer::Body> {
        let host = (req.headers().get(http::header::HOST))
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().host());
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        match &self.challenges {
            Some(challenges) => {
                challenges
                    .http_listen_answer(host, path, self.https_port)
                    .await
            }
            None => {
                Challenges::new(None, String::new())
                    .http_listen_answer(host, path, self.https_port)
                    .await
            }
        }
    }

    fn refuse_stream(
        &self,
        _req: &http::Request<hyper::body::Incoming>,
    ) -> http::Response<crate::answer::Body> {
        let mut response = http::Response::new(crate::answer::full(bytes::Bytes::new()));
        *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
        response
    }
}

impl listener::Handler for ServiceState {
    async fn handle(
        &self,
        req: http::Request<hyper::body::Incoming>,
        peer: SocketAddr,
    ) -> http::Response<crate::answer::Body> {
        crate::service::server::handle(req, peer, self).await
    }

    fn refuse_stream(
        &self,
        req: &http::Request<hyper::body::Incoming>,
    ) -> http::Response<crate::answer::Body> {
        self.service.proxy().refuse_stream(req)
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
        .is_some_and(|tls| tls.serves(&name, &serving.issued))
        .then_some(Advertised { value, name })
}
