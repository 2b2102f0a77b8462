//! `routes:`: what each route matches, where it forwards, and its limits with their scopes
//! and tiers.

use http::uri::{Authority, Scheme};
use http::{Method, Uri};

use super::file::RouteFile;
use super::limit::limit_fingerprint;
use super::{Validator, is_name};
use crate::limiter::{Ask, BudgetKey, KeyKind, Limit, MAX_LIMITS};

/// One route: which requests it matches, where they go, and what limits them.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Shared, so that a response body still streaming can name its route in the log.
    pub name: std::sync::Arc<str>,
    pub path_prefix: String,
    /// `None` matches every method.
    pub methods: Option<Vec<Method>>,
    /// How `path_prefix` is compared with the (normalised) path.
    pub path_match: PathMatch,
    pub upstream: Upstream,
    /// The gRPC status a rate-limited gRPC call is refused with.
    pub grpc_rate_limited: crate::grpc::RateLimitedStatus,
    /// Rewrite `Location` / `Content-Location` pointing at the upstream to the client's origin.
    pub rewrite_redirects: bool,
    /// How soon its requests are shed when the upstream's learned limit binds.
    pub priority: crate::adaptive::Priority,
    /// `adaptive_concurrency:`: the bounds of the upstream's learned limit, if this route asks
    /// for one (routes to the same upstream share one learned limit, and must agree on its
    /// bounds: `floodgate check` says so).
    pub adaptive: Option<crate::adaptive::Bounds>,
    /// The enforced limits: a request must pass every one that applies to it.
    pub enforced: Budget,
    /// Limits in shadow mode: decided and counted, never denying; budgets of their own.
    pub shadow: Budget,
    /// Who none of its limits apply to: the global `exempt:` and the route's own.
    pub exempt: super::Exempt,
    /// True when a limit reads the request's JSON body (`json:` keys): the body is then read
    /// whole before the decision, and forwarded from memory.
    pub reads_body: bool,
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

/// An upstream origin: scheme and authority (the request's path is forwarded unchanged), and
/// the HTTP version it is spoken to in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: Scheme,
    pub authority: Authority,
    /// The `Host` header forwarded requests carry, built once.
    pub host_header: http::HeaderValue,
    pub protocol: UpstreamProtocol,
}

/// How floodgate speaks to a route's upstream (`upstream_protocol:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 on pooled keep-alive connections, one request at a time on each.
    #[default]
    Http1,
    /// HTTP/2, many streams on each connection: cleartext by prior knowledge (h2c) on
    /// `http://`, ALPN `h2` on `https://`. What gRPC upstreams need.
    Http2,
    /// On `https://`, whichever of `h2` and `http/1.1` the upstream picks in ALPN; HTTP/1.1 on
    /// `http://` (cleartext has no negotiation that does not cost a round trip).
    Auto,
}

impl UpstreamProtocol {
    /// The name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "http1",
            UpstreamProtocol::Http2 => "http2",
            UpstreamProtocol::Auto => "auto",
        }
    }
}

impl Upstream {
    /// `scheme://authority`: what names the upstream (in `floodgate_adaptive_limit{upstream}`,
    /// and for the routes that share its learned limit).
    pub fn origin(&self) -> String {
        format!("{}://{}", self.scheme, self.authority)
    }
}

