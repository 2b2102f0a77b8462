//! The typed, validated configuration. `file.rs` holds the YAML as written; [`Config::from_yaml`]
//! parses it and checks every field, naming each problem by its path
//! (`routes[1].limits[0].refill_rate: must be > 0`). A `Config` that exists is valid.
//!
//! Closed choices (`storage.backend`, `on_error`, `algorithm`, `per`, ...) are serde enums, so
//! the parser itself names the allowed values. Limits are built through the limiter's checked
//! constructors; this module only attaches the field path to their errors. Environment
//! overrides (`FLOODGATE_REDIS_URL`) and the variables `${NAME}` in the file may name (see `config/env.rs`)
//! are read by the binary and passed in as [`Overrides`].

pub mod env;
pub mod file;
pub use cache::{CacheFile, RouteCacheFile};

mod admin;
mod alerts;
mod cache;
mod certificates;
mod consumers;
pub mod cost;
mod error;
mod exempt;
mod limit;
mod providers;
pub mod reload;
mod room;
mod route;
mod service;
mod storage;
mod telemetry;
mod tiers;
mod validate;

use validate::Validator;

pub use alerts::AlertSink;
pub use certificates::{
    AcmeChallenge, AcmeConfig, ClientAuth, TlsConfig, UpstreamTls, acme_domain,
};
pub use error::{ConfigError, FieldProblem};
pub use exempt::Exempt;
pub use providers::{DockerProvider, EngineEndpoint, ProvidersFile};
pub use room::{Activate, RoomConfig, RoomFile};
pub use route::{
    Budget, Cors, Figures, HeaderEdits, HeaderMatch, HostPattern, Part, PathMatch, Per,
    REFUSAL_NAMES, RequestView, RouteConfig, RouteLimit, RouteTimeouts, Templates, Upstream,
    UpstreamProtocol, Vars, WEBSOCKET_LEASE, WebSocketLimits, invalid_host, override_budget,
    request_host,
};
pub use service::{EntrySource, ForwardAuthConfig, ServiceConfig, ServiceFile, ServiceTls};
pub use storage::{Backend, StorageConfig};
pub use telemetry::{TelemetryConfig, TelemetryFile};
pub use tiers::KnownTiers;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::identity::{Consumers, IdentityConfig};
pub use crate::limiter::OnError;
use crate::tls;
use file::{Choice, FileConfig};

/// Values from outside the file that replace what it says: the binary reads them from the
/// environment (`FLOODGATE_REDIS_URL`, `FLOODGATE_DATABASE_URL`).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Replaces `storage.url` for the `redis` backend (`FLOODGATE_REDIS_URL`).
    pub redis_url: Option<String>,
    /// Replaces `storage.url` for the `postgres` backend (`FLOODGATE_DATABASE_URL`).
    pub database_url: Option<String>,
    /// The folder relative paths in the file are read from (default: the working directory).
    pub base_dir: Option<PathBuf>,
    /// The variables `${NAME}` in the file is replaced with (the process's environment).
    pub env: std::collections::HashMap<String, String>,
}

impl Overrides {
    /// Puts the URL the environment gives in place of `storage.url`: `FLOODGATE_DATABASE_URL`
    /// for the `postgres` backend, `FLOODGATE_REDIS_URL` for the others.
    fn apply(&self, file: &mut FileConfig) {
        let url = match file.storage.backend {
            Some(Choice::Known(file::BackendKind::Postgres)) => &self.database_url,
            _ => &self.redis_url,
        };
        if let Some(url) = url {
            file.storage.url = Some(url.clone());
        }
    }
}

