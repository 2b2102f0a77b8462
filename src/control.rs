//! Control at run time: bans, by an operator (`PUT /bans` on the admin listener) or by a limit's
//! penalty box (`penalty: {denials, within, ban}`). The decider reads them before it asks the
//! store: a banned identity's request is refused (429 `banned`, with `Retry-After` until the ban
//! ends), never forwarded, counted as `decision="banned"`.
//!
//! The table is read on every request without a lock (an `ArcSwap` of an immutable map, empty
//! for most deployments: one atomic load and an `is_empty`), and written by copying it whole
//! (bans are few and rare). It lives in this process: it survives reloads, not restarts, and
//! another instance does not see it (the next step is a change feed in the shared store).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::limiter::KeyKind;

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

/// The bans, by identity (its key kind and bytes).
type BanTable = HashMap<(KeyKind, Vec<u8>), Vec<Ban>>;

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
            .get(&(kind, value.to_vec()))?
            .iter()
            .filter(|b| b.until_us > now_us && b.route.as_deref().is_none_or(|r| r == route))
            .map(|b| b.until_us - now_us)
            .max()
    }

    /// Adds a ban; returns its id.
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
    ) -> String {
        let id = format!("ban-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
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
                .entry((ban.kind, ban.value.clone()))
                .or_default()
                .push(ban.clone());
            table
        });
        id
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ban_holds_on_its_route_or_everywhere_until_it_ends_or_is_lifted() {
        let bans = Bans::default();
        assert_eq!(bans.banned("api", KeyKind::ApiKey, b"k", 0), None);
        let id = bans.add(
            Some("api".into()),
            KeyKind::ApiKey,
            b"k".to_vec(),
            10_000_000,
            "scraping".into(),
            "operator",
            0,
        );
        assert_eq!(
            bans.banned("api", KeyKind::ApiKey, b"k", 4_000_000),
            Some(6_000_000)
        );
        assert_eq!(bans.banned("other", KeyKind::ApiKey, b"k", 0), None);
        assert_eq!(bans.banned("api", KeyKind::UserId, b"k", 0), None);
        assert_eq!(bans.banned("api", KeyKind::ApiKey, b"k", 10_000_000), None);
        let everywhere = bans.add(
            None,
            KeyKind::Ip,
            vec![10, 0, 0, 1],
            5_000_000,
            String::new(),
            "operator",
            0,
        );
        assert!(bans.banned("any", KeyKind::Ip, &[10, 0, 0, 1], 0).is_some());
        assert_eq!(bans.list(0).len(), 2);
        assert!(bans.remove(&id));
        assert!(!bans.remove(&id));
        assert!(bans.remove(&everywhere));
        assert!(bans.list(0).is_empty());
    }
}
