//! The control list's entries: a ban, an override, a reset, a cache purge, and how each is
//! written in the store's shared list (a JSON object; a ban's has no `type`, as the first ones were written).

use serde_json::{Value, json};

use crate::config::Budget;
use crate::limiter::{BudgetKey, KeyKind, hex};

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

/// One override: an identity's limits on a route, in place of the route's enforced limits.
#[derive(Debug, Clone)]
pub struct Override {
    pub id: String,
    pub route: String,
    pub kind: KeyKind,
    pub value: Vec<u8>,
    /// When it ends (µs since the Unix epoch); `u64::MAX`: when it is deleted.
    pub until_us: u64,
    /// The limits as the operator wrote them (`routes[].limits` syntax).
    pub limits: Value,
    /// Those limits, built: their store ids are the override's own ([`Override::store_name`]).
    pub budget: Budget,
}

/// Who an override is for: the route and the identity.
pub struct OverrideFor {
    pub route: String,
    pub kind: KeyKind,
    pub value: Vec<u8>,
}

impl Override {
    /// Override `id` for `whom`, its `limits` (as written) built and checked as
    /// `routes[].limits` are (a claim key needs `verifies_tokens`).
    pub fn build(
        id: String,
        whom: OverrideFor,
        until_us: u64,
        limits: Value,
        verifies_tokens: bool,
    ) -> Result<Override, crate::config::ConfigError> {
        let store_name = Override::store_name(&whom.route, &id);
        let budget = crate::config::override_budget(
            &whom.route,
            &store_name,
            limits.clone(),
            verifies_tokens,
        )?;
        Ok(Override {
            id,
            route: whom.route,
            kind: whom.kind,
            value: whom.value,
            until_us,
            limits,
            budget,
        })
    }

    /// What an override's budgets are named by in the store: the route and the override's id,
    /// so that they start full and no other override shares them.
    pub fn store_name(route: &str, id: &str) -> String {
        format!("{route}~{id}")
    }
}

/// One reset: an identity's budgets (their ids) that were made full again. Its entry tells the
/// other instances to forget what they kept of them.
#[derive(Debug, Clone)]
pub struct Reset {
    pub id: String,
    pub budgets: Vec<String>,
    pub kind: KeyKind,
    pub value: Vec<u8>,
    /// When its entry goes (µs since the Unix epoch).
    pub until_us: u64,
}

impl Reset {
    /// The budgets' keys.
    pub fn keys(&self) -> Vec<BudgetKey<'_>> {
        self.budgets
            .iter()
            .map(|budget| BudgetKey {
                budget,
                kind: self.kind,
                value: &self.value,
            })
            .collect()
    }
}

/// What a cache purge removes of a route's entries (`POST /cache/purge`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeScope {
    /// All of them.
    Route,
    /// Every query variant of one client path.
    Path(String),
    /// Every path under a prefix.
    Prefix(String),
    /// One URI's entries, every variant (an unsafe method answered 2xx or 3xx: RFC 9111 §4.4).
    Uri {
        host: String,
        path: String,
        query: Option<String>,
    },
}

impl PurgeScope {
    /// What it names of a route's entries, as the shared cache's store reads it.
    pub fn as_cache_scope(&self) -> crate::limiter::CacheScope<'_> {
        use crate::limiter::CacheScope;
        match self {
            PurgeScope::Route => CacheScope::Route,
            PurgeScope::Path(p) => CacheScope::Path(p),
            PurgeScope::Prefix(p) => CacheScope::Prefix(p),
            PurgeScope::Uri { host, path, query } => CacheScope::Uri {
                host,
                path,
                query: query.as_deref(),
            },
        }
    }
}

/// One cache purge: a route's entries that went on the instance that was asked. Its entry tells
/// the other instances to remove theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purge {
    pub id: String,
    pub route: String,
    pub scope: PurgeScope,
    /// When its entry goes (µs since the Unix epoch).
    pub until_us: u64,
}

impl Purge {
    /// True for an entry of `route` at `host`, client path `path` and `query` that the purge
    /// removes.
    pub fn covers(&self, route: &str, host: &str, path: &str, query: Option<&str>) -> bool {
        self.route == route && self.scope.as_cache_scope().covers(host, path, query)
    }
}