/// A valid floodgate configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: Option<SocketAddr>,
    pub tls: Option<TlsConfig>,
    /// `http_listen:`: plain HTTP for ACME's HTTP-01 answers and a 308 to https for the rest.
    pub http_listen: Option<SocketAddr>,
    /// `http3:`: the QUIC listener, if any (always with `tls`).
    pub http3: Option<Http3Config>,
    /// `proxy_protocol.from`: the peers whose connections to `listen` begin with a PROXY
    /// protocol header (v1 or v2), which names the client; `None`: no PROXY protocol.
    pub proxy_protocol: Option<Arc<[ipnet::IpNet]>>,
    /// Roots for verifying HTTPS upstreams instead of the system's.
    pub upstream_ca: Option<UpstreamCa>,
    /// `resolver:`: how upstream names are found (restart-only).
    pub resolver: crate::upstream::discovery::ResolverSpec,
    pub storage: StorageConfig,
    pub identity: IdentityConfig,
    /// The known API keys, when the file has a `consumers:` section.
    pub consumers: Option<Arc<Consumers>>,
    /// The tiers limits and exemptions name (a token's unknown tier is `default`).
    pub tiers: Arc<KnownTiers>,
    pub timeouts: Timeouts,
    /// `cache:`: the response cache's bounds (every cached route shares them).
    pub cache: crate::cache::Settings,
    pub routes: Vec<RouteConfig>,
    /// Global shadow mode: every limit decides and counts, none denies.
    pub shadow: bool,
    pub rate_limit_headers: HeaderProfile,
    pub log_format: LogFormat,
    /// How request paths are normalised before routing.
    pub paths: crate::path::PathRules,
    /// `underscores_in_headers`: keep request header names with `_` (default false: dropped, as
    /// nginx drops them, since CGI, WSGI and Rack read `X_Consumer` as `X-Consumer`).
    pub underscores_in_headers: bool,
    /// The largest request body accepted, in bytes; `None` (`max_body_size: 0`): no limit.
    pub max_body_size: Option<std::num::NonZeroU64>,
    /// The most client connections open at once, on the proxy listener.
    pub max_connections: usize,
    /// New HTTP/2 streams per connection: a token bucket (see `server`); `None`: no cap.
    pub http2_streams: Option<crate::limiter::Limit>,
    /// HTTP/2 streams a connection may abandon before their response: a token bucket (see
    /// `server`); past it the connection is closed.
    pub http2_resets: crate::limiter::Limit,
    /// `service:`: the limiter as a rate-limit service for other proxies.
    pub service: Option<Arc<ServiceConfig>>,
    /// `telemetry:` (or the `OTEL_*` variables): OpenTelemetry over OTLP; `None`: off.
    pub telemetry: Option<TelemetryConfig>,
    /// `alerts:`: webhooks told when an identity's budget is spent past a share of it.
    pub alerts: Vec<AlertSink>,
    /// `waiting_room:`: admission by turn to some routes.
    pub rooms: Vec<RoomConfig>,
    /// `providers.docker`: routes from containers' labels (restart-only).
    pub docker: Option<DockerProvider>,
    /// `usage_path:`: the path on the proxy listener where a client reads its own budgets.
    pub usage_path: Option<String>,
    /// `admin.token_file`'s token (surrounding whitespace trimmed): without one, the admin
    /// listener's write endpoints answer 403.
    pub admin_token: Option<Arc<str>>,
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

/// `http3:`: where and how HTTP/3 is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http3Config {
    /// The UDP address.
    pub listen: SocketAddr,
    /// `Alt-Svc: h3=":PORT"` on the TCP listener's answers, for the certificate's names.
    pub advertise: bool,
    /// Request streams open at once per connection.
    pub max_streams: u32,
    /// A connection silent this long is closed.
    pub idle_timeout: Duration,
}

/// `upstream_ca:`: a PEM bundle of CA certificates trusted for HTTPS upstreams in place of the
/// system's roots. Built only by the config's validation, from the file it names.
#[derive(Debug, Clone)]
pub struct UpstreamCa {
    path: PathBuf,
    roots: Arc<rustls::RootCertStore>,
}

impl UpstreamCa {
    /// The bundle's file, as the config names it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The certificates read from it.
    pub fn roots(&self) -> Arc<rustls::RootCertStore> {
        self.roots.clone()
    }
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
    /// A request body may go this long without data (nginx `client_body_timeout`); past it, 408.
    pub client_body: Duration,
    /// A response body may go this long without data (nginx `proxy_read_timeout`); past it the
    /// response is cut off.
    pub upstream_body: Duration,
    /// A connection with no request in progress is closed after this (nginx
    /// `keepalive_timeout`; for HTTP/2, with keep-alive pings).
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: Duration::from_secs(10),
            upstream_connect: Duration::from_secs(2),
            upstream_response: Duration::from_secs(30),
            drain: Duration::from_secs(30),
            client_body: Duration::from_secs(60),
            upstream_body: Duration::from_secs(60),
            idle: Duration::from_secs(75),
        }
    }
}

impl Config {
    /// Reads and validates a config file. Blocking: call it from a blocking thread on a runtime.
    /// Relative paths in it (`consumers.file`) are read from the file's folder.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        Source::load(path, overrides)?.config(&[])
    }
}

/// A config file read and parsed, not yet validated: what a reload keeps to validate again with
/// the routes a provider discovered ([`Source::config`]).
#[derive(Debug, Clone)]
pub struct Source {
    /// The file as a generic value (its `${NAME}`s replaced).
    value: serde_json::Value,
    overrides: Overrides,
    /// How many routes the file has.
    file_routes: usize,
}

