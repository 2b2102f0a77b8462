//! A fake container engine: the part of the Docker Engine API floodgate's provider reads
//! (`/_ping`, `/version`, `/containers/json`, `/containers/{id}/json`, a chunked `/events`
//! stream), on a Unix socket, in Docker's dialect or Podman's. The test changes its containers
//! and says which events it sends (or loses); every request it got is recorded.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::broadcast;

/// Whose words the events are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `die`; `health_status: healthy`.
    Docker,
    /// `died`; `health_status` with the status as an attribute.
    Podman,
}

/// One container.
#[derive(Debug, Clone)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ip: String,
    pub ports: Vec<u16>,
    pub running: bool,
    /// `Some` when it has a health check: `starting`, `healthy`, `unhealthy`.
    pub health: Option<String>,
}

impl Container {
    /// A running compose container of `project`/`service`, at `ip` exposing `port`, with
    /// `labels`.
    pub fn new(id: &str, service: &str, ip: &str, port: u16, labels: &[(&str, &str)]) -> Container {
        let mut all: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        all.insert("com.docker.compose.project".into(), "shop".into());
        all.insert("com.docker.compose.service".into(), service.into());
        Container {
            id: id.into(),
            name: format!("shop-{service}-{id}"),
            labels: all,
            ip: ip.into(),
            ports: vec![port],
            running: true,
            health: None,
        }
    }

    fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "Id": self.id,
            "Names": [format!("/{}", self.name)],
            "State": "running",
            "Labels": self.labels,
        })
    }

    fn inspect(&self) -> serde_json::Value {
        let ports: serde_json::Map<String, serde_json::Value> = (self.ports.iter())
            .map(|p| (format!("{p}/tcp"), serde_json::json!({})))
            .collect();
        let mut state = serde_json::json!({
            "Status": if self.running { "running" } else { "exited" },
            "Running": self.running,
        });
        if let Some(health) = &self.health {
            state["Health"] = serde_json::json!({"Status": health, "FailingStreak": 0});
        }
        serde_json::json!({
            "Id": self.id,
            "Name": format!("/{}", self.name),
            "State": state,
            "Config": {"Labels": self.labels, "ExposedPorts": ports},
            "NetworkSettings": {"Networks": {"shop_default": {"IPAddress": self.ip}}},
        })
    }
}

#[derive(Default)]
struct State {
    containers: BTreeMap<String, Container>,
    requests: Vec<String>,
}

/// The fake engine, serving until dropped or [`Engine::stop`]ped.
pub struct Engine {
    path: PathBuf,
    dialect: Dialect,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<Bytes>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Engine {
    /// An engine on a new socket in `dir`.
    pub async fn start(dir: &Path, dialect: Dialect) -> Engine {
        let (events, _) = broadcast::channel(256);
        let mut engine = Engine {
            path: dir.join("engine.sock"),
            dialect,
            state: Arc::default(),
            events,
            server: None,
        };
        engine.serve();
        engine
    }

    /// `unix://PATH`, for `providers.docker.endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    fn serve(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let listener = tokio::net::UnixListener::bind(&self.path).expect("bind the engine socket");
        let (state, events, dialect) = (self.state.clone(), self.events.clone(), self.dialect);
        self.server = Some(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                let (state, events) = (state.clone(), events.clone());
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let (state, events) = (state.clone(), events.clone());
                        async move { Ok::<_, Infallible>(answer(req, &state, &events, dialect)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }));
    }

