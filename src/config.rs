//! The typed, validated configuration. `file.rs` holds the YAML as written; [`Config::from_yaml`]
//! parses it and checks every field, naming each problem by its path
//! (`routes[1].limits[0].refill_rate: must be > 0`). A `Config` that exists is valid.

pub mod file;
pub mod tls;

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderName, Method, Uri};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::identity::IdentityConfig;
pub use crate::limiter::OnError;
use crate::limiter::{Algorithm, Limit};
use file::{FileConfig, LimitFile, RouteFile};

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
    pub timeouts: Timeouts,
    pub routes: Vec<RouteConfig>,
    /// Global shadow mode: every limit decides and counts, none denies.
    pub shadow: bool,
    pub rate_limit_headers: HeaderProfile,
    pub log_format: LogFormat,
}

/// Which rate-limit fields responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderProfile {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Unix seconds), as GitHub and most gateways.
    XRateLimit,
    /// `RateLimit-Policy` and `RateLimit` of draft-ietf-httpapi-ratelimit-headers-09.
    Ietf,
    /// No rate-limit fields (429s still carry `Retry-After`).
    None,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The enforced limits: a request must pass all of them.
    pub limits: Vec<Limit>,
    /// The route's name plus a fingerprint of its limits: limiter state is kept per budget id, so
    /// a reload that changes a route's limits starts it afresh and one that does not keeps it.
    pub budget_id: String,
    /// Limits in shadow mode: decided and counted, never denying. A budget of their own.
    pub shadow_limits: Vec<Limit>,
    pub shadow_budget_id: String,
    /// Policy names for the IETF headers (`{route}-{position in the file}`), enforced then shadow.
    pub limit_names: Vec<String>,
    pub shadow_limit_names: Vec<String>,
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
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::one("", format!("cannot read {}: {e}", path.display())))?;
        Config::from_yaml(&text)
    }

    /// Parses and validates YAML text.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
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
        Config::from_file(file)
    }

    /// Validates the file structs.
    pub fn from_file(file: FileConfig) -> Result<Config, ConfigError> {
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
        let rate_limit_headers = match file.rate_limit_headers.as_deref().unwrap_or("x_ratelimit") {
            "x_ratelimit" => HeaderProfile::XRateLimit,
            "ietf" => HeaderProfile::Ietf,
            "none" => HeaderProfile::None,
            other => {
                v.problem(
                    "rate_limit_headers",
                    format!("{other:?} is not one of x_ratelimit, ietf, none"),
                );
                HeaderProfile::XRateLimit
            }
        };
        let log_format = match file.log_format.as_deref().unwrap_or("human") {
            "human" => LogFormat::Human,
            "json" => LogFormat::Json,
            other => {
                v.problem("log_format", format!("{other:?} is not one of human, json"));
                LogFormat::Human
            }
        };
        match (listen, storage, identity, v.problems.is_empty()) {
            (Some(listen), Some(storage), Some(identity), true) => Ok(Config {
                listen,
                admin_listen,
                tls,
                upstream_ca,
                storage,
                identity,
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
        let url = std::env::var("FLOODGATE_REDIS_URL").ok().or(s.url);
        let backend = match s.backend.as_deref().unwrap_or("memory") {
            "memory" => Backend::Memory,
            "redis" => match url {
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
            "redis_cluster" => match s.urls {
                Some(urls) if !urls.is_empty() => Backend::RedisCluster { urls },
                _ => {
                    self.problem(
                        "storage.urls",
                        "required (one or more redis:// URLs) when backend is redis_cluster",
                    );
                    return None;
                }
            },
            other => {
                self.problem(
                    "storage.backend",
                    format!("{other:?} is not one of memory, redis, redis_cluster"),
                );
                return None;
            }
        };
        let on_error = match s.on_error.as_deref().unwrap_or("allow") {
            "allow" => OnError::Allow,
            "deny" => OnError::Deny,
            "local" => OnError::Local,
            other => {
                self.problem(
                    "storage.on_error",
                    format!("{other:?} is not one of allow, deny, local"),
                );
                OnError::Allow
            }
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
        if r.name.is_empty()
            || !r
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
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
        let mut limits = Vec::new();
        let mut shadow_limits = Vec::new();
        let mut limit_names = Vec::new();
        let mut shadow_limit_names = Vec::new();
        for (n, l) in r.limits.iter().enumerate() {
            if let Some(limit) = self.limit(&format!("{path}.limits[{n}]"), l) {
                let name = format!("{}-{n}", r.name);
                if l.shadow.unwrap_or(false) {
                    shadow_limits.push(limit);
                    shadow_limit_names.push(name);
                } else {
                    limits.push(limit);
                    limit_names.push(name);
                }
            }
        }
        if self.problems.len() > before {
            return None;
        }
        let budget_id = format!("{}#{}", r.name, limits_fingerprint(&limits));
        let shadow_budget_id = format!("{}~shadow#{}", r.name, limits_fingerprint(&shadow_limits));
        Some(RouteConfig {
            name: r.name,
            path_prefix: r.path_prefix,
            methods,
            upstream: upstream?,
            limits,
            budget_id,
            shadow_limits,
            shadow_budget_id,
            limit_names,
            shadow_limit_names,
        })
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
        let before = self.problems.len();
        let algorithm = match l.algorithm.as_str() {
            "token_bucket" | "leaky_bucket" => {
                let leaky = l.algorithm == "leaky_bucket";
                let (rate_name, rate) = if leaky {
                    ("leak_rate", l.leak_rate)
                } else {
                    ("refill_rate", l.refill_rate)
                };
                let wrong: &[(&str, bool)] = &[
                    (
                        if leaky { "refill_rate" } else { "leak_rate" },
                        if leaky {
                            l.refill_rate.is_some()
                        } else {
                            l.leak_rate.is_some()
                        },
                    ),
                    ("limit", l.limit.is_some()),
                    ("window", l.window.is_some()),
                ];
                self.not_parameters(path, &l.algorithm, wrong);
                let capacity = self.count(&format!("{path}.capacity"), l.capacity);
                let interval_us = match rate {
                    None => {
                        self.problem(
                            format!("{path}.{rate_name}"),
                            format!("required for {}", l.algorithm),
                        );
                        None
                    }
                    Some(r) if r.is_nan() || r <= 0.0 || !r.is_finite() => {
                        self.problem(format!("{path}.{rate_name}"), "must be > 0");
                        None
                    }
                    Some(r) => Algorithm::interval_for_rate(r).or_else(|| {
                        self.problem(
                            format!("{path}.{rate_name}"),
                            "must be at most 1000000 per second",
                        );
                        None
                    }),
                };
                match (capacity, interval_us) {
                    (Some(capacity), Some(interval_us)) if leaky => Algorithm::LeakyBucket {
                        capacity,
                        interval_us,
                    },
                    (Some(capacity), Some(interval_us)) => Algorithm::TokenBucket {
                        capacity,
                        interval_us,
                    },
                    _ => return None,
                }
            }
            "fixed_window" | "sliding_window_log" | "sliding_window_counter" => {
                self.not_parameters(
                    path,
                    &l.algorithm,
                    &[
                        ("capacity", l.capacity.is_some()),
                        ("refill_rate", l.refill_rate.is_some()),
                        ("leak_rate", l.leak_rate.is_some()),
                    ],
                );
                let limit = self.count(&format!("{path}.limit"), l.limit);
                let window_us = match l.window.as_deref() {
                    None => {
                        self.problem(
                            format!("{path}.window"),
                            format!("required for {}", l.algorithm),
                        );
                        None
                    }
                    Some(text) => match parse_duration(text) {
                        Ok(d) if d >= Duration::from_millis(1) => Some(d.as_micros() as u64),
                        Ok(_) => {
                            self.problem(format!("{path}.window"), "must be at least 1ms");
                            None
                        }
                        Err(message) => {
                            self.problem(format!("{path}.window"), message);
                            None
                        }
                    },
                };
                let (Some(limit), Some(window_us)) = (limit, window_us) else {
                    return None;
                };
                match l.algorithm.as_str() {
                    "fixed_window" => Algorithm::FixedWindow { limit, window_us },
                    "sliding_window_log" => Algorithm::SlidingWindowLog { limit, window_us },
                    _ => Algorithm::SlidingWindowCounter { limit, window_us },
                }
            }
            other => {
                self.problem(
                    format!("{path}.algorithm"),
                    format!(
                        "{other:?} is not one of token_bucket, leaky_bucket, fixed_window, \
                         sliding_window_log, sliding_window_counter"
                    ),
                );
                return None;
            }
        };
        let cost = match l.cost {
            None => 1,
            Some(c) if c >= 1 && c <= i64::from(algorithm.max_cost()) => c as u32,
            Some(_) => {
                self.problem(
                    format!("{path}.cost"),
                    format!(
                        "must be between 1 and {} (a request costing more could never pass)",
                        algorithm.max_cost()
                    ),
                );
                return None;
            }
        };
        // Both stores compute in microseconds; the Redis scripts in doubles, exact below 2^53.
        let (units, span) = algorithm.parameters();
        if units
            .checked_mul(span)
            .is_none_or(|product| product >= 1 << 53)
        {
            self.problem(
                path.to_string(),
                "the budget spans too long (more than about 285 years of microseconds)",
            );
        }
        (self.problems.len() == before).then_some(Limit { algorithm, cost })
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

    fn count(&mut self, path: &str, value: Option<i64>) -> Option<NonZeroU32> {
        match value {
            None => {
                self.problem(path, "required");
                None
            }
            Some(n) if n >= 1 && n <= i64::from(u32::MAX) => NonZeroU32::new(n as u32),
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

/// A short, stable fingerprint of a route's limits: the same limits give the same fingerprint on
/// every instance and across restarts.
fn limits_fingerprint(limits: &[Limit]) -> String {
    let mut spec = String::new();
    for l in limits {
        let (a, b) = l.algorithm.parameters();
        spec.push_str(&format!("{}:{a}:{b}:{};", l.algorithm.name(), l.cost));
    }
    let digest = Sha256::digest(spec.as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
