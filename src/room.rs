//! Waiting rooms (`waiting_room:`): when a surge outgrows the routes, at most `active` clients
//! are admitted at once, every instance together, the others waiting their turn in line (first
//! come, first served), told their place and an estimated wait.
//!
//! - [`line`]: the line itself, pure: the memory store's (Redis keeps the same in a script,
//!   `limiter/redis/room.rs`, and PostgreSQL in a function, `limiter/sql/room.sql`);
//! - [`Room`]: a room's rules, whether it is open, a request's turn, its metrics; [`Rooms`]: the
//!   rooms by name, kept across reloads.

pub mod line;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::config::{Activate, RoomConfig};
use crate::limiter::{Limiter, LimiterError, RoomBounds, RoomEntered};
use crate::metrics::RoomMetrics;

/// Whether a request may go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Admitted (or the room is closed, or the request's tier passes).
    Enter,
    /// In line: its place (1: next) and its estimated wait.
    Wait { position: u64, eta_secs: u64 },
}

/// One waiting room: its rules, the line this instance keeps on the memory store, and when one
/// of its routes last refused for capacity.
pub struct Room {
    config: Mutex<RoomConfig>,
    line: Mutex<line::Line>,
    /// Milliseconds since [`epoch_ms`]'s start of the last refusal for capacity on one of its routes (0:
    /// none).
    overloaded_at: AtomicU64,
    metrics: RoomMetrics,
    /// The store's count of admissions when this instance last heard it (to move the counter by
    /// what changed since).
    admitted_seen: AtomicU64,
}

/// The clock rooms count in on this instance: milliseconds since the first asked.
fn epoch_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

impl Room {
    fn new(config: RoomConfig, metrics: RoomMetrics) -> Room {
        Room {
            config: Mutex::new(config),
            line: Mutex::default(),
            overloaded_at: AtomicU64::new(0),
            metrics,
            admitted_seen: AtomicU64::new(0),
        }
    }

    fn config(&self) -> std::sync::MutexGuard<'_, RoomConfig> {
        self.config.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn name(&self) -> Arc<str> {
        self.config().name.clone()
    }

    /// One of its routes refused a request for capacity (its gate shed it, or a `per: route`
    /// or `per: endpoint` limit refused it): under `activate: overloaded` the room opens.
    pub fn overloaded(&self) {
        self.overloaded_at.store(epoch_ms(), Ordering::Relaxed);
    }

    /// True when the room admits by turn now: always, or under `activate: overloaded` within a
    /// session of the last refusal for capacity.
    pub fn is_open(&self) -> bool {
        let config = self.config();
        match config.activate {
            Activate::Always => true,
            Activate::Overloaded => {
                let at = self.overloaded_at.load(Ordering::Relaxed);
                at != 0 && epoch_ms().saturating_sub(at) < config.session.as_millis() as u64
            }
        }
    }

    /// True when a request of `tier` passes without waiting.
    pub fn bypasses(&self, tier: &str) -> bool {
        self.config().bypass_tiers.iter().any(|t| t == tier)
    }

    /// The turn of the client whose identity is `client` (its kind and bytes): from the store
    /// every instance shares, or (the memory store) this instance's line. A store that fails
    /// lets the request in (never a wait on a broken room).
    pub async fn enter(&self, limiter: &Limiter, client: &[u8]) -> Result<Turn, LimiterError> {
        let (name, bounds, rate) = {
            let config = self.config();
            let bounds = RoomBounds {
                active: config.active,
                admit_rate: config.admit_rate,
                session_ms: config.session.as_millis() as u64,
                linger_ms: line::LINGER_MS,
                max_line: line::MAX_LINE,
            };
            (config.name.clone(), bounds, config.admit_rate)
        };
        let digest = crate::limiter::hex(&Sha256::digest(client)[..16]);
        let entered = match limiter.room_enter(&name, &digest, bounds).await? {
            Some(entered) => entered,
            None => {
                let mut line = self.line.lock().unwrap_or_else(|p| p.into_inner());
                line.enter(digest.as_bytes(), epoch_ms(), bounds)
            }
        };
        self.publish(&entered);
        Ok(match entered.admitted {
            true => Turn::Enter,
            false => Turn::Wait {
                position: entered.position,
                eta_secs: (entered.position as f64 / rate).ceil() as u64,
            },
        })
    }

    fn publish(&self, entered: &RoomEntered) {
        self.metrics.active.set(entered.active as i64);
        self.metrics.waiting.set(entered.waiting as i64);
        let seen = self
            .admitted_seen
            .fetch_max(entered.admitted_total, Ordering::Relaxed);
        if entered.admitted_total > seen {
            self.metrics.admitted.inc_by(entered.admitted_total - seen);
        }
    }
}

/// The rooms, by name: kept across reloads (a room keeps its line while its name stays).
#[derive(Default)]
pub struct Rooms(Mutex<HashMap<Arc<str>, Arc<Room>>>);

impl Rooms {
    /// Each of `routes`' room (`None` for a route in none), the rooms made or updated from
    /// `configs`.
    pub fn for_routes(
        &self,
        configs: &[RoomConfig],
        routes: &[Arc<str>],
        metrics: impl Fn(&str) -> RoomMetrics,
    ) -> Vec<Option<Arc<Room>>> {
        let mut rooms = self.0.lock().unwrap_or_else(|p| p.into_inner());
        rooms.retain(|name, _| configs.iter().any(|c| c.name == *name));
        for config in configs {
            match rooms.get(&config.name) {
                Some(room) => *room.config() = config.clone(),
                None => {
                    let room = Room::new(config.clone(), metrics(&config.name));
                    rooms.insert(config.name.clone(), Arc::new(room));
                }
            }
        }
        routes
            .iter()
            .map(|route| {
                let config = configs.iter().find(|c| c.routes.contains(route))?;
                rooms.get(&config.name).cloned()
            })
            .collect()
    }
}
