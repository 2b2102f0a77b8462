//! A container's `floodgate.*` labels read into the route it claims: the route as the file
//! would write it (without its pool, which is the route's containers), the endpoint this
//! container adds, or every problem, each named by its label. The route itself is validated by
//! the config, exactly as the file's routes are ([`super::Apply::check`]); its problems come back
//! at `routes[N].…` and are named here by the label that wrote the field ([`label_path`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use serde_json::{Map, Value};

use crate::config::DockerProvider;

/// What the Engine API says of one container that labels are read with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub id: String,
    /// Its name, without Docker's leading `/`.
    pub name: String,
    /// `com.docker.compose.project`
    pub project: Option<String>,
    /// `com.docker.compose.service`
    pub service: Option<String>,
    pub labels: HashMap<String, String>,
    /// The TCP ports `Config.ExposedPorts` names.
    pub exposed: Vec<u16>,
    /// Its address on each network it is attached to.
    pub networks: Vec<(String, IpAddr)>,
}

/// The route a container claims.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The route's name (`floodgate.route.name`, else `<project>-<service>`, else the
    /// container's name).
    pub route: String,
    /// The route as written, without `upstreams`.
    pub written: Value,
    /// Where this container is reached.
    pub endpoint: SocketAddr,
}

/// What a container's labels come to.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// Not routed: another project's, not enabled, or `floodgate.enable: "false"`.
    Ignored,
    Claim(Claim),
    /// Enabled, and wrong: each problem as `label: message`.
    Invalid(Vec<String>),
}

/// The labels floodgate reads, besides `floodgate.enable`.
const ROUTE_LABELS: &[&str] = &[
    "path_prefix",
    "name",
    "hosts",
    "methods",
    "port",
    "priority",
    "limits",
    "config",
];

/// Route keys a label sets, which `floodgate.route.config` may not (`upstream` and `upstreams`
/// are the containers).
const SET_BY_LABELS: &[&str] = &[
    "path_prefix",
    "name",
    "hosts",
    "methods",
    "priority",
    "limits",
    "upstream",
    "upstreams",
];

/// Reads `facts`' labels as `provider` says (`exposed_by_default`, `project`, `network`).
pub fn read(facts: &Facts, provider: &DockerProvider) -> Reading {
    if provider
        .project
        .as_ref()
        .is_some_and(|p| facts.project.as_ref() != Some(p))
    {
        return Reading::Ignored;
    }
    let mut problems = Vec::new();
    let enabled = match facts.labels.get("floodgate.enable").map(|v| v.trim()) {
        None => provider.exposed_by_default,
        Some("true") => true,
        Some("false") => false,
        Some(other) => {
            problems.push(format!(
                "floodgate.enable: {other:?} is not \"true\" or \"false\""
            ));
            true
        }
    };
    if !enabled {
        return Reading::Ignored;
    }
    let label = |key: &str| facts.labels.get(&format!("floodgate.route.{key}"));
    for name in facts.labels.keys() {
        let known = name == "floodgate.enable"
            || name
                .strip_prefix("floodgate.route.")
                .is_some_and(|key| ROUTE_LABELS.contains(&key));
        if name.starts_with("floodgate.") && !known {
            problems.push(format!(
                "{name}: unknown label (floodgate reads floodgate.enable and floodgate.route.{{{}}})",
                ROUTE_LABELS.join(",")
            ));
        }
    }
    let mut route = match label("config") {
        None => Map::new(),
        Some(text) => match yaml(text) {
            Ok(Value::Object(map)) => {
                for key in map.keys() {
                    if SET_BY_LABELS.contains(&key.as_str()) {
                        let why = match key.as_str() {
                            "upstream" | "upstreams" => {
                                "set by discovery: the route's pool is its containers".to_string()
                            }
                            _ => format!("set it with the label floodgate.route.{key}"),
                        };
                        problems.push(format!("floodgate.route.config.{key}: {why}"));
                    }
                }
                map
            }
            Ok(Value::Null) => Map::new(),
            Ok(_) => {
                problems.push("floodgate.route.config: must be a mapping of route keys".into());
                Map::new()
            }
            Err(e) => {
                problems.push(format!("floodgate.route.config: {e}"));
                Map::new()
            }
        },
    };
    let name = match label("name").map(|n| n.trim().to_string()) {
        Some(name) => name,
        None => match (&facts.project, &facts.service) {
            (Some(project), Some(service)) => format!("{project}-{service}"),
            _ => facts.name.clone(),
        },
    };
    route.insert("name".into(), Value::String(name.clone()));
    match label("path_prefix") {
        Some(prefix) => {
            route.insert("path_prefix".into(), Value::String(prefix.trim().into()));
        }
        None => problems.push("floodgate.route.path_prefix: is required".into()),
    }
    for key in ["hosts", "methods"] {
        if let Some(list) = label(key) {
            let items: Vec<Value> = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.into()))
                .collect();
            route.insert(key.into(), Value::Array(items));
        }
    }
    if let Some(priority) = label("priority") {
        route.insert("priority".into(), Value::String(priority.trim().into()));
    }
    if let Some(limits) = label("limits") {
        match yaml(limits) {
            Ok(value) => {
                route.insert("limits".into(), value);
            }
            Err(e) => problems.push(format!("floodgate.route.limits: {e}")),
        }
    }
    let port = match label("port") {
        Some(text) => match text.trim().parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => {
                problems.push(format!("floodgate.route.port: {text:?} is not a port"));
                None
            }
        },
        None => match facts.exposed.as_slice() {
            [port] => Some(*port),
            [] => {
                problems.push(
                    "floodgate.route.port: the container exposes no port; name the one to route to"
                        .into(),
                );
                None
            }
            several => {
                let ports: Vec<String> = several.iter().map(u16::to_string).collect();
                problems.push(format!(
                    "floodgate.route.port: the container exposes {}; name the one to route to",
                    ports.join(", ")
                ));
                None
            }
        },
    };
    let address = address(facts, provider.network.as_deref()).map_err(|e| problems.push(e));
    match (port, address, problems.is_empty()) {
        (Some(port), Ok(ip), true) => Reading::Claim(Claim {
            route: name,
            written: Value::Object(route),
            endpoint: SocketAddr::new(ip, port),
        }),
        _ => Reading::Invalid(problems),
    }
}

