//! One entry of a route's `limits:`: built through the limiter's checked constructors, whose
//! errors are given the field's path here.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::file::{Choice, CostFile, LimitFile, Scope};
use super::{Validator, parse_duration};
use crate::limiter::calendar::{Calendar, Period};
use crate::limiter::{Algorithm, AlgorithmKind, Limit, LimitError, LimitField};

impl Validator {
    pub(super) fn limit(&mut self, path: &str, l: &LimitFile) -> Option<Limit> {
        let kind = match &l.algorithm {
            Choice::Known(kind) => *kind,
            Choice::Invalid(message) => {
                self.problem(format!("{path}.algorithm"), message.clone());
                return None;
            }
        };
        let (rate_name, rate) = match kind {
            AlgorithmKind::LeakyBucket => ("leak_rate", l.leak_rate),
            _ => ("refill_rate", l.refill_rate),
        };
        let units_name = if kind.is_bucket() {
            "capacity"
        } else {
            "limit"
        };
        let before = self.problems.len();
        self.stray_parameters(path, l, kind);
        let units = if kind.is_bucket() {
            l.capacity
        } else {
            l.limit
        };
        let units = self.count(&format!("{path}.{units_name}"), units);
        let built = self.algorithm(path, l, kind, units, (rate_name, rate))?;
        let cost = match &l.cost {
            None => Some(1),
            Some(CostFile::Units(c)) => u32::try_from(*c).ok().or(Some(0)),
            // Reserve-then-settle: the limit's own cost is the reserve without a request to
            // read (checked against the limit like a fixed cost; `cost.rs` checks the rest).
            // A reserve read from the request is checked by `cost.rs`, naming its own field
            // (`cost.reserve.max`), so here it is only cut to the limit.
            Some(CostFile::Settled(settled)) => {
                let units = built.as_ref().map_or(u32::MAX, |a| a.units());
                Some(super::cost::reserve_default(settled).min(units))
            }
        };
        let limit = built.and_then(|algorithm| Limit::new(algorithm, cost.unwrap_or(0)));
        let global = self.scope(path, l, kind);
        match limit {
            Ok(limit) if self.problems.len() == before && global => Some(limit.global()),
            Ok(limit) if self.problems.len() == before => Some(limit),
            Ok(_) => None,
            Err(e) => {
                let field = match e.field() {
                    LimitField::Units => format!("{path}.{units_name}"),
                    LimitField::Rate => format!("{path}.{rate_name}"),
                    LimitField::Window if kind == AlgorithmKind::Concurrency => {
                        format!("{path}.lease")
                    }
                    LimitField::Window => format!("{path}.window"),
                    LimitField::Cost => format!("{path}.cost"),
                    LimitField::Whole => path.to_string(),
                };
                self.limit_problem(field, e);
                None
            }
        }
    }

    /// Parameters `l` has that its algorithm does not take (a bucket's `window`, a window's
    /// `capacity`…), each named.
    fn stray_parameters(&mut self, path: &str, l: &LimitFile, kind: AlgorithmKind) {
        let name = kind.name();
        let lease = ("lease", l.lease.is_some());
        let calendar_fields = [
            ("period", l.period.is_some()),
            ("timezone", l.timezone.is_some()),
        ];
        if kind != AlgorithmKind::Quota {
            self.not_parameters(path, name, &calendar_fields);
        }
        if kind == AlgorithmKind::Quota {
            self.not_parameters(
                path,
                name,
                &[
                    ("capacity", l.capacity.is_some()),
                    ("refill_rate", l.refill_rate.is_some()),
                    ("leak_rate", l.leak_rate.is_some()),
                    ("window", l.window.is_some()),
                    lease,
                ],
            );
        } else if kind.is_bucket() {
            let wrong_rate = match kind {
                AlgorithmKind::LeakyBucket => ("refill_rate", l.refill_rate.is_some()),
                _ => ("leak_rate", l.leak_rate.is_some()),
            };
            self.not_parameters(
                path,
                name,
                &[
                    wrong_rate,
                    ("limit", l.limit.is_some()),
                    ("window", l.window.is_some()),
                    lease,
                ],
            );
        } else {
            let window_or_lease = if kind == AlgorithmKind::Concurrency {
                ("window", l.window.is_some())
            } else {
                lease
            };
            self.not_parameters(
                path,
                name,
                &[
                    ("capacity", l.capacity.is_some()),
                    ("refill_rate", l.refill_rate.is_some()),
                    ("leak_rate", l.leak_rate.is_some()),
                    window_or_lease,
                ],
            );
        }
    }

