//! Reloading the config (SIGHUP), as a library call: the file re-read and validated on a
//! blocking thread (a large file must not stall a runtime worker), then applied to every front
//! end at once: the proxy's snapshot and limiter, the admin endpoints (which read the proxy's
//! snapshot), and the server's new connections. What only a restart can change keeps its
//! running value and is named in a warning (`config::reload` has the one list); an invalid file
//! is logged with its field paths, and the running config stays. Both are counted
//! (`floodgate_config_reloads_total`).
//!
//! Routes a provider discovered (`providers.docker`) come through here too
//! ([`crate::provider::Apply`]): they are validated after the file's routes and applied the same
//! way, and a SIGHUP keeps them. A discovered route only the whole config refuses is left out
//! and named; the file's routes never are.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde_json::Value;

use super::Serving;
use crate::config::{Config, ConfigError, Overrides, Source};
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
    /// The file last read valid, and the discovered routes last applied: held while a config
    /// is made from them and applied, so a SIGHUP and a container's event apply one after the
    /// other.
    sources: Mutex<Sources>,
    /// Files read valid since the start ([`crate::provider::Apply::generation`]).
    generation: std::sync::atomic::AtomicU64,
}

struct Sources {
    file: Option<Source>,
    discovered: Vec<(Value, Duration)>,
}

/// `routes[N]…` as N and what follows (`limits[0].capacity`).
fn route_problem(path: &str) -> Option<(usize, &str)> {
    let rest = path.strip_prefix("routes[")?;
    let (index, rest) = rest.split_once(']')?;
    Some((index.parse().ok()?, rest.strip_prefix('.').unwrap_or(rest)))
}

