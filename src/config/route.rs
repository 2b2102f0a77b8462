//! `routes:`: what each route matches, where it forwards, and its limits with their scopes
//! and tiers.

use http::Method;
use http::uri::Scheme;

use crate::limiter::{Ask, BudgetKey, KeyKind, Limit};

mod build;
mod cors;
mod edge;
mod edits;
mod matching;
mod pool;
mod template;

pub use build::override_budget;
pub use cors::Cors;
pub use edge::{RouteTimeouts, WEBSOCKET_LEASE, WebSocketLimits};
pub use edits::{HeaderEdits, Vars};
pub use matching::{HeaderMatch, HostPattern, invalid_host, request_host};
pub use template::{Figures, NAMES as REFUSAL_NAMES, Templates};

/// One route: which requests it matches, where they go, and what limits them.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Shared, so that a response body still streaming can name its route in the log.
    pub name: std::sync::Arc<str>,
    pub path_prefix: String,
    /// `None` matches every method.
    pub methods: Option<Vec<Method>>,
    /// `hosts:`: the request's host must match one (empty: any host).
    pub hosts: Vec<HostPattern>,
    /// `headers:`: the request must have every one.
    pub headers: Vec<HeaderMatch>,
    /// How `path_prefix` is compared with the (normalised) path.
    pub path_match: PathMatch,
    /// The first origin (what names the upstream in its learned limit, traces and logs).
    pub upstream: Upstream,
    /// Every origin, and how requests are spread, retried and kept off failing endpoints.
    pub pool: crate::upstream::PoolSpec,
    /// The gRPC status a rate-limited gRPC call is refused with.
    pub grpc_rate_limited: crate::grpc::RateLimitedStatus,
    /// Rewrite `Location` / `Content-Location` pointing at the upstream to the client's origin.
    pub rewrite_redirects: bool,
    /// `rewrite_prefix:`: the matched `path_prefix` is replaced by this in the forwarded path
    /// (and a redirect under it comes back under `path_prefix`).
    pub rewrite_prefix: Option<String>,
    /// `request_headers:`: set and removed on the forwarded request.
    pub request_headers: HeaderEdits,
    /// `response_headers:`: set and removed on every answer of the route, floodgate's own too.
    pub response_headers: HeaderEdits,
    /// How soon its requests are shed when the upstream's learned limit binds.
    pub priority: crate::adaptive::Priority,
    /// `adaptive_concurrency:`: the bounds of the upstream's learned limit, if this route asks
    /// for one (routes to the same upstream share one learned limit, and must agree on its
    /// bounds: `floodgate check` says so).
    pub adaptive: Option<crate::adaptive::Bounds>,
    /// `adaptive_concurrency.fairness`: what makes the route's waiting requests one flow.
    pub fairness: crate::adaptive::Fairness,
    /// The enforced limits: a request must pass every one that applies to it.
    pub enforced: Budget,
    /// Limits in shadow mode: decided and counted, never denying; budgets of their own.
    pub shadow: Budget,
    /// Who none of its limits apply to: the global `exempt:` and the route's own.
    pub exempt: super::Exempt,
    /// True when a limit reads the request's JSON body (`json:` keys): the body is then read
    /// whole before the decision, and forwarded from memory.
    pub reads_body: bool,
    /// Names a client's request trailers may not carry to the upstream, beside those no trailer
    /// may ([`crate::proxy::body`]): what `request_headers` sets or removes, and the identity's
    /// headers. A trailer arrives after the head was checked and edited, so it could otherwise
    /// slip a forged value past `set` and `remove` (RFC 9110 §6.5.1: trailers must not carry
    /// what routing or authentication reads).
    pub trailers_denied: std::sync::Arc<[http::HeaderName]>,
    /// `cache:`: its GET (and HEAD) answers are cached by these rules.
    pub cache: Option<std::sync::Arc<crate::cache::Rules>>,
    /// A route a provider discovered: how long its requests are held while its pool is empty
    /// (`providers.docker.recreate_grace`). `None` for the file's routes.
    pub recreate_grace: Option<std::time::Duration>,
    /// `cors:`: preflights answered by floodgate, the allowed origin on every answer.
    pub cors: Option<std::sync::Arc<Cors>>,
    /// `refusals:`: this route's own bodies for floodgate's refusals.
    pub refusals: Option<std::sync::Arc<Templates>>,
    /// `timeouts:`: this route's own, where it sets them.
    pub timeouts: RouteTimeouts,
    /// `max_body_size:`: this route's own (`Some(None)`: no limit), where it sets one.
    pub max_body_size: Option<Option<std::num::NonZeroU64>>,
    /// `websocket:`: limits on its upgraded connections.
    pub websocket: Option<std::sync::Arc<WebSocketLimits>>,
    /// `upstream_tls:`: how its `https://` upstreams are reached, where it says.
    pub upstream_tls: Option<std::sync::Arc<crate::config::UpstreamTls>>,
}

