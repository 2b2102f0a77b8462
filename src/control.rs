//! Control at run time: what operators change while floodgate runs, and the penalty box.
//!
//! - **Bans** (`PUT /bans`, or a limit's `penalty: {denials, within, ban}`): a banned identity's
//!   requests are refused (429 `banned`, `Retry-After` until the ban ends), never forwarded,
//!   counted as `decision="banned"`.
//! - **Overrides** (`PUT /overrides`): an identity's limits on a route are others until the
//!   override is deleted or ends. Its budgets are its own (they start full).
//! - **Resets** (`POST /reset`): an identity's budgets on a route are full again.
//!
//! The decider reads bans and overrides before it asks the store ([`Control::find`]). The
//! tables are read on every request without a lock (an `ArcSwap` of immutable maps, empty for
//! most deployments: one atomic load and two `is_empty`s), and written by copying them whole
//! (changes are few and rare). They are keyed by the identity's bytes, so a look-up borrows the
//! request's bytes and is one hash look-up per table that has entries.
//!
//! With a shared store (Redis, PostgreSQL), every change is also an entry of the store's
//! control list ([`share`]), which every instance follows ([`follow`]: the list's version read
//! every [`FOLLOW_EVERY`], the entries when it changed): a change reaches every instance within
//! a second and survives restarts. A reset's entry lives a few seconds, long enough for every
//! instance to forget what it kept of the budgets (cached denials, leases). With the memory
//! store (one instance) they live in the process, and end with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::limiter::{KeyKind, Limiter, wall_clock_us};

mod entry;

pub use entry::{Ban, Entry, Override, OverrideFor, Purge, PurgeScope, Reset};

/// How often an instance reads the shared list's version.
pub const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(300);

/// How long the entry of an event (a reset, a cache purge) stays in the shared list: every
/// instance reads the list several times in it, and applies it once.
pub const EVENT_LIVES: std::time::Duration = std::time::Duration::from_secs(5);

/// When an event written now ends (µs since the Unix epoch): [`EVENT_LIVES`] from now.
pub fn event_ends_us() -> u64 {
    let lives = u64::try_from(EVENT_LIVES.as_micros()).unwrap_or(u64::MAX);
    crate::limiter::wall_clock_us().saturating_add(lives)
}

/// What is in force, by the identity's bytes (its kind checked on each entry). Keys and lists
/// are shared, so copying the tables for a write copies pointers, not entries.
#[derive(Debug, Default, Clone)]
struct Tables {
    bans: HashMap<Arc<[u8]>, Arc<[Ban]>>,
    overrides: HashMap<Arc<[u8]>, Arc<[Arc<Override>]>>,
}

impl Tables {
    /// How many bans and overrides there are.
    fn entries(&self) -> usize {
        let count = |lists: &mut dyn Iterator<Item = usize>| lists.sum::<usize>();
        count(&mut self.bans.values().map(|l| l.len()))
            + count(&mut self.overrides.values().map(|l| l.len()))
    }

    /// Drops what ended before `now_us` (a list is copied only when something in it ended).
    fn prune(&mut self, now_us: u64) {
        prune_map(&mut self.bans, |b| b.until_us > now_us);
        prune_map(&mut self.overrides, |o| o.until_us > now_us);
    }
}

/// Keeps the entries of `map` that `keep`, and the identities left with any.
fn prune_map<T: Clone>(map: &mut HashMap<Arc<[u8]>, Arc<[T]>>, keep: impl Fn(&T) -> bool) {
    map.retain(|_, list| {
        if !list.iter().all(&keep) {
            *list = list.iter().filter(|e| keep(e)).cloned().collect();
        }
        !list.is_empty()
    });
}

/// `map` with `entry` added to `value`'s list, less the entries of it `drop` picks.
fn push<T: Clone>(
    map: &mut HashMap<Arc<[u8]>, Arc<[T]>>,
    value: &[u8],
    entry: T,
    drop: impl Fn(&T) -> bool,
) {
    let list: Arc<[T]> = map
        .get(value)
        .into_iter()
        .flat_map(|list| list.iter())
        .filter(|e| !drop(e))
        .cloned()
        .chain(std::iter::once(entry))
        .collect();
    map.insert(Arc::from(value), list);
}

