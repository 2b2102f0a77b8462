//! The typed, validated configuration. `file.rs` holds the YAML as written; [`Config::from_yaml`]
//! parses it and checks every field, naming each problem by its path
//! (`routes[1].limits[0].refill_rate: must be > 0`). A `Config` that exists is valid.
//!
//! Closed choices (`storage.backend`, `on_error`, `algorithm`, `per`, ...) are serde enums, so
//! the parser itself names the allowed values. Limits are built through the limiter's checked
//! constructors; this module only attaches the field path to their errors. Environment
//! overrides (`FLOODGATE_REDIS_URL`) are read by the binary and passed in as [`Overrides`].

pub mod file;
pub mod tls;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderName, Method, Uri};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::identity::{
    ANONYMOUS_TIER, Consumer, Consumers, DEFAULT_TIER, IdentityConfig, UnknownKey,
};
pub use crate::limiter::OnError;
use crate::limiter::{Algorithm, AlgorithmKind, Limit, LimitError, LimitField, MAX_LIMITS};
use file::{BackendKind, Choice, ConsumerFile, FileConfig, LimitFile, RouteFile};

/// Values from outside the file that replace what it says: the binary reads them from the
/// environment (`FLOODGATE_REDIS_URL`).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Replaces `storage.url` for the `redis` backend.
    pub redis_url: Option<String>,
    /// The folder relative paths in the file are read from (default: the working directory).
    pub base_dir: Option<PathBuf>,
}

/// A valid floodgate configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: Option<SocketAddr>,
    pub tls: Option<TlsConfig>,
    /// Roots for verifying HTTPS upstreams instead of the system's.
    pub upstream_ca: Option<UpstreamCa>,
    pub storage: StorageConfig,
    pub identity: IdentityConfig,
    /// The known API keys, when the file has a `consumers:` section.
    pub consumers: Option<Arc<Consumers>>,
    pub timeouts: Timeouts,
    pub routes: Vec<RouteConfig>,
    /// Global shadow mode: every limit decides and counts, none denies.
    pub shadow: bool,
    pub rate_limit_headers: HeaderProfile,
    pub log_format: LogFormat,
}

/// Which rate-limit fields responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderProfile {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Unix seconds), as GitHub and most gateways.
    #[serde(rename = "x_ratelimit")]
    XRateLimit,
    /// `RateLimit-Policy` and `RateLimit` of draft-ietf-httpapi-ratelimit-headers-09.
    Ietf,
    /// No rate-limit fields (429s still carry `Retry-After`).
    None,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Human,
    Json,
}

/// Certificate and key files for TLS termination, read and checked at load.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The listener's rustls config built from `cert` and `key`, with ALPN `h2`, `http/1.1`.
    pub server_config: Arc<rustls::ServerConfig>,
}

/// `upstream_ca:`: a PEM bundle of CA certificates trusted for HTTPS upstreams in place of the
/// system's roots.
#[derive(Debug, Clone)]
pub struct UpstreamCa {
    pub path: PathBuf,
    pub roots: Arc<rustls::RootCertStore>,
}

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
}

/// The limiter store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis { url: String },
    RedisCluster { urls: Vec<String> },
}

/// How long floodgate waits on clients and upstreams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// A client must send a request's headers within this (slowloris guard).
    pub header_read: Duration,
    /// Connecting to an upstream; past it the client gets 502.
    pub upstream_connect: Duration,
    /// From sending the request to receiving the upstream's response headers; past it, 504.
    pub upstream_response: Duration,
    /// On shutdown, how long in-flight requests may take to finish.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: Duration::from_secs(10),
            upstream_connect: Duration::from_secs(2),
            upstream_response: Duration::from_secs(30),
            drain: Duration::from_secs(30),
        }
    }
}

/// One route: which requests it matches, where they go, and what limits them.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    pub path_prefix: String,
    /// `None` matches every method.
    pub methods: Option<Vec<Method>>,
    pub upstream: Upstream,
    /// The enforced limits: a request must pass every one that applies to it.
    pub enforced: Budget,
    /// Limits in shadow mode: decided and counted, never denying; budgets of their own.
    pub shadow: Budget,
}

