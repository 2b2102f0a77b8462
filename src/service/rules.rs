//! envoyproxy/ratelimit's configuration, read as it is: the files its users already keep, and
//! its matching rules.
//!
//! A file names a `domain` and a tree of `descriptors`: each node a `key`, an optional `value`
//! (with `*` matching any run of characters), an optional `rate_limit` and child `descriptors`.
//! A request's descriptor (a list of entries, each a key and a value) walks the tree entry by
//! entry: at each level the node for the exact `key_value`, else the first wildcard that matches,
//! else the bare `key` (each value its own budget). The limit that applies is the one on the node
//! reached at the descriptor's last entry; a descriptor that stops early, or matches nothing, is
//! answered OK without a limit.
//!
//! Units as envoyproxy/ratelimit counts them (MONTH is 30 days, YEAR 365), in fixed windows
//! aligned to the Unix epoch. floodgate's extensions inside `rate_limit:` (a file that uses them
//! no longer loads in envoyproxy/ratelimit): `unit_multiplier`, and `algorithm:` with that
//! algorithm's parameters as under `routes[].limits`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::config::{ConfigError, FieldProblem};
use crate::limiter::{Algorithm, AlgorithmKind, Limit};

/// Every domain's rules, from every file of `service.config`.
#[derive(Debug, Default)]
pub struct Rules {
    domains: HashMap<String, Level>,
    /// Keys floodgate reads but does not act on, named once at load (`quota_mode`, …).
    pub ignored: Vec<String>,
}

/// One level of a domain's descriptor tree.
#[derive(Debug, Default)]
struct Level {
    /// By `key_value`, or by `key` for a node without a value.
    exact: HashMap<String, Node>,
    /// Nodes whose value has a `*`, in file order: (key, value pattern).
    wildcards: Vec<(String, String, Node)>,
}

#[derive(Debug)]
struct Node {
    limit: Option<Box<RuleLimit>>,
    children: Level,
}

/// The `rate_limit` of one descriptor node.
#[derive(Debug)]
pub struct RuleLimit {
    /// What the store enforces (absent for `unlimited`).
    pub limit: Option<Limit>,
    /// The store's id for this limit's budgets: its domain, its place in the tree and a
    /// fingerprint of its parameters (a reload that changes it starts it afresh).
    pub budget_id: String,
    /// `current_limit` as Envoy reads it: requests per unit, the unit, the multiplier.
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub unit_multiplier: u32,
    pub name: Option<String>,
    /// The names of the limits this one replaces (`replaces: [{name}]`).
    pub replaces: Vec<String>,
    pub unlimited: bool,
    /// `shadow_mode`: counted, never denying.
    pub shadow: bool,
    /// `detailed_metric`: its own metric label.
    pub detailed_metric: bool,
    /// Where it is written: `file: descriptors[0].descriptors[1]`, for logs.
    pub path: String,
}

/// envoyproxy/ratelimit's units (and the proto's `RateLimitUnit` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Year = 6,
    Week = 7,
}

impl Unit {
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// Its length in seconds, as envoyproxy/ratelimit counts (a month is 30 days, a year 365).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The proto's number for it.
    pub fn number(self) -> i32 {
        self as i32
    }

