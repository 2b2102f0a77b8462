//! What floodgate knows of the engine's containers, and the routes they make: a pure state
//! machine over what the engine said (an inspect, a `kill`, a `die`, a listing), on an injected
//! clock, so the order of events is unit-tested here and the task (`provider.rs`) only reads
//! and applies.
//!
//! - A container joins its route's pool when it runs (when it has a health check: once inspect
//!   says `healthy`), is drained at `kill` (no new request; those in flight finish) and leaves
//!   at `die`, `destroy` or `remove`.
//! - One route per name: the first container seen claiming it says how it is routed; another
//!   claiming the name with a different route is reported with both names and not routed.
//! - A route whose last endpoint left is kept, with an empty pool, for `recreate_grace` from
//!   then (its requests are held, `proxy::held`), so a compose recreate answers no 404 or 502.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::labels::{Facts, Reading};

/// A container's part in routing, as `GET /discovered` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// An endpoint of its route.
    Serving,
    /// Running, its health check not yet passed.
    Starting,
    /// Killed: no new request goes to it.
    Draining,
    /// Its labels are wrong, or its route's name is another's.
    Invalid,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Serving => "serving",
            State::Starting => "starting",
            State::Draining => "draining",
            State::Invalid => "invalid",
        }
    }
}

/// What inspect says of a running container.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspected {
    pub facts: Facts,
    /// `State.Running`.
    pub running: bool,
    /// `State.Health.Status` when the container has a health check.
    pub health: Option<String>,
    /// Its labels read.
    pub reading: Reading,
}

#[derive(Debug, Clone)]
struct Container {
    facts: Facts,
    reading: Reading,
    healthy: bool,
    draining: bool,
    /// When it was first seen: the first claim of a name wins.
    seen: u64,
}

/// A route held with no endpoint, since `since`.
#[derive(Debug, Clone)]
struct Held {
    written: Value,
    since: Instant,
}

/// One container as `GET /discovered` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub id: String,
    pub name: String,
    pub service: Option<String>,
    pub route: Option<String>,
    pub endpoint: Option<SocketAddr>,
    pub state: State,
    pub error: Option<String>,
}

/// One discovered route: as written, with its pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: String,
    /// The route as the file would write it, `upstreams` included.
    pub written: Value,
    pub endpoints: Vec<SocketAddr>,
}

/// Every container floodgate knows, and the routes it last made.
#[derive(Debug, Default)]
pub struct Model {
    containers: BTreeMap<String, Container>,
    next_seen: u64,
    held: BTreeMap<String, Held>,
    /// The routes with endpoints the last time they were made, as written.
    served: BTreeMap<String, Value>,
    /// Routes the config refused (a problem only the whole config shows), by their written
    /// form, with the problems.
    refused: HashMap<String, Vec<String>>,
}

impl Model {
    /// What inspect said of a container (after its `start`, a `health_status`, a listing).
    /// Returns true when this changes what is routed or listed.
    pub fn inspected(&mut self, seen: Inspected) -> bool {
        let id = seen.facts.id.clone();
        if !seen.running {
            return self.gone(&id);
        }
        let healthy = seen.health.as_deref().is_none_or(|h| h == "healthy");
        let next_seen = &mut self.next_seen;
        let before = self.containers.get(&id).cloned();
        let container = self.containers.entry(id).or_insert_with(|| {
            *next_seen += 1;
            Container {
                facts: seen.facts.clone(),
                reading: seen.reading.clone(),
                healthy,
                draining: false,
                seen: *next_seen,
            }
        });
        container.facts = seen.facts;
        container.reading = seen.reading;
        container.healthy = healthy;
        before.is_none_or(|b| {
            b.facts != container.facts || b.reading != container.reading || b.healthy != healthy
        })
    }

    /// `kill`: the container takes no new request.
    pub fn killed(&mut self, id: &str) -> bool {
        match self.containers.get_mut(id) {
            Some(c) if !c.draining => {
                c.draining = true;
                true
            }
            _ => false,
        }
    }

    /// `die`, `destroy`, `remove` (podman's `died`): the container has left.
    pub fn gone(&mut self, id: &str) -> bool {
        self.containers.remove(id).is_some()
    }

