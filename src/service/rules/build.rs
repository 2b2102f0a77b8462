//! Building a domain's descriptor tree from a file's structs: each `rate_limit` checked and
//! turned into a limit (envoyproxy/ratelimit's units, or floodgate's `algorithm:`), each problem
//! named with its file and path.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::{FileDescriptor, FileRateLimit, Level, Node, RuleLimit, Unit, limit_units, problem};
use crate::config::FieldProblem;
use crate::limiter::{Algorithm, AlgorithmKind, Limit};

pub(super) struct Builder<'b> {
    pub(super) file: &'b Path,
    pub(super) domain: &'b str,
    pub(super) problems: &'b mut Vec<FieldProblem>,
    pub(super) ignored: &'b mut Vec<String>,
}

impl Builder<'_> {
    pub(super) fn level(
        &mut self,
        path: &str,
        tree: &str,
        descriptors: &[FileDescriptor],
    ) -> Level {
        let mut level = Level::default();
        for (i, d) in descriptors.iter().enumerate() {
            let path = format!("{path}[{i}]");
            if d.key.is_empty() {
                self.problems.push(problem(
                    self.file,
                    &format!("{path}.key"),
                    "must not be empty",
                ));
                continue;
            }
            let name = match &d.value {
                Some(value) => format!("{}_{value}", d.key),
                None => d.key.clone(),
            };
            // The node's place in the budget id: each part with its length before it, so no
            // key or value (whatever it holds) names another node's place.
            let tree = match &d.value {
                Some(value) => format!("{tree}/{}:{}={}:{value}", d.key.len(), d.key, value.len()),
                None => format!("{tree}/{}:{}", d.key.len(), d.key),
            };
            for (key, given) in [
                ("quota_mode", d.quota_mode.is_some()),
                ("share_threshold", d.share_threshold.is_some()),
                ("value_to_metric", d.value_to_metric.is_some()),
                ("metadata", d.metadata.is_some()),
                ("detailed_metric", d.detailed_metric),
            ] {
                if given {
                    self.ignored
                        .push(format!("{}: {path}.{key}", self.file.display()));
                }
            }
            let limit = d
                .rate_limit
                .as_ref()
                .and_then(|r| self.limit(&format!("{path}.rate_limit"), &tree, r, d));
            let node = Node {
                limit: limit.map(Box::new),
                children: self.level(&format!("{path}.descriptors"), &tree, &d.descriptors),
            };
            let nodes = level.keys.entry(d.key.clone()).or_default();
            let duplicate = match &d.value {
                Some(value) if value.contains('*') => {
                    let twice = nodes.wildcards.iter().any(|(v, _)| v == value);
                    nodes.wildcards.push((value.clone(), node));
                    twice
                }
                Some(value) => nodes.values.insert(value.clone(), node).is_some(),
                None => nodes.bare.replace(node).is_some(),
            };
            if duplicate {
                self.problems.push(problem(
                    self.file,
                    &path,
                    format!("duplicate descriptor {name:?} at this level"),
                ));
            }
        }
        level
    }

    fn limit(
        &mut self,
        path: &str,
        tree: &str,
        r: &FileRateLimit,
        d: &FileDescriptor,
    ) -> Option<RuleLimit> {
        let before = self.problems.len();
        let unit = match &r.unit {
            Some(text) => Unit::parse(text).or_else(|| {
                self.problems.push(problem(
                    self.file,
                    &format!("{path}.unit"),
                    format!("{text:?} is not one of second, minute, hour, day, week, month, year"),
                ));
                None
            }),
            None => None,
        };
        let multiplier = r.unit_multiplier.unwrap_or(1);
        if multiplier == 0 {
            self.problems.push(problem(
                self.file,
                &format!("{path}.unit_multiplier"),
                "must be at least 1",
            ));
        }
        let limit = if r.unlimited {
            None
        } else if let Some(algorithm) = &r.algorithm {
            self.algorithm(path, algorithm, r, unit, multiplier)
        } else {
            match (unit, r.requests_per_unit) {
                (Some(unit), Some(rpu)) if multiplier > 0 => {
                    let window_us = unit.seconds() * u64::from(multiplier) * 1_000_000;
                    match Algorithm::from_parts(
                        AlgorithmKind::FixedWindow,
                        u64::from(rpu),
                        window_us,
                    ) {
                        Ok(a) => Some(Limit::of(a)),
                        Err(e) => {
                            self.problems.push(problem(self.file, path, e.to_string()));
                            None
                        }
                    }
                }
                (None, _) if r.unit.is_none() => {
                    self.problems
                        .push(problem(self.file, &format!("{path}.unit"), "is required"));
                    None
                }
                (_, None) => {
                    self.problems.push(problem(
                        self.file,
                        &format!("{path}.requests_per_unit"),
                        "is required",
                    ));
                    None
                }
                _ => None,
            }
        };
        if self.problems.len() > before {
            return None;
        }
        let fingerprint = {
            let described = format!("{:?}|{:?}", limit.as_ref().map(Limit::algorithm), r.unit);
            let digest = Sha256::digest(described.as_bytes());
            crate::limiter::hex(&digest[..6])
        };
        Some(RuleLimit {
            budget_id: format!(
                "svc:{}:{}{tree}:{fingerprint}",
                self.domain.len(),
                self.domain
            ),
            limit,
            requests_per_unit: r.requests_per_unit.unwrap_or_else(|| {
                limit_units(r).map_or(0, |u| u32::try_from(u).unwrap_or(u32::MAX))
            }),
            unit: unit.unwrap_or(Unit::Second),
            unit_multiplier: multiplier,
            name: r.name.clone(),
            replaces: r.replaces.iter().map(|x| x.name.clone()).collect(),
            unlimited: r.unlimited,
            shadow: d.shadow_mode,
            detailed_metric: d.detailed_metric,
            path: format!("{}: {path}", self.file.display()),
        })
    }

    /// `algorithm:` inside `rate_limit`: floodgate's algorithms, their parameters named as under
    /// `routes[].limits`; `unit` (× `unit_multiplier`) stands for a missing `window`, and
    /// `requests_per_unit` for a missing `limit`.
    fn algorithm(
        &mut self,
        path: &str,
        algorithm: &str,
        r: &FileRateLimit,
        unit: Option<Unit>,
        multiplier: u32,
    ) -> Option<Limit> {
        let kind: AlgorithmKind =
            match serde_json::from_value(serde_json::Value::String(algorithm.to_string())) {
                Ok(kind) => kind,
                Err(_) => {
                    self.problems.push(problem(
                        self.file,
                        &format!("{path}.algorithm"),
                        format!("{algorithm:?} is not an algorithm floodgate has"),
                    ));
                    return None;
                }
            };
        let window_us = match (&r.window, unit) {
            (Some(text), _) => match crate::config::parse_duration(text) {
                Ok(d) => Some(d.as_micros() as u64),
                Err(e) => {
                    self.problems.push(problem(
                        self.file,
                        &format!("{path}.window"),
                        e.to_string(),
                    ));
                    return None;
                }
            },
            (None, Some(unit)) => Some(unit.seconds() * u64::from(multiplier) * 1_000_000),
            (None, None) => None,
        };
        let units = r
            .limit
            .or(r.capacity)
            .or(r.requests_per_unit.map(i64::from));
        let rate = r.refill_rate.or(r.leak_rate);
        let built = match (kind.is_bucket(), units, rate, window_us) {
            (true, Some(capacity), Some(rate), _) if capacity > 0 => {
                let interval_us = (1e6 / rate).round();
                if !(interval_us.is_finite() && interval_us >= 1.0) {
                    self.problems.push(problem(
                        self.file,
                        path,
                        "the rate must be positive and at most 1,000,000 per second",
                    ));
                    return None;
                }
                Algorithm::from_parts(kind, capacity as u64, interval_us as u64)
            }
            (false, Some(limit), _, Some(window_us)) if limit > 0 => {
                Algorithm::from_parts(kind, limit as u64, window_us)
            }
            _ => {
                self.problems.push(problem(
                    self.file,
                    path,
                    format!(
                        "{} needs {}",
                        kind.name(),
                        if kind.is_bucket() {
                            "capacity and a rate"
                        } else {
                            "limit (or requests_per_unit) and window (or unit)"
                        }
                    ),
                ));
                return None;
            }
        };
        match built {
            Ok(a) => Some(Limit::of(a)),
            Err(e) => {
                self.problems.push(problem(self.file, path, e.to_string()));
                None
            }
        }
    }
}
