//! The Engine API of Docker or Podman, through bollard: only `GET` on `/_ping`, `/version`,
//! `/containers/json`, `/containers/{id}/json` and `/events` (each under bollard's `/vX.Y`
//! prefix, X.Y the engine's own version, negotiated). The two engines' dialects are made one
//! here: Podman says `died` where Docker says `die`, ANDs repeated filters where Docker ORs
//! them (so the one filter sent is `type=container`, and the actions are picked here), and sends
//! `health_status` with the status as an attribute where Docker writes `health_status: healthy`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{EventsOptions, ListContainersOptions};
use futures_util::Stream;
use futures_util::StreamExt as _;

use super::labels::{self, Facts};
use super::model::Inspected;
use crate::config::{DockerProvider, EngineEndpoint};

/// How long one call (not the event stream) may take.
const CALL_TIMEOUT_SECS: u64 = 5;

/// What an event means for routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `start`, `health_status`, `restart`: inspect it again.
    Look(String),
    /// `kill` (`docker stop` sends it before the process exits), `stop`: drain it.
    Drain(String),
    /// `die`, `died`, `destroy`, `remove`: it has left.
    Gone(String),
}

impl Event {
    /// The action's name as the metric counts it (`die` for podman's `died`; `health_status`
    /// without its status).
    pub fn action(action: &str) -> &str {
        let action = action.split(':').next().unwrap_or(action).trim();
        match action {
            "died" => "die",
            other => other,
        }
    }

    /// What `action` on container `id` means, or `None` for an action routing ignores.
    pub fn of(action: &str, id: String) -> Option<Event> {
        match Event::action(action) {
            "start" | "restart" | "health_status" => Some(Event::Look(id)),
            "kill" | "stop" => Some(Event::Drain(id)),
            "die" | "destroy" | "remove" | "oom" => Some(Event::Gone(id)),
            _ => None,
        }
    }
}

/// A connection to the engine.
pub struct Engine {
    docker: Docker,
}

impl Engine {
    /// Connects (nothing is sent yet) and agrees the API version with the engine.
    pub async fn connect(endpoint: &EngineEndpoint) -> Result<Engine, String> {
        let docker = match endpoint {
            EngineEndpoint::Unix(path) => Docker::connect_with_unix(
                &path.to_string_lossy(),
                CALL_TIMEOUT_SECS,
                bollard::API_DEFAULT_VERSION,
            ),
            EngineEndpoint::Tcp(addr) => Docker::connect_with_http(
                &format!("tcp://{addr}"),
                CALL_TIMEOUT_SECS,
                bollard::API_DEFAULT_VERSION,
            ),
        }
        .map_err(|e| e.to_string())?;
        docker.ping().await.map_err(|e| e.to_string())?;
        // `/version`: an older engine refuses a newer client's version prefix.
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| e.to_string())?;
        Ok(Engine { docker })
    }

    /// The running containers' ids.
    pub async fn running(&self) -> Result<Vec<String>, String> {
        let options = ListContainersOptions {
            all: false,
            ..Default::default()
        };
        let list = (self.docker.list_containers(Some(options)).await).map_err(|e| e.to_string())?;
        Ok(list.into_iter().filter_map(|c| c.id).collect())
    }

    /// What inspect says of `id`, its labels read as `provider` says; `None` when it is gone.
    pub async fn inspect(
        &self,
        id: &str,
        provider: &DockerProvider,
    ) -> Result<Option<Inspected>, String> {
        let inspected = match self.docker.inspect_container(id, None).await {
            Ok(inspected) => inspected,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let config = inspected.config.unwrap_or_default();
        let labels: HashMap<String, String> = config.labels.unwrap_or_default();
        let mut exposed: Vec<u16> = (config.exposed_ports.unwrap_or_default().iter())
            .filter_map(|p| p.strip_suffix("/tcp").unwrap_or(p).parse().ok())
            .collect();
        exposed.sort_unstable();
        exposed.dedup();
        let mut networks: Vec<(String, IpAddr)> = inspected
            .network_settings
            .and_then(|n| n.networks)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, e)| Some((name, e.ip_address?.parse().ok()?)))
            .collect();
        networks.sort();
        let state = inspected.state.unwrap_or_default();
        let health = (state.health.and_then(|h| h.status))
            .map(|s| s.to_string())
            .filter(|s| !s.is_empty() && s != "none");
        let facts = Facts {
            id: inspected.id.unwrap_or_else(|| id.to_string()),
            name: inspected
                .name
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_string(),
            project: labels.get("com.docker.compose.project").cloned(),
            service: labels.get("com.docker.compose.service").cloned(),
            labels,
            exposed,
            networks,
        };
        let reading = labels::read(&facts, provider);
        Ok(Some(Inspected {
            facts,
            running: state.running.unwrap_or(false),
            health,
            reading,
        }))
    }

    /// The containers' events from `since` (Unix seconds) on: each as its action (counted) and
    /// what it means.
    pub fn events(
        &self,
        since: u64,
    ) -> impl Stream<Item = Result<(String, Option<Event>), String>> + use<> {
        let mut filters = HashMap::new();
        filters.insert("type".to_string(), vec!["container".to_string()]);
        let options = EventsOptions {
            filters: Some(filters),
            since: Some(since.to_string()),
            ..Default::default()
        };
        self.docker.events(Some(options)).map(|event| {
            let event = event.map_err(|e| e.to_string())?;
            let action = event.action.unwrap_or_default();
            let id = event.actor.and_then(|a| a.id).unwrap_or_default();
            let meaning = (!id.is_empty()).then(|| Event::of(&action, id)).flatten();
            Ok((Event::action(&action).to_string(), meaning))
        })
    }
}

/// The wait before the `n`th reconnection in a row: 250 ms doubling to 10 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_millis(250u64.saturating_mul(1 << n.min(6))).min(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_and_podman_dialects_mean_the_same() {
        let id = || "c1".to_string();
        assert_eq!(Event::of("die", id()), Some(Event::Gone(id())));
        assert_eq!(Event::of("died", id()), Some(Event::Gone(id())));
        assert_eq!(Event::action("died"), "die");
        assert_eq!(Event::of("kill", id()), Some(Event::Drain(id())));
        assert_eq!(
            Event::of("health_status: healthy", id()),
            Some(Event::Look(id()))
        );
        assert_eq!(Event::of("health_status", id()), Some(Event::Look(id())));
        assert_eq!(Event::action("health_status: healthy"), "health_status");
        assert_eq!(Event::of("exec_start: sh", id()), None);
        assert_eq!(Event::of("destroy", id()), Some(Event::Gone(id())));
    }

    #[test]
    fn reconnections_back_off_to_ten_seconds() {
        assert_eq!(backoff(0), Duration::from_millis(250));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(30), Duration::from_secs(10));
    }
}
