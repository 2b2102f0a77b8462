//! A route as written becomes a [`RouteConfig`]: its name, path and methods checked, each limit
//! built through the limiter's checked constructors (its cost, `per:`, tiers and penalty), its
//! upstream parsed; and the checks across routes (adaptive bounds per upstream, one slot per
//! route on Redis Cluster).

use http::{Method, Uri};

use super::*;
use crate::config::file::RouteFile;
use crate::config::limit::limit_fingerprint;
use crate::config::{Validator, is_name};
use crate::limiter::MAX_LIMITS;

impl Validator {
    pub(in crate::config) fn route(&mut self, path: &str, mut r: RouteFile) -> Option<RouteConfig> {
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
        let methods = (r.methods.take()).map(|m| self.methods(&format!("{path}.methods"), &m));
        if let Some(rewrite) = &r.rewrite_prefix
            && !rewrite.starts_with('/')
        {
            self.problem(
                format!("{path}.rewrite_prefix"),
                format!("{rewrite:?} must start with /"),
            );
        }
        let request_headers =
            self.header_edits(&format!("{path}.request_headers"), r.request_headers.take());
        let response_headers = self.header_edits(
            &format!("{path}.response_headers"),
            r.response_headers.take(),
        );
        let (hosts, headers) = self.matching(path, &mut r);
        let protocol = self.choice(
            &format!("{path}.upstream_protocol"),
            r.upstream_protocol.take(),
            UpstreamProtocol::Http1,
        );
        let pool = self.pool(path, &r, protocol);
        let grpc_rate_limited = self.choice(
            &format!("{path}.grpc_rate_limited_status"),
            r.grpc_rate_limited_status,
            Default::default(),
        );
        let (enforced, shadow) = self.budgets(path, &r.name, &r.name, &r.limits);
        let name: std::sync::Arc<str> = r.name.as_str().into();
        let cors =
            (r.cors.take()).and_then(|c| self.cors(&format!("{path}.cors"), c, methods.as_deref()));
        let refusals =
            (r.refusals.take()).and_then(|t| self.refusals(&format!("{path}.refusals"), &name, t));
        let timeouts = (r.timeouts.take())
            .map(|t| self.route_timeouts(&format!("{path}.timeouts"), t))
            .unwrap_or_default();
        let max_body_size = self.route_body_size(
            &format!("{path}.max_body_size"),
            r.max_body_size.as_ref().map(|s| s.0.as_str()),
        );
        let websocket =
            (r.websocket.take()).map(|w| self.websocket(&format!("{path}.websocket"), w));
        // `websocket.max_connections`: an upgrade request is decided by the route's limits and
        // a concurrency limit of that many per identity, all or nothing.
        let upgrade_budget = match websocket.as_ref().and_then(|w| w.max_connections) {
            // The route's own limits are checked once, above.
            Some(_) if self.problems.len() > before => None,
            None => None,
            Some(n) => {
                let connections: crate::config::file::LimitFile =
                    serde_json::from_value(serde_json::json!({
                        "algorithm": "concurrency",
                        "limit": n,
                        "lease": format!("{}s", WEBSOCKET_LEASE.as_secs()),
                    }))
                    .ok()?;
                r.limits.push(connections);
                let (enforced, _) = self.budgets(path, &r.name, &r.name, &r.limits);
                r.limits.pop();
                Some(enforced)
            }
        };
        let upstream_tls = (r.upstream_tls.take())
            .and_then(|t| self.upstream_tls(&format!("{path}.upstream_tls"), t))
            .map(std::sync::Arc::new);
        let pool = pool?;
        if self.problems.len() > before {
            return None;
        }
        let path_match = match r.rewrite_prefix {
            // A rewrite replaces whole segments: `/api/v1` → `/internal/` must not turn
            // `/api/v1../admin` into `/internal/../admin`, so such a route matches its prefix
            // only where a segment ends (`/api/v1`, `/api/v1/…`), whatever `path_match` says.
            Some(_) => PathMatch::Segment,
            None => self.choice(
                &format!("{path}.path_match"),
                r.path_match,
                PathMatch::Prefix,
            ),
        };
        let priority = self.choice(&format!("{path}.priority"), r.priority, Default::default());
        let cache = r
            .cache
            .take()
            .map(|c| std::sync::Arc::new(self.route_cache(&format!("{path}.cache"), c)));
        let (adaptive, fairness) = match r.adaptive_concurrency {
            Some(a) => {
                let (bounds, fairness) = self.adaptive(&format!("{path}.adaptive_concurrency"), a);
                (Some(bounds), fairness)
            }
            None => (None, Default::default()),
        };
        let reads_body = enforced.limits.iter().chain(&shadow.limits).any(|l| {
            l.parts.iter().any(|p| matches!(p, Part::Json(_)))
                || l.settled.as_ref().is_some_and(|s| s.reserve.reads_body())
        });
        let trailers_denied = (request_headers.set.iter().map(|(n, _)| n))
            .chain(&request_headers.remove)
            .cloned()
            .collect();
        let mut route = RouteConfig {
            trailers_denied,
            reads_body,
            cache,
            cors,
            refusals,
            timeouts,
            max_body_size,
            upstream_tls,
            name,
            path_prefix: r.path_prefix,
            methods,
            hosts,
            headers,
            path_match,
            upstream: match pool.origins.first() {
                Some((first, _)) => first.clone(),
                // A discovered route with no container yet: never dialled (its pool is empty),
                // only named.
                None => self.upstream(path, "http://discovered.invalid")?,
            },
            recreate_grace: r.discovered,
            pool,
            grpc_rate_limited,
            rewrite_redirects: r.rewrite_redirects.unwrap_or(true),
            rewrite_prefix: r.rewrite_prefix.take(),
            request_headers,
            response_headers,
            priority,
            adaptive,
            fairness,
            enforced,
            shadow,
            exempt: crate::config::Exempt::default(),
            websocket: None,
        };
        if let Some(mut limits) = websocket {
            if let Some(enforced) = upgrade_budget {
                // The upgrade route has the same limits on its connections (and no upgrade
                // route of its own).
                let upgrade = RouteConfig {
                    enforced,
                    websocket: Some(std::sync::Arc::new(limits.clone())),
                    ..route.clone()
                };
                limits.upgrade = Some(std::sync::Arc::new(upgrade));
            }
            route.websocket = Some(std::sync::Arc::new(limits));
        }
        Some(route)
    }