/// An entry of the shared list.
#[derive(Debug, Clone)]
pub enum Entry {
    Ban(Ban),
    Override(std::sync::Arc<Override>),
    Reset(Reset),
    Purge(Purge),
}

impl Entry {
    pub fn id(&self) -> &str {
        match self {
            Entry::Ban(b) => &b.id,
            Entry::Override(o) => &o.id,
            Entry::Reset(r) => &r.id,
            Entry::Purge(p) => &p.id,
        }
    }

    /// When it ends (µs since the Unix epoch).
    pub fn until_us(&self) -> u64 {
        match self {
            Entry::Ban(b) => b.until_us,
            Entry::Override(o) => o.until_us,
            Entry::Reset(r) => r.until_us,
            Entry::Purge(p) => p.until_us,
        }
    }

    /// Its text in the shared list.
    pub fn to_json(&self) -> String {
        match self {
            Entry::Ban(b) => json!({
                "id": b.id,
                "route": b.route,
                "kind": b.kind.as_str(),
                "value": hex(&b.value),
                "until_us": b.until_us,
                "reason": b.reason,
                "by": b.by,
            }),
            Entry::Override(o) => json!({
                "type": "override",
                "id": o.id,
                "route": o.route,
                "kind": o.kind.as_str(),
                "value": hex(&o.value),
                "until_us": o.until_us,
                "limits": o.limits,
            }),
            Entry::Reset(r) => json!({
                "type": "reset",
                "id": r.id,
                "budgets": r.budgets,
                "kind": r.kind.as_str(),
                "value": hex(&r.value),
                "until_us": r.until_us,
            }),
            Entry::Purge(p) => {
                let (path, prefix, uri) = match &p.scope {
                    PurgeScope::Route => (None, None, None),
                    PurgeScope::Path(path) => (Some(path), None, None),
                    PurgeScope::Prefix(prefix) => (None, Some(prefix), None),
                    PurgeScope::Uri { host, path, query } => (
                        None,
                        None,
                        Some(json!({"host": host, "path": path, "query": query})),
                    ),
                };
                json!({
                    "type": "purge",
                    "id": p.id,
                    "route": p.route,
                    "path": path,
                    "prefix": prefix,
                    "uri": uri,
                    "until_us": p.until_us,
                })
            }
        }
        .to_string()
    }

    /// An entry from its text (`None`: not one this floodgate can read).
    pub fn from_json(text: &str) -> Option<Entry> {
        let v: Value = serde_json::from_str(text).ok()?;
        let id = v["id"].as_str()?.to_string();
        if v["type"].as_str() == Some("purge") {
            return Some(Entry::Purge(Purge::from_json(id, &v)?));
        }
        let kind = kind_named(v["kind"].as_str()?)?;
        let value = unhex(v["value"].as_str()?)?;
        let until_us = v["until_us"].as_u64()?;
        Some(match v["type"].as_str() {
            None | Some("ban") => Entry::Ban(Ban {
                id,
                route: v["route"].as_str().map(str::to_string),
                kind,
                value,
                until_us,
                reason: v["reason"].as_str().unwrap_or("").to_string(),
                by: match v["by"].as_str() {
                    Some("penalty") => "penalty",
                    _ => "operator",
                },
            }),
            Some("override") => {
                let whom = OverrideFor {
                    route: v["route"].as_str()?.to_string(),
                    kind,
                    value,
                };
                // Written by an instance that checked it; claims are allowed here (the writer
                // knew whether tokens are verified).
                let over = Override::build(id, whom, until_us, v["limits"].clone(), true).ok()?;
                Entry::Override(std::sync::Arc::new(over))
            }
            Some("reset") => Entry::Reset(Reset {
                id,
                budgets: v["budgets"]
                    .as_array()?
                    .iter()
                    .map(|b| b.as_str().map(str::to_string))
                    .collect::<Option<_>>()?,
                kind,
                value,
                until_us,
            }),
            Some(_) => return None,
        })
    }
}

