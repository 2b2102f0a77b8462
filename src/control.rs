//! Control at run time: bans, by an operator (`PUT /bans` on the admin listener) or by a limit's
//! penalty box (`penalty: {denials, within, ban}`). The decider reads them before it asks the
//! store: a banned identity's request is refused (429 `banned`, with `Retry-After` until the ban
//! ends), never forwarded, counted as `decision="banned"`.
//!
//! The table is read on every request without a lock (an `ArcSwap` of an immutable map, empty
//! for most deployments: one atomic load and an `is_empty`), and written by copying it whole
//! (bans are few and rare). With Redis as the store, every ban is also written to a list there
//! (a hash and a version key: `RemoteStore::control_write`), and every instance follows that list
//! ([`follow`]: the version read every [`FOLLOW_EVERY`], the list when it changed), so a ban
//! reaches every instance within a second, and survives restarts. With the memory store (one
//! instance) and, for now, PostgreSQL, bans live in the process.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::limiter::{KeyKind, Limiter};

/// How often an instance reads the shared list's version.
pub const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(300);

/// One ban: whose, on which route (`None`: every route), until when, why.
#[derive(Debug, Clone)]
pub struct Ban {
    pub id: String,
    pub route: Option<String>,
    pub kind: KeyKind,
    /// The identity's bytes as the decider keys budgets (an API key, a consumer's name, a user
    /// id or subject, an address's octets).
    pub value: Vec<u8>,
    /// When it ends (µs since the Unix epoch).
    pub until_us: u64,
    pub reason: String,
    /// `operator` or `penalty`.
    pub by: &'static str,
}

/// The bans, by the identity's bytes (its kind checked on each ban): a lookup borrows the
/// request's bytes, copying nothing.
type BanTable = HashMap<Vec<u8>, Vec<Ban>>;

/// The bans in force, by identity.
#[derive(Debug, Default)]
pub struct Bans {
    table: ArcSwap<BanTable>,
    next: AtomicU64,
}

impl Bans {
    /// True when no ban was ever set or every one was lifted (the usual case: one load).
    pub fn is_empty(&self) -> bool {
        self.table.load().is_empty()
    }

    /// The ban of `kind`/`value` on `route` (or on every route) still in force at `now_us`,
    /// ending last: the seconds until it ends.
    pub fn banned(&self, route: &str, kind: KeyKind, value: &[u8], now_us: u64) -> Option<u64> {
        let table = self.table.load();
        if table.is_empty() {
            return None;
        }
        table
            .get(value)?
            .iter()
            .filter(|b| {
                b.kind == kind
                    && b.until_us > now_us
                    && b.route.as_deref().is_none_or(|r| r == route)
            })
            .map(|b| b.until_us - now_us)
            .max()
    }

    /// Adds a ban; returns it (its id is random: instances sharing a list never collide).
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &self,
        route: Option<String>,
        kind: KeyKind,
        value: Vec<u8>,
        until_us: u64,
        reason: String,
        by: &'static str,
        now_us: u64,
    ) -> Ban {
        use std::hash::BuildHasher;
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "ban-{:016x}",
            std::hash::RandomState::new().hash_one((now_us, n))
        );
        let ban = Ban {
            id: id.clone(),
            route,
            kind,
            value,
            until_us,
            reason,
            by,
        };
        self.table.rcu(|table| {
            let mut table: BanTable = (**table).clone();
            // Ended bans go as a new one comes.
            for bans in table.values_mut() {
                bans.retain(|b| b.until_us > now_us);
            }
            table.retain(|_, bans| !bans.is_empty());
            table
                .entry(ban.value.clone())
                .or_default()
                .push(ban.clone());
            table
        });
        ban
    }

    /// The table becomes `bans` (the shared list, read again).
    pub fn replace(&self, bans: Vec<Ban>) {
        let mut table = BanTable::new();
        for ban in bans {
            table.entry(ban.value.clone()).or_default().push(ban);
        }
        self.table.store(Arc::new(table));
    }

    /// Lifts the ban `id`; false when there is none.
    pub fn remove(&self, id: &str) -> bool {
        let mut found = false;
        self.table.rcu(|table| {
            let mut table: BanTable = (**table).clone();
            for bans in table.values_mut() {
                let before = bans.len();
                bans.retain(|b| b.id != id);
                found |= bans.len() != before;
            }
            table.retain(|_, bans| !bans.is_empty());
            table
        });
        found
    }

    /// The bans in force at `now_us`.
    pub fn list(&self, now_us: u64) -> Vec<Ban> {
        let mut out: Vec<Ban> = self
            .table
            .load()
            .values()
            .flatten()
            .filter(|b| b.until_us > now_us)
            .cloned()
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

/// Shared by the proxy (its decider) and the admin listener.
pub type SharedBans = Arc<Bans>;

impl Ban {
    /// Its entry in the shared list.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "id": self.id,
            "route": self.route,
            "kind": self.kind.as_str(),
            "value": crate::limiter::hex(&self.value),
            "until_us": self.until_us,
            "reason": self.reason,
            "by": self.by,
        })
        .to_string()
    }

    /// A ban from its entry in the shared list (`None`: not one floodgate wrote).
    pub fn from_json(text: &str) -> Option<Ban> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let kind = [
            KeyKind::ApiKey,
            KeyKind::Consumer,
            KeyKind::Jwt,
            KeyKind::UserId,
            KeyKind::Ip,
            KeyKind::Route,
            KeyKind::Request,
        ]
        .into_iter()
        .find(|k| Some(k.as_str()) == v["kind"].as_str())?;
        let hex = v["value"].as_str()?;
        let value = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(Ban {
            id: v["id"].as_str()?.to_string(),
            route: v["route"].as_str().map(str::to_string),
            kind,
            value,
            until_us: v["until_us"].as_u64()?,
            reason: v["reason"].as_str().unwrap_or("").to_string(),
            by: match v["by"].as_str() {
                Some("penalty") => "penalty",
                _ => "operator",
            },
        })
    }
}

