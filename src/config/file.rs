//! The config file as written: plain serde structs that reject unknown keys. Nothing here is
//! checked beyond its YAML type; `config.rs` turns these into a typed, validated [`super::Config`].

use serde::Deserialize;

use super::{HeaderProfile, LogFormat};
use crate::limiter::{AlgorithmKind, OnError};

/// A closed choice as written: the value, or what serde said is wrong with it (which names the
/// allowed values). Kept rather than failed on, so the validator reports it with every other
/// problem in the file at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice<T> {
    Known(T),
    Invalid(String),
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Choice<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(match T::deserialize(value) {
            Ok(known) => Choice::Known(known),
            Err(e) => Choice::Invalid(e.to_string()),
        })
    }
}

/// `storage.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Memory,
    Redis,
    RedisCluster,
    RedisSentinel,
    Postgres,
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: String,
    #[serde(default)]
    pub admin_listen: Option<String>,
    #[serde(default)]
    pub tls: Option<TlsFile>,
    /// Plain HTTP beside `listen`: ACME's HTTP-01 answers, and a 308 to https for the rest.
    #[serde(default)]
    pub http_listen: Option<String>,
    /// HTTP/3 over QUIC beside the TCP listener (needs `tls`).
    #[serde(default)]
    pub http3: Option<Http3File>,
    /// The PROXY protocol (v1 and v2) on `listen`, from these peers.
    #[serde(default)]
    pub proxy_protocol: Option<ProxyProtocolFile>,
    /// A PEM bundle of CA certificates for verifying HTTPS upstreams (default: the system's).
    #[serde(default)]
    pub upstream_ca: Option<String>,
    /// How upstream names are resolved.
    #[serde(default)]
    pub resolver: Option<ResolverFile>,
    #[serde(default)]
    pub storage: StorageFile,
    #[serde(default)]
    pub identity: IdentityFile,
    #[serde(default)]
    pub timeouts: TimeoutsFile,
    #[serde(default)]
    pub consumers: Option<ConsumersFile>,
    #[serde(default)]
    pub routes: Vec<RouteFile>,
    /// The response cache's bounds.
    #[serde(default)]
    pub cache: Option<super::CacheFile>,
    /// The limiter as a rate-limit service for other proxies.
    #[serde(default)]
    pub service: Option<super::ServiceFile>,
    /// OpenTelemetry over OTLP.
    #[serde(default)]
    pub telemetry: Option<super::TelemetryFile>,
    /// Webhooks told when a budget is spent past a share of it.
    #[serde(default)]
    pub alerts: Option<Vec<super::alerts::AlertFile>>,
    /// `waiting_room:`: admission by turn.
    #[serde(default)]
    pub waiting_room: Option<Vec<super::RoomFile>>,
    /// `providers:`: routes from the containers' labels.
    #[serde(default)]
    pub providers: Option<super::ProvidersFile>,
    /// On the proxy listener: a client's own budgets (`GET {usage_path}`).
    #[serde(default)]
    pub usage_path: Option<String>,
    /// The admin listener's write endpoints.
    #[serde(default)]
    pub admin: Option<AdminFile>,
    /// Global shadow mode: decide and count every limit, never deny.
    #[serde(default)]
    pub shadow: Option<bool>,
    /// Who no limit applies to, on every route.
    #[serde(default)]
    pub exempt: Option<ExemptFile>,
    /// Which rate-limit response headers to send: `x_ratelimit`, `ietf` or `none`.
    #[serde(default)]
    pub rate_limit_headers: Option<Choice<HeaderProfile>>,
    /// Log format: `human` or `json` (the `--log-format` flag wins).
    #[serde(default)]
    pub log_format: Option<Choice<LogFormat>>,
    /// Encoded slashes and backslashes in paths: `keep`, `reject` (default) or `decode`.
    #[serde(default)]
    pub path_normalization: Option<Choice<crate::path::EscapedSlashes>>,
    /// Merge repeated slashes in paths before routing (default true).
    #[serde(default)]
    pub merge_slashes: Option<bool>,
    /// Keep request header names that hold `_` (default false: they are dropped, as nginx does).
    #[serde(default)]
    pub underscores_in_headers: Option<bool>,
    /// The largest request body accepted: `1m` (default), `512k`, a number of bytes; `0` for no
    /// limit.
    #[serde(default)]
    pub max_body_size: Option<SizeText>,
    /// The most client connections open at once (default 10000).
    #[serde(default)]
    pub max_connections: Option<u64>,
    /// New HTTP/2 streams one connection may open per second (default: no cap; burst: half that).
    #[serde(default)]
    pub http2_max_streams_per_second: Option<f64>,
    /// HTTP/2 streams one connection may abandon (reset before their response) per second
    /// (default 100; burst: twice that). Past it the connection is closed.
    #[serde(default)]
    pub http2_max_resets_per_second: Option<f64>,
}