/// A list of limits decided together, all-or-nothing.
#[derive(Debug, Clone, Default)]
pub struct Budget {
    pub limits: Vec<RouteLimit>,
}

impl Budget {
    /// True when there is no limit.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }
}

/// Whose budget a limit spends (`per:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    /// The request's identity: consumer or API key, user id, or IP, in that order.
    #[default]
    Identity,
    /// The client IP from the trusted-proxy walk, whatever key or user id is sent.
    Ip,
    /// One budget shared by every client of the route.
    Route,
}

impl Per {
    /// The name used in the config file and `/budgets`.
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Identity => "identity",
            Per::Ip => "ip",
            Per::Route => "route",
        }
    }
}

/// One limit of a route, with whose budget it spends and the store id of that budget.
#[derive(Debug, Clone)]
pub struct RouteLimit {
    pub limit: Limit,
    pub per: Per,
    /// The consumer tiers it applies to; `None`: every request.
    pub tiers: Option<Vec<String>>,
    /// The store's id for this limit's budgets: the route's name, `~shadow` for shadow limits,
    /// the limit's position in the file and a fingerprint of its parameters. A reload that
    /// changes the limit starts it afresh; one that does not keeps its state.
    pub budget_id: String,
    /// The policy name for the IETF headers: `{route}-{position}`.
    pub name: String,
    /// The limit's position in the route's `limits:` list.
    pub position: usize,
}

impl RouteLimit {
    /// True when the limit applies to a request of consumer tier `tier`.
    pub fn applies_to(&self, tier: &str) -> bool {
        self.tiers
            .as_ref()
            .is_none_or(|tiers| tiers.iter().any(|t| t == tier))
    }
}

/// An upstream origin: scheme and authority (the request's path is forwarded unchanged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: Scheme,
    pub authority: Authority,
    /// The `Host` header forwarded requests carry, built once.
    pub host_header: http::HeaderValue,
}

/// Every problem found in a config file, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub problems: Vec<FieldProblem>,
}

/// One problem: the field's path (`routes[1].limits[0].refill_rate`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![FieldProblem {
                path: path.into(),
                message: message.into(),
            }],
        }
    }
}

impl Config {
    /// Reads and validates a config file. Blocking: call it from a blocking thread on a runtime.
    /// Relative paths in it (`consumers.file`) are read from the file's folder.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one("", format!("cannot read {}: {e}", path.display())))?;
        let overrides = Overrides {
            base_dir: path.parent().map(Path::to_path_buf),
            ..overrides.clone()
        };
        Config::from_yaml_with(&text, &overrides)
    }

    /// Parses and validates YAML text, with no overrides.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        Config::from_yaml_with(text, &Overrides::default())
    }

    /// Parses and validates YAML text, applying `overrides`.
    pub fn from_yaml_with(text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
        // YAML → a generic value → the file structs, so that serde_path_to_error can name the
        // field of a type error or unknown key whatever the YAML parser reports.
        // `.inf` and `.nan` come through as strings, so the field they are in gets named below.
        let mut options = serde_saphyr::Options::default();
        options.non_finite_float_policy = serde_saphyr::NonFiniteFloatPolicy::AsString;
        let value: serde_json::Value = serde_saphyr::from_str_with_options(text, options)
            .map_err(|e| ConfigError::one("", format!("invalid YAML: {e}")))?;
        let file: FileConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::one(
                if path == "." { String::new() } else { path },
                e.into_inner().to_string(),
            )
        })?;
        Config::from_file(file, overrides)
    }

    /// Validates the file structs.
    pub fn from_file(mut file: FileConfig, overrides: &Overrides) -> Result<Config, ConfigError> {
        if let Some(url) = &overrides.redis_url {
            file.storage.url = Some(url.clone());
        }
        let mut v = Validator::default();
        let listen = v.socket_addr("listen", &file.listen);
        let admin_listen = file
            .admin_listen
            .as_deref()
            .and_then(|a| v.socket_addr("admin_listen", a));
        let tls = file.tls.and_then(|t| v.tls(t));
        let upstream_ca = file.upstream_ca.and_then(|path| v.upstream_ca(path));
        let storage = v.storage(file.storage);
        let identity = v.identity(file.identity);
        let consumers = file
            .consumers
            .map(|c| Arc::new(v.consumers(c, overrides.base_dir.as_deref())));
        let timeouts = v.timeouts(file.timeouts);
        let mut routes = Vec::with_capacity(file.routes.len());
        for (i, route) in file.routes.into_iter().enumerate() {
            if let Some(route) = v.route(&format!("routes[{i}]"), route) {
                if routes.iter().any(|r: &RouteConfig| r.name == route.name) {
                    v.problem(
                        format!("routes[{i}].name"),
                        format!("duplicate route name {:?}", route.name),
                    );
                }
                routes.push(route);
            }
        }
        v.known_tiers(&routes, consumers.as_deref());
        if let Some(storage) = &storage
            && matches!(storage.backend, Backend::RedisCluster { .. })
        {
            v.single_slot_routes(&routes);
        }
        let rate_limit_headers = v.choice(
            "rate_limit_headers",
            file.rate_limit_headers,
            HeaderProfile::XRateLimit,
        );
        let log_format = v.choice("log_format", file.log_format, LogFormat::Human);
        match (listen, storage, identity, v.problems.is_empty()) {
            (Some(listen), Some(storage), Some(identity), true) => Ok(Config {
                listen,
                admin_listen,
                tls,
                upstream_ca,
                storage,
                identity,
                consumers,
                timeouts,
                routes,
                shadow: file.shadow.unwrap_or(false),
                rate_limit_headers,
                log_format,
            }),
            _ => Err(ConfigError {
                problems: v.problems,
            }),
        }
    }
}

