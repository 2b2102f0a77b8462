//! `floodgate replay`: what would this config have denied? Recorded requests are run through a
//! config's routes, identity rules, consumers, tiers and limits, in the log's time order and on
//! the log's own clock, by the same [`MemoryStore`] and algorithms the proxy uses. No store, no
//! upstream, no network.
//!
//! Inputs, one request per line, told apart line by line:
//! - floodgate's JSON access log (`--log-format json`, `RUST_LOG=floodgate::access=info`): the
//!   timestamp (µs), method, path, `client_ip`, `identity_hash` (the SHA-256 of the API key or
//!   user id, never the key) and `latency_ms` (how long a concurrency slot was held);
//! - nginx's `combined` format: the identity is the client IP; `$time_local` has one-second
//!   resolution, so the requests of one second are spread evenly over it.
//!
//! Streaming, with memory bounded by what is alive at once: lines are read one at a time; a
//! reorder window of [`REORDER_WINDOW_US`] of log time puts slightly out-of-order lines (several
//! workers writing one log) back in order; a line older than the window is decided at the
//! window's edge and counted as `late`. The store is swept as log time passes, so it holds only
//! the budgets alive at once, and the most-denied identities are kept in a fixed-size table
//! (Space-Saving: counts are exact for any identity whose count exceeds the smallest kept one).

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::BufRead;
use std::net::IpAddr;
use std::sync::Arc;

use http::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::access_log::{self, AccessRecord};
use crate::config::{Budget, Config};
use crate::identity::{Identity, IdentityKind, ip_octets};
use crate::limiter::{
    AlgorithmKind, Ask, BudgetKey, Decision, KeyKind, MAX_LIMITS, ManualClock, MemoryStore,
};
use crate::metrics::DecisionLabel;
use crate::policy::{Asks, Claim, Policy, Step, Whose};
use crate::route::RouteTable;

/// How far back in log time a line may be and still be put in order.
pub const REORDER_WINDOW_US: u64 = 10_000_000;
/// How often, in log time, the store drops full budgets.
const SWEEP_EVERY_US: u64 = 5_000_000;
/// How many most-denied identities are tracked per route.
const TOP_TRACKED: usize = 64;
/// How many are reported.
const TOP_REPORTED: usize = 10;
/// How many malformed lines are listed by number (all are counted).
const MALFORMED_LISTED: usize = 20;
/// The most budgets the replay store tracks (far above what one log keeps alive at once).
const MAX_KEYS: usize = 10_000_000;

/// One recorded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// µs since the Unix epoch.
    pub at_us: u64,
    pub method: Method,
    pub path: String,
    pub client_ip: IpAddr,
    pub identity: RecordedIdentity,
    /// How long the request took, when the log says (concurrency slots are held that long).
    pub latency_us: Option<u64>,
    /// What the live proxy decided, when the log says: `Some(true)` admitted, `Some(false)`
    /// denied (429).
    pub recorded: Option<bool>,
    /// The log's clock has whole seconds only (nginx): the second's requests get spread over it.
    pub whole_second: bool,
}

/// Who sent a recorded request, as far as the log says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedIdentity {
    /// The SHA-256 of its API key.
    ApiKey([u8; 32]),
    /// The SHA-256 of its user id (set by a trusted proxy).
    UserId([u8; 32]),
    /// Nothing but the client IP.
    Ip,
}

/// A line that could not be read, by number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub file: String,
    pub line: u64,
    pub reason: String,
}

/// [`parse_line`] on bytes: JSON is parsed from them directly (its strings are checked as
/// UTF-8 where they are read); a combined line must be UTF-8 as a whole.
fn parse_bytes(line: &[u8]) -> Result<Option<Record>, String> {
    let line = line.trim_ascii_end();
    match line.first() {
        None => Ok(None),
        Some(b'{') => parse_json(line),
        Some(_) => std::str::from_utf8(line)
            .map_err(|_| "not UTF-8".to_string())
            .and_then(parse_combined)
            .map(Some),
    }
}

/// Parses one line of either format. `Ok(None)`: a line that is not a request (another log
/// target, a blank line).
pub fn parse_line(line: &str) -> Result<Option<Record>, String> {
    parse_bytes(line.as_bytes())
}