impl Source {
    /// Reads a config file. Blocking: call it from a blocking thread on a runtime. Relative
    /// paths in it (`consumers.file`) are read from the file's folder.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Source, ConfigError> {
        // A config is kilobytes; a huge file, a device or a FIFO is a mistake, and would stall
        // whoever parses it (`files` reads regular files only, up to a limit).
        let text = crate::files::read_text(path).map_err(|e| {
            let denied = std::fs::File::open(path)
                .err()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
            let who = match denied {
                true => format!(
                    "; floodgate runs as {}, which must be able to read it (the Docker image runs as uid 10001)",
                    process_user()
                ),
                false => String::new(),
            };
            ConfigError::one("", format!("{e}{who}"))
        })?;
        let overrides = Overrides {
            base_dir: path.parent().map(Path::to_path_buf),
            ..overrides.clone()
        };
        Source::parse(&text, &overrides)
    }

    /// Parses YAML text, with `overrides`.
    pub fn parse(text: &str, overrides: &Overrides) -> Result<Source, ConfigError> {
        let text = env::expand(text, &overrides.env).map_err(|problems| ConfigError {
            problems: problems
                .into_iter()
                .map(|message| FieldProblem {
                    path: String::new(),
                    message,
                })
                .collect(),
        })?;
        let text = text.as_ref();
        // YAML → a generic value → the file structs, so that serde_path_to_error can name the
        // field of a type error or unknown key whatever the YAML parser reports.
        // `.inf` and `.nan` come through as strings, so the field they are in gets named below.
        let mut options = serde_saphyr::Options::default();
        options.non_finite_float_policy = serde_saphyr::NonFiniteFloatPolicy::AsString;
        let value: serde_json::Value = serde_saphyr::from_str_with_options(text, options)
            .map_err(|e| ConfigError::one("", format!("invalid YAML: {e}")))?;
        let file_routes = value
            .get("routes")
            .and_then(|r| r.as_array())
            .map_or(0, Vec::len);
        Ok(Source {
            value,
            overrides: overrides.clone(),
            file_routes,
        })
    }

    /// How many routes the file itself has: a problem at `routes[N]` with N at least this is
    /// one of the discovered routes'.
    pub fn file_routes(&self) -> usize {
        self.file_routes
    }

    /// The validated config: the file's routes, then `discovered` (routes as written, each with
    /// its hold, in that order).
    pub fn config(
        &self,
        discovered: &[(serde_json::Value, Duration)],
    ) -> Result<Config, ConfigError> {
        let mut value = self.value.clone();
        if !discovered.is_empty()
            && let serde_json::Value::Object(map) = &mut value
        {
            let routes = map
                .entry("routes")
                .or_insert_with(|| serde_json::Value::Array(Vec::new()));
            if let serde_json::Value::Array(list) = routes {
                list.extend(discovered.iter().map(|(route, _)| route.clone()));
            }
        }
        let mut file: FileConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::one(
                if path == "." { String::new() } else { path },
                e.into_inner().to_string(),
            )
        })?;
        for (route, (_, grace)) in file
            .routes
            .iter_mut()
            .skip(self.file_routes)
            .zip(discovered)
        {
            route.discovered = Some(*grace);
        }
        Config::from_file(file, &self.overrides)
    }
}

