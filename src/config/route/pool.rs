//! A route's pool as written (`upstream` or `upstreams`, `balance`, `hash_on`, `outlier`,
//! `retries`) checked into a [`PoolSpec`], and `resolver:`; every problem named by its field.

use std::time::Duration;

use crate::config::Validator;
use crate::config::file::{OriginFile, ResolverFile, RouteFile};
use crate::upstream::discovery::ResolverSpec;
use crate::upstream::{Balance, HashOn, HealthSpec, OutlierSpec, PoolSpec, RetryOn, RetrySpec};

use super::UpstreamProtocol;

/// A share written `20%` (or a bare number), 0 to 100.
fn percent(text: &str) -> Option<u32> {
    let n: u32 = text.trim().trim_end_matches('%').trim().parse().ok()?;
    (n <= 100).then_some(n)
}

impl Validator {
    /// The route's pool (`upstream` or `upstreams`, and how it is used), spoken to in
    /// `protocol`.
    pub(in crate::config) fn pool(
        &mut self,
        path: &str,
        r: &RouteFile,
        protocol: UpstreamProtocol,
    ) -> Option<PoolSpec> {
        let before = self.problems.len();
        let origins = self.origins(path, r, protocol);
        let balance = self.balance(path, r);
        let health = self.health_check(path, r);
        let outlier = self.outlier(path, r);
        let retries = self.retries(path, r);
        // A discovered route's pool may be empty: its containers are gone or still starting,
        // and its requests are held for `recreate_grace` (`proxy::held`).
        let filled = !origins.is_empty() || r.discovered.is_some();
        (self.problems.len() == before && filled).then_some(PoolSpec {
            origins,
            balance,
            outlier,
            retries,
            health,
        })
    }