/// A line of floodgate's JSON log: its timestamp, target and request span.
#[derive(Deserialize)]
struct JsonLine<'a> {
    #[serde(borrow)]
    timestamp: Raw<'a>,
    #[serde(borrow, default)]
    target: Option<Raw<'a>>,
    #[serde(borrow, default)]
    span: Option<AccessRecord<'a>>,
}

/// A JSON string's bytes, borrowed without checking them as UTF-8: the fields read this way
/// are parsed as ASCII (a timestamp, an address, a hex digest, a name from a fixed set), so
/// anything else fails there. Escaped strings (never in these fields) are refused.
#[derive(Clone, Copy)]
struct Raw<'a>(&'a [u8]);

impl<'de: 'a, 'a> Deserialize<'de> for Raw<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Raw<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string without escapes")
            }
            fn visit_borrowed_bytes<E: serde::de::Error>(
                self,
                v: &'de [u8],
            ) -> Result<Raw<'de>, E> {
                Ok(Raw(v))
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Raw<'de>, E> {
                Ok(Raw(v.as_bytes()))
            }
        }
        d.deserialize_bytes(Visitor)
    }
}

/// The fields of floodgate's access-log line that replay reads, as the scanner finds them: raw
/// bytes, turned into an [`AccessRecord`] by [`Fields::record`].
#[derive(Default)]
struct Fields<'a> {
    timestamp: Option<&'a [u8]>,
    target: Option<&'a [u8]>,
    method: Option<&'a [u8]>,
    path: Option<&'a [u8]>,
    client_ip: Option<&'a [u8]>,
    identity: Option<&'a [u8]>,
    identity_hash: Option<&'a [u8]>,
    decision: Option<&'a [u8]>,
    latency_ms: Option<f64>,
}

/// One pass over a line as floodgate writes it: a flat object whose `fields` and `span` are
/// flat objects too, strings without escapes, numbers. `None` for anything else (an escape, a
/// nested array, a key of its own twice), which the general parser then reads.
fn scan(line: &[u8]) -> Option<Fields<'_>> {
    let mut f = Fields::default();
    let mut i = 0;
    let mut depth = 0;
    let mut in_span = false;
    let next = |i: &mut usize| -> Option<u8> {
        while let Some(&b) = line.get(*i) {
            *i += 1;
            if !b.is_ascii_whitespace() {
                return Some(b);
            }
        }
        None
    };
    // A string's bytes, `i` just past its opening quote; no escapes.
    let string = |i: &mut usize| -> Option<&[u8]> {
        let start = *i;
        let len = memchr::memchr2(b'"', b'\\', &line[start..])?;
        if line[start + len] == b'\\' {
            return None;
        }
        *i = start + len + 1;
        Some(&line[start..start + len])
    };
    if next(&mut i)? != b'{' {
        return None;
    }
    depth += 1;
    loop {
        match next(&mut i)? {
            b'}' => {
                depth -= 1;
                in_span = false;
                if depth == 0 {
                    break;
                }
                continue;
            }
            b',' => continue,
            b'"' => {}
            _ => return None,
        }
        let key = string(&mut i)?;
        if next(&mut i)? != b':' {
            return None;
        }
        match next(&mut i)? {
            b'"' => {
                let value = string(&mut i)?;
                let slot = match (depth, in_span, key) {
                    (1, _, b"timestamp") => &mut f.timestamp,
                    (1, _, b"target") => &mut f.target,
                    (2, true, b"method") => &mut f.method,
                    (2, true, b"path") => &mut f.path,
                    (2, true, b"client_ip") => &mut f.client_ip,
                    (2, true, b"identity") => &mut f.identity,
                    (2, true, b"identity_hash") => &mut f.identity_hash,
                    (2, true, b"decision") => &mut f.decision,
                    _ => continue,
                };
                if slot.replace(value).is_some() {
                    return None;
                }
            }
            b'{' if depth == 1 => {
                depth += 1;
                in_span = key == b"span";
            }
            b => {
                // A number, true, false or null: up to the next , or }.
                let start = i - 1;
                let len = memchr::memchr2(b',', b'}', &line[start..])?;
                let text = &line[start..start + len];
                if b == b'[' || b == b'{' || text.contains(&b'[') {
                    return None;
                }
                i = start + len;
                if depth == 2 && in_span && key == b"latency_ms" {
                    f.latency_ms = Some(std::str::from_utf8(text).ok()?.trim().parse().ok()?);
                }
            }
        }
    }
    Some(f)
}

