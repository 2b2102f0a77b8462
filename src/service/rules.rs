//! envoyproxy/ratelimit's configuration, read as it is: the files its users already keep, and
//! its matching rules.
//!
//! A file names a `domain` and a tree of `descriptors`: each node a `key`, an optional `value`
//! (with `*` matching any run of characters), an optional `rate_limit` and child `descriptors`.
//! A request's descriptor (a list of entries, each a key and a value) walks the tree entry by
//! entry: at each level the node for the exact key and value, else the first wildcard of that key
//! that matches, else the bare `key` (each value its own budget). Keys and values are compared as
//! the pairs they are, never joined into one string: envoyproxy/ratelimit looks nodes up by
//! `key + "_" + value`, so a key `a_b` there shadows key `a` with value `b` (and its children);
//! here they are different nodes whatever characters a key or value holds. The limit that applies is the one on the node
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

use crate::config::{ConfigError, FieldProblem};
use crate::limiter::Limit;

/// Every domain's rules, from every file of `service.config`.
#[derive(Debug, Default)]
pub struct Rules {
    domains: HashMap<String, Level>,
    /// Keys floodgate reads but does not act on, named once at load (`quota_mode`, …).
    pub ignored: Vec<String>,
}

/// One level of a domain's descriptor tree: its nodes by key.
#[derive(Debug, Default)]
struct Level {
    keys: HashMap<String, KeyNodes>,
}

/// The nodes of one key at one level.
#[derive(Debug, Default)]
struct KeyNodes {
    /// By exact value.
    values: HashMap<String, Node>,
    /// Values with a `*`, in file order: (pattern, node).
    wildcards: Vec<(String, Node)>,
    /// The node without a value (each value its own budget).
    bare: Option<Node>,
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
    /// `detailed_metric` (read; floodgate's service metric has no per-descriptor label, so it
    /// is named in the load warning).
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

    /// The proto's number of the unit the proto3 JSON `name` names (`UNKNOWN` is 0).
    pub fn number_of(name: &str) -> Option<i32> {
        if name == "UNKNOWN" {
            return Some(0);
        }
        Self::parse(name)
            .filter(|u| u.name() == name)
            .map(Unit::number)
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
            let text = crate::files::read_text(&file).map_err(|e| one(&file, "", e))?;
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
        self.keys.is_empty()
    }

    fn find(&self, entry: &Entry) -> Option<&Node> {
        let nodes = self.keys.get(&entry.key)?;
        if let Some(node) = nodes.values.get(&entry.value) {
            return Some(node);
        }
        if let Some((_, node)) = nodes
            .wildcards
            .iter()
            .find(|(pattern, _)| glob(pattern, &entry.value))
        {
            return Some(node);
        }
        nodes.bare.as_ref()
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

mod build;
use build::Builder;

#[cfg(test)]
mod tests;