/// How a route's `path_prefix` matches (`path_match:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    /// A plain string prefix, as nginx's `location /prefix`: `/api/rides` matches `/api/ridesX`.
    #[default]
    Prefix,
    /// The prefix must end at a segment boundary: `/api/rides` matches `/api/rides`,
    /// `/api/rides/` and `/api/rides/1`, not `/api/ridesX`.
    Segment,
}

impl PathMatch {
    /// True when `path` falls under `prefix`.
    pub fn matches(self, prefix: &str, path: &str) -> bool {
        match self {
            PathMatch::Prefix => path.starts_with(prefix),
            PathMatch::Segment => {
                path.starts_with(prefix)
                    && (prefix.ends_with('/')
                        || path.len() == prefix.len()
                        || path.as_bytes()[prefix.len()] == b'/')
            }
        }
    }
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
    /// One budget per endpoint of the route's pool (a replica's capacity): the request spends
    /// the budget of the endpoint it is sent to, and the balancer passes over spent ones.
    Endpoint,
    /// One budget per combination of values read from the request (`header:NAME`,
    /// `query:NAME`, `segment:N`, beside `identity`, `ip`, `route`): see [`RouteLimit::parts`].
    Request,
}

/// One part of a composite `per:` key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Part {
    Identity,
    Ip,
    Route,
    /// A request header's value (its first line).
    Header(http::HeaderName),
    /// A query parameter's value (its first occurrence, as sent).
    Query(String),
    /// The Nth path segment after the route's prefix (1 is the first).
    Segment(usize),
    /// A claim of the request's verified bearer token (`identity.jwt`).
    Claim(String),
    /// A top-level field of the request's JSON body (the body is read before the decision).
    Json(String),
}

/// What a composite key reads from a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    pub headers: &'a http::HeaderMap,
    pub query: Option<&'a str>,
    /// The path after the route's `path_prefix`.
    pub rest: &'a str,
    /// The verified bearer token's claims, if it had one.
    pub claims: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// The request's body, if it was read (a route with a `json:` key) and is a JSON object.
    pub json: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// A JSON value as a key: a string's text, a number's or a boolean's JSON; `None` for null, an
/// array or an object (the request then lacks the value).
pub fn json_key(value: &serde_json::Value) -> Option<std::borrow::Cow<'_, [u8]>> {
    use serde_json::Value;
    match value {
        Value::String(s) if !s.is_empty() => Some(std::borrow::Cow::Borrowed(s.as_bytes())),
        Value::Number(n) => Some(std::borrow::Cow::Owned(n.to_string().into_bytes())),
        Value::Bool(b) => Some(std::borrow::Cow::Borrowed(if *b {
            b"true"
        } else {
            b"false"
        })),
        _ => None,
    }
}

impl Per {
    /// The name used in the config file and `/budgets`.
    pub fn as_str(self) -> &'static str {
        match self {
            Per::Identity => "identity",
            Per::Ip => "ip",
            Per::Route => "route",
            Per::Endpoint => "endpoint",
            Per::Request => "request",
        }
    }
}

/// One limit of a route, with whose budget it spends and the store id of that budget.
#[derive(Debug, Clone)]
pub struct RouteLimit {
    pub limit: Limit,
    /// `cost: {reserve, actual}`: reserved at admission, settled when the response ends.
    pub settled: Option<std::sync::Arc<super::cost::Settled>>,
    pub per: Per,
    /// `per: Request`'s parts, in order (empty for the other scopes).
    pub parts: Box<[Part]>,
    /// The consumer tiers it applies to; `None`: every request.
    pub tiers: Option<Vec<String>>,
    /// `penalty:`: denials by this limit, counted per identity in the store as a fixed window of
    /// `denials` per `within`, and the ban that follows the window's last one.
    pub penalty: Option<Penalty>,
    /// `cache_hit_cost`: units a fresh cache hit spends on it (0: none).
    pub cache_hit_cost: u32,
    /// `wait`: a request it refuses with a retry within this long is held and decided again
    /// then (0: refused at once).
    pub wait: std::time::Duration,
    /// `max_waiting`: requests held for it at once on this instance; past it, refused.
    pub max_waiting: u32,
    /// Requests held for it now (this config's: a reload starts a new count).
    pub held: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// Derived from the route and the limit when the config is loaded (private, so that they
    /// cannot drift from what they are derived from): see the accessors.
    budget_id: String,
    name: String,
    position: usize,
}

impl RouteConfig {
    /// True when the route has a limit, enforced or shadow (a route without one is proxied
    /// unlimited: no identity is needed to limit it).
    pub fn is_limited(&self) -> bool {
        !(self.enforced.is_empty() && self.shadow.is_empty())
    }
}