impl<'a> Fields<'a> {
    /// The span these fields are, by the same types the general parser reads.
    fn record(&self) -> Result<AccessRecord<'a>, String> {
        let text = |bytes: &'a [u8], what: &str| {
            std::str::from_utf8(bytes)
                .map(Cow::Borrowed)
                .map_err(|_| format!("{what} is not UTF-8"))
        };
        Ok(AccessRecord {
            method: text(self.method.ok_or("no method")?, "the method")?,
            path: text(self.path.ok_or("no path")?, "the path")?,
            route: None,
            client_ip: self.client_ip.map(|ip| text(ip, "client_ip")).transpose()?,
            identity: self
                .identity
                .map(|i| IdentityKind::from_label(i).ok_or("unknown identity"))
                .transpose()?,
            identity_hash: self
                .identity_hash
                .map(|h| text(h, "identity_hash"))
                .transpose()?,
            decision: self
                .decision
                .map(|d| DecisionLabel::from_label(d).ok_or("unknown decision"))
                .transpose()?,
            status: None,
            latency_ms: self.latency_ms,
        })
    }
}

fn parse_json(line: &[u8]) -> Result<Option<Record>, String> {
    let Some(f) = scan(line) else {
        return parse_json_general(line);
    };
    if f.target.is_some_and(|t| t != access_log::TARGET.as_bytes()) {
        return Ok(None);
    }
    if f.method.is_none() && f.path.is_none() {
        return Err("no request span".into());
    }
    record_from(f.timestamp.ok_or("no timestamp")?, f.record()?).map(Some)
}

/// Any JSON line, through serde_json: the span as an [`AccessRecord`], then the same
/// [`record_from`].
fn parse_json_general(line: &[u8]) -> Result<Option<Record>, String> {
    let parsed: JsonLine<'_> =
        serde_json::from_slice(line).map_err(|e| format!("invalid JSON: {e}"))?;
    if parsed
        .target
        .is_some_and(|t| t.0 != access_log::TARGET.as_bytes())
    {
        return Ok(None);
    }
    let span = parsed.span.ok_or("no request span")?;
    record_from(parsed.timestamp.0, span).map(Some)
}

/// A replayable request from a line's timestamp and its request span.
fn record_from(timestamp: &[u8], span: AccessRecord<'_>) -> Result<Record, String> {
    let at_us = std::str::from_utf8(timestamp)
        .ok()
        .and_then(parse_rfc3339_us)
        .ok_or("timestamp is not RFC 3339")?;
    let method = Method::from_bytes(span.method.as_bytes()).map_err(|_| "invalid method")?;
    // A request rejected before identification (404, 400) has no client_ip: replay routes it
    // only, so any address serves.
    let client_ip = match &span.client_ip {
        Some(ip) => ip.parse().map_err(|_| "client_ip is not an address")?,
        None => IpAddr::from([0, 0, 0, 0]),
    };
    let hash = span
        .identity_hash
        .as_deref()
        .map(|h| parse_sha256(h.as_bytes()))
        .transpose()?;
    let identity = match (span.identity, hash) {
        (Some(IdentityKind::ApiKey | IdentityKind::Consumer), Some(h)) => {
            RecordedIdentity::ApiKey(h)
        }
        (Some(IdentityKind::UserId), Some(h)) => RecordedIdentity::UserId(h),
        _ => RecordedIdentity::Ip,
    };
    // The line is written when the request has finished; the proxy decided `latency` earlier.
    let latency_us = span.latency_ms.map(|ms| (ms * 1000.0) as u64);
    Ok(Record {
        at_us: at_us.saturating_sub(latency_us.unwrap_or(0)),
        method,
        path: span.path.into_owned(),
        client_ip,
        identity,
        latency_us,
        recorded: span.decision.and_then(DecisionLabel::admitted_by_limits),
        whole_second: false,
    })
}