/// A size as written: a YAML number (`1048576`, `0`) or a string with a unit (`1m`, `512k`),
/// kept as text for the validator to parse and report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeText(pub String);

impl<'de> Deserialize<'de> for SizeText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(text) => Ok(SizeText(text)),
            serde_json::Value::Number(n) => Ok(SizeText(n.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "expected a size like 1m, 512k or a number of bytes, found {other}"
            ))),
        }
    }
}

/// `request_headers:` / `response_headers:` on a route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEditsFile {
    #[serde(default)]
    pub set: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub remove: Option<Vec<String>>,
}

/// `tls:` — terminate TLS on the proxy listener.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    /// One certificate chain and its key (the same as one entry of `certificates`).
    #[serde(default)]
    pub cert: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    /// Several, chosen by the name the client asks for (SNI).
    #[serde(default)]
    pub certificates: Vec<CertificateFile>,
    /// Certificates ordered and renewed from an ACME CA.
    #[serde(default)]
    pub acme: Option<AcmeFile>,
    /// Client certificates asked for on `listen`.
    #[serde(default)]
    pub client_auth: Option<ClientAuthFile>,
}

/// `tls.certificates[]`: a chain (leaf first) and its key, PEM files.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateFile {
    pub cert: String,
    pub key: String,
}

/// `tls.acme:` — certificates from an ACME CA (RFC 8555).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeFile {
    pub directory: String,
    #[serde(default)]
    pub email: Option<String>,
    /// Default: every exact name in the routes' hosts.
    #[serde(default)]
    pub domains: Option<Vec<String>>,
    /// `http-01` (default) or `tls-alpn-01`.
    #[serde(default)]
    pub challenge: Option<String>,
    /// The CA certificate that signs the directory's own HTTPS certificate.
    #[serde(default)]
    pub ca: Option<String>,
    /// Where the account and certificates are kept on the memory store.
    #[serde(default)]
    pub dir: Option<String>,
}

/// `tls.client_auth:` — client certificates verified against `ca`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAuthFile {
    pub ca: String,
    /// A handshake without a valid certificate fails (default false: one is asked for, not
    /// required).
    #[serde(default)]
    pub required: Option<bool>,
}

/// `upstream_tls:` on a route — how its upstreams are reached over TLS.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsFile {
    /// The CA bundle the upstream's certificate must chain to (default: `upstream_ca`, else
    /// the system's roots).
    #[serde(default)]
    pub ca: Option<String>,
    /// A client certificate presented to the upstream (with `key`).
    #[serde(default)]
    pub cert: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    /// The name sent as SNI and verified in the upstream's certificate (default: the upstream
    /// URL's host).
    #[serde(default)]
    pub server_name: Option<String>,
}

/// `http3:` — a QUIC listener (UDP) serving HTTP/3 with the proxy's routes and limits.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Http3File {
    pub listen: String,
    /// Say `Alt-Svc: h3=":PORT"` on HTTP/1.1 and HTTP/2 answers (default true).
    #[serde(default)]
    pub advertise: Option<bool>,
    /// Request streams open at once per connection (default 100).
    #[serde(default)]
    pub max_streams: Option<u64>,
    /// How long a connection may be silent before it is closed (default 30s).
    #[serde(default)]
    pub idle_timeout: Option<String>,
}

/// `admin:`: what the admin listener's write endpoints need.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminFile {
    /// A file holding the bearer token the write endpoints require.
    #[serde(default)]
    pub token_file: Option<String>,
}