/// Writes `ban` to the store's shared list (`None` for `id`: removes it), if the store keeps
/// one; a failure is logged (the ban holds here, and the next write or restart does not
/// bring it back to the others).
pub async fn share(limiter: &Limiter, id: &str, ban: Option<&Ban>) {
    let entry = ban.map(Ban::to_json);
    if let Err(e) = limiter.control_write(id, entry.as_deref()).await {
        tracing::warn!(%id, error = %e, "the ban could not be written to the store: it holds on this instance only");
    }
}

/// Follows the store's shared list, forever (returns at once when the store keeps none): the
/// version every [`FOLLOW_EVERY`], the whole list when it changed, ended bans removed from it.
pub async fn follow(bans: SharedBans, limiter: Limiter) {
    let mut known: Option<String> = None;
    loop {
        match limiter.control_read(known.clone()).await {
            Ok(None) => return,
            Ok(Some(list)) => {
                if let Some(entries) = list.entries {
                    let now = crate::limiter::wall_clock_us();
                    let mut live = Vec::new();
                    for entry in &entries {
                        match Ban::from_json(entry) {
                            Some(ban) if ban.until_us > now => live.push(ban),
                            Some(ban) => share(&limiter, &ban.id, None).await,
                            None => {}
                        }
                    }
                    bans.replace(live);
                }
                known = Some(list.version);
            }
            Err(e) => tracing::debug!(error = %e, "reading the shared bans failed"),
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ban_holds_on_its_route_or_everywhere_until_it_ends_or_is_lifted() {
        let bans = Bans::default();
        assert_eq!(bans.banned("api", KeyKind::ApiKey, b"k", 0), None);
        let id = bans
            .add(
                Some("api".into()),
                KeyKind::ApiKey,
                b"k".to_vec(),
                10_000_000,
                "scraping".into(),
                "operator",
                0,
            )
            .id;
        assert_eq!(
            bans.banned("api", KeyKind::ApiKey, b"k", 4_000_000),
            Some(6_000_000)
        );
        assert_eq!(bans.banned("other", KeyKind::ApiKey, b"k", 0), None);
        assert_eq!(bans.banned("api", KeyKind::UserId, b"k", 0), None);
        assert_eq!(bans.banned("api", KeyKind::ApiKey, b"k", 10_000_000), None);
        let everywhere = bans
            .add(
                None,
                KeyKind::Ip,
                vec![10, 0, 0, 1],
                5_000_000,
                String::new(),
                "operator",
                0,
            )
            .id;
        let entry = bans
            .list(0)
            .iter()
            .find(|b| b.id == everywhere)
            .unwrap()
            .to_json();
        let back = Ban::from_json(&entry).unwrap();
        assert_eq!(
            (back.kind, back.value.as_slice(), back.until_us),
            (KeyKind::Ip, &[10u8, 0, 0, 1][..], 5_000_000)
        );
        assert!(bans.banned("any", KeyKind::Ip, &[10, 0, 0, 1], 0).is_some());
        assert_eq!(bans.list(0).len(), 2);
        assert!(bans.remove(&id));
        assert!(!bans.remove(&id));
        assert!(bans.remove(&everywhere));
        assert!(bans.list(0).is_empty());
    }
}
