//! A limit's cost settled after the response (`cost: {reserve: …, actual: …}`): what is held
//! when the request is admitted (a number, or read from the request), and where the real cost
//! is read when the response ends (a JSON field of the body, the usage an event stream's last
//! event carries, or a header or trailer). The proxy does the reading (`proxy/cost.rs`), the
//! limiter the settling (`limiter/settle.rs`).

use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use serde_json::{Map, Value};

use super::Validator;
use super::file::{ReadFile, ReserveFile, SettledFile};
use crate::limiter::{AlgorithmKind, Limit};

/// `cost: {reserve, actual}`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub reserve: Reserve,
    pub actual: Actual,
    /// The most an `actual` figure is charged as (`actual.max`, by default the limit): what an
    /// upstream reports is the upstream's word, and no figure may wrap a counter.
    pub actual_max: u64,
}

/// What is held at admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// The same for every request.
    Units(u32),
    /// Read from the request; `default` when it does not say, cut to `max`.
    Read { from: Field, default: u32, max: u32 },
}

/// Where a figure is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A field of a JSON body, by its dotted path (`usage.total_tokens`).
    Json(Box<[String]>),
    /// A header (or, for `actual`, a trailer).
    Header(HeaderName),
    /// `refund_on` / `spend_on`: the response's status says whether the request keeps its units
    /// (as reserved) or gets them back (0), decided at the response head.
    Status(Statuses),
}

/// The statuses of `refund_on` (`refund: true`) or `spend_on` (`refund: false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statuses {
    /// Whole statuses, and classes by their hundreds digit (`4` for `"4xx"`).
    pub codes: Vec<u16>,
    pub classes: Vec<u16>,
    pub refund: bool,
}

impl Statuses {
    /// True when an answer of `status` gets the request's units back.
    pub fn refunds(&self, status: u16) -> bool {
        let listed = self.codes.contains(&status) || self.classes.contains(&(status / 100));
        listed == self.refund
    }
}

/// Where the real cost is read when the response ends.
pub type Actual = Field;

impl Reserve {
    /// The units to hold for a request with `headers` and (if read) JSON body `json`: at least 1.
    pub fn of(&self, headers: &HeaderMap, json: Option<&Map<String, Value>>) -> u32 {
        match self {
            Reserve::Units(units) => *units,
            Reserve::Read { from, default, max } => {
                let read = match from {
                    Field::Json(path) => json.and_then(|m| lookup(m, path)).and_then(units_of),
                    Field::Header(name) => header_units(headers, name),
                    Field::Status(_) => None,
                };
                let units = read.map_or(*default, |n| n.min(u64::from(*max)) as u32);
                units.max(1)
            }
        }
    }

    /// True when reading it needs the request's JSON body.
    pub fn reads_body(&self) -> bool {
        matches!(
            self,
            Reserve::Read {
                from: Field::Json(_),
                ..
            }
        )
    }
}

/// The value at `path` in `map` (each step an object's field).
pub fn lookup<'a>(map: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    rest.iter()
        .try_fold(map.get(first)?, |value, step| value.as_object()?.get(step))
}

/// A JSON value as a count of units: a non-negative number or a string holding one, a fraction
/// rounded up, a figure past `u64::MAX` saturating there (the caller caps it). Negative, not a
/// number, or not finite: `None` (the caller falls back to the reserve or default).
pub fn units_of(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().and_then(whole_units)),
        Value::String(s) => units_in(s),
        _ => None,
    }
}

/// A header's (or trailer's) value as a count of units, as [`units_of`] reads a string.
pub fn header_units(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    units_in(headers.get(name)?.to_str().ok()?)
}

/// Text as a count of units, as [`units_of`] reads it.
fn units_in(text: &str) -> Option<u64> {
    let text = text.trim();
    text.parse::<u64>()
        .ok()
        .or_else(|| text.parse::<f64>().ok().and_then(whole_units))
}

/// A finite, non-negative figure rounded up to whole units (saturating at `u64::MAX`).
fn whole_units(f: f64) -> Option<u64> {
    // `as` saturates a float above u64::MAX at u64::MAX.
    (f.is_finite() && f >= 0.0).then(|| f.ceil() as u64)
}