/// `storage:` — where limiter state lives.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageFile {
    #[serde(default)]
    pub backend: Option<Choice<BackendKind>>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub urls: Option<Vec<String>>,
    /// `redis_sentinel`: the sentinels' URLs.
    #[serde(default)]
    pub sentinels: Option<Vec<String>>,
    /// `redis_sentinel`: the name the sentinels know the master by.
    #[serde(default)]
    pub master_name: Option<String>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub on_error: Option<Choice<OnError>>,
    #[serde(default)]
    pub key_prefix: Option<String>,
    /// Memory store: the most identities tracked at once.
    #[serde(default)]
    pub max_keys: Option<u64>,
    /// Redis and PostgreSQL: batch the decisions waiting for one server into one call (default
    /// true).
    #[serde(default)]
    pub batch: Option<bool>,
    /// Redis: `auto` (default) leases budgets this instance spends fast; `disabled`.
    #[serde(default)]
    pub leases: Option<Choice<LeaseMode>>,
    /// How long a lease lasts at most (default 250ms).
    #[serde(default)]
    pub lease_ttl: Option<String>,
    /// The store that holds `scope: global` budgets.
    #[serde(default)]
    pub global: Option<GlobalFile>,
}

/// `storage.global`: the store of budgets shared across regions.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalFile {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub lease_ttl: Option<String>,
    #[serde(default)]
    pub timeout: Option<String>,
}

/// A limit's `scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Region,
    Global,
}

/// `identity:` — whose budget a request spends.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityFile {
    #[serde(default)]
    pub api_key_header: Option<String>,
    #[serde(default)]
    pub user_id_header: Option<String>,
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// IPv6 clients are identified by this prefix length (default 64).
    #[serde(default)]
    pub ipv6_prefix: Option<i64>,
    /// Remove the user id header from untrusted peers' requests before forwarding (default true).
    #[serde(default)]
    pub strip_untrusted_user_id: Option<bool>,
    /// Bearer tokens, verified: their subject is the identity after the API key.
    #[serde(default)]
    pub jwt: Option<JwtFile>,
    /// A one-value header naming the client, believed from trusted proxies.
    #[serde(default)]
    pub client_ip_header: Option<String>,
    /// Walk RFC 7239 `Forwarded: for=` (default false).
    #[serde(default)]
    pub forwarded: Option<bool>,
    /// A verified client certificate names the client first (default false).
    #[serde(default)]
    pub client_cert: Option<bool>,
}

/// `identity.jwt:` — verified bearer tokens.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFile {
    /// The header carrying `Bearer <token>` (default Authorization).
    #[serde(default)]
    pub header: Option<String>,
    /// A JWKS (JSON Web Key Set) file, re-read at every reload.
    #[serde(default)]
    pub jwks_file: Option<String>,
    /// A JWKS URL, fetched and refreshed.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// A file holding the shared secret of HS256/384/512 tokens (re-read at every reload).
    #[serde(default)]
    pub hmac_secret_file: Option<String>,
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub audiences: Vec<String>,
    /// The signature algorithms accepted (default RS256, ES256, EdDSA); `none` never is.
    #[serde(default)]
    pub algorithms: Option<Vec<String>>,
    #[serde(default)]
    pub subject_claim: Option<String>,
    #[serde(default)]
    pub tier_claim: Option<String>,
    #[serde(default)]
    pub leeway: Option<String>,
    #[serde(default)]
    pub when_missing: Option<Choice<crate::identity::jwt::WhenMissing>>,
}

/// `consumers:` — the API keys floodgate knows.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumersFile {
    /// `reject` (401) or `anonymous`.
    #[serde(default)]
    pub unknown_key: Option<Choice<crate::identity::UnknownKey>>,
    /// A YAML file holding a list of entries (relative paths: to the config file's folder).
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub entries: Vec<ConsumerFile>,
}

/// One consumer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerFile {
    pub name: String,
    #[serde(default)]
    pub tier: Option<String>,
    /// The hex SHA-256 of each of its keys (`floodgate hash-key KEY` prints it).
    #[serde(default)]
    pub keys_sha256: Vec<String>,
}