/// What applies to one request (see [`Control::find`]).
#[derive(Debug, Default)]
pub struct Found {
    /// Banned: the µs until the ban (the one ending last) ends.
    pub banned_us: Option<u64>,
    /// The override of the identity's limits on the route.
    pub over: Option<Arc<Override>>,
}

/// The bans and overrides in force.
#[derive(Debug, Default)]
pub struct Control {
    tables: ArcSwap<Tables>,
    next: AtomicU64,
    /// The purges this instance made itself (`Control::note_own_purge`): its follower does not
    /// purge again what was filled since.
    own_purges: std::sync::Mutex<HashSet<String>>,
}

/// Shared by the proxy (its decider), the admin listener and the follower.
pub type SharedControl = Arc<Control>;

impl Control {
    /// True when nothing is in force (the usual case: one load).
    pub fn is_empty(&self) -> bool {
        let tables = self.tables.load();
        tables.bans.is_empty() && tables.overrides.is_empty()
    }

    /// The ban and the override of `kind`/`value` on `route` (a ban on every route counts).
    /// The clock is read only when the identity has an entry.
    pub fn find(&self, route: &str, kind: KeyKind, value: &[u8]) -> Found {
        let tables = self.tables.load();
        let mut found = Found::default();
        if tables.bans.is_empty() && tables.overrides.is_empty() {
            return found;
        }
        let mut now = None;
        let mut now = || *now.get_or_insert_with(wall_clock_us);
        if let Some(bans) = tables.bans.get(value) {
            let now = now();
            found.banned_us = bans
                .iter()
                .filter(|b| {
                    b.kind == kind
                        && b.until_us > now
                        && b.route.as_deref().is_none_or(|r| r == route)
                })
                .map(|b| b.until_us - now)
                .max();
        }
        if let Some(overrides) = tables.overrides.get(value) {
            let now = now();
            found.over = overrides
                .iter()
                .find(|o| o.kind == kind && o.until_us > now && *o.route == *route)
                .cloned();
        }
        found
    }

    /// The µs until `kind`/`value`'s ban on `route` ends, if it is banned.
    pub fn banned(&self, route: &str, kind: KeyKind, value: &[u8]) -> Option<u64> {
        if self.tables.load().bans.is_empty() {
            return None;
        }
        self.find(route, kind, value).banned_us
    }

    /// A new entry's id: `{what}-` and 16 hex digits, random (instances sharing a list never
    /// collide).
    pub fn new_id(&self, what: &str) -> String {
        use std::hash::BuildHasher;
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let seed = std::hash::RandomState::new().hash_one((wall_clock_us(), n));
        format!("{what}-{seed:016x}")
    }

    /// Notes that this instance made purge `id` itself: the follower skips it.
    pub fn note_own_purge(&self, id: &str) {
        let mut own = self.own_purges.lock().unwrap_or_else(|p| p.into_inner());
        own.insert(id.to_string());
    }

    /// True (once: it is forgotten) when this instance made purge `id` itself.
    pub fn take_own_purge(&self, id: &str) -> bool {
        let mut own = self.own_purges.lock().unwrap_or_else(|p| p.into_inner());
        own.remove(id)
    }

    /// Adds a ban (ended entries go as it comes).
    pub fn ban(&self, ban: Ban) {
        let now = wall_clock_us();
        self.tables.rcu(|tables| {
            let mut tables = Tables::clone(tables);
            tables.prune(now);
            push(&mut tables.bans, &ban.value, ban.clone(), |_| false);
            tables
        });
    }

    /// Sets an override: it replaces the identity's earlier override on the same route.
    pub fn set_override(&self, over: Arc<Override>) {
        let now = wall_clock_us();
        self.tables.rcu(|tables| {
            let mut tables = Tables::clone(tables);
            tables.prune(now);
            push(&mut tables.overrides, &over.value, over.clone(), |o| {
                o.kind == over.kind && o.route == over.route
            });
            tables
        });
    }