/// The container's address: on `network`, else on its only network.
fn address(facts: &Facts, network: Option<&str>) -> Result<IpAddr, String> {
    match network {
        Some(wanted) => facts
            .networks
            .iter()
            .find(|(name, _)| name == wanted || name.ends_with(&format!("_{wanted}")))
            .map(|(_, ip)| *ip)
            .ok_or_else(|| {
                format!(
                    "providers.docker.network: the container has no address on network {wanted:?} (it is on {})",
                    names(facts)
                )
            }),
        None => match facts.networks.as_slice() {
            [(_, ip)] => Ok(*ip),
            [] => Err("the container has no network address (network_mode: host or none?)".into()),
            _ => Err(format!(
                "providers.docker.network: the container is on {}; name the one floodgate reaches it on",
                names(facts)
            )),
        },
    }
}

fn names(facts: &Facts) -> String {
    let names: Vec<&str> = facts.networks.iter().map(|(n, _)| n.as_str()).collect();
    if names.is_empty() {
        "no network".into()
    } else {
        names.join(", ")
    }
}

/// A label's YAML (a flow sequence, a block mapping) as a value.
fn yaml(text: &str) -> Result<Value, String> {
    serde_saphyr::from_str::<Value>(text).map_err(|e| format!("invalid YAML: {e}"))
}