fn parse_sha256(bytes: &[u8]) -> Result<[u8; 32], String> {
    if bytes.len() != 64 {
        return Err("identity_hash is not 64 hex digits".into());
    }
    // A table of hex digit values (0xff: not a hex digit).
    const HEX: [u8; 256] = {
        let mut table = [0xff; 256];
        let mut i = 0;
        while i < 10 {
            table[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            table[b'a' as usize + i] = 10 + i as u8;
            table[b'A' as usize + i] = 10 + i as u8;
            i += 1;
        }
        table
    };
    let mut out = [0u8; 32];
    let mut bad = 0u8;
    for (byte, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let (hi, lo) = (HEX[pair[0] as usize], HEX[pair[1] as usize]);
        bad |= hi | lo;
        *byte = hi << 4 | (lo & 0x0f);
    }
    if bad & 0xf0 != 0 {
        return Err("identity_hash is not 64 hex digits".into());
    }
    Ok(out)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn number(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Two to four ASCII digits at `at`.
fn digits(b: &[u8], at: usize, n: usize) -> Option<i64> {
    let mut v = 0i64;
    for &c in b.get(at..at + n)? {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(c - b'0');
    }
    Some(v)
}

/// `2026-11-22T18:30:41.123456Z` (or `+01:00`) as µs since the epoch.
pub fn parse_rfc3339_us(text: &str) -> Option<u64> {
    // The layout tracing writes, read by position; anything else goes the general way.
    let b = text.as_bytes();
    if b.len() == 27
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[26] == b'Z'
    {
        let (y, m, d) = (digits(b, 0, 4)?, digits(b, 5, 2)?, digits(b, 8, 2)?);
        let (h, mi, s) = (digits(b, 11, 2)?, digits(b, 14, 2)?, digits(b, 17, 2)?);
        let micros = digits(b, 20, 6)?;
        if (1..=12).contains(&m) && (1..=31).contains(&d) && h <= 23 && mi <= 59 && s <= 60 {
            let secs = days_from_civil(y, m, d) * 86_400 + h * 3600 + mi * 60 + s;
            return u64::try_from(secs * 1_000_000 + micros).ok();
        }
        return None;
    }
    parse_rfc3339_general(text)
}

fn parse_rfc3339_general(text: &str) -> Option<u64> {
    let (date, rest) = text.split_once('T')?;
    let mut ymd = date.split('-');
    let (y, m, d) = (
        number(ymd.next()?)?,
        number(ymd.next()?)?,
        number(ymd.next()?)?,
    );
    if ymd.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let zone_at = rest.find(['Z', 'z', '+', '-'])?;
    let (clock, zone) = rest.split_at(zone_at);
    let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut parts = hms.split(':');
    let (h, mi, s) = (
        number(parts.next()?)?,
        number(parts.next()?)?,
        number(parts.next()?)?,
    );
    if parts.next().is_some() || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut micros = 0i64;
    for (i, b) in fraction.bytes().take(6).enumerate() {
        if !b.is_ascii_digit() {
            return None;
        }
        micros += i64::from(b - b'0') * 10i64.pow(5 - i as u32);
    }
    let offset = match zone {
        "Z" | "z" => 0,
        _ => {
            let (hh, mm) = zone[1..].split_once(':')?;
            let minutes = number(hh)? * 60 + number(mm)?;
            if zone.starts_with('-') {
                -minutes
            } else {
                minutes
            }
        }
    };
    let secs = days_from_civil(y, m, d) * 86_400 + h * 3600 + mi * 60 + s - offset * 60;
    u64::try_from(secs * 1_000_000 + micros).ok()
}

/// nginx `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status ...`.
fn parse_combined(line: &str) -> Result<Record, String> {
    let (addr, rest) = line.split_once(' ').ok_or("not a combined log line")?;
    let client_ip: IpAddr = addr
        .parse()
        .map_err(|_| "the first field is not an address")?;
    let open = rest.find('[').ok_or("no [time]")?;
    let close = rest[open..].find(']').ok_or("no [time]")? + open;
    let at_us = parse_time_local(&rest[open + 1..close])
        .ok_or("time is not like 10/Oct/2000:13:55:36 -0700")?;
    let after = &rest[close + 1..];
    let q1 = after.find('"').ok_or("no \"request\"")?;
    let q2 = after[q1 + 1..].find('"').ok_or("no \"request\"")? + q1 + 1;
    let mut request = after[q1 + 1..q2].split(' ');
    let method = Method::from_bytes(request.next().unwrap_or("").as_bytes())
        .map_err(|_| "invalid method")?;
    let target = request.next().ok_or("no request target")?;
    let path = target.split('?').next().unwrap_or(target);
    if !path.starts_with('/') {
        return Err("the request target is not a path".into());
    }
    Ok(Record {
        at_us,
        method,
        path: path.to_string(),
        client_ip: client_ip.to_canonical(),
        identity: RecordedIdentity::Ip,
        latency_us: None,
        recorded: None,
        whole_second: true,
    })
}

/// `10/Oct/2000:13:55:36 -0700` as µs since the epoch (a whole second).
fn parse_time_local(text: &str) -> Option<u64> {
    let (when, zone) = text.split_once(' ')?;
    let mut parts = when.split([':', '/']);
    let d = number(parts.next()?)?;
    let month = parts.next()?;
    let y = number(parts.next()?)?;
    let (h, mi, s) = (
        number(parts.next()?)?,
        number(parts.next()?)?,
        number(parts.next()?)?,
    );
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = MONTHS.iter().position(|&name| name == month)? as i64 + 1;
    if !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 || parts.next().is_some() {
        return None;
    }
    if zone.len() != 5 || !(zone.starts_with('+') || zone.starts_with('-')) {
        return None;
    }
    let minutes = number(&zone[1..3])? * 60 + number(&zone[3..5])?;
    let offset = if zone.starts_with('-') {
        -minutes
    } else {
        minutes
    };
    let secs = days_from_civil(y, m, d) * 86_400 + h * 3600 + mi * 60 + s - offset * 60;
    u64::try_from(secs * 1_000_000).ok()
}

/// Counts per route.
#[derive(Debug, Default, Clone)]
struct RouteStats {
    requests: u64,
    allowed: u64,
    denied: u64,
    /// Forwarded although a limit said no (`shadow: true`, or a shadow limit): counted in
    /// `allowed` too.
    shadow_denied: u64,
    invalid_key: u64,
    /// Per enforced limit (by position in the enforced list): requests it said no to.
    limit_denials: Vec<u64>,
    /// Per shadow limit: requests it would have said no to.
    shadow_denials: Vec<u64>,
    /// Requests whose live decision the log records, and how many of those replay agrees with.
    compared: u64,
    agreed: u64,
    top: TopK,
}

/// The Space-Saving summary of the most frequent items, in fixed memory.
#[derive(Debug, Default, Clone)]
struct TopK {
    counts: HashMap<String, u64>,
}

impl TopK {
    fn add(&mut self, item: String) {
        if let Some(n) = self.counts.get_mut(&item) {
            *n += 1;
        } else if self.counts.len() < TOP_TRACKED {
            self.counts.insert(item, 1);
        } else if let Some((smallest, n)) = self
            .counts
            .iter()
            .min_by_key(|(_, n)| **n)
            .map(|(k, n)| (k.clone(), *n))
        {
            // The newcomer inherits the evicted count: an overestimate by at most that much.
            self.counts.remove(&smallest);
            self.counts.insert(item, n + 1);
        }
    }

    fn top(&self) -> Vec<(&str, u64)> {
        let mut all: Vec<_> = self.counts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        all.truncate(TOP_REPORTED);
        all
    }
}

/// A release of concurrency leases at a log time.
struct PendingRelease {
    at_us: u64,
    lease: u64,
    route: usize,
    /// Whether the leases are in the route's shadow limits (else its enforced ones).
    shadow: bool,
    /// Per lease: the limit's position in that list, and the budget's key kind and value.
    keys: Vec<(usize, KeyKind, Vec<u8>)>,
}

impl PartialEq for PendingRelease {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.lease) == (other.at_us, other.lease)
    }
}
impl Eq for PendingRelease {}
impl PartialOrd for PendingRelease {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for PendingRelease {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_us, self.lease).cmp(&(other.at_us, other.lease))
    }
}