/// `storage.leases`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseMode {
    Auto,
    Disabled,
}

/// `timeouts:` — how long floodgate waits on clients and upstreams.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsFile {
    #[serde(default)]
    pub header_read: Option<String>,
    #[serde(default)]
    pub upstream_connect: Option<String>,
    #[serde(default)]
    pub upstream_response: Option<String>,
    #[serde(default)]
    pub drain: Option<String>,
    #[serde(default)]
    pub client_body: Option<String>,
    #[serde(default)]
    pub upstream_body: Option<String>,
    #[serde(default)]
    pub idle: Option<String>,
}

/// `proxy_protocol:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyProtocolFile {
    pub from: Vec<String>,
}

/// A route's `websocket:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSocketFile {
    #[serde(default)]
    pub max_connections: Option<i64>,
    #[serde(default)]
    pub messages: Option<MessagesFile>,
    #[serde(default)]
    pub max_message: Option<SizeText>,
    #[serde(default)]
    pub idle_timeout: Option<String>,
}

/// `websocket.messages:`: a token bucket per connection.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesFile {
    pub capacity: i64,
    pub refill_rate: f64,
}

/// A route's `cors:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsFile {
    pub origins: Vec<String>,
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    #[serde(default)]
    pub headers: Option<Vec<String>>,
    #[serde(default)]
    pub expose: Option<Vec<String>>,
    #[serde(default)]
    pub credentials: Option<bool>,
    #[serde(default)]
    pub max_age: Option<String>,
}

/// One template of a route's `refusals:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalFile {
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub content_type: Option<String>,
    pub body: String,
}

/// One entry of `routes:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    pub name: String,
    pub path_prefix: String,
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    /// Host names (`*.` for subdomains) the route answers for; none: any host.
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    /// Headers the request must have: each a value, or `"*"` for any.
    #[serde(default)]
    pub headers: Option<std::collections::BTreeMap<String, String>>,
    /// `prefix` (default: a plain string prefix, like nginx) or `segment` (the prefix must end
    /// at a `/`: `/api/rides` matches `/api/rides/1`, not `/api/ridesX`).
    #[serde(default)]
    pub path_match: Option<Choice<super::PathMatch>>,
    /// One origin (a name: every address it resolves to is an endpoint); or `upstreams`.
    #[serde(default)]
    pub upstream: Option<String>,
    /// A pool of origins, each a URL or `{url, weight}` (instead of `upstream`).
    #[serde(default)]
    pub upstreams: Option<Vec<OriginFile>>,
    /// `least_request` (default), `round_robin` or `hash`.
    #[serde(default)]
    pub balance: Option<String>,
    /// `balance: hash` only: `identity` (default) or `header:NAME`.
    #[serde(default)]
    pub hash_on: Option<String>,
    /// Passive ejection (on by default).
    #[serde(default)]
    pub outlier: Option<OutlierFile>,
    /// Retries of failed attempts on another endpoint.
    #[serde(default)]
    pub retries: Option<RetriesFile>,
    /// Active health checks.
    #[serde(default)]
    pub health_check: Option<HealthCheckFile>,
    /// `http1` (default), `http2` (h2c by prior knowledge on `http://`, ALPN `h2` on
    /// `https://`) or `auto` (ALPN picks on `https://`; HTTP/1.1 on `http://`).
    #[serde(default)]
    pub upstream_protocol: Option<Choice<super::UpstreamProtocol>>,
    /// The gRPC status of a rate-limited gRPC call: `resource_exhausted` (default) or
    /// `unavailable` (Envoy's default).
    #[serde(default)]
    pub grpc_rate_limited_status: Option<Choice<crate::grpc::RateLimitedStatus>>,
    /// Rewrite `Location` and `Content-Location` headers that point at the upstream's origin to
    /// the origin the client used (default true, as nginx's `proxy_redirect default`).
    #[serde(default)]
    pub rewrite_redirects: Option<bool>,
    /// What the matched `path_prefix` becomes in the forwarded path.
    #[serde(default)]
    pub rewrite_prefix: Option<String>,
    /// Headers set and removed on the forwarded request.
    #[serde(default)]
    pub request_headers: Option<HeaderEditsFile>,
    /// Headers set and removed on every answer of the route.
    #[serde(default)]
    pub response_headers: Option<HeaderEditsFile>,
    /// `high`, `normal` (default) or `low`: how soon its requests are shed when the upstream's
    /// learned limit binds.
    #[serde(default)]
    pub priority: Option<Choice<crate::adaptive::Priority>>,
    /// Learn how many requests in flight the upstream can take.
    #[serde(default)]
    pub adaptive_concurrency: Option<AdaptiveFile>,
    /// Who no limit of this route applies to (beside the global `exempt:`).
    #[serde(default)]
    pub exempt: Option<ExemptFile>,
    /// Cache this route's GET (and HEAD) answers.
    #[serde(default)]
    pub cache: Option<super::RouteCacheFile>,
    #[serde(default)]
    pub limits: Vec<LimitFile>,
    /// CORS for browser clients: preflights answered by floodgate, the allowed origin on every
    /// answer of the route.
    #[serde(default)]
    pub cors: Option<CorsFile>,
    /// This route's own bodies for floodgate's refusals, by refusal name.
    #[serde(default)]
    pub refusals: Option<std::collections::BTreeMap<String, RefusalFile>>,
    /// This route's own `timeouts.*` (those after routing).
    #[serde(default)]
    pub timeouts: Option<TimeoutsFile>,
    /// This route's own `max_body_size`.
    #[serde(default)]
    pub max_body_size: Option<SizeText>,
    /// Limits on its upgraded (WebSocket) connections.
    #[serde(default)]
    pub websocket: Option<WebSocketFile>,
    /// How its `https://` upstreams are reached: trust, client certificate, server name.
    #[serde(default)]
    pub upstream_tls: Option<UpstreamTlsFile>,
    /// Set for a route a provider discovered (never from the file): its `recreate_grace`. Its
    /// pool may then be empty (its containers all gone or starting), holding requests that long.
    #[serde(skip)]
    pub discovered: Option<std::time::Duration>,
}

