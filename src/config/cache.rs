//! `cache:` (the bounds every cached route shares) and a route's `cache:`, checked and built
//! into [`crate::cache::Settings`] and [`crate::cache::Rules`].

use std::time::Duration;

use serde::Deserialize;

use super::Validator;
use super::file::SizeText;
use crate::cache::{KeyPart, Rules, Settings, rules::DEFAULT_STATUSES};

/// `cache:` at the top level.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheFile {
    /// Bytes of entries each instance keeps (default 64MiB).
    #[serde(default)]
    pub memory: Option<SizeText>,
    /// The largest answer stored (default 1MiB).
    #[serde(default)]
    pub max_entry: Option<SizeText>,
    /// Entries and fills shared by every instance through `storage`.
    #[serde(default)]
    pub shared: Option<bool>,
}

/// A route's `cache:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteCacheFile {
    #[serde(default)]
    pub ttl: Option<String>,
    #[serde(default)]
    pub force: Option<bool>,
    #[serde(default)]
    pub key: Option<Vec<String>>,
    #[serde(default)]
    pub public: Option<bool>,
    #[serde(default)]
    pub statuses: Option<Vec<i64>>,
    #[serde(default)]
    pub coalesce: Option<bool>,
    #[serde(default)]
    pub coalesce_wait: Option<String>,
    #[serde(default)]
    pub stale_while_revalidate: Option<String>,
    #[serde(default)]
    pub stale_if_error: Option<String>,
    #[serde(default)]
    pub stale_if_overloaded: Option<String>,
    #[serde(default)]
    pub stale_if_limited: Option<String>,
}

impl Validator {
    /// `cache:`: `memory` and `max_entry` sizes above 0, `max_entry` at most `memory`;
    /// `shared` needs a store the instances share.
    pub(super) fn cache(
        &mut self,
        file: Option<CacheFile>,
        storage: Option<&super::StorageConfig>,
    ) -> Settings {
        let memory_store = storage.is_none_or(|s| matches!(s.backend, super::Backend::Memory));
        let Some(file) = file else {
            return Settings::default();
        };
        let default = Settings::default();
        let size = |v: &mut Validator, field: &str, text: &Option<SizeText>, default: usize| {
            let path = format!("cache.{field}");
            let n = v.size(&path, text.as_ref().map(|s| s.0.as_str()), default as u64);
            if n == 0 {
                v.problem(&path, "must be larger than 0");
                return default;
            }
            usize::try_from(n).unwrap_or(usize::MAX)
        };
        let memory = size(self, "memory", &file.memory, default.memory);
        let max_entry = size(self, "max_entry", &file.max_entry, default.max_entry);
        if max_entry > memory {
            self.problem(
                "cache.max_entry",
                format!("{max_entry} bytes is more than cache.memory ({memory} bytes)"),
            );
        }
        let shared = file.shared == Some(true);
        if shared && memory_store {
            self.problem(
                "cache.shared",
                "needs a store the instances share (storage.backend: redis, redis_cluster, redis_sentinel or postgres), not memory",
            );
        }
        Settings {
            memory,
            max_entry,
            shared,
        }
    }

    /// A route's `cache:` at `path`.
    pub(super) fn route_cache(&mut self, path: &str, file: RouteCacheFile) -> Rules {
        let ttl = self.duration(
            &format!("{path}.ttl"),
            file.ttl.as_deref(),
            Duration::from_secs(1),
        );
        let key = match file.key {
            None => vec![KeyPart::Query],
            Some(parts) => parts
                .iter()
                .enumerate()
                .filter_map(|(n, part)| self.key_part(&format!("{path}.key[{n}]"), part))
                .collect(),
        };
        let statuses = match file.statuses {
            None => DEFAULT_STATUSES.to_vec(),
            Some(list) => list
                .iter()
                .enumerate()
                .filter_map(|(n, &status)| match status {
                    200..=599 => Some(status as u16),
                    _ => {
                        self.problem(
                            format!("{path}.statuses[{n}]"),
                            format!("{status} is not a final HTTP status (200 to 599)"),
                        );
                        None
                    }
                })
                .collect(),
        };
        let stale = |v: &mut Validator, field: &str, text: &Option<String>| {
            v.duration_or_zero(&format!("{path}.{field}"), text.as_deref())
        };
        Rules {
            ttl,
            force: file.force.unwrap_or(false),
            key,
            public: file.public.unwrap_or(false),
            statuses,
            coalesce: file.coalesce.unwrap_or(true),
            coalesce_wait: self.duration(
                &format!("{path}.coalesce_wait"),
                file.coalesce_wait.as_deref(),
                Duration::from_secs(2),
            ),
            stale_while_revalidate: stale(
                self,
                "stale_while_revalidate",
                &file.stale_while_revalidate,
            ),
            stale_if_error: stale(self, "stale_if_error", &file.stale_if_error),
            stale_if_overloaded: stale(self, "stale_if_overloaded", &file.stale_if_overloaded),
            stale_if_limited: stale(self, "stale_if_limited", &file.stale_if_limited),
        }
    }

    /// One part of `key:`: `query`, `identity` or `header:NAME`.
    fn key_part(&mut self, path: &str, text: &str) -> Option<KeyPart> {
        match text.split_once(':') {
            None if text == "query" => Some(KeyPart::Query),
            None if text == "identity" => Some(KeyPart::Identity),
            Some(("header", name)) => match http::HeaderName::from_bytes(name.trim().as_bytes()) {
                Ok(name) => Some(KeyPart::Header(name)),
                Err(_) => {
                    self.problem(path, format!("{name:?} is not a header name"));
                    None
                }
            },
            _ => {
                self.problem(
                    path,
                    format!("{text:?} is not a key part: query, identity or header:NAME"),
                );
                None
            }
        }
    }

    /// A duration that may be 0 (the default: off).
    fn duration_or_zero(&mut self, path: &str, text: Option<&str>) -> Duration {
        match text.map(super::parse_duration) {
            None => Duration::ZERO,
            Some(Ok(d)) => d,
            Some(Err(message)) => {
                self.problem(path, message);
                Duration::ZERO
            }
        }
    }
}