/// A replay in progress: feed it records in any order with [`Replay::push`], then
/// [`Replay::finish`].
pub struct Replay {
    plan: Arc<Plan>,
    store: MemoryStore,
    clock: Arc<ManualClock>,
    stats: Vec<RouteStats>,
    /// Records waiting in the reorder window, in (time, arrival) order: a log in order only
    /// appends at the back; an out-of-order line is inserted where it belongs.
    window: VecDeque<(u64, u64, Record)>,
    releases: BinaryHeap<Reverse<PendingRelease>>,
    seq: u64,
    newest_seen: u64,
    last_decided: u64,
    last_sweep: u64,
    first_at: Option<u64>,
    requests: u64,
    no_route: u64,
    late: u64,
    reordered: u64,
    lines: u64,
    skipped: u64,
    malformed: Vec<Malformed>,
    malformed_total: u64,
}

/// The config being replayed, shared so a decision can borrow it while it updates the counts.
struct Plan {
    config: Config,
    table: RouteTable,
}

/// How the report names an identity: hashed for keys and user ids (the log holds digests).
fn label(identity: &Identity<'_>) -> String {
    match identity {
        Identity::Consumer(c) => format!("consumer:{}", c.name),
        Identity::ApiKey(d) => format!("api_key:{}…", hex(&d[..d.len().min(6)])),
        Identity::UserId(d) => format!("user_id:{}…", hex(&d[..d.len().min(6)])),
        Identity::Ip(ip) => format!("ip:{ip}"),
    }
}