/// The algorithms a settled cost works with: those whose state is a count that can be charged
/// into debt and refunded (a leaky bucket's delay, a log's one entry per unit and a concurrency
/// slot are not).
const SETTLEABLE: [AlgorithmKind; 4] = [
    AlgorithmKind::TokenBucket,
    AlgorithmKind::FixedWindow,
    AlgorithmKind::SlidingWindowCounter,
    AlgorithmKind::Quota,
];

/// The limit's own cost under `cost: {reserve, actual}`: the reserve when no request says
/// otherwise (checked against the limit as a fixed cost is).
pub(super) fn reserve_default(settled: &SettledFile) -> u32 {
    let n = match &settled.reserve {
        Some(ReserveFile::Units(n)) => *n,
        Some(ReserveFile::Read(read)) => read.default.or(read.max).unwrap_or(1),
        None => 1,
    };
    u32::try_from(n).unwrap_or(0)
}

impl Validator {
    /// A problem at `path` unless `limit`'s algorithm can `what` after the response.
    fn settleable(&mut self, path: &str, limit: &Limit, what: &str) {
        let kind = limit.algorithm().kind();
        if !SETTLEABLE.contains(&kind) {
            self.problem(
                path,
                format!(
                    "{} cannot {what} after the response: use token_bucket, fixed_window, sliding_window_counter or quota",
                    kind.name()
                ),
            );
        }
    }

    /// `refund_on` or `spend_on` (`refund`) at `path` of `limit`, whose requests cost `cost`:
    /// a settled cost whose actual is the reserve or nothing, as the answer's status says.
    pub(super) fn status_settled(
        &mut self,
        path: &str,
        statuses: &[super::file::StatusFile],
        refund: bool,
        limit: &Limit,
        cost: u32,
    ) -> Option<Arc<Settled>> {
        use super::file::StatusFile;
        let before = self.problems.len();
        self.settleable(path, limit, "give units back");
        if statuses.is_empty() {
            self.problem(path, "name at least one status or class");
        }
        let mut out = Statuses {
            codes: Vec::new(),
            classes: Vec::new(),
            refund,
        };
        for (n, status) in statuses.iter().enumerate() {
            match status {
                StatusFile::Code(code) if (100..=599).contains(code) => {
                    out.codes.push(*code as u16)
                }
                StatusFile::Class(class)
                    if class.len() == 3
                        && class[1..].eq_ignore_ascii_case("xx")
                        && matches!(class.as_bytes()[0], b'1'..=b'5') =>
                {
                    out.classes.push(u16::from(class.as_bytes()[0] - b'0'))
                }
                _ => self.problem(
                    format!("{path}[{n}]"),
                    "a status (100-599) or a class (\"1xx\" to \"5xx\")",
                ),
            }
        }
        (self.problems.len() == before).then(|| {
            Arc::new(Settled {
                reserve: Reserve::Units(cost.max(1)),
                actual: Field::Status(out),
                actual_max: u64::from(limit.algorithm().units()),
            })
        })
    }

