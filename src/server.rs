//! The listeners: accepting connections, serving HTTP/1.1 and HTTP/2 (cleartext h2 by prior
//! knowledge) with upgrades, the slowloris guard, and graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

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
            let service = service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(proxy.handle(req, peer).await) }
            });
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            let conn = graceful.watch(conn.into_owned());
            let open = self.proxy.metrics().open_connections().clone();
            open.inc();
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, %peer, "connection ended with an error");
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