    /// A list of HTTP methods at `path` (any case), each bad one named by its index.
    pub(super) fn methods(&mut self, path: &str, methods: &[String]) -> Vec<Method> {
        methods
            .iter()
            .enumerate()
            .filter_map(|(n, m)| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| {
                        self.problem(
                            format!("{path}[{n}]"),
                            format!("{m:?} is not an HTTP method"),
                        )
                    })
                    .ok()
            })
            .collect()
    }

    /// What a route matches beyond its path: `hosts` (exact or `*.` wildcards) and `headers`
    /// (a value, or `*` for any).
    fn matching(&mut self, path: &str, r: &mut RouteFile) -> (Vec<HostPattern>, Vec<HeaderMatch>) {
        let hosts: Vec<HostPattern> = r
            .hosts
            .take()
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter_map(|(n, host)| {
                HostPattern::parse(host)
                    .map_err(|e| self.problem(format!("{path}.hosts[{n}]"), e))
                    .ok()
            })
            .collect();
        let headers: Vec<HeaderMatch> = r
            .headers
            .take()
            .unwrap_or_default()
            .iter()
            .filter_map(|(name, value)| {
                let at = format!("{path}.headers.{name}");
                let name = http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| self.problem(&at, format!("{name:?} is not a header name")))
                    .ok()?;
                let value = match value.as_str() {
                    "*" => None,
                    v => Some(
                        http::HeaderValue::from_str(v)
                            .map_err(|_| {
                                self.problem(&at, format!("{v:?} cannot be a header value"))
                            })
                            .ok()?,
                    ),
                };
                Some(HeaderMatch { name, value })
            })
            .collect();
        (hosts, headers)
    }

    /// The limits at `{path}.limits` of route `route`, enforced and shadow: each built through
    /// the limiter's checked constructors (its cost, `per:`, tiers and penalty). Their store ids
    /// begin with `store_name` (the route's name; an override's is its own, so that it starts
    /// afresh: see `control.rs`).
    pub(in crate::config) fn budgets(
        &mut self,
        path: &str,
        route: &str,
        store_name: &str,
        limits: &[crate::config::file::LimitFile],
    ) -> (Budget, Budget) {
        let mut enforced = Budget::default();
        let mut shadow = Budget::default();
        if limits.len() > MAX_LIMITS {
            self.problem(
                format!("{path}.limits"),
                format!("at most {MAX_LIMITS} limits per route"),
            );
        }
        for (n, l) in limits.iter().enumerate() {
            let limit_path = format!("{path}.limits[{n}]");
            let Some(limit) = self.limit(&limit_path, l) else {
                continue;
            };
            let by_status = match (&l.refund_on, &l.spend_on) {
                (Some(_), Some(_)) => {
                    self.problem(
                        format!("{limit_path}.spend_on"),
                        "refund_on and spend_on are two ways to say one thing: use one",
                    );
                    continue;
                }
                (Some(list), None) => Some((format!("{limit_path}.refund_on"), list, true)),
                (None, Some(list)) => Some((format!("{limit_path}.spend_on"), list, false)),
                (None, None) => None,
            };
            let settled = match (&l.cost, by_status) {
                (Some(crate::config::file::CostFile::Settled(_)), Some((at, _, _))) => {
                    self.problem(
                        at,
                        "a cost settled after the response (cost: {reserve, actual}) is already settled by what it reads",
                    );
                    continue;
                }
                (Some(crate::config::file::CostFile::Settled(file)), None) => {
                    let Some(settled) = self.settled(&format!("{limit_path}.cost"), file, &limit)
                    else {
                        continue;
                    };
                    Some(settled)
                }
                (_, Some((at, list, refund))) => {
                    let cost = limit.cost();
                    let Some(settled) = self.status_settled(&at, list, refund, &limit, cost) else {
                        continue;
                    };
                    Some(settled)
                }
                (_, None) => None,
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
                "{store_name}{}#{n}#{}",
                if is_shadow { "~shadow" } else { "" },
                limit_fingerprint(&limit)
            );
            let (per, parts) = self.per(&format!("{limit_path}.per"), l.per.as_ref());
            let penalty =
                (l.penalty.as_ref()).and_then(|p| self.penalty(&limit_path, p, per, store_name, n));
            let wait = self.duration(
                &format!("{limit_path}.wait"),
                l.wait.as_deref(),
                std::time::Duration::ZERO,
            );
            let max_waiting = match l.max_waiting {
                None => 1000,
                Some(n) if (1..=1_000_000).contains(&n) => n as u32,
                Some(n) => {
                    self.problem(
                        format!("{limit_path}.max_waiting"),
                        format!("{n} must be between 1 and 1000000"),
                    );
                    1000
                }
            };
            let route_limit = RouteLimit {
                wait,
                max_waiting,
                held: Default::default(),
                cache_hit_cost: self.cache_hit_cost(
                    &format!("{limit_path}.cache_hit_cost"),
                    l.cache_hit_cost,
                    &limit,
                ),
                limit,
                settled,
                per,
                parts,
                tiers,
                penalty,
                budget_id,
                name: format!("{route}-{n}"),
                position: n,
            };
            if is_shadow {
                shadow.limits.push(route_limit);
            } else {
                enforced.limits.push(route_limit);
            }
        }
        (enforced, shadow)
    }

    /// A limit's `penalty` at `limit_path`: `denials` within `within` ban for `ban`; none on a
    /// limit `per: endpoint` (a client is not to blame for a spent replica).
    fn penalty(
        &mut self,
        limit_path: &str,
        p: &crate::config::file::PenaltyFile,
        per: Per,
        store_name: &str,
        n: usize,
    ) -> Option<Penalty> {
        let path = format!("{limit_path}.penalty");
        if per == Per::Endpoint {
            // A spent replica is passed over, not the client's doing.
            self.problem(
                    &path,
                    "a limit per: endpoint has no penalty (a client is not to blame for a spent replica)",
                );
            return None;
        }
        let within = crate::config::parse_duration(&p.within)
            .map_err(|e| self.problem(format!("{path}.within"), e))
            .ok()?;
        let ban = crate::config::parse_duration(&p.ban)
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
        let counter =
            crate::limiter::Algorithm::fixed_window(denials.saturating_sub(1).max(1), within)
                .map_err(|e| self.problem(format!("{path}.within"), e.to_string()))
                .ok()?;
        Some(Penalty {
            counter: Limit::of(counter),
            first_denial_bans: denials == 1,
            ban,
            budget_id: format!("{store_name}#{n}~penalty"),
        })
    }

    /// `cache_hit_cost` at `path`: from 0 (the default: a hit spends nothing) to what the limit
    /// holds.
    fn cache_hit_cost(&mut self, path: &str, cost: Option<i64>, limit: &Limit) -> u32 {
        let most = limit.algorithm().max_cost();
        match cost {
            None => 0,
            Some(n) if n >= 0 && n <= i64::from(most) => n as u32,
            Some(n) => {
                self.problem(
                    path,
                    format!("{n} must be between 0 and {most} (what the limit holds)"),
                );
                0
            }
        }
    }

    /// `adaptive_concurrency:` at `path`: `min_limit` (default 4) ≥ 1, `max_limit` (default
    /// 1000) ≥ it, `queue_timeout` (default 50ms); `fairness` (default none) with `queues`
    /// (default 64) and `queue_length` (default 50).
    fn adaptive(
        &mut self,
        path: &str,
        a: crate::config::file::AdaptiveFile,
    ) -> (crate::adaptive::Bounds, crate::adaptive::Fairness) {
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
        let queues = count("queues", a.queues, 64);
        let queue_length = count("queue_length", a.queue_length, 50);
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
        let fairness = self.fairness(&format!("{path}.fairness"), a.fairness.as_deref());
        if fairness == crate::adaptive::Fairness::None {
            for (field, given) in [("queues", a.queues), ("queue_length", a.queue_length)] {
                if given.is_some() {
                    self.problem(
                        format!("{path}.{field}"),
                        "applies only with fairness (identity, header:NAME or claim:NAME)",
                    );
                }
            }
        }
        let fair =
            (fairness != crate::adaptive::Fairness::None).then_some(crate::adaptive::FairBounds {
                queues,
                queue_length,
            });
        let bounds = crate::adaptive::Bounds {
            min_limit,
            max_limit: max_limit.max(min_limit),
            queue_timeout,
            fair,
        };
        (bounds, fairness)
    }

    /// `fairness:` at `path`: `none` (the default), `identity`, `header:NAME`, `claim:NAME`.
    fn fairness(&mut self, path: &str, text: Option<&str>) -> crate::adaptive::Fairness {
        use crate::adaptive::Fairness;
        let Some(text) = text else {
            return Fairness::None;
        };
        let named = |prefix: &str| text.strip_prefix(prefix).filter(|n| !n.is_empty());
        if let Some(name) = named("header:") {
            return match http::HeaderName::from_bytes(name.as_bytes()) {
                Ok(name) => Fairness::Header(name),
                Err(_) => {
                    self.problem(path, format!("{name:?} is not a header name"));
                    Fairness::None
                }
            };
        }
        if let Some(claim) = named("claim:") {
            return Fairness::Claim(claim.to_string());
        }
        match text {
            "none" => Fairness::None,
            "identity" => Fairness::Identity,
            other => {
                self.problem(
                    path,
                    format!("{other:?} is not one of none, identity, header:NAME, claim:NAME"),
                );
                Fairness::None
            }
        }
    }

    /// Routes that forward to the same upstream share its learned limit, so they must agree on
    /// its bounds.
    pub(in crate::config) fn shared_adaptive_bounds(&mut self, routes: &[RouteConfig]) {
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
    pub(in crate::config) fn per(
        &mut self,
        path: &str,
        file: Option<&crate::config::file::PerFile>,
    ) -> (Per, Box<[Part]>) {
        use crate::config::file::PerFile;
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
        // A replica's budget is a scope of its own: the request's endpoint is chosen by the
        // limits, not read from the request, so it joins no composite key.
        if let Some((at, _)) = texts.iter().find(|(_, text)| *text == "endpoint") {
            if texts.len() > 1 {
                self.problem(
                    at.as_str(),
                    "endpoint stands alone (per: endpoint): a replica's budget is shared by every client",
                );
            }
            return (Per::Endpoint, Box::new([]));
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
                        "{text:?} is not a scope: identity, ip, route, endpoint, header:NAME, query:NAME, segment:N, claim:NAME or json:FIELD"
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

    /// `request_headers:` or `response_headers:` at `path`: each name a header floodgate does
    /// not manage itself (framing, hop by hop), each `set` value text with the contract's
    /// variables.
    pub(in crate::config) fn header_edits(
        &mut self,
        path: &str,
        file: Option<crate::config::file::HeaderEditsFile>,
    ) -> super::edits::HeaderEdits {
        let mut out = super::edits::HeaderEdits::default();
        let Some(file) = file else {
            return out;
        };
        let name_of = |v: &mut Self, at: &str, name: &str| {
            let parsed = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| v.problem(at, format!("{name:?} is not a header name")))
                .ok()?;
            if super::edits::managed(&parsed) {
                v.problem(
                    at,
                    format!("{name} is managed by floodgate (framing, hop by hop): a route may not set or remove it"),
                );
                return None;
            }
            Some(parsed)
        };
        for (name, value) in file.set.unwrap_or_default() {
            let at = format!("{path}.set.{name}");
            let Some(parsed) = name_of(self, &at, &name) else {
                continue;
            };
            match super::edits::Value::parse(&value) {
                Ok(value) => out.set.push((parsed, value)),
                Err(e) => self.problem(&at, e),
            }
        }
        for (n, name) in file.remove.unwrap_or_default().iter().enumerate() {
            if let Some(parsed) = name_of(self, &format!("{path}.remove[{n}]"), name) {
                out.remove.push(parsed);
            }
        }
        out
    }

    /// Redis Cluster runs one script per decision, and a script's keys must share a slot. The
    /// budgets of one client value share a slot (its hash is the hash tag), but a route mixing
    /// `per:` scopes spends budgets of different values at once, which no one slot holds.
    pub(in crate::config) fn single_slot_routes(&mut self, routes: &[RouteConfig]) {
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

    pub(in crate::config) fn upstream(&mut self, path: &str, text: &str) -> Option<Upstream> {
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
            host: authority.host().into(),
            protocol: UpstreamProtocol::Http1,
        })
    }
}

