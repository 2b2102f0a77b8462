//! Reloading the config (SIGHUP), as a library call: the file re-read and validated on a
//! blocking thread (a large file must not stall a runtime worker), then applied to every front
//! end at once: the proxy's snapshot and limiter, the admin endpoints (which read the proxy's
//! snapshot), and the server's new connections. What only a restart can change keeps its
//! running value and is named in a warning (`config::reload` has the one list); an invalid file
//! is logged with its field paths, and the running config stays. Both are counted
//! (`floodgate_config_reloads_total`).

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Serving;
use crate::config::{Config, Overrides};
use crate::proxy::Proxy;

/// What a reload applies a new config to, and what it reads it from.
pub struct Reloader {
    proxy: Arc<Proxy>,
    serving: Arc<ArcSwap<Serving>>,
    path: PathBuf,
    /// The config the process started with: the restart-only values still in force.
    running: Config,
    overrides: Overrides,
    /// The rate-limit service, whose rules (`service.config`) a reload reads again.
    service: Option<Arc<crate::service::Service>>,
}

impl Reloader {
    /// A reloader of `path` (read with `overrides`, as at start) for `proxy` and the server
    /// whose `serving` settings these are; `running` is the config the process started with.
    pub fn new(
        proxy: Arc<Proxy>,
        serving: Arc<ArcSwap<Serving>>,
        path: PathBuf,
        running: Config,
        overrides: Overrides,
    ) -> Reloader {
        Reloader {
            proxy,
            serving,
            path,
            running,
            overrides,
            service: None,
        }
    }

    /// Reloads `service`'s rules too.
    pub fn with_service(mut self, service: Arc<crate::service::Service>) -> Reloader {
        self.service = Some(service);
        self
    }

    /// Re-reads the file and applies it, or keeps the running config if it is invalid.
    pub async fn reload(&self) {
        let (file, overrides) = (self.path.clone(), self.overrides.clone());
        let loaded = tokio::task::spawn_blocking(move || Config::load(&file, &overrides)).await;
        let metrics = self.proxy.metrics();
        match loaded {
            Ok(Ok(new)) => {
                self.apply(&new);
                if let Some(service) = &self.service {
                    let service = service.clone();
                    let loaded = tokio::task::spawn_blocking(move || service.reload()).await;
                    if let Ok(Err(e)) = loaded {
                        metrics.reload(false);
                        tracing::error!(problems = %e, "service.config reload rejected; keeping the running rules");
                        return;
                    }
                }
                tracing::info!(routes = new.routes.len(), "config reloaded");
                // Counted last: whoever waits for the count finds the warnings written.
                metrics.reload(true);
            }
            Ok(Err(e)) => {
                metrics.reload(false);
                tracing::error!(problems = %e, "config reload rejected; keeping the running config");
            }
            Err(e) => {
                metrics.reload(false);
                tracing::error!(error = %e, "config reload failed; keeping the running config");
            }
        }
    }

    /// Applies a valid `new` config to every front end.
    fn apply(&self, new: &Config) {
        self.proxy.reload(new);
        self.serving.store(Arc::new(Serving::from_config(new)));
        if let Some(ceiling) = crate::config::reload::storage_timeout_ceiling(&self.running)
            && new.storage.timeout > ceiling
        {
            tracing::warn!(
                timeout = ?new.storage.timeout,
                ?ceiling,
                "storage.timeout: decisions wait at most the store connections' reply timeout, set at start, until a restart"
            );
        }
        let restart_only = crate::config::reload::restart_only_changes(&self.running, new);
        if !restart_only.is_empty() {
            tracing::warn!(
                fields = restart_only.join(", "),
                "these settings changed in the file but take effect on restart only; their running values stay"
            );
        }
    }
}