impl Replay {
    /// A replay of `config`'s routes and limits.
    pub fn new(config: Config) -> Self {
        let clock = Arc::new(ManualClock::new_for_test(0));
        let stats = config
            .routes
            .iter()
            .map(|r| RouteStats {
                limit_denials: vec![0; r.enforced.limits.len()],
                shadow_denials: vec![0; r.shadow.limits.len()],
                ..RouteStats::default()
            })
            .collect();
        Replay {
            plan: Arc::new(Plan {
                table: RouteTable::new(config.routes.clone()),
                config,
            }),
            store: MemoryStore::new(clock.clone(), MAX_KEYS),
            clock,
            stats,
            window: VecDeque::new(),
            releases: BinaryHeap::new(),
            seq: 0,
            newest_seen: 0,
            last_decided: 0,
            last_sweep: 0,
            first_at: None,
            requests: 0,
            no_route: 0,
            late: 0,
            reordered: 0,
            lines: 0,
            skipped: 0,
            malformed: Vec::new(),
            malformed_total: 0,
        }
    }

    /// Reads every line of `input` (named `file` in reports).
    pub fn read(&mut self, file: &str, input: impl BufRead) -> std::io::Result<()> {
        let mut combined_second: Option<u64> = None;
        let mut same_second: Vec<Record> = Vec::new();
        let mut input = input;
        let mut buf = Vec::with_capacity(1024);
        let mut n: u64 = 0;
        loop {
            buf.clear();
            if input.read_until(b'\n', &mut buf)? == 0 {
                break;
            }
            n += 1;
            self.lines += 1;
            match parse_bytes(&buf) {
                Ok(None) => self.skipped += 1,
                Err(reason) => {
                    self.malformed_total += 1;
                    if self.malformed.len() < MALFORMED_LISTED {
                        self.malformed.push(Malformed {
                            file: file.to_string(),
                            line: n,
                            reason,
                        });
                    }
                }
                Ok(Some(record)) if record.whole_second => {
                    // nginx: whole seconds. Collect one second's lines, then spread them over it.
                    if combined_second != Some(record.at_us) {
                        self.spread(&mut same_second);
                        combined_second = Some(record.at_us);
                    }
                    same_second.push(record);
                }
                Ok(Some(record)) => self.push(record),
            }
        }
        self.spread(&mut same_second);
        Ok(())
    }