impl Purge {
    /// A purge from its entry's fields (`v`), named `id`.
    fn from_json(id: String, v: &Value) -> Option<Purge> {
        let text = |name: &str| v[name].as_str().map(str::to_string);
        let uri = &v["uri"];
        let scope = match (text("path"), text("prefix"), uri.is_object()) {
            (None, None, false) => PurgeScope::Route,
            (Some(path), None, false) => PurgeScope::Path(path),
            (None, Some(prefix), false) => PurgeScope::Prefix(prefix),
            (None, None, true) => PurgeScope::Uri {
                host: uri["host"].as_str()?.to_string(),
                path: uri["path"].as_str()?.to_string(),
                query: uri["query"].as_str().map(str::to_string),
            },
            _ => return None,
        };
        Some(Purge {
            id,
            route: text("route")?,
            scope,
            until_us: v["until_us"].as_u64()?,
        })
    }
}

/// The kind named `name` (as [`KeyKind::as_str`] writes it).
pub fn kind_named(name: &str) -> Option<KeyKind> {
    [
        KeyKind::ApiKey,
        KeyKind::Consumer,
        KeyKind::Jwt,
        KeyKind::UserId,
        KeyKind::Ip,
        KeyKind::Route,
        KeyKind::Request,
        KeyKind::Endpoint,
    ]
    .into_iter()
    .find(|k| k.as_str() == name)
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_reads_back_as_it_was_written() {
        let ban = Entry::Ban(Ban {
            id: "ban-1".into(),
            route: None,
            kind: KeyKind::Ip,
            value: vec![10, 0, 0, 1],
            until_us: 5_000_000,
            reason: "scraping".into(),
            by: "penalty",
        });
        let Some(Entry::Ban(back)) = Entry::from_json(&ban.to_json()) else {
            panic!("not a ban");
        };
        assert_eq!(
            (back.route, back.kind, back.value, back.until_us, back.by),
            (None, KeyKind::Ip, vec![10, 0, 0, 1], 5_000_000, "penalty")
        );
        let limits = json!([{"algorithm": "fixed_window", "limit": 50, "window": "1m"}]);
        let over = Entry::Override(std::sync::Arc::new(Override {
            id: "ovr-1".into(),
            route: "api".into(),
            kind: KeyKind::Consumer,
            value: b"acme".to_vec(),
            until_us: u64::MAX,
            limits: limits.clone(),
            budget: Budget::default(),
        }));
        let Some(Entry::Override(back)) = Entry::from_json(&over.to_json()) else {
            panic!("not an override");
        };
        assert_eq!(back.limits, limits);
        assert_eq!(back.budget.limits.len(), 1);
        assert!(
            back.budget.limits[0]
                .budget_id()
                .starts_with("api~ovr-1#0#")
        );
        let reset = Entry::Reset(Reset {
            id: "rst-1".into(),
            budgets: vec!["api#0#ab".into()],
            kind: KeyKind::ApiKey,
            value: b"k".to_vec(),
            until_us: 9,
        });
        let Some(Entry::Reset(back)) = Entry::from_json(&reset.to_json()) else {
            panic!("not a reset");
        };
        assert_eq!(back.keys()[0].budget, "api#0#ab");
        for scope in [
            PurgeScope::Route,
            PurgeScope::Path("/c/a".into()),
            PurgeScope::Prefix("/c/".into()),
            PurgeScope::Uri {
                host: "api.example".into(),
                path: "/c/x".into(),
                query: Some("a=1".into()),
            },
            PurgeScope::Uri {
                host: String::new(),
                path: "/c/x".into(),
                query: None,
            },
        ] {
            let purge = Purge {
                id: "prg-1".into(),
                route: "c".into(),
                scope,
                until_us: 9,
            };
            let Some(Entry::Purge(back)) = Entry::from_json(&Entry::Purge(purge.clone()).to_json())
            else {
                panic!("not a purge");
            };
            assert_eq!(back, purge);
        }
        assert!(
            Entry::from_json(r#"{"type":"later","id":"x","kind":"ip","value":"","until_us":1}"#)
                .is_none()
        );
        assert!(Entry::from_json("not json").is_none());
    }
}