    /// The proto3 JSON name of the proto's unit `number`.
    pub fn name_of(number: i32) -> &'static str {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Month,
            Unit::Year,
            Unit::Week,
        ]
        .into_iter()
        .find(|u| u.number() == number)
        .map_or("UNKNOWN", Unit::name)
    }

    /// The proto3 JSON name (`SECOND`, …).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// A file of envoyproxy/ratelimit's format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRules {
    domain: String,
    #[serde(default)]
    descriptors: Vec<FileDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDescriptor {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<FileRateLimit>,
    #[serde(default)]
    descriptors: Vec<FileDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    // Read, not acted on: named in a warning.
    #[serde(default)]
    quota_mode: Option<bool>,
    #[serde(default)]
    share_threshold: Option<bool>,
    #[serde(default)]
    value_to_metric: Option<bool>,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRateLimit {
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<FileReplaces>,
    /// floodgate's: a window of this many units.
    #[serde(default)]
    unit_multiplier: Option<u32>,
    /// floodgate's: another algorithm, with its parameters as under `routes[].limits`.
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    capacity: Option<i64>,
    #[serde(default)]
    refill_rate: Option<f64>,
    #[serde(default)]
    leak_rate: Option<f64>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    window: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileReplaces {
    name: String,
}

/// One entry of a request's descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: String,
}

impl Rules {
    /// Reads every file `paths` names (a directory: its `*.yaml` and `*.yml` files, in name
    /// order). Every problem is named with its file and path.
    pub fn load(paths: &[PathBuf]) -> Result<Rules, ConfigError> {
        let mut files = Vec::new();
        for path in paths {
            if path.is_dir() {
                let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(|e| one(path, "", format!("cannot read the directory: {e}")))?
                    .filter_map(|e| Some(e.ok()?.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                    .collect();
                found.sort();
                files.extend(found);
            } else {
                files.push(path.clone());
            }
        }
        let mut rules = Rules::default();
        let mut problems = Vec::new();
        let mut seen: HashMap<String, PathBuf> = HashMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| one(&file, "", format!("cannot read it: {e}")))?;
            match Rules::parse_file(&file, &text, &mut rules) {
                Ok(domain) => {
                    if let Some(first) = seen.insert(domain.clone(), file.clone()) {
                        problems.push(problem(
                            &file,
                            "domain",
                            format!("domain {domain:?} is also in {}", first.display()),
                        ));
                    }
                }
                Err(mut more) => problems.append(&mut more),
            }
        }
        if problems.is_empty() {
            Ok(rules)
        } else {
            Err(ConfigError { problems })
        }
    }

    /// Rules from one file's text (tests; `floodgate check`).
    pub fn from_yaml(name: &str, text: &str) -> Result<Rules, ConfigError> {
        let mut rules = Rules::default();
        Rules::parse_file(Path::new(name), text, &mut rules)
            .map_err(|problems| ConfigError { problems })?;
        Ok(rules)
    }

    fn parse_file(file: &Path, text: &str, rules: &mut Rules) -> Result<String, Vec<FieldProblem>> {
        let value: serde_json::Value = serde_saphyr::from_str(text)
            .map_err(|e| vec![problem(file, "", format!("invalid YAML: {e}"))])?;
        let parsed: FileRules = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            vec![problem(file, &path, e.into_inner().to_string())]
        })?;
        if parsed.domain.is_empty() {
            return Err(vec![problem(file, "domain", "must not be empty")]);
        }
        let mut problems = Vec::new();
        let mut builder = Builder {
            file,
            domain: &parsed.domain,
            problems: &mut problems,
            ignored: &mut rules.ignored,
        };
        let level = builder.level("descriptors", "", &parsed.descriptors);
        if !problems.is_empty() {
            return Err(problems);
        }
        rules.domains.insert(parsed.domain.clone(), level);
        Ok(parsed.domain)
    }

    /// True when `domain` has rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit that applies to `entries` in `domain` (envoyproxy/ratelimit's `GetLimit`).
    pub fn find(&self, domain: &str, entries: &[Entry]) -> Option<&RuleLimit> {
        let mut level = self.domains.get(domain)?;
        for (i, entry) in entries.iter().enumerate() {
            let node = level.find(entry)?;
            if i + 1 == entries.len() {
                return node.limit.as_deref();
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

impl Level {
    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty()
    }

    fn find(&self, entry: &Entry) -> Option<&Node> {
        let mut key_value = String::with_capacity(entry.key.len() + 1 + entry.value.len());
        key_value.push_str(&entry.key);
        key_value.push('_');
        key_value.push_str(&entry.value);
        if let Some(node) = self.exact.get(&key_value) {
            return Some(node);
        }
        if let Some((_, _, node)) = self
            .wildcards
            .iter()
            .find(|(key, pattern, _)| *key == entry.key && glob(pattern, &entry.value))
        {
            return Some(node);
        }
        self.exact.get(&entry.key)
    }
}

/// `*` in `pattern` matches any run of characters (none included); the rest is literal.
fn glob(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.len() >= part.len() && rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

struct Builder<'b> {
    file: &'b Path,
    domain: &'b str,
    problems: &'b mut Vec<FieldProblem>,
    ignored: &'b mut Vec<String>,
}

impl Builder<'_> {
    fn level(&mut self, path: &str, tree: &str, descriptors: &[FileDescriptor]) -> Level {
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
            let tree = format!("{tree}/{name}");
            for (key, given) in [
                ("quota_mode", d.quota_mode.is_some()),
                ("share_threshold", d.share_threshold.is_some()),
                ("value_to_metric", d.value_to_metric.is_some()),
                ("metadata", d.metadata.is_some()),
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
            let duplicate = match &d.value {
                Some(value) if value.contains('*') => {
                    let twice = level
                        .wildcards
                        .iter()
                        .any(|(k, v, _)| *k == d.key && v == value);
                    level.wildcards.push((d.key.clone(), value.clone(), node));
                    twice
                }
                _ => level.exact.insert(name.clone(), node).is_some(),
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
            budget_id: format!("svc:{}{tree}:{fingerprint}", self.domain),
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

fn limit_units(r: &FileRateLimit) -> Option<i64> {
    r.limit.or(r.capacity)
}

fn problem(file: &Path, path: &str, message: impl Into<String>) -> FieldProblem {
    FieldProblem {
        path: if path.is_empty() {
            file.display().to_string()
        } else {
            format!("{}: {path}", file.display())
        },
        message: message.into(),
    }
}

fn one(file: &Path, path: &str, message: String) -> ConfigError {
    ConfigError {
        problems: vec![problem(file, path, message)],
    }
}

#[cfg(test)]
mod tests;