    /// The requests of one logged second, at evenly spaced instants across it.
    fn spread(&mut self, second: &mut Vec<Record>) {
        let n = second.len() as u64;
        for (i, mut record) in second.drain(..).enumerate() {
            record.at_us += i as u64 * 1_000_000 / n.max(1);
            self.push(record);
        }
    }

    /// Adds one record; decides every record that has left the reorder window.
    pub fn push(&mut self, record: Record) {
        let at = record.at_us;
        if at < self.newest_seen {
            self.reordered += 1;
        }
        self.newest_seen = self.newest_seen.max(at);
        self.seq += 1;
        // After every record of its time already waiting (arrival order breaks ties).
        let at_index = self.window.partition_point(|(t, _, _)| *t <= at);
        self.window.insert(at_index, (at, self.seq, record));
        while let Some((oldest, _, _)) = self.window.front() {
            if *oldest + REORDER_WINDOW_US > self.newest_seen {
                break;
            }
            if let Some((_, seq, record)) = self.window.pop_front() {
                self.decide(record, seq);
            }
        }
    }

    fn decide(&mut self, mut record: Record, seq: u64) {
        if record.at_us < self.last_decided {
            // Older than the reorder window allowed for: decided at the window's edge.
            self.late += 1;
            record.at_us = self.last_decided;
        }
        let now = record.at_us;
        self.last_decided = now;
        self.first_at.get_or_insert(now);
        self.clock.set(now);
        self.release_until(now);
        if now >= self.last_sweep + SWEEP_EVERY_US {
            self.store.sweep();
            self.last_sweep = now;
        }
        self.requests += 1;
        let plan = Arc::clone(&self.plan);
        let Some(i) = plan.table.position(&record.method, &record.path) else {
            self.no_route += 1;
            return;
        };
        let route = &plan.config.routes[i];
        self.stats[i].requests += 1;
        if route.enforced.is_empty() && route.shadow.is_empty() {
            self.stats[i].allowed += 1;
            return;
        }
        // Whose allowances: the proxy's rules (crate::policy), on the digests the log holds. The
        // address is the one a budget is kept for (an IPv6 client's /64): nginx logs whole
        // addresses; floodgate's own log already holds this one.
        let client = plan.config.identity.budget_addr(record.client_ip);
        let claim = match &record.identity {
            RecordedIdentity::ApiKey(digest) => Claim::ApiKeyDigest(digest),
            RecordedIdentity::UserId(digest) => Claim::Keyless(Identity::UserId(&digest[..])),
            RecordedIdentity::Ip => Claim::Keyless(Identity::Ip(client)),
        };
        let policy = Policy {
            identity: &plan.config.identity,
            consumers: plan.config.consumers.as_deref(),
            shadow: plan.config.shadow,
        };
        // A key no consumer has, under `unknown_key: anonymous`: the log knows only the address.
        let Ok(whose) = policy.resolve(claim, || Ok(Identity::Ip(client)), || client) else {
            self.stats[i].invalid_key += 1;
            return;
        };
        let enforced = self.run_budget(
            i,
            &route.enforced,
            &whose,
            now,
            seq,
            record.latency_us,
            false,
        );
        let forwarded = enforced.is_none_or(|allowed| policy.step(allowed) != Step::Deny);
        if let Some(live) = record.recorded {
            self.stats[i].compared += 1;
            self.stats[i].agreed += u64::from(live == forwarded);
        }
        if enforced == Some(false) {
            self.stats[i].top.add(label(&whose.identity));
        }
        if forwarded {
            let shadow =
                self.run_budget(i, &route.shadow, &whose, now, seq, record.latency_us, true);
            self.stats[i].allowed += 1;
            // As the proxy labels it: a denial that was only logged, by `shadow: true` or by a
            // shadow limit.
            self.stats[i].shadow_denied +=
                u64::from(enforced == Some(false) || shadow == Some(false));
        } else {
            self.stats[i].denied += 1;
        }
    }