impl Config {
    /// Parses and validates YAML text, with no overrides.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        Config::from_yaml_with(text, &Overrides::default())
    }

    /// Parses and validates YAML text, applying `overrides`.
    pub fn from_yaml_with(text: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
        Source::parse(text, overrides)?.config(&[])
    }

    /// Validates the file structs.
    pub fn from_file(mut file: FileConfig, overrides: &Overrides) -> Result<Config, ConfigError> {
        overrides.apply(&mut file);
        let mut v = Validator::default();
        let listen = v.socket_addr("listen", &file.listen);
        let admin_listen = file
            .admin_listen
            .as_deref()
            .and_then(|a| v.socket_addr("admin_listen", a));
        let tls_set = file.tls.is_some();
        let tls = file.tls.and_then(|t| v.tls(t));
        let http_listen = file
            .http_listen
            .as_deref()
            .and_then(|a| v.socket_addr("http_listen", a));
        if http_listen.is_some() && !tls_set {
            v.problem(
                "http_listen",
                "needs `tls:`: it answers ACME's HTTP-01 and sends everything else to https",
            );
        }
        if file.identity.client_cert == Some(true)
            && tls.as_ref().is_some_and(|t| t.client_auth().is_none())
        {
            v.problem(
                "identity.client_cert",
                "needs `tls.client_auth` (the CA client certificates are verified against)",
            );
        }
        if let Some(acme) = tls.as_ref().and_then(|t| t.acme.as_ref())
            && acme.challenge == AcmeChallenge::Http01
            && http_listen.is_none()
        {
            v.problem(
                "tls.acme.challenge",
                "http-01 is answered on `http_listen` (port 80 as the CA sees it): set it, or use tls-alpn-01",
            );
        }
        let http3 = file.http3.and_then(|h| v.http3(h, tls_set));
        let proxy_protocol = file.proxy_protocol.map(|p| {
            if p.from.is_empty() {
                v.problem(
                    "proxy_protocol.from",
                    "list the balancers that send it (10.0.0.0/8): from any other peer a PROXY header is refused",
                );
            }
            Arc::from(v.networks("proxy_protocol.from", &p.from))
        });
        let upstream_ca = file.upstream_ca.and_then(|path| v.upstream_ca(path));
        let resolver = v.resolver(file.resolver);
        let storage = v.storage(file.storage);
        if let Some(acme) = tls.as_ref().and_then(|t| t.acme.as_ref())
            && acme.dir.is_none()
            && storage
                .as_ref()
                .is_some_and(|s| matches!(s.backend, Backend::Memory))
        {
            v.problem(
                "tls.acme.dir",
                "on the memory store, name the directory the ACME account and certificates are kept in (a shared store keeps them for every instance)",
            );
        }
        let cache = v.cache(file.cache, storage.as_ref());
        let identity = v.identity(file.identity, overrides.base_dir.as_deref());
        let consumers = file
            .consumers
            .map(|c| Arc::new(v.consumers(c, overrides.base_dir.as_deref())));
        let timeouts = v.timeouts(file.timeouts);
        let tiers_from_tokens = identity
            .as_ref()
            .and_then(|i| i.jwt.as_ref())
            .is_some_and(|jwt| jwt.tier_claim.is_some());
        let exempt = v.exempt(
            "exempt",
            file.exempt,
            consumers.as_deref(),
            tiers_from_tokens,
        );
        v.verifies_tokens = identity.as_ref().is_some_and(|i| i.jwt.is_some());
        v.has_global_store = storage.as_ref().is_some_and(|s| s.global.is_some());
        let routes = v.routes(
            file.routes,
            &exempt,
            consumers.as_deref(),
            tiers_from_tokens,
            identity.as_ref(),
        );
        v.across_routes(
            &routes,
            consumers.as_deref(),
            tiers_from_tokens,
            storage.as_ref(),
        );
        let rate_limit_headers = v.choice(
            "rate_limit_headers",
            file.rate_limit_headers,
            HeaderProfile::XRateLimit,
        );
        let log_format = v.choice("log_format", file.log_format, LogFormat::Human);
        let paths = v.path_rules(file.path_normalization, file.merge_slashes);
        let max_body_size = std::num::NonZeroU64::new(v.size(
            "max_body_size",
            file.max_body_size.as_ref().map(|s| s.0.as_str()),
            1 << 20,
        ));
        let (http2_streams, http2_resets) = v.http2_rates(
            file.http2_max_streams_per_second,
            file.http2_max_resets_per_second,
        );
        let service = file
            .service
            .and_then(|s| v.service(s, overrides.base_dir.as_deref()))
            .map(Arc::new);
        let telemetry = v.telemetry(file.telemetry, &overrides.env);
        let admin_token = v.admin_token(file.admin, overrides.base_dir.as_deref());
        let alerts = v.alerts(file.alerts);
        let rooms = v.rooms(file.waiting_room, &routes);
        let docker = v.providers(file.providers);
        let usage_path = v.usage_path(file.usage_path);
        let max_connections = v.max_connections(file.max_connections);
        match (
            listen,
            storage,
            identity,
            http2_streams,
            http2_resets,
            v.problems.is_empty(),
        ) {
            (
                Some(listen),
                Some(storage),
                Some(identity),
                Some(http2_streams),
                Some(http2_resets),
                true,
            ) => Ok(Config {
                listen,
                admin_listen,
                tls,
                http_listen,
                http3,
                proxy_protocol,
                upstream_ca,
                resolver,
                storage,
                identity,
                consumers,
                timeouts,
                tiers: Arc::new(KnownTiers::of(&routes)),
                cache,
                routes,
                shadow: file.shadow.unwrap_or(false),
                rate_limit_headers,
                log_format,
                paths,
                underscores_in_headers: file.underscores_in_headers.unwrap_or(false),
                max_body_size,
                max_connections,
                http2_streams,
                http2_resets,
                service,
                telemetry,
                alerts,
                rooms,
                docker,
                usage_path,
                admin_token,
            }),
            _ => Err(ConfigError {
                problems: v.problems,
            }),
        }
    }
}