/// An entry of `upstreams:`: a URL, or a URL with its weight.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OriginFile {
    Url(String),
    Weighted(WeightedOriginFile),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedOriginFile {
    pub url: String,
    #[serde(default)]
    pub weight: Option<u32>,
}

/// `health_check:` on a route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckFile {
    pub path: String,
    #[serde(default)]
    pub interval: Option<String>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub healthy_after: Option<u32>,
    #[serde(default)]
    pub unhealthy_after: Option<u32>,
}

/// `outlier:` on a route.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutlierFile {
    #[serde(default)]
    pub consecutive_failures: Option<u32>,
    #[serde(default)]
    pub ejection: Option<String>,
    /// A share of the pool, like `50%`.
    #[serde(default)]
    pub max_ejected: Option<String>,
}

/// `retries:` on a route.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetriesFile {
    #[serde(default)]
    pub attempts: Option<u32>,
    /// Names, and statuses as numbers or strings (`[connect_failure, 503]`).
    #[serde(default)]
    pub on: Option<Vec<serde_json::Value>>,
    /// A share of the route's requests, like `20%`.
    #[serde(default)]
    pub budget: Option<String>,
}

/// `resolver:`: how upstream names are found.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolverFile {
    #[serde(default)]
    pub servers: Option<Vec<String>>,
    #[serde(default)]
    pub refresh: Option<String>,
}

/// `per:` as written: one scope, or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PerFile {
    One(String),
    Many(Vec<String>),
}

/// `exempt:`, global or on a route.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExemptFile {
    /// CIDRs (or bare addresses) of clients no limit applies to.
    #[serde(default)]
    pub networks: Vec<String>,
    /// Consumer tiers no limit applies to.
    #[serde(default)]
    pub tiers: Vec<String>,
    /// Consumers (by name) no limit applies to.
    #[serde(default)]
    pub consumers: Vec<String>,
}

/// `adaptive_concurrency:` on a route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveFile {
    #[serde(default)]
    pub min_limit: Option<i64>,
    #[serde(default)]
    pub max_limit: Option<i64>,
    #[serde(default)]
    pub queue_timeout: Option<String>,
    /// `none`, `identity`, `header:NAME` or `claim:NAME`.
    #[serde(default)]
    pub fairness: Option<String>,
    #[serde(default)]
    pub queues: Option<i64>,
    #[serde(default)]
    pub queue_length: Option<i64>,
}

