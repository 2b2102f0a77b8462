//! `storage:`: which store keeps limiter state, and what happens when it fails.

use std::time::Duration;

use super::file::{self, BackendKind};
use super::{OnError, Validator};

/// Where limiter state lives and what to do when that store fails.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub backend: Backend,
    /// The budget for one limiter decision.
    pub timeout: Duration,
    pub on_error: OnError,
    pub key_prefix: String,
    /// Memory store (and the `local` fallback): the most identities tracked at once.
    pub max_keys: usize,
    /// Redis and PostgreSQL: decisions waiting while a call is in flight leave together in the
    /// next one.
    pub batch: bool,
    /// Redis and PostgreSQL: lease budgets this instance spends fast (`None`: `leases:
    /// disabled`), for at most
    /// this long.
    pub lease_ttl: Option<Duration>,
    /// `storage.global`: where `scope: global` budgets live.
    pub global: Option<GlobalConfig>,
}

/// `storage.global`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalConfig {
    pub url: String,
    pub region: String,
    pub lease_ttl: Duration,
    pub timeout: Duration,
}

impl StorageConfig {
    /// The limiter's own terms for this section (the limiter knows nothing of the config):
    /// which store, and how it is asked.
    pub fn limiter_spec(&self) -> crate::limiter::LimiterSpec {
        use crate::limiter::StoreSpec;
        use crate::limiter::redis::RedisTarget;
        let store = match &self.backend {
            Backend::Memory => StoreSpec::Memory,
            Backend::Redis { url } => StoreSpec::Redis(RedisTarget::Single(url.clone())),
            Backend::RedisCluster { urls } => StoreSpec::Redis(RedisTarget::Cluster(urls.clone())),
            Backend::RedisSentinel {
                sentinels,
                master_name,
            } => StoreSpec::Redis(RedisTarget::Sentinel {
                sentinels: sentinels.clone(),
                master_name: master_name.clone(),
            }),
            Backend::Postgres { url } => StoreSpec::Postgres(url.clone()),
        };
        crate::limiter::LimiterSpec {
            store,
            timeout: self.timeout,
            batch: self.batch,
            lease_ttl: self.lease_ttl,
            key_prefix: self.key_prefix.clone(),
            max_keys: self.max_keys,
        }
    }
}

/// The limiter store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis {
        url: String,
    },
    RedisCluster {
        urls: Vec<String>,
    },
    /// Redis behind Sentinel: the master named `master_name`, found and followed.
    RedisSentinel {
        sentinels: Vec<String>,
        master_name: String,
    },
    /// PostgreSQL (or a database speaking its protocol and SQL).
    Postgres {
        url: String,
    },
}

