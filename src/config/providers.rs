//! `providers:`: where routes come from beside the file. Today one provider: `docker`, the
//! Engine API of Docker or Podman, whose labelled containers become routes (`src/provider.rs`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::Validator;

/// `providers:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersFile {
    #[serde(default)]
    pub docker: Option<DockerFile>,
}

/// `providers.docker:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerFile {
    pub endpoint: String,
    #[serde(default)]
    pub network: Option<String>,
    #[serde(default)]
    pub exposed_by_default: Option<bool>,
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub resync: Option<String>,
    #[serde(default)]
    pub recreate_grace: Option<String>,
}

/// Where the Engine API listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEndpoint {
    /// `unix:///var/run/docker.sock`
    Unix(PathBuf),
    /// `tcp://HOST:PORT` (plain HTTP, as a socket proxy serves it).
    Tcp(String),
}

impl std::fmt::Display for EngineEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineEndpoint::Unix(path) => write!(f, "unix://{}", path.display()),
            EngineEndpoint::Tcp(addr) => write!(f, "tcp://{addr}"),
        }
    }
}

/// `providers.docker`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerProvider {
    pub endpoint: EngineEndpoint,
    /// The network whose address a container is reached at; `None`: its only one.
    pub network: Option<String>,
    /// Containers without `floodgate.enable` are routed too (default false).
    pub exposed_by_default: bool,
    /// Only this compose project's containers.
    pub project: Option<String>,
    /// A full listing this often, beside the event stream.
    pub resync: Duration,
    /// How long a discovered route with no endpoint holds its requests.
    pub recreate_grace: Duration,
}

impl Validator {
    /// `providers:`.
    pub(super) fn providers(&mut self, file: Option<ProvidersFile>) -> Option<DockerProvider> {
        let docker = file?.docker?;
        let at = "providers.docker";
        let endpoint = if let Some(path) = docker.endpoint.strip_prefix("unix://") {
            (!path.is_empty()).then(|| EngineEndpoint::Unix(PathBuf::from(path)))
        } else if let Some(addr) = docker.endpoint.strip_prefix("tcp://") {
            let addr = addr.trim_end_matches('/');
            addr.rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
                .then(|| EngineEndpoint::Tcp(addr.to_string()))
        } else {
            None
        };
        let Some(endpoint) = endpoint else {
            self.problem(
                format!("{at}.endpoint"),
                format!(
                    "{:?} is not unix:///PATH or tcp://HOST:PORT",
                    docker.endpoint
                ),
            );
            return None;
        };
        let network = docker.network.filter(|n| {
            let ok = !n.trim().is_empty();
            if !ok {
                self.problem(format!("{at}.network"), "must not be empty");
            }
            ok
        });
        let resync = self.duration(
            &format!("{at}.resync"),
            docker.resync.as_deref(),
            Duration::from_secs(30),
        );
        let recreate_grace = self.duration(
            &format!("{at}.recreate_grace"),
            docker.recreate_grace.as_deref(),
            Duration::from_secs(10),
        );
        if recreate_grace > Duration::from_secs(300) {
            self.problem(
                format!("{at}.recreate_grace"),
                "must be at most 5m (requests are held that long)",
            );
        }
        Some(DockerProvider {
            endpoint,
            network,
            exposed_by_default: docker.exposed_by_default.unwrap_or(false),
            project: docker.project.filter(|p| !p.is_empty()),
            resync,
            recreate_grace,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, EngineEndpoint};

    fn docker(section: &str) -> Result<Config, String> {
        Config::from_yaml(&format!(
            "listen: 127.0.0.1:8080\nproviders:\n  docker:\n{section}"
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn the_docker_provider_is_read_with_its_defaults() {
        let c = docker("    endpoint: unix:///run/podman/podman.sock\n").unwrap();
        let d = c.docker.unwrap();
        assert_eq!(
            d.endpoint,
            EngineEndpoint::Unix("/run/podman/podman.sock".into())
        );
        assert!(!d.exposed_by_default);
        assert_eq!(d.resync.as_secs(), 30);
        assert_eq!(d.recreate_grace.as_secs(), 10);
        let c =
            docker("    endpoint: tcp://socket-proxy:2375\n    network: app\n    project: shop\n")
                .unwrap();
        let d = c.docker.unwrap();
        assert_eq!(d.endpoint, EngineEndpoint::Tcp("socket-proxy:2375".into()));
        assert_eq!(d.network.as_deref(), Some("app"));
        assert_eq!(d.project.as_deref(), Some("shop"));
    }

    #[test]
    fn each_mistake_names_its_field() {
        let e = docker("    endpoint: /var/run/docker.sock\n").unwrap_err();
        assert!(e.contains("providers.docker.endpoint"), "{e}");
        let e = docker("    endpoint: tcp://h:2375\n    resync: 0s\n    recreate_grace: 10m\n")
            .unwrap_err();
        assert!(e.contains("providers.docker.resync"), "{e}");
        assert!(e.contains("providers.docker.recreate_grace"), "{e}");
        let e = docker("    endpoint: tcp://h:2375\n    exposed: true\n").unwrap_err();
        assert!(e.contains("providers.docker"), "{e}");
    }
}
