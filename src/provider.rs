//! Routes from the containers: `providers.docker` watches the Engine API of Docker or Podman
//! and makes a route of every compose service labelled `floodgate.*`, its running containers
//! the endpoints of the route's pool.
//!
//! One task ([`run`]): connect, open the event stream (from a second before the listing, so
//! nothing between the two is lost), list and inspect every running container, then follow
//! events, listing everything again every `resync` (a lost event costs at most that long). What
//! the engine says goes into the [`model`] (pure, unit-tested); the routes it makes are applied
//! through the same path as SIGHUP ([`Apply`], the server's reloader), so limiter state,
//! pools' health and connections carry over, and budgets, keyed by the route's name, survive a
//! redeploy. The engine unreachable: the last routes keep serving, and the task reconnects
//! with backoff. Seen at admin `GET /discovered` ([`Status`]), in the `floodgate_discovery_*`
//! metrics, and in one log line per change.

pub mod engine;
pub mod labels;
pub mod model;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt as _;
use serde_json::Value;

use crate::config::DockerProvider;
use crate::metrics::Metrics;
use engine::{Engine, Event};
use labels::Reading;
use model::{Inspected, Listed, Model, Route};

/// A problem with a route as written: the field's path below the route (`limits[0].capacity`),
/// and what is wrong.
pub type Problem = (String, String);

/// Discovered routes the config refused, by index, with their problems.
pub type Refused = Vec<(usize, Vec<Problem>)>;

/// Where discovered routes go: the config they are validated in and applied to.
pub trait Apply: Send + Sync + 'static {
    /// The problems of one route as written, validated beside the file's as a discovered route
    /// is (none: it is valid). Blocking.
    fn check(&self, route: &Value) -> Vec<Problem>;

    /// Serves `routes` (each as written, and its hold) after the file's, in place of those
    /// applied before. A route only the whole config refuses is left out: its index and
    /// problems are returned. Blocking.
    fn apply(&self, routes: &[(Value, Duration)]) -> Refused;

    /// Which reading of the file `check` validates against: it changes when a SIGHUP reads a
    /// new one, so that what was checked before is checked again.
    fn generation(&self) -> u64;
}

/// What `GET /discovered` reads.
#[derive(Debug, Default)]
pub struct Status {
    connected: AtomicBool,
    containers: Mutex<Vec<Listed>>,
}

impl Status {
    /// `{"connected", "containers": [{"id", "name", "service", "route", "endpoint", "state",
    /// "error"}]}`.
    pub fn to_json(&self) -> Value {
        let containers = self.containers.lock().unwrap_or_else(|p| p.into_inner());
        let containers: Vec<Value> = containers
            .iter()
            .map(|c| {
                serde_json::json!({
                    "id": c.id,
                    "name": c.name,
                    "service": c.service,
                    "route": c.route,
                    "endpoint": c.endpoint.map(|e| e.to_string()),
                    "state": c.state.as_str(),
                    "error": c.error,
                })
            })
            .collect();
        serde_json::json!({
            "connected": self.connected.load(Ordering::Relaxed),
            "containers": containers,
        })
    }

    fn connected(&self, connected: bool, metrics: &Metrics) {
        self.connected.store(connected, Ordering::Relaxed);
        metrics.discovery_connected(connected);
    }
}

/// The provider's state between events.
struct Watcher {
    spec: DockerProvider,
    apply: Arc<dyn Apply>,
    status: Arc<Status>,
    metrics: Arc<Metrics>,
    model: Model,
    /// Each route as written, checked by the config once: its problems (none: valid).
    checked: HashMap<String, Vec<String>>,
    /// What was applied last, and listed last (for the log lines of a change).
    applied: Vec<Route>,
    listed: Vec<Listed>,
    /// Containers ready by the engine's word whose port does not accept connections yet (a
    /// process still binding it): `starting` until it does, tried every `PROBE_EVERY`.
    unopened: std::collections::BTreeMap<String, Inspected>,
    /// The file's reading `checked` and the model's refusals were made against.
    generation: u64,
}

/// How often a container's port is tried again until it accepts a connection.
const PROBE_EVERY: Duration = Duration::from_millis(25);