impl Validator {
    pub(super) fn route(&mut self, path: &str, r: RouteFile) -> Option<RouteConfig> {
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
        let protocol = self.choice(
            &format!("{path}.upstream_protocol"),
            r.upstream_protocol,
            UpstreamProtocol::Http1,
        );
        let upstream = self
            .upstream(&format!("{path}.upstream"), &r.upstream)
            .map(|u| Upstream { protocol, ..u });
        let grpc_rate_limited = self.choice(
            &format!("{path}.grpc_rate_limited_status"),
            r.grpc_rate_limited_status,
            Default::default(),
        );
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
            let settled = match &l.cost {
                Some(super::file::CostFile::Settled(file)) => {
                    let Some(settled) = self.settled(&format!("{limit_path}.cost"), file, &limit)
                    else {
                        continue;
                    };
                    Some(settled)
                }
                _ => None,
            };
            // A settled limit's requests each cost what they reserve: flagged so that nothing
            // assumes one request's cost (leases, the deny cache).
            let limit = if settled.is_some() {
                limit.settled()
            } else {
                limit
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
            let (per, parts) = self.per(&format!("{limit_path}.per"), l.per.as_ref());
            let penalty = l.penalty.as_ref().and_then(|p| {
                let path = format!("{limit_path}.penalty");
                let within = super::parse_duration(&p.within)
                    .map_err(|e| self.problem(format!("{path}.within"), e))
                    .ok()?;
                let ban = super::parse_duration(&p.ban)
                    .map_err(|e| self.problem(format!("{path}.ban"), e))
                    .ok()?;
                if ban.is_zero() {
                    self.problem(format!("{path}.ban"), "must be longer than 0");
                    return None;
                }
                let denials = u32::try_from(p.denials)
                    .ok()
                    .filter(|&d| d >= 1)
                    .or_else(|| {
                        self.problem(format!("{path}.denials"), "must be at least 1");
                        None
                    })?;
                // The denials counted: a fixed window of `denials - 1` admissions, so that
                // the denial that finds it full is the `denials`-th.
                let counter = crate::limiter::Algorithm::fixed_window(
                    denials.saturating_sub(1).max(1),
                    within,
                )
                .map_err(|e| self.problem(format!("{path}.within"), e.to_string()))
                .ok()?;
                Some(Penalty {
                    counter: Limit::of(counter),
                    first_denial_bans: denials == 1,
                    ban,
                    budget_id: format!("{}#{n}~penalty", r.name),
                })
            });
            let route_limit = RouteLimit {
                limit,
                settled,
                per,
                parts,
                tiers,
                penalty,
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
        let path_match = self.choice(
            &format!("{path}.path_match"),
            r.path_match,
            PathMatch::Prefix,
        );
        let priority = self.choice(&format!("{path}.priority"), r.priority, Default::default());
        let adaptive = r
            .adaptive_concurrency
            .map(|a| self.adaptive(&format!("{path}.adaptive_concurrency"), a));
        let reads_body = enforced.limits.iter().chain(&shadow.limits).any(|l| {
            l.parts.iter().any(|p| matches!(p, Part::Json(_)))
                || l.settled.as_ref().is_some_and(|s| s.reserve.reads_body())
        });
        Some(RouteConfig {
            reads_body,
            name: r.name.into(),
            path_prefix: r.path_prefix,
            methods,
            path_match,
            upstream: upstream?,
            grpc_rate_limited,
            rewrite_redirects: r.rewrite_redirects.unwrap_or(true),
            priority,
            adaptive,
            enforced,
            shadow,
            exempt: super::Exempt::default(),
        })
    }

    /// `adaptive_concurrency:` at `path`: `min_limit` (default 4) ≥ 1, `max_limit` (default
    /// 1000) ≥ it, `queue_timeout` (default 50ms).
    fn adaptive(&mut self, path: &str, a: super::file::AdaptiveFile) -> crate::adaptive::Bounds {
        let mut count = |field: &str, value: Option<i64>, default: u32| match value {
            None => default,
            Some(n) if (1..=1_000_000).contains(&n) => n as u32,
            Some(n) => {
                self.problem(
                    format!("{path}.{field}"),
                    format!("{n} must be between 1 and 1000000"),
                );
                default
            }
        };
        let min_limit = count("min_limit", a.min_limit, 4);
        let max_limit = count("max_limit", a.max_limit, 1000);
        if max_limit < min_limit {
            self.problem(
                format!("{path}.max_limit"),
                format!("{max_limit} is below min_limit ({min_limit})"),
            );
        }
        let queue_timeout = self.duration(
            &format!("{path}.queue_timeout"),
            a.queue_timeout.as_deref(),
            std::time::Duration::from_millis(50),
        );
        crate::adaptive::Bounds {
            min_limit,
            max_limit: max_limit.max(min_limit),
            queue_timeout,
        }
    }

    /// Routes that forward to the same upstream share its learned limit, so they must agree on
    /// its bounds.
    pub(super) fn shared_adaptive_bounds(&mut self, routes: &[RouteConfig]) {
        for (i, route) in routes.iter().enumerate() {
            let Some(bounds) = route.adaptive else {
                continue;
            };
            let earlier = routes[..i].iter().find(|r| {
                r.upstream.origin() == route.upstream.origin()
                    && r.adaptive.is_some_and(|b| b != bounds)
            });
            if let Some(earlier) = earlier {
                self.problem(
                    format!("routes[{i}].adaptive_concurrency"),
                    format!(
                        "route {:?} forwards to the same upstream with other bounds; routes to one upstream share its learned limit",
                        &*earlier.name
                    ),
                );
            }
        }
    }

    /// `per:` at `path`: one of `identity`, `ip`, `route` as before, or (a list of, or one of)
    /// `header:NAME`, `query:NAME`, `segment:N` beside them, a composite key (`Per::Request`).
    pub(super) fn per(
        &mut self,
        path: &str,
        file: Option<&super::file::PerFile>,
    ) -> (Per, Box<[Part]>) {
        use super::file::PerFile;
        let texts: Vec<(String, &str)> = match file {
            None => return (Per::Identity, Box::new([])),
            Some(PerFile::One(text)) => vec![(path.to_string(), text.as_str())],
            Some(PerFile::Many(list)) => list
                .iter()
                .enumerate()
                .map(|(n, text)| (format!("{path}[{n}]"), text.as_str()))
                .collect(),
        };
        if texts.is_empty() {
            self.problem(path, "names no scope");
            return (Per::Identity, Box::new([]));
        }
        let mut parts = Vec::with_capacity(texts.len());
        for (at, text) in &texts {
            let part = match text.split_once(':') {
                None => match *text {
                    "identity" => Some(Part::Identity),
                    "ip" => Some(Part::Ip),
                    "route" => Some(Part::Route),
                    _ => None,
                },
                Some(("header", name)) => match http::HeaderName::from_bytes(name.as_bytes()) {
                    Ok(name) => Some(Part::Header(name)),
                    Err(_) => {
                        self.problem(at.as_str(), format!("{name:?} is not a header name"));
                        continue;
                    }
                },
                Some(("query", name)) if !name.is_empty() => Some(Part::Query(name.to_string())),
                Some(("segment", n)) => {
                    match n.parse::<usize>() {
                        Ok(n) if n >= 1 => Some(Part::Segment(n)),
                        _ => {
                            self.problem(at.as_str(), format!("{n:?} is not a segment number (1 is the first after the prefix)"));
                            continue;
                        }
                    }
                }
                Some(("claim", name)) if !name.is_empty() => {
                    if !self.verifies_tokens {
                        self.problem(
                            at.as_str(),
                            format!(
                                "{text:?} needs identity.jwt (only a verified token has claims)"
                            ),
                        );
                        continue;
                    }
                    Some(Part::Claim(name.to_string()))
                }
                Some(("json", name)) if !name.is_empty() => Some(Part::Json(name.to_string())),
                _ => None,
            };
            match part {
                Some(part) => parts.push(part),
                None => self.problem(
                    at.as_str(),
                    format!(
                        "{text:?} is not a scope: identity, ip, route, header:NAME, query:NAME, segment:N, claim:NAME or json:FIELD"
                    ),
                ),
            }
        }
        match parts.as_slice() {
            [Part::Identity] => (Per::Identity, Box::new([])),
            [Part::Ip] => (Per::Ip, Box::new([])),
            [Part::Route] => (Per::Route, Box::new([])),
            [] => (Per::Identity, Box::new([])),
            _ => (Per::Request, parts.into_boxed_slice()),
        }
    }

    /// Redis Cluster runs one script per decision, and a script's keys must share a slot. The
    /// budgets of one client value share a slot (its hash is the hash tag), but a route mixing
    /// `per:` scopes spends budgets of different values at once, which no one slot holds.
    pub(super) fn single_slot_routes(&mut self, routes: &[RouteConfig]) {
        for (i, route) in routes.iter().enumerate() {
            for (budget, label) in [(&route.enforced, "enforced"), (&route.shadow, "shadow")] {
                // Two composite keys share a slot only when they read the same parts.
                let mut scopes = budget.limits.iter().map(|l| (l.per, &l.parts));
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

    pub(super) fn upstream(&mut self, path: &str, text: &str) -> Option<Upstream> {
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
            protocol: UpstreamProtocol::Http1,
        })
    }
}

/// The first value of query parameter `name` in `query`, as sent (not percent-decoded).
fn query_value<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}