    /// A full listing: the running containers' ids. Any other is gone (its event was missed).
    pub fn listed(&mut self, running: &[String]) -> bool {
        let before = self.containers.len();
        self.containers.retain(|id, _| running.contains(id));
        before != self.containers.len()
    }

    /// True when `id` is known, running and healthy (its port was found open when it joined).
    pub fn joined(&self, id: &str) -> bool {
        self.containers.get(id).is_some_and(|c| c.healthy)
    }

    /// The file changed: what the config refused is asked again.
    pub fn forget_refusals(&mut self) {
        self.refused.clear();
    }

    /// The config refused `written` with `problems`: its containers are reported invalid.
    pub fn refuse(&mut self, written: &Value, problems: Vec<String>) {
        self.refused.insert(written.to_string(), problems);
    }

    /// The routes to serve at `now`, by name, and every container's part. A route that lost
    /// its last endpoint is kept, empty, until `grace` after.
    pub fn routes(&mut self, now: Instant, grace: Duration) -> (Vec<Route>, Vec<Listed>) {
        // Each name's first claimant (lowest `seen`) says how the route is written.
        let mut first: BTreeMap<String, (u64, String, Value)> = BTreeMap::new();
        for c in self.containers.values() {
            if let Reading::Claim(claim) = &c.reading {
                let slot = first.entry(claim.route.clone()).or_insert((
                    c.seen,
                    c.facts.name.clone(),
                    claim.written.clone(),
                ));
                if c.seen < slot.0 {
                    *slot = (c.seen, c.facts.name.clone(), claim.written.clone());
                }
            }
        }
        let mut listed = Vec::with_capacity(self.containers.len());
        let mut pools: BTreeMap<String, Vec<SocketAddr>> = BTreeMap::new();
        let mut by_seen: Vec<&Container> = self.containers.values().collect();
        by_seen.sort_by_key(|c| c.seen);
        for c in by_seen {
            let mut entry = Listed {
                id: c.facts.id.clone(),
                name: c.facts.name.clone(),
                service: c.facts.service.clone(),
                route: None,
                endpoint: None,
                state: State::Invalid,
                error: None,
            };
            match &c.reading {
                Reading::Ignored => continue,
                Reading::Invalid(problems) => {
                    entry.error = Some(problems.join("; "));
                }
                Reading::Claim(claim) => {
                    entry.route = Some(claim.route.clone());
                    entry.endpoint = Some(claim.endpoint);
                    let (_, owner, written) = &first[&claim.route];
                    if let Some(problems) = self.refused.get(&claim.written.to_string()) {
                        entry.error = Some(problems.join("; "));
                    } else if *written != claim.written {
                        entry.error = Some(format!(
                            "route {:?} is claimed by container {owner} with different labels; this one is not routed until that one leaves",
                            claim.route
                        ));
                    } else {
                        entry.state = if c.draining {
                            State::Draining
                        } else if !c.healthy {
                            State::Starting
                        } else {
                            State::Serving
                        };
                        let pool = pools.entry(claim.route.clone()).or_default();
                        if entry.state == State::Serving {
                            pool.push(claim.endpoint);
                        }
                    }
                }
            }
            listed.push(entry);
        }
        // The first claimant of a name another claims differently is reported too.
        let contested: Vec<(String, String)> = listed
            .iter()
            .filter(|l| {
                l.error
                    .as_deref()
                    .is_some_and(|e| e.contains("is claimed by"))
            })
            .filter_map(|l| Some((l.route.clone()?, l.name.clone())))
            .collect();
        for (route, other) in contested {
            let (_, owner, _) = &first[&route];
            if let Some(entry) = listed
                .iter_mut()
                .find(|l| &l.name == owner && l.error.is_none())
            {
                entry.error = Some(format!(
                    "route {route:?} is also claimed by container {other} with different labels; this one's are used"
                ));
            }
        }
        let mut routes = Vec::new();
        for (name, (_, _, written)) in &first {
            if self.refused.contains_key(&written.to_string()) {
                continue;
            }
            let Some(endpoints) = pools.get(name) else {
                continue;
            };
            if endpoints.is_empty() {
                let held = self.held.entry(name.clone()).or_insert(Held {
                    written: written.clone(),
                    since: now,
                });
                held.written = written.clone();
            } else {
                self.held.remove(name);
                routes.push(route(name, written, endpoints));
            }
        }
        // A route served last time whose containers all went at once is held too.
        for (name, written) in std::mem::take(&mut self.served) {
            if !routes.iter().any(|r: &Route| r.name == name) {
                self.held.entry(name).or_insert(Held {
                    written,
                    since: now,
                });
            }
        }
        self.served = (routes.iter())
            .map(|r| (r.name.clone(), r.written.clone()))
            .collect();
        // Routes with no endpoint (their containers gone, draining or starting) stay, empty,
        // within their grace.
        self.held
            .retain(|_, held| now.saturating_duration_since(held.since) < grace);
        for (name, held) in &self.held {
            routes.push(route(name, &held.written, &[]));
        }
        routes.sort_by(|a, b| a.name.cmp(&b.name));
        (routes, listed)
    }

