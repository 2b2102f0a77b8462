//! `waiting_room:`: admission by turn when a surge outgrows the routes (`src/room.rs`).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::{RouteConfig, Validator, is_name};

/// One `waiting_room:` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomFile {
    pub name: String,
    pub routes: Vec<String>,
    pub active: Option<i64>,
    pub admit_rate: Option<f64>,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub activate: Option<String>,
    #[serde(default)]
    pub bypass_tiers: Vec<String>,
}

/// When a room admits by turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activate {
    /// From when one of its routes refuses for capacity (its adaptive gate sheds, or a
    /// `per: route` or `per: endpoint` limit refuses), until none has for `session`.
    Overloaded,
    /// Always.
    Always,
}

/// One waiting room.
#[derive(Debug, Clone, PartialEq)]
pub struct RoomConfig {
    pub name: Arc<str>,
    /// The routes it admits to, by name.
    pub routes: Vec<Arc<str>>,
    /// Clients admitted at once, every instance together.
    pub active: u64,
    /// New admissions a second, at most.
    pub admit_rate: f64,
    /// An admission lasts this long after the client's last request.
    pub session: Duration,
    pub activate: Activate,
    /// Tiers that pass without waiting.
    pub bypass_tiers: Vec<String>,
}

impl Validator {
    /// `waiting_room:`: names unique, each naming routes that exist (and no route in two rooms),
    /// `active` at least 1, `admit_rate` above 0, `session` above 0.
    pub(super) fn rooms(
        &mut self,
        file: Option<Vec<RoomFile>>,
        routes: &[RouteConfig],
    ) -> Vec<RoomConfig> {
        let mut rooms: Vec<RoomConfig> = Vec::new();
        for (n, room) in file.unwrap_or_default().into_iter().enumerate() {
            let path = format!("waiting_room[{n}]");
            if !is_name(&room.name) {
                self.problem(
                    format!("{path}.name"),
                    format!("{:?} must be letters, digits, '_', '.' or '-'", room.name),
                );
            } else if rooms.iter().any(|r| *r.name == *room.name) {
                self.problem(
                    format!("{path}.name"),
                    format!("{:?} names two rooms", room.name),
                );
            }
            if room.routes.is_empty() {
                self.problem(format!("{path}.routes"), "name at least one route");
            }
            let mut names = Vec::new();
            for (r, route) in room.routes.iter().enumerate() {
                let at = format!("{path}.routes[{r}]");
                match routes.iter().find(|c| *c.name == **route) {
                    None => self.problem(at, format!("no route is named {route:?}")),
                    Some(_)
                        if rooms
                            .iter()
                            .any(|o| o.routes.iter().any(|x| **x == **route)) =>
                    {
                        self.problem(at, format!("route {route:?} is in another room already"))
                    }
                    Some(config) => names.push(config.name.clone()),
                }
            }
            let active = match room.active {
                Some(n) if n >= 1 => n as u64,
                Some(n) => {
                    self.problem(format!("{path}.active"), format!("{n} must be at least 1"));
                    1
                }
                None => {
                    self.problem(
                        format!("{path}.active"),
                        "required: clients admitted at once",
                    );
                    1
                }
            };
            let admit_rate = match room.admit_rate {
                Some(r) if r.is_finite() && r > 0.0 => r,
                Some(r) => {
                    self.problem(format!("{path}.admit_rate"), format!("{r} must be above 0"));
                    1.0
                }
                None => {
                    self.problem(
                        format!("{path}.admit_rate"),
                        "required: admissions a second",
                    );
                    1.0
                }
            };
            let session = self.duration(
                &format!("{path}.session"),
                room.session.as_deref(),
                Duration::from_secs(300),
            );
            if session.is_zero() {
                self.problem(format!("{path}.session"), "must be longer than 0");
            }
            let activate = match room.activate.as_deref() {
                None | Some("overloaded") => Activate::Overloaded,
                Some("always") => Activate::Always,
                Some(other) => {
                    self.problem(
                        format!("{path}.activate"),
                        format!("{other:?} is not one of overloaded, always"),
                    );
                    Activate::Overloaded
                }
            };
            for (t, tier) in room.bypass_tiers.iter().enumerate() {
                if !is_name(tier) {
                    self.problem(
                        format!("{path}.bypass_tiers[{t}]"),
                        format!("{tier:?} must be letters, digits, '_', '.' or '-'"),
                    );
                }
            }
            rooms.push(RoomConfig {
                name: room.name.as_str().into(),
                routes: names,
                active,
                admit_rate,
                session,
                activate,
                bypass_tiers: room.bypass_tiers,
            });
        }
        rooms
    }
}