/// One entry of a route's `limits:`. Which parameters apply depends on `algorithm`.
///
/// One flat struct rather than an enum tagged by `algorithm`: the validator then names a
/// parameter given to the wrong algorithm (`routes[0].limits[0].leak_rate: is not a parameter of
/// token_bucket`), where serde would only list the fields it expected.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitFile {
    pub algorithm: Choice<AlgorithmKind>,
    /// Units a fresh cache hit spends on this limit (default 0: hits spend nothing).
    #[serde(default)]
    pub cache_hit_cost: Option<i64>,
    /// How long a request it would refuse may be held for it instead (default 0: none).
    #[serde(default)]
    pub wait: Option<String>,
    /// Requests held for it at once, per instance (default 1000).
    #[serde(default)]
    pub max_waiting: Option<i64>,
    #[serde(default)]
    pub capacity: Option<i64>,
    #[serde(default)]
    pub refill_rate: Option<f64>,
    #[serde(default)]
    pub leak_rate: Option<f64>,
    #[serde(default)]
    pub limit: Option<i64>,
    #[serde(default)]
    pub window: Option<String>,
    /// Concurrency: how long a lease lasts at most (default 60s).
    #[serde(default)]
    pub lease: Option<String>,
    /// Quota: `day`, `week` (from Monday) or `month` (from the 1st).
    #[serde(default)]
    pub period: Option<String>,
    /// Quota: the IANA time zone its periods start in (default UTC).
    #[serde(default)]
    pub timezone: Option<String>,
    /// Units one request spends: a number, or `{reserve, actual}` (settled after the response).
    #[serde(default)]
    pub cost: Option<CostFile>,
    /// Statuses and classes (`404`, `"5xx"`) whose answers get the request's units back.
    #[serde(default)]
    pub refund_on: Option<Vec<StatusFile>>,
    /// Statuses and classes whose answers alone keep the request's units (the others refund).
    #[serde(default)]
    pub spend_on: Option<Vec<StatusFile>>,
    /// Shadow mode for this limit: decide and count, never deny.
    #[serde(default)]
    pub shadow: Option<bool>,
    /// Whose budget the limit spends: `identity` (default), `ip`, `route`, `header:NAME`,
    /// `query:NAME`, `segment:N`, or a list of them.
    #[serde(default)]
    pub per: Option<PerFile>,
    /// The consumer tiers the limit applies to (default: every request).
    #[serde(default)]
    pub tiers: Option<Vec<String>>,
    /// The penalty box: this many denials by the limit within a span ban the identity.
    #[serde(default)]
    pub penalty: Option<PenaltyFile>,
    /// `region` (default): the region's store holds the budget; `global`: one budget for
    /// every region (`storage.global`).
    #[serde(default)]
    pub scope: Option<Choice<Scope>>,
}

/// A limit's `penalty:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PenaltyFile {
    pub denials: i64,
    pub within: String,
    pub ban: String,
}

/// A limit's `cost:`: a number, or reserve-then-settle.
/// A status (`404`) or a class (`"4xx"`) in `refund_on` / `spend_on`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StatusFile {
    Code(i64),
    Class(String),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum CostFile {
    Units(i64),
    Settled(SettledFile),
}

/// `cost: {reserve: …, actual: …}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettledFile {
    #[serde(default)]
    pub reserve: Option<ReserveFile>,
    #[serde(default)]
    pub actual: Option<ReadFile>,
}

/// `reserve:`: a number, or read from the request.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ReserveFile {
    Units(i64),
    Read(ReadFile),
}

/// Where a figure is read: a JSON field (`json: max_tokens`, `json: usage.total_tokens`) or a
/// header; `default` and `max` for a reserve.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    #[serde(default)]
    pub json: Option<String>,
    #[serde(default)]
    pub header: Option<String>,
    #[serde(default)]
    pub default: Option<i64>,
    #[serde(default)]
    pub max: Option<i64>,
}