    /// The ban or override `id`, ended or not.
    pub fn entry(&self, id: &str) -> Option<Entry> {
        let tables = self.tables.load();
        if let Some(ban) = tables
            .bans
            .values()
            .flat_map(|l| l.iter())
            .find(|b| b.id == id)
        {
            return Some(Entry::Ban(ban.clone()));
        }
        tables
            .overrides
            .values()
            .flat_map(|l| l.iter())
            .find(|o| o.id == id)
            .map(|o| Entry::Override(o.clone()))
    }

    /// Removes the ban or override `id`; false when there is none.
    pub fn remove(&self, id: &str) -> bool {
        let mut found = false;
        self.tables.rcu(|tables| {
            let before = tables.entries();
            let mut tables = Tables::clone(tables);
            prune_map(&mut tables.bans, |b| b.id != id);
            prune_map(&mut tables.overrides, |o| o.id != id);
            found = tables.entries() != before;
            tables
        });
        found
    }

    /// The tables become the shared list's entries (read again).
    pub fn replace(&self, bans: Vec<Ban>, overrides: Vec<Arc<Override>>) {
        let mut by_value: HashMap<Vec<u8>, Vec<Ban>> = HashMap::new();
        for ban in bans {
            by_value.entry(ban.value.clone()).or_default().push(ban);
        }
        let mut over_by_value: HashMap<Vec<u8>, Vec<Arc<Override>>> = HashMap::new();
        for over in overrides {
            over_by_value
                .entry(over.value.clone())
                .or_default()
                .push(over);
        }
        let tables = Tables {
            bans: by_value
                .into_iter()
                .map(|(k, v)| (Arc::from(k), Arc::from(v)))
                .collect(),
            overrides: over_by_value
                .into_iter()
                .map(|(k, v)| (Arc::from(k), Arc::from(v)))
                .collect(),
        };
        self.tables.store(Arc::new(tables));
    }

    /// The override of `kind`/`value` on `route`, ended or not.
    pub fn override_for(&self, route: &str, kind: KeyKind, value: &[u8]) -> Option<Arc<Override>> {
        self.tables
            .load()
            .overrides
            .get(value)?
            .iter()
            .find(|o| o.kind == kind && o.route == route)
            .cloned()
    }