/// The config `file` and `discovered` make: all of them, else (when some discovered routes are
/// what the config refuses) the file's routes with the discovered ones the config takes, and
/// the refused ones by index with their problems. An error only when the file itself is
/// invalid.
fn compose(
    file: &Source,
    discovered: &[(Value, Duration)],
) -> Result<(Config, crate::provider::Refused), ConfigError> {
    let all_problems = match file.config(discovered) {
        Ok(config) => return Ok((config, Vec::new())),
        Err(e) => e.problems,
    };
    let alone = file.config(&[])?;
    let first = file.file_routes();
    let mut refused: crate::provider::Refused = Vec::new();
    for problem in &all_problems {
        if let Some((n, rest)) = route_problem(&problem.path)
            && n >= first
        {
            let index = n - first;
            let entry = match refused.iter_mut().find(|(i, _)| *i == index) {
                Some(entry) => entry,
                None => {
                    refused.push((index, Vec::new()));
                    refused.last_mut().expect("just pushed")
                }
            };
            entry.1.push((rest.to_string(), problem.message.clone()));
        }
    }
    // Without the routes named: usually enough. Else one at a time, each kept if the config
    // still takes it.
    let kept: Vec<usize> = (0..discovered.len())
        .filter(|i| !refused.iter().any(|(r, _)| r == i))
        .collect();
    let pick = |indices: &[usize]| -> Vec<(Value, Duration)> {
        indices.iter().map(|&i| discovered[i].clone()).collect()
    };
    if !refused.is_empty()
        && let Ok(config) = file.config(&pick(&kept))
    {
        return Ok((config, refused));
    }
    let mut taken: Vec<usize> = Vec::new();
    let mut config = alone;
    for i in kept {
        let mut trial = taken.clone();
        trial.push(i);
        match file.config(&pick(&trial)) {
            Ok(c) => {
                config = c;
                taken = trial;
            }
            Err(e) => {
                if !refused.iter().any(|(r, _)| *r == i) {
                    let problems = e
                        .problems
                        .into_iter()
                        .map(|p| match route_problem(&p.path) {
                            Some((_, rest)) => (rest.to_string(), p.message),
                            None => (String::new(), format!("{}: {}", p.path, p.message)),
                        })
                        .collect();
                    refused.push((i, problems));
                }
            }
        }
    }
    Ok((config, refused))
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
        let file = Source::load(&path, &overrides).ok();
        Reloader {
            proxy,
            serving,
            path,
            running,
            overrides,
            service: None,
            sources: Mutex::new(Sources {
                file,
                discovered: Vec::new(),
            }),
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Reloads `service`'s rules too.
    pub fn with_service(mut self, service: Arc<crate::service::Service>) -> Reloader {
        self.service = Some(service);
        self
    }

    /// Re-reads the file and applies it (with the discovered routes), or keeps the running
    /// config if it is invalid.
    pub async fn reload(self: &Arc<Self>) {
        let this = self.clone();
        let loaded = tokio::task::spawn_blocking(move || this.reload_file()).await;
        let metrics = self.proxy.metrics();
        match loaded {
            Ok(Ok(routes)) => {
                if let Some(service) = &self.service {
                    let service = service.clone();
                    let loaded = tokio::task::spawn_blocking(move || service.reload()).await;
                    if let Ok(Err(e)) = loaded {
                        metrics.reload(false);
                        tracing::error!(problems = %e, "service.config reload rejected; keeping the running rules");
                        return;
                    }
                }
                tracing::info!(routes, "config reloaded");
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

    /// The file read again and applied with the discovered routes: how many routes serve.
    fn reload_file(&self) -> Result<usize, ConfigError> {
        let file = Source::load(&self.path, &self.overrides)?;
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        let (config, refused) = compose(&file, &sources.discovered)?;
        for (index, problems) in refused {
            let name = sources
                .discovered
                .get(index)
                .and_then(|(r, _)| r.get("name").cloned());
            tracing::warn!(
                route = %name.unwrap_or_default(),
                problems = ?problems,
                "a discovered route is refused beside the reloaded file; left out"
            );
        }
        self.apply(&config);
        sources.file = Some(file);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(config.routes.len())
    }

    /// Applies a valid `new` config to every front end.
    fn apply(&self, new: &Config) {
        self.proxy.reload(new);
        let (issued, challenges) = self.serving.load().carried();
        self.serving
            .store(Arc::new(Serving::from_config(new, issued, challenges)));
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

impl crate::provider::Apply for Reloader {
    fn check(&self, route: &Value) -> Vec<crate::provider::Problem> {
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        let Some(file) = &sources.file else {
            return vec![(String::new(), "the config file cannot be read".into())];
        };
        let grace = self
            .running
            .docker
            .as_ref()
            .map_or(Duration::ZERO, |d| d.recreate_grace);
        match file.config(&[(route.clone(), grace)]) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .problems
                .into_iter()
                .map(|p| match route_problem(&p.path) {
                    Some((n, rest)) if n == file.file_routes() => (rest.to_string(), p.message),
                    _ => (String::new(), format!("{}: {}", p.path, p.message)),
                })
                .collect(),
        }
    }

    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn apply(&self, routes: &[(Value, Duration)]) -> crate::provider::Refused {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        sources.discovered = routes.to_vec();
        let Some(file) = &sources.file else {
            return Vec::new();
        };
        match compose(file, routes) {
            Ok((config, refused)) => {
                Reloader::apply(self, &config);
                refused
            }
            Err(e) => {
                tracing::error!(problems = %e, "the config file is invalid; discovered routes not applied");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_of_a_route_is_found_by_its_index() {
        assert_eq!(
            route_problem("routes[12].limits[0].capacity"),
            Some((12, "limits[0].capacity"))
        );
        assert_eq!(route_problem("routes[3]"), Some((3, "")));
        assert_eq!(route_problem("storage.url"), None);
    }

    #[test]
    fn a_discovered_route_the_config_refuses_is_left_out_and_the_others_kept() {
        let file = Source::parse(
            "listen: 127.0.0.1:0\nroutes:\n  - {name: api, path_prefix: /api/, upstream: http://127.0.0.1:1}\n",
            &Overrides::default(),
        )
        .unwrap();
        let route = |name: &str, capacity: i64| {
            serde_json::json!({
                "name": name, "path_prefix": format!("/{name}/"),
                "upstreams": ["http://10.0.0.1:9000"],
                "limits": [{"algorithm": "token_bucket", "capacity": capacity, "refill_rate": 1}],
            })
        };
        let grace = Duration::from_secs(10);
        let discovered = [
            (route("rides", 5), grace),
            (route("api", 5), grace), // the file's name
            (route("bad", 0), grace),
        ];
        let (config, refused) = compose(&file, &discovered).unwrap();
        let names: Vec<&str> = config.routes.iter().map(|r| &*r.name).collect();
        assert_eq!(names, ["api", "rides"]);
        assert_eq!(config.routes[1].recreate_grace, Some(grace));
        assert_eq!(config.routes[0].recreate_grace, None);
        let indices: Vec<usize> = refused.iter().map(|(i, _)| *i).collect();
        assert_eq!(indices, [1, 2], "{refused:?}");
        assert_eq!(refused[1].1[0].0, "limits[0].capacity");
        // An empty pool is a discovered route's only.
        let mut empty = route("rides", 5);
        empty["upstreams"] = serde_json::json!([]);
        let (config, refused) = compose(&file, &[(empty.clone(), grace)]).unwrap();
        assert!(refused.is_empty(), "{refused:?}");
        assert!(config.routes[1].pool.origins.is_empty());
        let mut yaml = serde_json::to_string(&empty).unwrap();
        yaml = format!("listen: 127.0.0.1:0\nroutes: [{yaml}]\n");
        let e = Config::from_yaml(&yaml).unwrap_err();
        assert!(e.to_string().contains("routes[0].upstreams"), "{e}");
    }
}