impl Validator {
    /// `storage.backend` and the keys it needs (`url`, `urls`, `sentinels`, `master_name`),
    /// each URL checked for its scheme (and a PostgreSQL URL's options and files read now).
    fn backend(
        &mut self,
        kind: BackendKind,
        url: Option<String>,
        urls: Option<Vec<String>>,
        sentinels_in: Option<Vec<String>>,
        master_name_in: Option<String>,
    ) -> Option<Backend> {
        Some(match kind {
            BackendKind::Memory => Backend::Memory,
            BackendKind::Redis => match url {
                Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                    Backend::Redis { url }
                }
                Some(url) => {
                    self.problem(
                        "storage.url",
                        format!("{url:?} must start with redis:// or rediss://"),
                    );
                    return None;
                }
                None => {
                    self.problem(
                        "storage.url",
                        "required when backend is redis (or set FLOODGATE_REDIS_URL)",
                    );
                    return None;
                }
            },
            BackendKind::RedisSentinel => {
                let sentinels = match sentinels_in {
                    Some(urls) if !urls.is_empty() => urls,
                    _ => {
                        self.problem(
                            "storage.sentinels",
                            "required (one or more redis:// URLs of sentinels) when backend is redis_sentinel",
                        );
                        return None;
                    }
                };
                for (i, url) in sentinels.iter().enumerate() {
                    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                        self.problem(
                            format!("storage.sentinels[{i}]"),
                            format!("{url:?} must start with redis:// or rediss://"),
                        );
                    }
                }
                let Some(master_name) = master_name_in.filter(|n| !n.is_empty()) else {
                    self.problem(
                        "storage.master_name",
                        "required when backend is redis_sentinel (the name in `sentinel monitor`)",
                    );
                    return None;
                };
                Backend::RedisSentinel {
                    sentinels,
                    master_name,
                }
            }
            BackendKind::Postgres => match url {
                Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                    // What the driver will read, and the certificate files the URL names: a
                    // bad option, sslmode or file is named now, not at the first connection.
                    if let Err(e) = crate::limiter::postgres::url::options(&url) {
                        self.problem("storage.url", format!("{:?}: {e}", redact_password(&url)));
                        return None;
                    }
                    Backend::Postgres { url }
                }
                Some(url) => {
                    self.problem(
                        "storage.url",
                        format!(
                            "{:?} must start with postgres:// or postgresql://",
                            redact_password(&url)
                        ),
                    );
                    return None;
                }
                None => {
                    self.problem(
                        "storage.url",
                        "required when backend is postgres (or set FLOODGATE_DATABASE_URL)",
                    );
                    return None;
                }
            },
            BackendKind::RedisCluster => match urls {
                Some(urls) if !urls.is_empty() => Backend::RedisCluster { urls },
                _ => {
                    self.problem(
                        "storage.urls",
                        "required (one or more redis:// URLs) when backend is redis_cluster",
                    );
                    return None;
                }
            },
        })
    }

    pub(super) fn storage(&mut self, s: file::StorageFile) -> Option<StorageConfig> {
        let on_error = self.choice("storage.on_error", s.on_error, OnError::Allow);
        let kind = self.choice("storage.backend", s.backend, BackendKind::Memory);
        let backend = self.backend(kind, s.url, s.urls, s.sentinels, s.master_name)?;
        let max_keys = match s.max_keys {
            None => 1_000_000,
            Some(0) => {
                self.problem("storage.max_keys", "must be > 0");
                1
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let global = s.global.and_then(|g| self.global(g, &backend));
        Some(StorageConfig {
            global,
            backend,
            timeout: self.duration(
                "storage.timeout",
                s.timeout.as_deref(),
                Duration::from_millis(50),
            ),
            on_error,
            key_prefix: s.key_prefix.unwrap_or_else(|| "fg:".to_string()),
            max_keys,
            batch: s.batch.unwrap_or(true),
            lease_ttl: {
                // (`duration` refuses 0.)
                let ttl = self.duration(
                    "storage.lease_ttl",
                    s.lease_ttl.as_deref(),
                    Duration::from_millis(250),
                );
                (self.choice("storage.leases", s.leases, file::LeaseMode::Auto)
                    == file::LeaseMode::Auto)
                    .then_some(ttl)
            },
        })
    }
}

impl Validator {
    fn global(&mut self, g: file::GlobalFile, backend: &Backend) -> Option<GlobalConfig> {
        if !matches!(backend, Backend::Redis { .. } | Backend::Postgres { .. }) {
            self.problem(
                "storage.global",
                "needs a region store that is one Redis server or PostgreSQL (backend: redis or postgres): the region's slices live there",
            );
        }
        let url = match g.url {
            Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => Some(url),
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                match crate::limiter::postgres::url::options(&url) {
                    Ok(_) => Some(url),
                    Err(e) => {
                        self.problem(
                            "storage.global.url",
                            format!("{:?}: {e}", redact_password(&url)),
                        );
                        None
                    }
                }
            }
            Some(url) => {
                self.problem(
                    "storage.global.url",
                    format!(
                        "{:?} must start with redis://, rediss://, postgres:// or postgresql://",
                        redact_password(&url)
                    ),
                );
                None
            }
            None => {
                self.problem(
                    "storage.global.url",
                    "required: the global store's redis:// URL",
                );
                None
            }
        };
        let region = match g.region {
            Some(r)
                if !r.is_empty()
                    && r.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.') =>
            {
                Some(r)
            }
            Some(r) => {
                self.problem(
                    "storage.global.region",
                    format!("{r:?}: letters, digits, '-', '_' and '.' only"),
                );
                None
            }
            None => {
                self.problem("storage.global.region", "required: this instance's region");
                None
            }
        };
        let lease_ttl = self.duration(
            "storage.global.lease_ttl",
            g.lease_ttl.as_deref(),
            Duration::from_secs(2),
        );
        let timeout = self.duration(
            "storage.global.timeout",
            g.timeout.as_deref(),
            Duration::from_millis(500),
        );
        if lease_ttl < Duration::from_millis(100) {
            self.problem("storage.global.lease_ttl", "must be at least 100ms");
        }
        Some(GlobalConfig {
            url: url?,
            region: region?,
            lease_ttl,
            timeout,
        })
    }
}

/// `url` with any password replaced by `***`, for error messages.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}