    /// When the next held route's grace ends (the routes are made again then).
    pub fn next_expiry(&self, grace: Duration) -> Option<Instant> {
        self.held.values().map(|h| h.since + grace).min()
    }
}

fn route(name: &str, written: &Value, endpoints: &[SocketAddr]) -> Route {
    let mut written = written.clone();
    if let Value::Object(map) = &mut written {
        let upstreams = endpoints
            .iter()
            .map(|e| Value::String(format!("http://{e}")))
            .collect();
        map.insert("upstreams".into(), Value::Array(upstreams));
    }
    Route {
        name: name.to_string(),
        written,
        endpoints: endpoints.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::labels::Claim;
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);

    fn container(id: &str, route: &str, ip: &str, written: Value) -> Inspected {
        Inspected {
            facts: Facts {
                id: id.into(),
                name: format!("c-{id}"),
                service: Some(route.into()),
                ..Default::default()
            },
            running: true,
            health: None,
            reading: Reading::Claim(Claim {
                route: route.into(),
                written,
                endpoint: format!("{ip}:9000").parse().unwrap(),
            }),
        }
    }

    fn rides() -> Value {
        serde_json::json!({"name": "rides", "path_prefix": "/rides/"})
    }

    fn pool(model: &mut Model, now: Instant) -> Vec<(String, Vec<String>)> {
        model
            .routes(now, GRACE)
            .0
            .into_iter()
            .map(|r| {
                (
                    r.name,
                    r.endpoints.iter().map(|e| e.ip().to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn containers_join_at_start_drain_at_kill_and_leave_at_die() {
        let (mut m, now) = (Model::default(), Instant::now());
        assert!(m.inspected(container("a", "rides", "10.0.0.1", rides())));
        assert!(m.inspected(container("b", "rides", "10.0.0.2", rides())));
        assert_eq!(
            pool(&mut m, now),
            [("rides".into(), vec!["10.0.0.1".into(), "10.0.0.2".into()])]
        );
        assert!(m.killed("a"));
        assert!(!m.killed("a"), "a second kill changes nothing");
        assert_eq!(
            pool(&mut m, now),
            [("rides".into(), vec!["10.0.0.2".into()])]
        );
        // A listing while it is still running keeps it draining.
        m.inspected(container("a", "rides", "10.0.0.1", rides()));
        assert_eq!(
            pool(&mut m, now),
            [("rides".into(), vec!["10.0.0.2".into()])]
        );
        let listed = m.routes(now, GRACE).1;
        assert_eq!(listed[0].state, State::Draining);
        assert!(m.gone("a"));
        assert_eq!(m.routes(now, GRACE).1.len(), 1);
    }

    #[test]
    fn a_container_with_a_health_check_joins_once_healthy() {
        let (mut m, now) = (Model::default(), Instant::now());
        let mut starting = container("a", "rides", "10.0.0.1", rides());
        starting.health = Some("starting".into());
        m.inspected(starting.clone());
        let (routes, listed) = m.routes(now, GRACE);
        assert_eq!(listed[0].state, State::Starting);
        assert!(routes[0].endpoints.is_empty(), "held, with no endpoint");
        starting.health = Some("healthy".into());
        assert!(m.inspected(starting));
        assert_eq!(
            pool(&mut m, now),
            [("rides".into(), vec!["10.0.0.1".into()])]
        );
    }

    #[test]
    fn a_route_that_lost_its_last_endpoint_is_held_for_its_grace_then_dropped() {
        let (mut m, now) = (Model::default(), Instant::now());
        m.inspected(container("a", "rides", "10.0.0.1", rides()));
        pool(&mut m, now);
        m.killed("a");
        m.gone("a");
        assert_eq!(
            pool(&mut m, now + Duration::from_secs(1)),
            [("rides".into(), vec![])]
        );
        assert_eq!(m.next_expiry(GRACE), Some(now + Duration::from_secs(11)));
        // The new container within the grace: served, no longer held.
        m.inspected(container("b", "rides", "10.0.0.3", rides()));
        assert_eq!(
            pool(&mut m, now + Duration::from_secs(2)),
            [("rides".into(), vec!["10.0.0.3".into()])]
        );
        assert_eq!(m.next_expiry(GRACE), None);
        m.gone("b");
        let lost = now + Duration::from_secs(3);
        assert_eq!(pool(&mut m, lost), [("rides".into(), vec![])]);
        assert_eq!(pool(&mut m, lost + GRACE), []);
    }

    #[test]
    fn a_second_claim_of_a_name_with_other_labels_is_reported_with_both_names() {
        let (mut m, now) = (Model::default(), Instant::now());
        m.inspected(container("a", "rides", "10.0.0.1", rides()));
        let other = serde_json::json!({"name": "rides", "path_prefix": "/other/"});
        m.inspected(container("b", "rides", "10.0.0.2", other));
        let (routes, listed) = m.routes(now, GRACE);
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].endpoints, ["10.0.0.1:9000".parse().unwrap()]);
        assert_eq!(routes[0].written["path_prefix"], "/rides/");
        let (a, b) = (&listed[0], &listed[1]);
        assert_eq!((a.state, b.state), (State::Serving, State::Invalid));
        assert!(a.error.as_deref().unwrap().contains("c-b"), "{a:?}");
        assert!(b.error.as_deref().unwrap().contains("c-a"), "{b:?}");
        // The first leaves: the second's labels now say how the route is written.
        m.gone("a");
        let (routes, _) = m.routes(now, GRACE);
        assert_eq!(routes[0].written["path_prefix"], "/other/");
    }

    #[test]
    fn a_route_whose_containers_all_die_at_once_is_held() {
        let (mut m, now) = (Model::default(), Instant::now());
        m.inspected(container("a", "rides", "10.0.0.1", rides()));
        pool(&mut m, now);
        m.gone("a");
        assert_eq!(pool(&mut m, now), [("rides".into(), vec![])]);
        assert_eq!(pool(&mut m, now + GRACE), []);
    }

    #[test]
    fn a_listing_drops_what_it_no_longer_has() {
        let (mut m, now) = (Model::default(), Instant::now());
        m.inspected(container("a", "rides", "10.0.0.1", rides()));
        m.inspected(container("b", "rides", "10.0.0.2", rides()));
        assert!(m.listed(&["b".into()]));
        assert!(!m.listed(&["b".into()]));
        assert_eq!(
            pool(&mut m, now),
            [("rides".into(), vec!["10.0.0.2".into()])]
        );
    }

    #[test]
    fn a_route_the_config_refuses_is_not_routed_and_its_containers_say_why() {
        let (mut m, now) = (Model::default(), Instant::now());
        m.inspected(container("a", "rides", "10.0.0.1", rides()));
        m.refuse(
            &rides(),
            vec!["floodgate.route.limits[0].capacity: must be > 0".into()],
        );
        let (routes, listed) = m.routes(now, GRACE);
        assert!(routes.is_empty());
        assert_eq!(listed[0].state, State::Invalid);
        assert!(listed[0].error.as_deref().unwrap().contains("capacity"));
    }
}