/// Collects problems while checking fields one by one.
#[derive(Default)]
struct Validator {
    problems: Vec<FieldProblem>,
}

impl Validator {
    fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(FieldProblem {
            path: path.into(),
            message: message.into(),
        });
    }

    /// The value of a closed choice, or `default` when it is absent; an invalid one is a
    /// problem at `path` (and `default` stands in, so validation goes on).
    fn choice<T>(&mut self, path: &str, choice: Option<Choice<T>>, default: T) -> T {
        match choice {
            None => default,
            Some(Choice::Known(value)) => value,
            Some(Choice::Invalid(message)) => {
                self.problem(path, message);
                default
            }
        }
    }

    fn socket_addr(&mut self, path: &str, text: &str) -> Option<SocketAddr> {
        text.parse()
            .map_err(|_| {
                self.problem(
                    path,
                    format!("{text:?} is not an address like 127.0.0.1:8080"),
                )
            })
            .ok()
    }

    fn tls(&mut self, t: file::TlsFile) -> Option<TlsConfig> {
        let (cert, key) = (PathBuf::from(t.cert), PathBuf::from(t.key));
        match tls::server_config(&cert, &key) {
            Ok(server_config) => Some(TlsConfig {
                cert,
                key,
                server_config,
            }),
            Err(problems) => {
                for p in problems {
                    self.problem(format!("tls.{}", p.field), p.message);
                }
                None
            }
        }
    }

    fn upstream_ca(&mut self, path: String) -> Option<UpstreamCa> {
        let path = PathBuf::from(path);
        match tls::root_store(&path) {
            Ok(roots) => Some(UpstreamCa {
                path,
                roots: Arc::new(roots),
            }),
            Err(message) => {
                self.problem("upstream_ca", message);
                None
            }
        }
    }

    fn duration(&mut self, path: &str, text: Option<&str>, default: Duration) -> Duration {
        match text.map(parse_duration) {
            None => default,
            Some(Ok(d)) if !d.is_zero() => d,
            Some(Ok(_)) => {
                self.problem(path, "must be longer than 0");
                default
            }
            Some(Err(message)) => {
                self.problem(path, message);
                default
            }
        }
    }

    fn storage(&mut self, s: file::StorageFile) -> Option<StorageConfig> {
        let on_error = self.choice("storage.on_error", s.on_error, OnError::Allow);
        let backend = match self.choice("storage.backend", s.backend, BackendKind::Memory) {
            BackendKind::Memory => Backend::Memory,
            BackendKind::Redis => match s.url {
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
            BackendKind::RedisCluster => match s.urls {
                Some(urls) if !urls.is_empty() => Backend::RedisCluster { urls },
                _ => {
                    self.problem(
                        "storage.urls",
                        "required (one or more redis:// URLs) when backend is redis_cluster",
                    );
                    return None;
                }
            },
        };
        let max_keys = match s.max_keys {
            None => 1_000_000,
            Some(0) => {
                self.problem("storage.max_keys", "must be > 0");
                1
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        Some(StorageConfig {
            backend,
            timeout: self.duration(
                "storage.timeout",
                s.timeout.as_deref(),
                Duration::from_millis(50),
            ),
            on_error,
            key_prefix: s.key_prefix.unwrap_or_else(|| "fg:".to_string()),
            max_keys,
        })
    }

    fn header_name(
        &mut self,
        path: &str,
        text: Option<&str>,
        default: &'static str,
    ) -> Option<HeaderName> {
        let text = text.unwrap_or(default);
        HeaderName::try_from(text)
            .map_err(|_| self.problem(path, format!("{text:?} is not a valid header name")))
            .ok()
    }

    fn identity(&mut self, i: file::IdentityFile) -> Option<IdentityConfig> {
        let api_key_header = self.header_name(
            "identity.api_key_header",
            i.api_key_header.as_deref(),
            "x-api-key",
        );
        let user_id_header = self.header_name(
            "identity.user_id_header",
            i.user_id_header.as_deref(),
            "x-user-id",
        );
        let mut trusted_proxies = Vec::new();
        for (n, text) in i.trusted_proxies.iter().enumerate() {
            // A bare address means that one host.
            let parsed = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
            match parsed {
                Ok(net) => trusted_proxies.push(net.trunc()),
                Err(_) => self.problem(
                    format!("identity.trusted_proxies[{n}]"),
                    format!("{text:?} is not a CIDR like 10.0.0.0/8 or an IP address"),
                ),
            }
        }
        Some(IdentityConfig {
            api_key_header: api_key_header?,
            user_id_header: user_id_header?,
            trusted_proxies,
        })
    }

    fn timeouts(&mut self, t: file::TimeoutsFile) -> Timeouts {
        let d = Timeouts::default();
        Timeouts {
            header_read: self.duration(
                "timeouts.header_read",
                t.header_read.as_deref(),
                d.header_read,
            ),
            upstream_connect: self.duration(
                "timeouts.upstream_connect",
                t.upstream_connect.as_deref(),
                d.upstream_connect,
            ),
            upstream_response: self.duration(
                "timeouts.upstream_response",
                t.upstream_response.as_deref(),
                d.upstream_response,
            ),
            drain: self.duration("timeouts.drain", t.drain.as_deref(), d.drain),
        }
    }

    fn route(&mut self, path: &str, r: RouteFile) -> Option<RouteConfig> {
        let before = self.problems.len();
        if !is_name(&r.name) {
            self.problem(
                format!("{path}.name"),
                format!("{:?} must be letters, digits, '_', '.' or '-' (it names metrics and store keys)", r.name),
            );
        }
        if !r.path_prefix.starts_with('/') {
            self.problem(
                format!("{path}.path_prefix"),
                format!("{:?} must start with /", r.path_prefix),
            );
        }
        let methods = r.methods.map(|methods| {
            methods
                .iter()
                .enumerate()
                .filter_map(|(n, m)| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| {
                            self.problem(
                                format!("{path}.methods[{n}]"),
                                format!("{m:?} is not an HTTP method"),
                            )
                        })
                        .ok()
                })
                .collect::<Vec<_>>()
        });
        let upstream = self.upstream(&format!("{path}.upstream"), &r.upstream);
        let mut enforced = Budget::default();
        let mut shadow = Budget::default();
        if r.limits.len() > MAX_LIMITS {
            self.problem(
                format!("{path}.limits"),
                format!("at most {MAX_LIMITS} limits per route"),
            );
        }
        for (n, l) in r.limits.iter().enumerate() {
            let limit_path = format!("{path}.limits[{n}]");
            let Some(limit) = self.limit(&limit_path, l) else {
                continue;
            };
            let tiers = l.tiers.as_ref().map(|tiers| {
                for (t, tier) in tiers.iter().enumerate() {
                    if !is_name(tier) {
                        self.problem(
                            format!("{limit_path}.tiers[{t}]"),
                            format!("{tier:?} must be letters, digits, '_', '.' or '-'"),
                        );
                    }
                }
                tiers.clone()
            });
            let is_shadow = l.shadow.unwrap_or(false);
            let budget_id = format!(
                "{}{}#{n}#{}",
                r.name,
                if is_shadow { "~shadow" } else { "" },
                limit_fingerprint(&limit)
            );
            let route_limit = RouteLimit {
                limit,
                per: self.choice(&format!("{limit_path}.per"), l.per.clone(), Per::Identity),
                tiers,
                budget_id,
                name: format!("{}-{n}", r.name),
                position: n,
            };
            if is_shadow {
                shadow.limits.push(route_limit);
            } else {
                enforced.limits.push(route_limit);
            }
        }
        if self.problems.len() > before {
            return None;
        }
        Some(RouteConfig {
            name: r.name,
            path_prefix: r.path_prefix,
            methods,
            upstream: upstream?,
            enforced,
            shadow,
        })
    }

    /// `consumers:`: inline entries and those of `file`, each key's digest parsed and unique.
    fn consumers(&mut self, c: file::ConsumersFile, base_dir: Option<&Path>) -> Consumers {
        let unknown_key = self.choice("consumers.unknown_key", c.unknown_key, UnknownKey::Reject);
        let mut consumers = Consumers::new(unknown_key);
        let mut names = std::collections::HashSet::new();
        let mut add = |v: &mut Validator, path: String, entry: ConsumerFile| {
            if !is_name(&entry.name) {
                v.problem(
                    format!("{path}.name"),
                    format!("{:?} must be letters, digits, '_', '.' or '-'", entry.name),
                );
            } else if !names.insert(entry.name.clone()) {
                v.problem(
                    format!("{path}.name"),
                    format!("duplicate consumer name {:?}", entry.name),
                );
            }
            let tier = entry.tier.unwrap_or_else(|| DEFAULT_TIER.to_string());
            if !is_name(&tier) || tier == ANONYMOUS_TIER {
                v.problem(
                    format!("{path}.tier"),
                    format!(
                        "{tier:?} must be letters, digits, '_', '.' or '-', and not {ANONYMOUS_TIER:?} (the tier of requests without a consumer)"
                    ),
                );
            }
            let index = consumers.add(Consumer {
                name: entry.name,
                tier,
            });
            for (k, hex) in entry.keys_sha256.iter().enumerate() {
                let key_path = format!("{path}.keys_sha256[{k}]");
                match parse_sha256(hex) {
                    None => v.problem(
                        key_path,
                        "must be 64 hex digits: the SHA-256 of the key (floodgate hash-key KEY)",
                    ),
                    Some(digest) => {
                        if let Err(owner) = consumers.add_key(digest, index) {
                            v.problem(key_path, format!("consumer {owner:?} has this key already"));
                        }
                    }
                }
            }
        };
        for (i, entry) in c.entries.into_iter().enumerate() {
            add(self, format!("consumers.entries[{i}]"), entry);
        }
        if let Some(file) = c.file {
            let path = match base_dir {
                Some(dir) => dir.join(&file),
                None => PathBuf::from(&file),
            };
            let entries = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|text| {
                    let value: serde_json::Value = serde_saphyr::from_str(&text)
                        .map_err(|e| format!("invalid YAML in {}: {e}", path.display()))?;
                    serde_path_to_error::deserialize::<_, Vec<ConsumerFile>>(value).map_err(|e| {
                        let at = e.path().to_string();
                        format!("[{at}]: {}", e.into_inner())
                    })
                });
            match entries {
                Ok(entries) => {
                    for (i, entry) in entries.into_iter().enumerate() {
                        add(self, format!("consumers.file[{i}]"), entry);
                    }
                }
                Err(message) => self.problem("consumers.file", message),
            }
        }
        consumers
    }

    /// Every tier a limit names must be one a request can have.
    fn known_tiers(&mut self, routes: &[RouteConfig], consumers: Option<&Consumers>) {
        let mut known: std::collections::HashSet<&str> = [ANONYMOUS_TIER].into();
        if let Some(consumers) = consumers {
            known.extend(consumers.iter().map(|c| c.tier.as_str()));
        }
        for (i, route) in routes.iter().enumerate() {
            let limits = route.enforced.limits.iter().chain(&route.shadow.limits);
            for limit in limits {
                let position = limit.position;
                for (t, tier) in limit.tiers.iter().flatten().enumerate() {
                    if !known.contains(tier.as_str()) {
                        self.problem(
                            format!("routes[{i}].limits[{position}].tiers[{t}]"),
                            format!(
                                "no request can have tier {tier:?}: it is neither {ANONYMOUS_TIER:?} nor the tier of any consumer"
                            ),
                        );
                    }
                }
            }
        }
    }

    /// Redis Cluster runs one script per decision, and a script's keys must share a slot. The
    /// budgets of one client value share a slot (its hash is the hash tag), but a route mixing
    /// `per:` scopes spends budgets of different values at once, which no one slot holds.
    fn single_slot_routes(&mut self, routes: &[RouteConfig]) {
        for (i, route) in routes.iter().enumerate() {
            for (budget, label) in [(&route.enforced, "enforced"), (&route.shadow, "shadow")] {
                let mut scopes = budget.limits.iter().map(|l| l.per);
                if let Some(first) = scopes.next()
                    && scopes.any(|per| per != first)
                {
                    self.problem(
                        format!("routes[{i}].limits"),
                        format!(
                            "the {label} limits mix per: scopes, which redis_cluster cannot decide \
                             in one atomic step; use one scope per route there"
                        ),
                    );
                }
            }
        }
    }

    fn upstream(&mut self, path: &str, text: &str) -> Option<Upstream> {
        let uri: Uri = match text.parse() {
            Ok(uri) => uri,
            Err(_) => {
                self.problem(
                    path,
                    format!("{text:?} is not a URL like http://127.0.0.1:9000"),
                );
                return None;
            }
        };
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            self.problem(
                path,
                format!("{text:?} must be an absolute URL like http://127.0.0.1:9000"),
            );
            return None;
        };
        if *scheme != Scheme::HTTP && *scheme != Scheme::HTTPS {
            self.problem(
                path,
                format!("scheme {scheme:?} is not supported (use http:// or https://)"),
            );
            return None;
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            self.problem(
                path,
                "must be an origin without a path (the request's path is forwarded as it is)",
            );
            return None;
        }
        let Ok(host_header) = http::HeaderValue::from_str(authority.as_str()) else {
            self.problem(
                path,
                format!("{text:?} has a host that cannot be a Host header"),
            );
            return None;
        };
        Some(Upstream {
            scheme: scheme.clone(),
            authority: authority.clone(),
            host_header,
        })
    }

    fn limit(&mut self, path: &str, l: &LimitFile) -> Option<Limit> {
        let kind = match &l.algorithm {
            Choice::Known(kind) => *kind,
            Choice::Invalid(message) => {
                self.problem(format!("{path}.algorithm"), message.clone());
                return None;
            }
        };
        let name = kind.name();
        let (rate_name, rate) = match kind {
            AlgorithmKind::LeakyBucket => ("leak_rate", l.leak_rate),
            _ => ("refill_rate", l.refill_rate),
        };
        let units_name = if kind.is_bucket() {
            "capacity"
        } else {
            "limit"
        };
        let before = self.problems.len();
        let lease = ("lease", l.lease.is_some());
        if kind.is_bucket() {
            let wrong_rate = match kind {
                AlgorithmKind::LeakyBucket => ("refill_rate", l.refill_rate.is_some()),
                _ => ("leak_rate", l.leak_rate.is_some()),
            };
            self.not_parameters(
                path,
                name,
                &[
                    wrong_rate,
                    ("limit", l.limit.is_some()),
                    ("window", l.window.is_some()),
                    lease,
                ],
            );
        } else {
            let window_or_lease = if kind == AlgorithmKind::Concurrency {
                ("window", l.window.is_some())
            } else {
                lease
            };
            self.not_parameters(
                path,
                name,
                &[
                    ("capacity", l.capacity.is_some()),
                    ("refill_rate", l.refill_rate.is_some()),
                    ("leak_rate", l.leak_rate.is_some()),
                    window_or_lease,
                ],
            );
        }
        let units = if kind.is_bucket() {
            l.capacity
        } else {
            l.limit
        };
        let units = self.count(&format!("{path}.{units_name}"), units);
        let built = if kind.is_bucket() {
            let rate = match rate {
                None => {
                    self.problem(
                        format!("{path}.{rate_name}"),
                        format!("required for {name}"),
                    );
                    None
                }
                // Checked on its own, so a bad capacity and a bad rate are both named.
                Some(rate) => match Algorithm::interval_for_rate(rate) {
                    Ok(_) => Some(rate),
                    Err(e) => {
                        self.limit_problem(format!("{path}.{rate_name}"), e);
                        None
                    }
                },
            };
            let (Some(units), Some(rate)) = (units, rate) else {
                return None;
            };
            match kind {
                AlgorithmKind::LeakyBucket => Algorithm::leaky_bucket(units, rate),
                _ => Algorithm::token_bucket(units, rate),
            }
        } else if kind == AlgorithmKind::Concurrency {
            let units = units?;
            let lease = self.duration(
                &format!("{path}.lease"),
                l.lease.as_deref(),
                Duration::from_secs(60),
            );
            Algorithm::concurrency(units, lease)
        } else {
            let window = match l.window.as_deref().map(parse_duration) {
                None => {
                    self.problem(format!("{path}.window"), format!("required for {name}"));
                    None
                }
                Some(Ok(window)) => Some(window),
                Some(Err(message)) => {
                    self.problem(format!("{path}.window"), message);
                    None
                }
            };
            let (Some(units), Some(window)) = (units, window) else {
                return None;
            };
            match kind {
                AlgorithmKind::FixedWindow => Algorithm::fixed_window(units, window),
                AlgorithmKind::SlidingWindowLog => Algorithm::sliding_window_log(units, window),
                _ => Algorithm::sliding_window_counter(units, window),
            }
        };
        let cost = match l.cost {
            None => Some(1),
            Some(c) => u32::try_from(c).ok().or(Some(0)),
        };
        let limit = built.and_then(|algorithm| Limit::new(algorithm, cost.unwrap_or(0)));
        match limit {
            Ok(limit) if self.problems.len() == before => Some(limit),
            Ok(_) => None,
            Err(e) => {
                let field = match e.field() {
                    LimitField::Units => format!("{path}.{units_name}"),
                    LimitField::Rate => format!("{path}.{rate_name}"),
                    LimitField::Window if kind == AlgorithmKind::Concurrency => {
                        format!("{path}.lease")
                    }
                    LimitField::Window => format!("{path}.window"),
                    LimitField::Cost => format!("{path}.cost"),
                    LimitField::Whole => path.to_string(),
                };
                self.limit_problem(field, e);
                None
            }
        }
    }

    fn limit_problem(&mut self, path: String, error: LimitError) {
        self.problem(path, error.to_string());
    }

    fn not_parameters(&mut self, path: &str, algorithm: &str, present: &[(&str, bool)]) {
        for (name, is_present) in present {
            if *is_present {
                self.problem(
                    format!("{path}.{name}"),
                    format!("is not a parameter of {algorithm}"),
                );
            }
        }
    }

    fn count(&mut self, path: &str, value: Option<i64>) -> Option<u32> {
        match value {
            None => {
                self.problem(path, "required");
                None
            }
            Some(n) if n >= 1 && n <= i64::from(u32::MAX) => Some(n as u32),
            Some(n) if n >= 1 => {
                self.problem(path, format!("must be at most {}", u32::MAX));
                None
            }
            Some(_) => {
                self.problem(path, "must be > 0");
                None
            }
        }
    }
}

/// Parses `500ms`, `1s`, `1m`, `1h`, `1h 30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration like 500ms, 1s, 1m or 1h ({e})"))
}

/// 64 hex digits as 32 bytes.
fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// True for names that can go into metric labels and store keys.
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// A short, stable fingerprint of a limit: the same limit gives the same fingerprint on every
/// instance and across restarts.
fn limit_fingerprint(limit: &Limit) -> String {
    let (a, b) = limit.algorithm().parameters();
    let spec = format!("{}:{a}:{b}:{}", limit.algorithm().name(), limit.cost());
    let digest = Sha256::digest(spec.as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
