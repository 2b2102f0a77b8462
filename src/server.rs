//! The listeners: accepting connections, TLS termination (rustls; ALPN picks h2 or HTTP/1.1),
//! serving HTTP/1.1 and HTTP/2 (cleartext h2 by prior knowledge) with upgrades, the slowloris
//! guard, and graceful shutdown. The admin listener is always plain HTTP.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admin;
use crate::config::Config;
use crate::proxy::Proxy;

/// Process-wide health: whether the proxy is draining (then `/readyz` answers 503).
#[derive(Debug, Default)]
pub struct Health {
    draining: AtomicBool,
}

impl Health {
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// A proxy with its listeners bound, ready to serve.
pub struct Server {
    proxy: Arc<Proxy>,
    health: Arc<Health>,
    listener: TcpListener,
    admin: Option<TcpListener>,
    /// Set when the proxy listener terminates TLS.
    tls: Option<TlsAcceptor>,
    header_read_timeout: Duration,
    drain_timeout: Duration,
}

impl Server {
    /// Binds the proxy listener and, if configured, the admin listener.
    pub async fn bind(config: &Config, proxy: Arc<Proxy>) -> std::io::Result<Server> {
        let listener = TcpListener::bind(config.listen).await?;
        let admin = match config.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        Ok(Server {
            proxy,
            health: Arc::new(Health::default()),
            listener,
            admin,
            tls: config
                .tls
                .as_ref()
                .map(|tls| TlsAcceptor::from(tls.server_config.clone())),
            header_read_timeout: config.timeouts.header_read,
            drain_timeout: config.timeouts.drain,
        })
    }

    /// The proxy listener's address (with the real port when the config said port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The admin listener's address, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The health flags `/readyz` reads.
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// Serves until `shutdown` completes, then stops accepting, lets in-flight requests finish
    /// (for at most the drain timeout) and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .max_buf_size(64 * 1024);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(256)
            .max_header_list_size(64 * 1024);
        let builder = Arc::new(builder);
        let graceful = GracefulShutdown::new();

        if let Some(admin) = self.admin {
            tokio::spawn(admin::serve(admin, self.proxy.clone(), self.health.clone()));
        }
        if let Some(store) = self.proxy.limiter().memory().cloned() {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                loop {
                    tick.tick().await;
                    let store = store.clone();
                    let _ = tokio::task::spawn_blocking(move || store.sweep()).await;
                }
            });
        }

        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
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
            let builder = builder.clone();
            // Taken now, so that a drain also waits for connections still in their handshake.
            let watcher = graceful.watcher();
            let tls = self.tls.clone();
            let handshake_timeout = self.header_read_timeout;
            let open = self.proxy.metrics().open_connections().clone();
            open.inc();
            tokio::spawn(async move {
                match tls {
                    None => serve_connection(&builder, watcher, stream, proxy, peer).await,
                    // The handshake runs here, not in the accept loop, so a slow client cannot
                    // hold up others; the header-read timeout bounds it like a slow request head.
                    Some(acceptor) => {
                        match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await
                        {
                            Ok(Ok(stream)) => {
                                serve_connection(&builder, watcher, stream, proxy, peer).await
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
        drop(self.listener);
        tracing::info!(timeout = ?self.drain_timeout, "draining in-flight requests");
        if tokio::time::timeout(self.drain_timeout, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("drain timeout reached; closing remaining connections");
        }
    }
}

/// Serves HTTP/1.1 or HTTP/2 (whichever the client speaks) on one accepted connection, plain or
/// TLS, until it closes or a drain ends it.
async fn serve_connection<S>(
    builder: &auto::Builder<TokioExecutor>,
    watcher: Watcher,
    stream: S,
    proxy: Arc<Proxy>,
    peer: SocketAddr,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let proxy = proxy.clone();
        async move { Ok::<_, Infallible>(proxy.handle(req, peer).await) }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    if let Err(e) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(error = %e, %peer, "connection ended with an error");
    }
}