/// The limits of an override (`PUT /overrides`, `control.rs`) for route `route`, checked as
/// `routes[].limits` are, with paths named from the request's body (`limits[0].capacity`).
/// An override's limits are enforced and decided at admission: `shadow: true` and settled
/// costs (`cost: {reserve, actual}`) are refused, as is `per:` with a `claim:` part unless
/// `verifies_tokens`. Their store ids begin with `store_name`: an override's budgets start full.
pub fn override_budget(
    route: &str,
    store_name: &str,
    limits: serde_json::Value,
    verifies_tokens: bool,
) -> Result<Budget, crate::config::ConfigError> {
    use crate::config::ConfigError;
    use crate::config::file::{CostFile, LimitFile};
    let limits: Vec<LimitFile> = serde_path_to_error::deserialize(limits).map_err(|e| {
        let path = e.path().to_string();
        let path = match path.as_str() {
            "." => "limits".to_string(),
            p => format!("limits{p}"),
        };
        ConfigError::one(path, e.into_inner().to_string())
    })?;
    let mut v = Validator {
        verifies_tokens,
        ..Validator::default()
    };
    if limits.is_empty() {
        v.problem("limits", "name at least one limit");
    }
    for (n, l) in limits.iter().enumerate() {
        if l.shadow == Some(true) {
            v.problem(
                format!("limits[{n}].shadow"),
                "an override's limits are enforced",
            );
        }
        if let Some(CostFile::Settled(_)) = l.cost {
            v.problem(
                format!("limits[{n}].cost"),
                "an override's limits cost a fixed number of units (settled costs are not supported)",
            );
        }
    }
    if !v.problems.is_empty() {
        return Err(ConfigError {
            problems: v.problems,
        });
    }
    let (enforced, _) = v.budgets("", route, store_name, &limits);
    if !v.problems.is_empty() {
        for p in &mut v.problems {
            p.path = p.path.trim_start_matches('.').to_string();
        }
        return Err(ConfigError {
            problems: v.problems,
        });
    }
    Ok(enforced)
}