/// The label that wrote a discovered route's field, from the field's path below the route
/// (`limits[0].capacity` → `floodgate.route.limits[0].capacity`; `cache.ttl` →
/// `floodgate.route.config.cache.ttl`; the pool → `floodgate.route.port`).
pub fn label_path(field: &str) -> String {
    let key = field.split(['.', '[']).next().unwrap_or("");
    match key {
        "" => "floodgate.route".into(),
        "upstream" | "upstreams" => "floodgate.route.port".into(),
        _ if SET_BY_LABELS.contains(&key) => format!("floodgate.route.{field}"),
        _ => format!("floodgate.route.config.{field}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn provider() -> DockerProvider {
        DockerProvider {
            endpoint: crate::config::EngineEndpoint::Tcp("127.0.0.1:2375".into()),
            network: None,
            exposed_by_default: false,
            project: None,
            resync: Duration::from_secs(30),
            recreate_grace: Duration::from_secs(10),
        }
    }

    fn facts(labels: &[(&str, &str)]) -> Facts {
        Facts {
            id: "abc".into(),
            name: "shop-rides-1".into(),
            project: Some("shop".into()),
            service: Some("rides".into()),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            exposed: vec![9000],
            networks: vec![("shop_default".into(), "10.0.0.5".parse().unwrap())],
        }
    }

    fn problems(reading: Reading) -> Vec<String> {
        match reading {
            Reading::Invalid(p) => p,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn a_labelled_container_claims_its_services_route_at_its_only_port() {
        let reading = read(
            &facts(&[
                ("floodgate.enable", "true"),
                ("floodgate.route.path_prefix", "/api/rides/"),
                ("floodgate.route.hosts", "a.example, b.example"),
                ("floodgate.route.methods", "GET,POST"),
                (
                    "floodgate.route.limits",
                    "[{algorithm: token_bucket, capacity: 20, refill_rate: 10}]",
                ),
                ("floodgate.route.config", "cache: {ttl: 1s}\n"),
            ]),
            &provider(),
        );
        let Reading::Claim(claim) = reading else {
            panic!("{reading:?}")
        };
        assert_eq!(claim.route, "shop-rides");
        assert_eq!(claim.endpoint, "10.0.0.5:9000".parse().unwrap());
        assert_eq!(
            claim.written,
            serde_json::json!({
                "name": "shop-rides",
                "path_prefix": "/api/rides/",
                "hosts": ["a.example", "b.example"],
                "methods": ["GET", "POST"],
                "limits": [{"algorithm": "token_bucket", "capacity": 20, "refill_rate": 10}],
                "cache": {"ttl": "1s"},
            })
        );
    }

    #[test]
    fn containers_not_enabled_or_of_another_project_are_ignored() {
        let labels = [("floodgate.route.path_prefix", "/")];
        assert_eq!(read(&facts(&labels), &provider()), Reading::Ignored);
        let everyone = DockerProvider {
            exposed_by_default: true,
            ..provider()
        };
        assert!(matches!(
            read(&facts(&labels), &everyone),
            Reading::Claim(_)
        ));
        let other = DockerProvider {
            project: Some("billing".into()),
            ..everyone.clone()
        };
        assert_eq!(read(&facts(&labels), &other), Reading::Ignored);
        let disabled = [("floodgate.enable", "false"), labels[0]];
        assert_eq!(read(&facts(&disabled), &everyone), Reading::Ignored);
    }

    #[test]
    fn each_mistake_is_named_by_its_label() {
        let mut f = facts(&[
            ("floodgate.enable", "yes"),
            ("floodgate.route.prefix", "/x"),
            ("floodgate.route.limits", "[{capacity: 1"),
            ("floodgate.route.config", "upstream: http://x\n"),
        ]);
        f.exposed = vec![80, 9000];
        let p = problems(read(&f, &provider()));
        let labels: Vec<&str> = p.iter().map(|p| p.split(':').next().unwrap()).collect();
        assert_eq!(
            {
                let mut l = labels.clone();
                l.sort();
                l
            },
            [
                "floodgate.enable",
                "floodgate.route.config.upstream",
                "floodgate.route.limits",
                "floodgate.route.path_prefix",
                "floodgate.route.port",
                "floodgate.route.prefix",
            ],
            "{p:?}"
        );
        assert!(p.iter().any(|p| p.contains("exposes 80, 9000")), "{p:?}");
    }

    #[test]
    fn the_network_named_is_the_address_used() {
        let mut f = facts(&[
            ("floodgate.enable", "true"),
            ("floodgate.route.path_prefix", "/"),
            ("floodgate.route.port", "8080"),
        ]);
        f.networks
            .push(("shop_app".into(), "10.1.0.7".parse().unwrap()));
        let p = problems(read(&f, &provider()));
        assert!(p[0].starts_with("providers.docker.network:"), "{p:?}");
        let on_app = DockerProvider {
            network: Some("app".into()),
            ..provider()
        };
        let Reading::Claim(claim) = read(&f, &on_app) else {
            panic!()
        };
        assert_eq!(claim.endpoint, "10.1.0.7:8080".parse().unwrap());
    }

    #[test]
    fn a_fields_path_is_named_by_the_label_that_wrote_it() {
        assert_eq!(
            label_path("limits[0].capacity"),
            "floodgate.route.limits[0].capacity"
        );
        assert_eq!(label_path("cache.ttl"), "floodgate.route.config.cache.ttl");
        assert_eq!(label_path("upstreams[1]"), "floodgate.route.port");
        assert_eq!(label_path("name"), "floodgate.route.name");
    }
}