    /// The engine goes away: its socket closes, and every connection with it.
    pub fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }

    /// The engine is back, with the containers it had.
    pub fn restart(&mut self) {
        self.stop();
        self.serve();
    }

    /// Adds (or replaces) a container, sending no event.
    pub fn put(&self, container: Container) {
        let mut state = self.state.lock().unwrap();
        state.containers.insert(container.id.clone(), container);
    }

    /// Changes a container, sending no event.
    pub fn update(&self, id: &str, change: impl FnOnce(&mut Container)) {
        let mut state = self.state.lock().unwrap();
        change(state.containers.get_mut(id).expect("a known container"));
    }

    /// Removes a container, sending no event (a lost one).
    pub fn remove(&self, id: &str) {
        self.state.lock().unwrap().containers.remove(id);
    }

    /// Sends the event `action` (in Docker's words: `start`, `kill`, `die`, `destroy`,
    /// `health_status`) for container `id`, in the engine's dialect.
    pub fn event(&self, action: &str, id: &str) {
        let (action, health) = match (action, self.dialect) {
            ("die", Dialect::Podman) => ("died".to_string(), None),
            ("health_status", Dialect::Docker) => {
                let status = self.health_of(id);
                (format!("health_status: {status}"), None)
            }
            ("health_status", Dialect::Podman) => {
                ("health_status".into(), Some(self.health_of(id)))
            }
            (other, _) => (other.to_string(), None),
        };
        let mut attributes = serde_json::json!({"name": id});
        if let Some(health) = health {
            attributes["health_status"] = serde_json::Value::String(health);
        }
        let line = serde_json::json!({
            "Type": "container",
            "Action": action,
            "status": action,
            "id": id,
            "Actor": {"ID": id, "Attributes": attributes},
            "scope": "local",
            "time": 1,
            "timeNano": 1,
        });
        let _ = self.events.send(Bytes::from(format!("{line}\n")));
    }

    fn health_of(&self, id: &str) -> String {
        let state = self.state.lock().unwrap();
        (state.containers.get(id))
            .and_then(|c| c.health.clone())
            .unwrap_or_default()
    }

    /// Every request received, as `METHOD /path` (the version prefix removed).
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn json(value: serde_json::Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(value.to_string())).boxed())
        .unwrap()
}

fn status(code: u16, message: &str) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(
                serde_json::json!({"message": message}).to_string(),
            ))
            .boxed(),
        )
        .unwrap()
}

fn answer(
    req: Request<hyper::body::Incoming>,
    state: &Mutex<State>,
    events: &broadcast::Sender<Bytes>,
    dialect: Dialect,
) -> Response<Body> {
    // bollard prefixes `/vX.Y`.
    let full = req.uri().path().to_string();
    let path = match full.strip_prefix("/v") {
        Some(rest) => rest.find('/').map_or(full.as_str(), |i| &rest[i..]),
        None => full.as_str(),
    }
    .to_string();
    let mut state = state.lock().unwrap();
    state.requests.push(format!("{} {path}", req.method()));
    if req.method() != hyper::Method::GET {
        return status(405, "this fake engine answers GET only");
    }
    let api = match dialect {
        Dialect::Docker => "1.47",
        Dialect::Podman => "1.41",
    };
    match path.as_str() {
        "/_ping" => Response::new(Full::new(Bytes::from_static(b"OK")).boxed()),
        "/version" => json(serde_json::json!({
            "Version": "fake", "ApiVersion": api, "MinAPIVersion": "1.24", "Os": "linux",
        })),
        "/containers/json" => json(serde_json::Value::Array(
            (state.containers.values())
                .filter(|c| c.running)
                .map(Container::summary)
                .collect(),
        )),
        "/events" => {
            let receiver = events.subscribe();
            let stream = futures_util::stream::unfold(receiver, |mut rx| async move {
                loop {
                    match rx.recv().await {
                        Ok(line) => return Some((Ok::<_, Infallible>(Frame::data(line)), rx)),
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            });
            Response::builder()
                .header("content-type", "application/json")
                .body(StreamBody::new(stream).boxed())
                .unwrap()
        }
        other => match other
            .strip_prefix("/containers/")
            .and_then(|rest| rest.strip_suffix("/json"))
        {
            Some(id) => match state.containers.get(id) {
                Some(c) => json(c.inspect()),
                None => status(404, &format!("no such container: {id}")),
            },
            None => status(404, "page not found"),
        },
    }
}