impl Validator {
    /// `routes:`, each validated at its path (`routes[2]`), its `exempt` joined to the top
    /// level's, its trailers denied the identity's headers; a name used twice is a problem.
    fn routes(
        &mut self,
        files: Vec<file::RouteFile>,
        exempt: &Exempt,
        consumers: Option<&Consumers>,
        tiers_from_tokens: bool,
        identity: Option<&IdentityConfig>,
    ) -> Vec<RouteConfig> {
        let mut routes = Vec::with_capacity(files.len());
        for (i, mut route) in files.into_iter().enumerate() {
            let path = format!("routes[{i}]");
            let own = self.exempt(
                &format!("{path}.exempt"),
                route.exempt.take(),
                consumers,
                tiers_from_tokens,
            );
            if let Some(mut route) = self.route(&path, route) {
                route.exempt = exempt.with(&own);
                if let Some(identity) = identity {
                    let names = [&identity.api_key_header, &identity.user_id_header];
                    route.trailers_denied = (route.trailers_denied.iter())
                        .chain(names)
                        .cloned()
                        .collect();
                }
                if routes.iter().any(|r: &RouteConfig| r.name == route.name) {
                    self.problem(
                        format!("routes[{i}].name"),
                        format!("duplicate route name {:?}", route.name),
                    );
                }
                routes.push(route);
            }
        }
        routes
    }

    /// What holds across routes: tiers the routes name that exist, one adaptive limit's bounds
    /// for the routes that share it, and on Redis Cluster each route's limits in one slot.
    fn across_routes(
        &mut self,
        routes: &[RouteConfig],
        consumers: Option<&Consumers>,
        tiers_from_tokens: bool,
        storage: Option<&StorageConfig>,
    ) {
        self.known_tiers(routes, consumers, tiers_from_tokens);
        self.shared_adaptive_bounds(routes);
        if let Some(storage) = storage
            && matches!(storage.backend, Backend::RedisCluster { .. })
        {
            self.single_slot_routes(routes);
        }
    }

    /// `path_normalization` (escaped slashes refused by default) and `merge_slashes` (on).
    fn path_rules(
        &mut self,
        escaped: Option<Choice<crate::path::EscapedSlashes>>,
        merge: Option<bool>,
    ) -> crate::path::PathRules {
        crate::path::PathRules {
            escaped_slashes: self.choice(
                "path_normalization",
                escaped,
                crate::path::EscapedSlashes::Reject,
            ),
            merge_slashes: merge.unwrap_or(true),
        }
    }

    /// `http2_max_streams_per_second` (no cap by default) and `http2_max_resets_per_second`
    /// (100): the outer `Option` says valid or not.
    fn http2_rates(
        &mut self,
        streams: Option<f64>,
        resets: Option<f64>,
    ) -> (
        Option<Option<crate::limiter::Limit>>,
        Option<crate::limiter::Limit>,
    ) {
        // Outer `Option`: valid or not; inner: configured or not (no cap by default).
        let http2_streams = match streams {
            None => Some(None),
            Some(rate) => self
                .per_connection_rate("http2_max_streams_per_second", rate, 0.5)
                .map(Some),
        };
        let http2_resets =
            self.per_connection_rate("http2_max_resets_per_second", resets.unwrap_or(100.0), 2.0);
        (http2_streams, http2_resets)
    }

    /// `max_connections`: 10,000 by default, more than 0.
    fn max_connections(&mut self, max_connections: Option<u64>) -> usize {
        match max_connections {
            None => 10_000,
            Some(0) => {
                self.problem("max_connections", "must be > 0");
                1
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        }
    }
}

/// This process's user and group ids, as `uid N (gid M)`: the owner of `/proc/self` on Linux.
fn process_user() -> String {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata("/proc/self") {
        Ok(meta) => format!("uid {} (gid {})", meta.uid(), meta.gid()),
        Err(_) => "a user".to_string(),
    }
}

/// Parses `500ms`, `1s`, `1m`, `1h`, `1h 30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration like 500ms, 1s, 1m or 1h ({e})"))
}

/// True for names that can go into metric labels and store keys.
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

#[cfg(test)]
mod tests;