/// A limit's penalty box (`penalty: {denials, within, ban}`).
#[derive(Debug, Clone)]
pub struct Penalty {
    /// Counts the identity's denials by the limit: a fixed window that fills one denial before
    /// the ban.
    pub counter: Limit,
    /// `denials: 1`: the first denial bans.
    pub first_denial_bans: bool,
    /// How long the ban lasts.
    pub ban: std::time::Duration,
    /// The counter's budget id.
    pub budget_id: String,
}

impl RouteLimit {
    /// The store's id for this limit's allowances: the route's name, `~shadow` for shadow
    /// limits, the limit's position in the file and a fingerprint of its parameters. A reload
    /// that changes the limit starts it afresh; one that does not keeps its state.
    pub fn budget_id(&self) -> &str {
        &self.budget_id
    }

    /// The policy name for the IETF headers: `{route}-{position}`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limit's position in the route's `limits:` list.
    pub fn position(&self) -> usize {
        self.position
    }

    /// The ask this limit makes of a request whose identity is `identity` (its key kind and
    /// bytes) and whose client address is `ip` (its octets): the budget its `per:` names.
    /// `None` when that value is unknown (only `/budgets` asks without one).
    pub fn ask<'a>(
        &'a self,
        identity: Option<(KeyKind, &'a [u8])>,
        ip: Option<&'a [u8]>,
    ) -> Option<Ask<'a>> {
        let (kind, value) = match self.per {
            // A composite key's value is built by `request_key`; without one (a part the
            // request lacks, or a caller that has no request), the identity's budget.
            Per::Identity | Per::Request => identity?,
            Per::Ip => (KeyKind::Ip, ip?),
            Per::Route => (KeyKind::Route, &[][..]),
            // Only with the endpoint a request is sent to: `ask_endpoint`.
            Per::Endpoint => return None,
        };
        Some(Ask {
            limit: &self.limit,
            key: BudgetKey {
                budget: &self.budget_id,
                kind,
                value,
            },
        })
    }

    /// A `per: endpoint` limit's ask: the budget of the endpoint named `endpoint`
    /// (`address:port`), the same name on every instance that resolves it.
    pub fn ask_endpoint<'a>(&'a self, endpoint: &'a [u8]) -> Ask<'a> {
        Ask {
            limit: &self.limit,
            key: BudgetKey {
                budget: &self.budget_id,
                kind: KeyKind::Endpoint,
                value: endpoint,
            },
        }
    }

    /// A composite limit's ask: its budget for `value` ([`RouteLimit::request_key`]'s bytes).
    pub fn ask_request<'a>(&'a self, value: &'a [u8]) -> Ask<'a> {
        Ask {
            limit: &self.limit,
            key: BudgetKey {
                budget: &self.budget_id,
                kind: KeyKind::Request,
                value,
            },
        }
    }

    /// Appends to `out` the composite key of `per: Request` for a request (each part's value,
    /// tagged and length-prefixed so that no two combinations run together); false, with `out`
    /// as it was, when the request lacks a part's value (it then spends its identity's
    /// budget).
    pub fn request_key(
        &self,
        view: &RequestView<'_>,
        identity: (KeyKind, &[u8]),
        ip: &[u8],
        out: &mut Vec<u8>,
    ) -> bool {
        let start = out.len();
        for part in self.parts.iter() {
            let owned;
            let (tag, value): (u8, &[u8]) = match part {
                Part::Identity => (identity.0 as u8, identity.1),
                Part::Ip => (b'i', ip),
                Part::Route => (b'r', &[]),
                Part::Header(name) => match view.headers.get(name) {
                    Some(v) if !v.is_empty() => (b'h', v.as_bytes()),
                    _ => {
                        out.truncate(start);
                        return false;
                    }
                },
                Part::Query(name) => match query_value(view.query, name) {
                    Some(v) if !v.is_empty() => (b'q', v.as_bytes()),
                    _ => {
                        out.truncate(start);
                        return false;
                    }
                },
                Part::Segment(n) => match view.rest.split('/').filter(|s| !s.is_empty()).nth(n - 1)
                {
                    Some(v) => (b's', v.as_bytes()),
                    None => {
                        out.truncate(start);
                        return false;
                    }
                },
                Part::Claim(name) | Part::Json(name) => {
                    let (tag, map) = match part {
                        Part::Claim(_) => (b'c', view.claims),
                        _ => (b'j', view.json),
                    };
                    match map.and_then(|m| m.get(name)).and_then(json_key) {
                        Some(v) => {
                            owned = v;
                            (tag, &owned[..])
                        }
                        None => {
                            out.truncate(start);
                            return false;
                        }
                    }
                }
            };
            out.push(tag);
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        }
        true
    }

    /// True when the limit applies to a request of consumer tier `tier`.
    pub fn applies_to(&self, tier: &str) -> bool {
        self.tiers
            .as_ref()
            .is_none_or(|tiers| tiers.iter().any(|t| t == tier))
    }
}

pub use crate::upstream::{Origin as Upstream, UpstreamProtocol};

/// The first value of query parameter `name` in `query`, as sent (not percent-decoded).
fn query_value<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}