    /// Decides one budget; counts its limits' denials. `None`: no limit applied.
    #[allow(clippy::too_many_arguments)]
    fn run_budget(
        &mut self,
        index: usize,
        budget: &Budget,
        whose: &Whose<'_>,
        now: u64,
        lease: u64,
        latency_us: Option<u64>,
        shadow: bool,
    ) -> Option<bool> {
        let (mut id_buf, mut ip_buf) = ([0u8; 16], [0u8; 16]);
        let id = whose.identity.key_bytes(&mut id_buf);
        let ip = ip_octets(whose.ip, &mut ip_buf);
        let Asks { asks, positions } = whose.asks(budget, id, ip);
        let mut decisions = [Decision::EMPTY; MAX_LIMITS];
        let verdict = self.store.decide_into(&asks, now, lease, &mut decisions)?;
        let stats = &mut self.stats[index];
        let counts = if shadow {
            &mut stats.shadow_denials
        } else {
            &mut stats.limit_denials
        };
        for (d, &position) in decisions[..asks.len()].iter().zip(&positions) {
            if !d.allowed {
                counts[position] += 1;
            }
        }
        let concurrent: Vec<_> = asks
            .iter()
            .zip(&positions)
            .filter(|(a, _)| a.limit.algorithm().kind() == AlgorithmKind::Concurrency)
            .map(|(a, &p)| (p, a.key.kind, a.key.value.to_vec()))
            .collect();
        if verdict.allowed && !concurrent.is_empty() {
            // The slot is held for as long as the request took (as logged; else it ends at once).
            self.releases.push(Reverse(PendingRelease {
                at_us: now + latency_us.unwrap_or(0),
                lease,
                route: index,
                shadow,
                keys: concurrent,
            }));
        }
        Some(verdict.allowed)
    }

    /// Gives back the concurrency leases of requests that had finished by `now`.
    fn release_until(&mut self, now: u64) {
        while self
            .releases
            .peek()
            .is_some_and(|Reverse(r)| r.at_us <= now)
        {
            let Some(Reverse(release)) = self.releases.pop() else {
                break;
            };
            let route = &self.plan.config.routes[release.route];
            let budget = if release.shadow {
                &route.shadow
            } else {
                &route.enforced
            };
            for (position, kind, value) in &release.keys {
                let Some(limit) = budget.limits.get(*position) else {
                    continue;
                };
                let ask = Ask {
                    limit: &limit.limit,
                    key: BudgetKey {
                        budget: &limit.budget_id,
                        kind: *kind,
                        value,
                    },
                };
                self.store.release(&[ask], release.lease);
            }
        }
    }

    /// Decides what is left in the window and reports.
    pub fn finish(mut self) -> Report {
        while let Some((_, seq, record)) = self.window.pop_front() {
            self.decide(record, seq);
        }
        let routes = self
            .plan
            .config
            .routes
            .iter()
            .zip(&self.stats)
            .map(|(route, s)| RouteReport {
                name: route.name.to_string(),
                requests: s.requests,
                allowed: s.allowed,
                denied: s.denied,
                shadow_denied: s.shadow_denied,
                invalid_key: s.invalid_key,
                compared: s.compared,
                agreed: s.agreed,
                limits: route
                    .enforced
                    .limits
                    .iter()
                    .zip(&s.limit_denials)
                    .map(|(l, &d)| (l, d, false))
                    .chain(
                        route
                            .shadow
                            .limits
                            .iter()
                            .zip(&s.shadow_denials)
                            .map(|(l, &d)| (l, d, true)),
                    )
                    .map(|(l, denied, shadow)| LimitReport {
                        position: l.position,
                        algorithm: l.limit.algorithm().name(),
                        per: l.per.as_str(),
                        tiers: l.tiers.clone(),
                        shadow,
                        denied,
                    })
                    .collect(),
                top_denied: s
                    .top
                    .top()
                    .into_iter()
                    .map(|(id, n)| (id.to_string(), n))
                    .collect(),
            })
            .collect();
        Report {
            lines: self.lines,
            requests: self.requests,
            skipped: self.skipped,
            no_route: self.no_route,
            malformed_total: self.malformed_total,
            malformed: self.malformed,
            reordered: self.reordered,
            late: self.late,
            first_us: self.first_at,
            last_us: self.first_at.map(|_| self.last_decided),
            routes,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

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

#[cfg(test)]
mod tests;