    /// `upstream` or `upstreams`: the pool's origins, each once, with its weight.
    fn origins(
        &mut self,
        path: &str,
        r: &RouteFile,
        protocol: UpstreamProtocol,
    ) -> Vec<(super::Upstream, u32)> {
        let written: Vec<(String, String, u32)> = match (&r.upstream, &r.upstreams) {
            (Some(url), None) => vec![(format!("{path}.upstream"), url.clone(), 1)],
            (None, Some(list)) if !list.is_empty() => list
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    let at = format!("{path}.upstreams[{i}]");
                    match o {
                        OriginFile::Url(url) => (at, url.clone(), 1),
                        OriginFile::Weighted(w) => {
                            let weight = w.weight.unwrap_or(1);
                            if !(1..=100).contains(&weight) {
                                self.problem(
                                    format!("{at}.weight"),
                                    format!("{weight} is not a weight from 1 to 100"),
                                );
                            }
                            (format!("{at}.url"), w.url.clone(), weight)
                        }
                    }
                })
                .collect(),
            (None, Some(_)) if r.discovered.is_some() => Vec::new(),
            (None, Some(_)) => {
                self.problem(format!("{path}.upstreams"), "must name at least one origin");
                Vec::new()
            }
            (Some(_), Some(_)) => {
                self.problem(
                    format!("{path}.upstreams"),
                    "a route has upstream or upstreams, not both",
                );
                Vec::new()
            }
            (None, None) => {
                self.problem(
                    format!("{path}.upstream"),
                    "is required (or upstreams: a pool of origins)",
                );
                Vec::new()
            }
        };
        let mut origins = Vec::with_capacity(written.len());
        for (at, url, weight) in written {
            if let Some(origin) = self.upstream(&at, &url) {
                if origins.iter().any(|(o, _): &(super::Upstream, u32)| {
                    o.scheme == origin.scheme && o.authority == origin.authority
                }) {
                    self.problem(at, format!("{url:?} is in the pool twice"));
                    continue;
                }
                origins.push((super::Upstream { protocol, ..origin }, weight));
            }
        }
        origins
    }

    /// `balance` and `hash_on`.
    fn balance(&mut self, path: &str, r: &RouteFile) -> Balance {
        let balance = match r.balance.as_deref() {
            None | Some("least_request") => Balance::LeastRequest,
            Some("round_robin") => Balance::RoundRobin,
            Some("hash") => Balance::Hash(match r.hash_on.as_deref() {
                None | Some("identity") => HashOn::Identity,
                Some(h) => match h
                    .strip_prefix("header:")
                    .map(|n| n.parse::<http::HeaderName>())
                {
                    Some(Ok(name)) => HashOn::Header(name),
                    _ => {
                        self.problem(
                            format!("{path}.hash_on"),
                            format!("{h:?} is not identity or header:NAME"),
                        );
                        HashOn::Identity
                    }
                },
            }),
            Some(other) => {
                self.problem(
                    format!("{path}.balance"),
                    format!("{other:?} is not one of least_request, round_robin, hash"),
                );
                Balance::LeastRequest
            }
        };
        if r.hash_on.is_some() && !matches!(balance, Balance::Hash(_)) {
            self.problem(format!("{path}.hash_on"), "is for balance: hash");
        }
        balance
    }

    /// `health_check`, if any.
    fn health_check(&mut self, path: &str, r: &RouteFile) -> Option<HealthSpec> {
        r.health_check.as_ref().map(|h| {
            let at = format!("{path}.health_check");
            if !h.path.starts_with('/') || h.path.contains([' ', '\r', '\n']) {
                self.problem(
                    format!("{at}.path"),
                    format!("{:?} must be a path starting with /", h.path),
                );
            }
            let check = HealthSpec {
                path: h.path.clone(),
                interval: self.duration(
                    &format!("{at}.interval"),
                    h.interval.as_deref(),
                    Duration::from_secs(5),
                ),
                timeout: self.duration(
                    &format!("{at}.timeout"),
                    h.timeout.as_deref(),
                    Duration::from_secs(1),
                ),
                healthy_after: h.healthy_after.unwrap_or(2),
                unhealthy_after: h.unhealthy_after.unwrap_or(3),
            };
            for (name, n) in [
                ("healthy_after", check.healthy_after),
                ("unhealthy_after", check.unhealthy_after),
            ] {
                if n == 0 {
                    self.problem(format!("{at}.{name}"), "must be at least 1");
                }
            }
            check
        })
    }

    /// `outlier`, over its defaults.
    fn outlier(&mut self, path: &str, r: &RouteFile) -> OutlierSpec {
        let mut outlier = OutlierSpec::default();
        if let Some(o) = &r.outlier {
            if let Some(n) = o.consecutive_failures {
                outlier.consecutive_failures = n;
            }
            outlier.ejection = self.duration(
                &format!("{path}.outlier.ejection"),
                o.ejection.as_deref(),
                outlier.ejection,
            );
            if let Some(text) = &o.max_ejected {
                match percent(text) {
                    Some(p) => outlier.max_ejected_percent = p,
                    None => self.problem(
                        format!("{path}.outlier.max_ejected"),
                        format!("{text:?} is not a share like 50%"),
                    ),
                }
            }
        }
        outlier
    }

    /// `retries`, over its defaults.
    fn retries(&mut self, path: &str, r: &RouteFile) -> RetrySpec {
        let mut retries = RetrySpec::default();
        if let Some(rf) = &r.retries {
            if let Some(n) = rf.attempts {
                if !(1..=5).contains(&n) {
                    self.problem(
                        format!("{path}.retries.attempts"),
                        format!("{n} is not from 1 (no retry) to 5"),
                    );
                }
                retries.attempts = n.clamp(1, 5);
            }
            if let Some(list) = &rf.on {
                let mut on = RetryOn {
                    connect_failure: false,
                    refused_stream: false,
                    reset: false,
                    statuses: 0,
                };
                for (i, what) in list.iter().enumerate() {
                    let what = match what {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    match what.as_str() {
                        "connect_failure" => on.connect_failure = true,
                        "refused_stream" => on.refused_stream = true,
                        "reset" => on.reset = true,
                        "502" => on.statuses |= 1,
                        "503" => on.statuses |= 2,
                        "504" => on.statuses |= 4,
                        other => self.problem(
                            format!("{path}.retries.on[{i}]"),
                            format!("{other:?} is not one of connect_failure, refused_stream, reset, 502, 503, 504"),
                        ),
                    }
                }
                retries.on = on;
            }
            if let Some(text) = &rf.budget {
                match percent(text) {
                    Some(p) => retries.budget_percent = p,
                    None => self.problem(
                        format!("{path}.retries.budget"),
                        format!("{text:?} is not a share like 20%"),
                    ),
                }
            }
        }
        retries
    }

    /// `resolver:`.
    pub(in crate::config) fn resolver(&mut self, file: Option<ResolverFile>) -> ResolverSpec {
        let mut spec = ResolverSpec::default();
        let Some(file) = file else {
            return spec;
        };
        for (i, text) in file.servers.iter().flatten().enumerate() {
            // A bare address means port 53.
            let parsed = text
                .parse::<std::net::SocketAddr>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(|ip| (ip, 53).into()));
            match parsed {
                Ok(addr) => spec.servers.push(addr),
                Err(_) => self.problem(
                    format!("resolver.servers[{i}]"),
                    format!("{text:?} is not an address like 127.0.0.11:53"),
                ),
            }
        }
        spec.refresh = self.duration(
            "resolver.refresh",
            file.refresh.as_deref(),
            Duration::from_secs(5),
        );
        spec
    }
}
