//! What a replay found, as text or JSON.

use serde_json::{Value, json};

use super::{Malformed, REORDER_WINDOW_US};

/// What a replay found.
#[derive(Debug, Clone)]
pub struct Report {
    pub lines: u64,
    pub requests: u64,
    /// Lines that are not requests (other log targets, blank lines).
    pub skipped: u64,
    pub no_route: u64,
    pub malformed_total: u64,
    /// The first malformed lines, by number.
    pub malformed: Vec<Malformed>,
    /// Lines that arrived after a later one and were put back in order.
    pub reordered: u64,
    /// Lines older than the reorder window, decided at its edge.
    pub late: u64,
    pub first_us: Option<u64>,
    pub last_us: Option<u64>,
    pub routes: Vec<RouteReport>,
}

/// One route's figures.
#[derive(Debug, Clone)]
pub struct RouteReport {
    pub name: String,
    pub requests: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Requests forwarded although a limit said no: an enforced one under `shadow: true`, or a
    /// shadow limit (the proxy's `shadow_denied`; counted in `allowed` too).
    pub shadow_denied: u64,
    /// Unknown API keys under `unknown_key: reject` (401, neither allowed nor denied).
    pub invalid_key: u64,
    /// A cached route's requests answered from the cache (`None`: the route has no cache).
    pub cached: Option<u64>,
    /// Requests that would have reached the upstream.
    pub upstream: u64,
    /// Requests whose live decision the log records (floodgate's JSON log), and how many of
    /// them replay decided the same way: replaying a proxy's own log with its own config should
    /// agree on all.
    pub compared: u64,
    pub agreed: u64,
    pub limits: Vec<LimitReport>,
    /// The identities denied most, hashed for keys and user ids.
    pub top_denied: Vec<(String, u64)>,
}

/// One limit's figures.
#[derive(Debug, Clone)]
pub struct LimitReport {
    pub position: usize,
    pub algorithm: &'static str,
    pub per: &'static str,
    pub tiers: Option<Vec<String>>,
    pub shadow: bool,
    /// Requests this limit said no to (a request several limits refuse counts for each).
    pub denied: u64,
}

impl Report {
    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "lines": self.lines,
            "requests": self.requests,
            "skipped_lines": self.skipped,
            "no_route": self.no_route,
            "malformed": {
                "total": self.malformed_total,
                "first": self.malformed.iter().map(|m| json!({"file": m.file, "line": m.line, "reason": m.reason})).collect::<Vec<_>>(),
            },
            "reordered": self.reordered,
            "late": self.late,
            "first_timestamp_us": self.first_us,
            "last_timestamp_us": self.last_us,
            "routes": self.routes.iter().map(|r| json!({
                "name": r.name,
                "requests": r.requests,
                "allowed": r.allowed,
                "denied": r.denied,
                "shadow_denied": r.shadow_denied,
                "invalid_key": r.invalid_key,
                "cached": r.cached,
                "upstream": r.upstream,
                "agreement": {"compared": r.compared, "agreed": r.agreed},
                "limits": r.limits.iter().map(|l| json!({
                    "position": l.position,
                    "algorithm": l.algorithm,
                    "per": l.per,
                    "tiers": l.tiers,
                    "shadow": l.shadow,
                    "denied": l.denied,
                })).collect::<Vec<_>>(),
                "top_denied": r.top_denied.iter().map(|(id, n)| json!({"identity": id, "denied": n})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }

    /// The report as text for a terminal.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let span_s = match (self.first_us, self.last_us) {
            (Some(a), Some(b)) => (b - a) as f64 / 1e6,
            _ => 0.0,
        };
        let _ = writeln!(
            out,
            "{} requests over {:.1} s of log ({} lines; {} not requests, {} malformed, {} matched no route)",
            self.requests, span_s, self.lines, self.skipped, self.malformed_total, self.no_route
        );
        if self.reordered > 0 || self.late > 0 {
            let _ = writeln!(
                out,
                "note: {} lines were out of time order and were sorted (window {} s); {} were older than that and were decided at the window's edge",
                self.reordered,
                REORDER_WINDOW_US / 1_000_000,
                self.late
            );
        }
        for m in &self.malformed {
            let _ = writeln!(out, "malformed: {}:{}: {}", m.file, m.line, m.reason);
        }
        if self.malformed_total > self.malformed.len() as u64 {
            let _ = writeln!(
                out,
                "malformed: ... and {} more",
                self.malformed_total - self.malformed.len() as u64
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<24} {:>10} {:>10} {:>10} {:>8} {:>12}",
            "route", "requests", "allowed", "denied", "denied%", "invalid_key"
        );
        for r in &self.routes {
            let share = if r.requests > 0 {
                100.0 * r.denied as f64 / r.requests as f64
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "{:<24} {:>10} {:>10} {:>10} {:>7.2}% {:>12}",
                r.name, r.requests, r.allowed, r.denied, share, r.invalid_key
            );
            if let Some(cached) = r.cached {
                let _ = writeln!(
                    out,
                    "  cache: {cached} answered from the cache; {} would reach the upstream",
                    r.upstream
                );
            }
            for l in &r.limits {
                let tiers = l
                    .tiers
                    .as_ref()
                    .map(|t| format!(" tiers={}", t.join(",")))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  limits[{}] {} per={}{}{}: {} {}",
                    l.position,
                    l.algorithm,
                    l.per,
                    tiers,
                    if l.shadow { " (shadow)" } else { "" },
                    l.denied,
                    if l.shadow { "would deny" } else { "denied" },
                );
            }
            if r.compared > 0 {
                let _ = writeln!(
                    out,
                    "  agrees with the logged decision on {} of {} requests",
                    r.agreed, r.compared
                );
            }
            if !r.top_denied.is_empty() {
                let top: Vec<String> = r
                    .top_denied
                    .iter()
                    .map(|(id, n)| format!("{id} ({n})"))
                    .collect();
                let _ = writeln!(out, "  denied most: {}", top.join(", "));
            }
        }
        out
    }
}