/// How long one try of a container's port may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// True when `addr` accepts a TCP connection now.
async fn open(addr: std::net::SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// Follows the engine forever (see the module's docs).
pub async fn run(
    spec: DockerProvider,
    apply: Arc<dyn Apply>,
    status: Arc<Status>,
    metrics: Arc<Metrics>,
) {
    let mut watcher = Watcher {
        spec,
        apply,
        status,
        metrics,
        model: Model::default(),
        checked: HashMap::new(),
        applied: Vec::new(),
        listed: Vec::new(),
        unopened: Default::default(),
        generation: 0,
    };
    let mut failures = 0u32;
    loop {
        match watcher.follow(&mut failures).await {
            Ok(()) => {}
            Err(e) => {
                watcher.metrics.discovery_error();
                if failures == 0 {
                    tracing::warn!(
                        endpoint = %watcher.spec.endpoint,
                        error = %e,
                        "container engine unreachable; the routes last discovered keep serving, reconnecting"
                    );
                }
            }
        }
        watcher.status.connected(false, &watcher.metrics);
        tokio::time::sleep(engine::backoff(failures)).await;
        failures = failures.saturating_add(1);
    }
}

impl Watcher {
    /// One connection: listed, then followed until the stream ends or a call fails.
    async fn follow(&mut self, failures: &mut u32) -> Result<(), String> {
        let engine = Engine::connect(&self.spec.endpoint).await?;
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs().saturating_sub(1));
        let mut events = Box::pin(engine.events(since));
        self.resync(&engine).await?;
        self.status.connected(true, &self.metrics);
        if *failures > 0 {
            tracing::info!(endpoint = %self.spec.endpoint, "container engine reachable again");
        }
        *failures = 0;
        let mut resync_at = tokio::time::Instant::now() + self.spec.resync;
        loop {
            let expiry = (self.model.next_expiry(self.spec.recreate_grace))
                .map(tokio::time::Instant::from_std);
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok((action, meaning))) => {
                        self.metrics.discovery_event(&action);
                        if let Some(meaning) = meaning {
                            self.event(&engine, meaning).await?;
                        }
                    }
                    Some(Err(e)) => return Err(format!("the event stream failed: {e}")),
                    None => return Err("the engine closed the event stream".into()),
                },
                () = tokio::time::sleep_until(resync_at) => {
                    self.resync(&engine).await?;
                    resync_at = tokio::time::Instant::now() + self.spec.resync;
                }
                () = sleep_until_some(expiry) => self.remake().await,
                () = tokio::time::sleep(PROBE_EVERY), if !self.unopened.is_empty() => {
                    self.probe().await;
                }
            }
        }
    }

    /// Every running container listed and inspected again; any other forgotten. After a SIGHUP
    /// read a new file, every route as written is checked again (a label the old file refused
    /// may be valid now, or the reverse).
    async fn resync(&mut self, engine: &Engine) -> Result<(), String> {
        let generation = self.apply.generation();
        if generation != self.generation {
            self.generation = generation;
            self.checked.clear();
            self.model.forget_refusals();
        }
        let running = engine.running().await?;
        self.model.listed(&running);
        self.unopened.retain(|id, _| running.contains(id));
        for id in &running {
            match engine.inspect(id, &self.spec).await? {
                Some(seen) => {
                    let seen = self.checked_reading(seen).await;
                    self.join(seen).await;
                }
                None => {
                    self.gone(id);
                }
            }
        }
        self.remake().await;
        Ok(())
    }

    /// One event's meaning, applied.
    async fn event(&mut self, engine: &Engine, event: Event) -> Result<(), String> {
        let changed = match event {
            Event::Look(id) => match engine.inspect(&id, &self.spec).await? {
                Some(seen) => {
                    let seen = self.checked_reading(seen).await;
                    self.join(seen).await
                }
                None => self.gone(&id),
            },
            Event::Drain(id) => {
                self.unopened.remove(&id);
                self.model.killed(&id)
            }
            Event::Gone(id) => self.gone(&id),
        };
        if changed {
            self.remake().await;
        }
        Ok(())
    }

    /// A container the engine says is running (and healthy): into the model, once its port
    /// accepts connections (a container joined at its `start` event, before its process has
    /// bound the port, would have its first requests refused). Until then it is `starting`.
    async fn join(&mut self, seen: Inspected) -> bool {
        let id = seen.facts.id.clone();
        let ready = seen.running && seen.health.as_deref().is_none_or(|h| h == "healthy");
        let endpoint = match &seen.reading {
            Reading::Claim(claim) if ready && !self.model.joined(&id) => Some(claim.endpoint),
            _ => None,
        };
        if let Some(endpoint) = endpoint
            && !open(endpoint).await
        {
            let mut starting = seen.clone();
            starting.health = Some("starting".into());
            self.unopened.insert(id, seen);
            return self.model.inspected(starting);
        }
        self.unopened.remove(&id);
        self.model.inspected(seen)
    }

    fn gone(&mut self, id: &str) -> bool {
        self.unopened.remove(id);
        self.model.gone(id)
    }

    /// The containers whose port was closed, tried again; those that accept join.
    async fn probe(&mut self) {
        let mut changed = false;
        let waiting: Vec<(String, Inspected)> = (self.unopened.iter())
            .map(|(id, seen)| (id.clone(), seen.clone()))
            .collect();
        for (id, seen) in waiting {
            let Reading::Claim(claim) = &seen.reading else {
                continue;
            };
            if open(claim.endpoint).await {
                self.unopened.remove(&id);
                changed |= self.model.inspected(seen);
            }
        }
        if changed {
            self.remake().await;
        }
    }

    /// `seen` with its claim checked by the config (once per route as written): a route the
    /// config refuses makes the container invalid, each problem named by its label.
    async fn checked_reading(&mut self, mut seen: Inspected) -> Inspected {
        let Reading::Claim(claim) = &seen.reading else {
            return seen;
        };
        let key = claim.written.to_string();
        let problems = match self.checked.get(&key) {
            Some(problems) => problems.clone(),
            None => {
                // Checked with this container as its pool, so the route is whole.
                let mut route = claim.written.clone();
                if let Value::Object(map) = &mut route {
                    let upstream = Value::String(format!("http://{}", claim.endpoint));
                    map.insert("upstreams".into(), Value::Array(vec![upstream]));
                }
                let apply = self.apply.clone();
                let problems = tokio::task::spawn_blocking(move || apply.check(&route))
                    .await
                    .unwrap_or_else(|e| vec![(String::new(), e.to_string())]);
                let problems: Vec<String> = problems
                    .into_iter()
                    .map(|(path, message)| format!("{}: {message}", labels::label_path(&path)))
                    .collect();
                if self.checked.len() > 4096 {
                    self.checked.clear();
                }
                self.checked.insert(key, problems.clone());
                problems
            }
        };
        if !problems.is_empty() {
            seen.reading = Reading::Invalid(problems);
        }
        seen
    }

    /// The routes made again from the model, applied if they changed, and logged.
    async fn remake(&mut self) {
        let now = std::time::Instant::now();
        let grace = self.spec.recreate_grace;
        let (mut routes, mut listed) = self.model.routes(now, grace);
        if routes != self.applied {
            let apply = self.apply.clone();
            let written: Vec<(Value, Duration)> =
                routes.iter().map(|r| (r.written.clone(), grace)).collect();
            let refused = tokio::task::spawn_blocking(move || apply.apply(&written))
                .await
                .unwrap_or_default();
            if !refused.is_empty() {
                for (index, problems) in refused {
                    let Some(route) = routes.get(index) else {
                        continue;
                    };
                    let mut as_written = route.written.clone();
                    if let Value::Object(map) = &mut as_written {
                        map.remove("upstreams");
                    }
                    let problems = problems
                        .into_iter()
                        .map(|(path, message)| format!("{}: {message}", labels::label_path(&path)))
                        .collect();
                    self.model.refuse(&as_written, problems);
                }
                (routes, listed) = self.model.routes(now, grace);
                let apply = self.apply.clone();
                let written: Vec<(Value, Duration)> =
                    routes.iter().map(|r| (r.written.clone(), grace)).collect();
                let _ = tokio::task::spawn_blocking(move || apply.apply(&written)).await;
            }
            self.log_routes(&routes);
            self.applied = routes;
        }
        self.log_containers(&listed);
        *self
            .status
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = listed.clone();
        self.listed = listed;
    }

    /// One line per route that came, changed its endpoints or went.
    fn log_routes(&self, routes: &[Route]) {
        let endpoints = |r: &Route| {
            let list: Vec<String> = r.endpoints.iter().map(|e| e.to_string()).collect();
            list.join(",")
        };
        for route in routes {
            match self.applied.iter().find(|r| r.name == route.name) {
                None => tracing::info!(
                    route = route.name,
                    endpoints = endpoints(route),
                    "discovered route added"
                ),
                Some(old) if old.endpoints != route.endpoints => tracing::info!(
                    route = route.name,
                    endpoints = endpoints(route),
                    "discovered route's endpoints changed"
                ),
                Some(old) if old.written != route.written => {
                    tracing::info!(route = route.name, "discovered route's labels changed")
                }
                Some(_) => {}
            }
        }
        for old in &self.applied {
            if !routes.iter().any(|r| r.name == old.name) {
                tracing::info!(route = old.name, "discovered route removed");
            }
        }
    }

    /// One line per container whose part changed; an invalid one at warn, counted.
    fn log_containers(&self, listed: &[Listed]) {
        for c in listed {
            let before = self.listed.iter().find(|l| l.id == c.id);
            if before.is_some_and(|b| b.state == c.state && b.error == c.error) {
                continue;
            }
            let endpoint = c.endpoint.map(|e| e.to_string()).unwrap_or_default();
            let route = c.route.as_deref().unwrap_or("");
            match &c.error {
                Some(error) => {
                    self.metrics.discovery_error();
                    // In the contract's words: `container rides-2: floodgate.route.limits[0]
                    // .capacity: must be > 0` (the log's formatter escapes the label's text).
                    tracing::warn!(
                        route,
                        state = c.state.as_str(),
                        "container {}: {error}",
                        c.name
                    );
                }
                None => tracing::info!(
                    container = c.name,
                    route,
                    endpoint,
                    state = c.state.as_str(),
                    "discovered container"
                ),
            }
        }
        for old in &self.listed {
            if !listed.iter().any(|c| c.id == old.id) {
                tracing::info!(container = old.name, "discovered container left");
            }
        }
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