    /// The bans in force at `now_us`, by id.
    pub fn bans(&self, now_us: u64) -> Vec<Ban> {
        let mut out: Vec<Ban> = self
            .tables
            .load()
            .bans
            .values()
            .flat_map(|list| list.iter())
            .filter(|b| b.until_us > now_us)
            .cloned()
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The overrides in force at `now_us`, by id.
    pub fn overrides(&self, now_us: u64) -> Vec<Arc<Override>> {
        let mut out: Vec<Arc<Override>> = self
            .tables
            .load()
            .overrides
            .values()
            .flat_map(|list| list.iter())
            .filter(|o| o.until_us > now_us)
            .cloned()
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

/// Writes `changes` to the store's shared list, all or none (each an id and its entry, `None`:
/// it goes), if the store keeps one. The caller applies a change here only once this is `Ok`: an
/// instance never keeps a change the store did not take.
///
/// A failure may be a timeout of a write the store then applies late (a stopped Redis answers
/// when it resumes). So on a failure the changes' inverse (`undo`) is sent at once, on the same
/// connection and so after the write: whatever became of the write, the list ends as it was.
pub async fn share(
    limiter: &Limiter,
    changes: &[(&str, Option<&Entry>)],
    undo: &[(&str, Option<&Entry>)],
) -> Result<(), crate::limiter::LimiterError> {
    let texts: Vec<(String, Option<String>)> = changes
        .iter()
        .map(|(id, e)| (id.to_string(), e.map(Entry::to_json)))
        .collect();
    let borrowed: Vec<_> = texts
        .iter()
        .map(|(id, e)| (id.as_str(), e.as_deref()))
        .collect();
    let Err(e) = limiter.control_write(&borrowed).await else {
        return Ok(());
    };
    if undo.is_empty() {
        return Err(e);
    }
    let undo: Vec<(String, Option<String>)> = undo
        .iter()
        .map(|(id, e)| (id.to_string(), e.map(Entry::to_json)))
        .collect();
    let limiter = limiter.clone();
    tokio::spawn(async move {
        let borrowed: Vec<_> = undo
            .iter()
            .map(|(id, e)| (id.as_str(), e.as_deref()))
            .collect();
        if let Err(e) = limiter.control_write(&borrowed).await {
            let ids: Vec<&str> = borrowed.iter().map(|(id, _)| *id).collect();
            tracing::warn!(?ids, error = %e, "undoing a change the store did not acknowledge failed too: if the store applied it late, every instance follows it");
        }
    });
    Err(e)
}

/// Removes ended entry `id` from the shared list (the follower's housekeeping; a failure is
/// tried again at the next read).
async fn sweep(limiter: &Limiter, id: &str) {
    if let Err(e) = limiter.control_write(&[(id, None)]).await {
        tracing::debug!(%id, error = %e, "removing an ended entry from the shared list failed");
    }
}

/// Follows the store's shared list, forever (returns at once when the store keeps none): the
/// version every [`FOLLOW_EVERY`]; when it changed, every entry: bans and overrides become the
/// tables, each reset not seen before has this instance forget what it kept of the budgets,
/// each purge not seen before (and not made here) goes to `purge` (the cache's), ended entries
/// are removed from the list.
pub async fn follow(control: SharedControl, limiter: Limiter, purge: impl Fn(&Purge)) {
    let mut known: Option<String> = None;
    // Resets and purges this instance applied (its own included), while their entries last.
    let mut applied: HashSet<String> = HashSet::new();
    // The entries as last read, by their text: an entry read again is not parsed again (an
    // override's limits are built once, however many overrides the list holds).
    let mut parsed: HashMap<String, Option<Entry>> = HashMap::new();
    loop {
        match limiter.control_read(known.clone()).await {
            Ok(None) => return,
            Ok(Some(list)) => {
                if let Some(entries) = list.entries {
                    let now = wall_clock_us();
                    let (mut bans, mut overrides, mut resets) =
                        (Vec::new(), Vec::new(), Vec::new());
                    let mut purges = Vec::new();
                    let mut now_parsed = HashMap::with_capacity(entries.len());
                    for text in entries {
                        let entry = match parsed.remove(&text) {
                            Some(entry) => entry,
                            None => Entry::from_json(&text),
                        };
                        now_parsed.insert(text, entry.clone());
                        let Some(entry) = entry else {
                            continue;
                        };
                        if entry.until_us() <= now {
                            sweep(&limiter, entry.id()).await;
                            continue;
                        }
                        match entry {
                            Entry::Ban(ban) => bans.push(ban),
                            Entry::Override(over) => overrides.push(over),
                            Entry::Reset(reset) => resets.push(reset),
                            Entry::Purge(p) => purges.push(p),
                        }
                    }
                    parsed = now_parsed;
                    control.replace(bans, overrides);
                    for reset in &resets {
                        if applied.insert(reset.id.clone()) {
                            limiter.forget(&reset.keys());
                        }
                    }
                    for p in &purges {
                        if applied.insert(p.id.clone()) && !control.take_own_purge(&p.id) {
                            purge(p);
                        }
                    }
                    applied.retain(|id| {
                        resets.iter().any(|r| r.id == *id) || purges.iter().any(|p| p.id == *id)
                    });
                }
                known = Some(list.version);
            }
            Err(e) => tracing::debug!(error = %e, "reading the shared control list failed"),
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// How an identity is shown in listings, logs and alerts: API keys, user ids and subjects
/// hashed (as `/top` shows them), consumers by name, addresses as written.
pub fn label(kind: KeyKind, value: &[u8]) -> String {
    use sha2::Digest;
    match kind {
        KeyKind::Consumer => format!("consumer:{}", String::from_utf8_lossy(value)),
        KeyKind::Route => "route".into(),
        KeyKind::Ip => match value.len() {
            4 => std::net::IpAddr::from(<[u8; 4]>::try_from(value).unwrap_or_default()).to_string(),
            16 => {
                std::net::IpAddr::from(<[u8; 16]>::try_from(value).unwrap_or_default()).to_string()
            }
            _ => "ip:?".into(),
        },
        other => {
            let digest = sha2::Sha256::digest(value);
            format!("{}:{}…", other.as_str(), crate::limiter::hex(&digest[..6]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ban(
        control: &Control,
        route: Option<&str>,
        kind: KeyKind,
        value: &[u8],
        until: u64,
    ) -> String {
        let ban = Ban {
            id: control.new_id("ban"),
            route: route.map(str::to_string),
            kind,
            value: value.to_vec(),
            until_us: until,
            reason: "scraping".into(),
            by: "operator",
        };
        control.ban(ban.clone());
        ban.id
    }

    #[test]
    fn a_ban_holds_on_its_route_or_everywhere_until_it_ends_or_is_lifted() {
        let control = Control::default();
        let far = wall_clock_us() + 3_600_000_000;
        assert!(control.is_empty());
        assert_eq!(control.banned("api", KeyKind::ApiKey, b"k"), None);
        let id = ban(&control, Some("api"), KeyKind::ApiKey, b"k", far);
        let wait = control.banned("api", KeyKind::ApiKey, b"k").unwrap();
        assert!(wait > 3_590_000_000 && wait <= 3_600_000_000, "{wait}");
        assert_eq!(control.banned("other", KeyKind::ApiKey, b"k"), None);
        assert_eq!(control.banned("api", KeyKind::UserId, b"k"), None);
        let ended = ban(&control, Some("api"), KeyKind::Ip, b"e", 1);
        assert_eq!(control.banned("api", KeyKind::Ip, b"e"), None);
        let everywhere = ban(&control, None, KeyKind::Ip, &[10, 0, 0, 1], far);
        assert!(control.banned("any", KeyKind::Ip, &[10, 0, 0, 1]).is_some());
        // The ended ban went when the next came.
        assert_eq!(control.bans(0).len(), 2);
        assert!(!control.remove(&ended));
        assert!(control.remove(&id));
        assert!(!control.remove(&id));
        assert!(control.remove(&everywhere));
        assert!(control.bans(0).is_empty());
        assert!(control.is_empty());
    }

    fn over(control: &Control, value: &[u8], until_us: u64) -> Arc<Override> {
        Arc::new(Override {
            id: control.new_id("ovr"),
            route: "api".into(),
            kind: KeyKind::ApiKey,
            value: value.to_vec(),
            until_us,
            limits: serde_json::Value::Null,
            budget: Default::default(),
        })
    }

    #[test]
    fn an_identitys_override_replaces_its_earlier_one_and_ends() {
        let control = Control::default();
        let first = over(&control, b"k", u64::MAX);
        control.set_override(first.clone());
        let found = control.find("api", KeyKind::ApiKey, b"k").over.unwrap();
        assert_eq!(found.id, first.id);
        assert!(control.find("web", KeyKind::ApiKey, b"k").over.is_none());
        assert!(control.find("api", KeyKind::Consumer, b"k").over.is_none());
        let second = over(&control, b"k", u64::MAX);
        control.set_override(second.clone());
        assert_eq!(control.overrides(0).len(), 1);
        assert_eq!(
            control
                .override_for("api", KeyKind::ApiKey, b"k")
                .unwrap()
                .id,
            second.id
        );
        // Ended: not applied, and gone at the next write.
        control.set_override(over(&control, b"old", 1));
        assert!(control.find("api", KeyKind::ApiKey, b"old").over.is_none());
        control.set_override(over(&control, b"other", u64::MAX));
        assert_eq!(control.overrides(0).len(), 2);
        assert!(!control.remove(&first.id));
        assert!(control.remove(&second.id));
        assert_eq!(control.overrides(0).len(), 1);
    }
}