    /// `cost: {reserve, actual}` at `path` of `limit`: each field checked and named.
    pub(super) fn settled(
        &mut self,
        path: &str,
        file: &SettledFile,
        limit: &Limit,
    ) -> Option<Arc<Settled>> {
        let before = self.problems.len();
        self.settleable(path, limit, "settle a cost");
        let units = limit.algorithm().units();
        let reserve = match &file.reserve {
            None => {
                self.problem(
                    format!("{path}.reserve"),
                    "required (what is held at admission)",
                );
                None
            }
            Some(ReserveFile::Units(n)) => match u32::try_from(*n) {
                Ok(n) if n >= 1 && n <= units => Some(Reserve::Units(n)),
                _ => {
                    self.problem(
                        format!("{path}.reserve"),
                        format!("must be between 1 and {units} (the limit)"),
                    );
                    None
                }
            },
            Some(ReserveFile::Read(read)) => {
                let from = self.field(&format!("{path}.reserve"), read);
                let max = match read.max {
                    None => Some(units),
                    Some(n) => u32::try_from(n).ok().filter(|n| *n >= 1 && *n <= units).or_else(|| {
                        self.problem(
                            format!("{path}.reserve.max"),
                            format!("must be between 1 and {units} (the limit: a larger reserve could never be held)"),
                        );
                        None
                    }),
                };
                let default = match (read.default, max) {
                    (None, max) => max,
                    (Some(n), Some(max)) => u32::try_from(n)
                        .ok()
                        .filter(|n| *n >= 1 && *n <= max)
                        .or_else(|| {
                            self.problem(
                                format!("{path}.reserve.default"),
                                format!("must be between 1 and {max} (reserve.max)"),
                            );
                            None
                        }),
                    (Some(_), None) => None,
                };
                match (from, default, max) {
                    (Some(from), Some(default), Some(max)) => {
                        Some(Reserve::Read { from, default, max })
                    }
                    _ => None,
                }
            }
        };
        let actual = match &file.actual {
            None => {
                self.problem(
                    format!("{path}.actual"),
                    "required (where the real cost is read when the response ends)",
                );
                None
            }
            Some(read) => {
                if read.default.is_some() {
                    self.problem(
                        format!("{path}.actual.default"),
                        "is a reserve's setting (a response without the figure settles at the reserve)",
                    );
                }
                self.field(&format!("{path}.actual"), read)
            }
        };
        let actual_max = match file.actual.as_ref().and_then(|read| read.max) {
            None => Some(u64::from(units)),
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n >= 1 && *n <= units)
                .map(u64::from)
                .or_else(|| {
                    self.problem(
                        format!("{path}.actual.max"),
                        format!("must be between 1 and {units} (the limit: a budget's debt is at most one limit)"),
                    );
                    None
                }),
        };
        if self.problems.len() > before {
            return None;
        }
        Some(Arc::new(Settled {
            reserve: reserve?,
            actual: actual?,
            actual_max: actual_max?,
        }))
    }

    /// `json:` or `header:` at `path`: exactly one.
    fn field(&mut self, path: &str, read: &ReadFile) -> Option<Field> {
        match (&read.json, &read.header) {
            (Some(json), None) => {
                let steps: Box<[String]> = json.split('.').map(str::to_string).collect();
                if steps.iter().any(|s| s.is_empty()) {
                    self.problem(
                        format!("{path}.json"),
                        format!("{json:?} is not a field path (fields joined by dots)"),
                    );
                    return None;
                }
                Some(Field::Json(steps))
            }
            (None, Some(header)) => match HeaderName::from_bytes(header.as_bytes()) {
                Ok(name) => Some(Field::Header(name)),
                Err(_) => {
                    self.problem(
                        format!("{path}.header"),
                        format!("{header:?} is not a header name"),
                    );
                    None
                }
            },
            _ => {
                self.problem(path, "give one of json: or header:");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_reserve_is_read_cut_to_its_max_and_defaults_when_absent() {
        let reserve = Reserve::Read {
            from: Field::Json(["max_tokens".to_string()].into()),
            default: 1000,
            max: 32000,
        };
        let headers = HeaderMap::new();
        assert_eq!(
            reserve.of(&headers, Some(&map(r#"{"max_tokens": 50}"#))),
            50
        );
        assert_eq!(
            reserve.of(&headers, Some(&map(r#"{"max_tokens": 90000}"#))),
            32000
        );
        assert_eq!(
            reserve.of(&headers, Some(&map(r#"{"max_tokens": "70"}"#))),
            70
        );
        assert_eq!(
            reserve.of(&headers, Some(&map(r#"{"max_tokens": -3}"#))),
            1000
        );
        assert_eq!(reserve.of(&headers, Some(&map("{}"))), 1000);
        assert_eq!(reserve.of(&headers, None), 1000);
        assert_eq!(reserve.of(&headers, Some(&map(r#"{"max_tokens": 0}"#))), 1);
    }

    #[test]
    fn a_dotted_path_walks_objects() {
        let usage = map(r#"{"usage": {"total_tokens": 187, "prompt_tokens": 2.5}}"#);
        let path = |p: &str| p.split('.').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            lookup(&usage, &path("usage.total_tokens")).and_then(units_of),
            Some(187)
        );
        assert_eq!(
            lookup(&usage, &path("usage.prompt_tokens")).and_then(units_of),
            Some(3)
        );
        assert_eq!(lookup(&usage, &path("usage.total_tokens.x")), None);
        assert_eq!(lookup(&usage, &path("cost")), None);
    }
}