    /// The algorithm `l` describes, from its `units` and its rate (`rate_name`: `refill_rate`
    /// or `leak_rate`), window, calendar or lease; `None` when a part it needs is missing or
    /// invalid (each named).
    fn algorithm(
        &mut self,
        path: &str,
        l: &LimitFile,
        kind: AlgorithmKind,
        units: Option<u32>,
        (rate_name, rate): (&str, Option<f64>),
    ) -> Option<Result<Algorithm, LimitError>> {
        let name = kind.name();
        Some(if kind.is_bucket() {
            let rate = match rate {
                None => {
                    self.problem(
                        format!("{path}.{rate_name}"),
                        format!("required for {name}"),
                    );
                    None
                }
                // Checked on its own, so a bad capacity and a bad rate are both named.
                Some(rate) => match Algorithm::interval_for_rate(rate) {
                    Ok(_) => Some(rate),
                    Err(e) => {
                        self.limit_problem(format!("{path}.{rate_name}"), e);
                        None
                    }
                },
            };
            let (Some(units), Some(rate)) = (units, rate) else {
                return None;
            };
            match kind {
                AlgorithmKind::LeakyBucket => Algorithm::leaky_bucket(units, rate),
                _ => Algorithm::token_bucket(units, rate),
            }
        } else if kind == AlgorithmKind::Quota {
            let calendar = self.calendar(path, l);
            let (Some(units), Some(calendar)) = (units, calendar) else {
                return None;
            };
            Algorithm::quota(units, calendar)
        } else if kind == AlgorithmKind::Concurrency {
            let units = units?;
            let lease = self.duration(
                &format!("{path}.lease"),
                l.lease.as_deref(),
                Duration::from_secs(60),
            );
            Algorithm::concurrency(units, lease)
        } else {
            let window = match l.window.as_deref().map(parse_duration) {
                None => {
                    self.problem(format!("{path}.window"), format!("required for {name}"));
                    None
                }
                Some(Ok(window)) => Some(window),
                Some(Err(message)) => {
                    self.problem(format!("{path}.window"), message);
                    None
                }
            };
            let (Some(units), Some(window)) = (units, window) else {
                return None;
            };
            match kind {
                AlgorithmKind::FixedWindow => Algorithm::fixed_window(units, window),
                AlgorithmKind::SlidingWindowLog => Algorithm::sliding_window_log(units, window),
                _ => Algorithm::sliding_window_counter(units, window),
            }
        })
    }

    /// A limit's `scope`: true for `global`, which needs `storage.global`, a token bucket, a
    /// fixed window or a quota, and a fixed cost.
    fn scope(&mut self, path: &str, l: &LimitFile, kind: AlgorithmKind) -> bool {
        let scope = self.choice(&format!("{path}.scope"), l.scope.clone(), Scope::Region);
        if scope != Scope::Global {
            return false;
        }
        if !self.has_global_store {
            self.problem(
                format!("{path}.scope"),
                "global needs storage.global (the store that holds budgets shared across regions)",
            );
        }
        if !matches!(
            kind,
            AlgorithmKind::TokenBucket | AlgorithmKind::FixedWindow | AlgorithmKind::Quota
        ) {
            self.problem(
                format!("{path}.scope"),
                format!(
                    "global is for token_bucket, fixed_window and quota limits, not {}",
                    kind.name()
                ),
            );
        }
        if matches!(l.cost, Some(CostFile::Settled(_))) {
            self.problem(
                format!("{path}.cost"),
                "a scope: global limit takes a fixed cost (settled costs are for region limits)",
            );
        }
        if l.shadow == Some(true) {
            self.problem(
                format!("{path}.shadow"),
                "a scope: global limit cannot be in shadow mode",
            );
        }
        true
    }

    /// A quota's `period` and `timezone`.
    fn calendar(&mut self, path: &str, l: &LimitFile) -> Option<Calendar> {
        let period = match l.period.as_deref() {
            None => {
                self.problem(format!("{path}.period"), "required for quota");
                None
            }
            Some(p) => Period::parse(p).or_else(|| {
                self.problem(
                    format!("{path}.period"),
                    format!("{p:?} is not a period: day, week or month"),
                );
                None
            }),
        };
        let zone = l.timezone.as_deref().unwrap_or("UTC");
        match Calendar::new(period.unwrap_or(Period::Day), zone) {
            Ok(calendar) => Some(calendar).filter(|_| period.is_some()),
            Err(e) => {
                self.problem(format!("{path}.timezone"), e.to_string());
                None
            }
        }
    }

    pub(super) fn limit_problem(&mut self, path: String, error: LimitError) {
        self.problem(path, error.to_string());
    }

    pub(super) fn not_parameters(&mut self, path: &str, algorithm: &str, present: &[(&str, bool)]) {
        for (name, is_present) in present {
            if *is_present {
                self.problem(
                    format!("{path}.{name}"),
                    format!("is not a parameter of {algorithm}"),
                );
            }
        }
    }

    pub(super) fn count(&mut self, path: &str, value: Option<i64>) -> Option<u32> {
        match value {
            None => {
                self.problem(path, "required");
                None
            }
            Some(n) if n >= 1 && n <= i64::from(u32::MAX) => Some(n as u32),
            Some(n) if n >= 1 => {
                self.problem(path, format!("must be at most {}", u32::MAX));
                None
            }
            Some(_) => {
                self.problem(path, "must be > 0");
                None
            }
        }
    }
}

/// A short, stable fingerprint of a limit: the same limit gives the same fingerprint on every
/// instance and across restarts.
pub(super) fn limit_fingerprint(limit: &Limit) -> String {
    let (a, b) = limit.algorithm().wire();
    let mut spec = format!("{}:{a}:{b}:{}", limit.algorithm().name(), limit.cost());
    if let Some(calendar) = limit.algorithm().calendar() {
        spec = format!("{spec}:{}", calendar.zone());
    }
    let digest = Sha256::digest(spec.as_bytes());
    crate::limiter::hex(&digest[..4])
}
