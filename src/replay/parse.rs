//! Reading logs: floodgate's JSON access log (a fast scanner for the lines floodgate writes, and
//! serde for anything else, both into [`AccessRecord`]) and nginx's `combined` format.

use std::borrow::Cow;
use std::net::IpAddr;

use http::Method;
use serde::Deserialize;

use super::time::{parse_rfc3339_us, parse_time_local};
use crate::access_log::{self, AccessRecord};
use crate::identity::IdentityKind;
use crate::metrics::DecisionLabel;

/// One recorded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// µs since the Unix epoch.
    pub at_us: u64,
    pub method: Method,
    pub path: String,
    /// The host the request named, when the log says (floodgate's JSON log does).
    pub host: Option<String>,
    pub client_ip: IpAddr,
    pub identity: RecordedIdentity,
    /// How long the request took, when the log says (concurrency slots are held that long).
    pub latency_us: Option<u64>,
    /// What the live proxy decided, when the log says: `Some(true)` admitted, `Some(false)`
    /// denied (429).
    pub recorded: Option<bool>,
    /// The log's clock has whole seconds only (nginx): the second's requests get spread over it.
    pub whole_second: bool,
    /// What the request's settled limits reserved and cost (`cost: {reserve, actual}`), by
    /// limit position: (position, reserved, settled).
    pub costs: Vec<(usize, u64, u64)>,
    /// The status the client was answered, when the log says (what `refund_on` / `spend_on`
    /// read).
    pub status: Option<u16>,
    /// The digests of its composite keys (`per:` with request parts), by limit position.
    pub keys: Vec<(usize, [u8; 16])>,
}

/// Who sent a recorded request, as far as the log says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedIdentity {
    /// The SHA-256 of its API key.
    ApiKey([u8; 32]),
    /// The SHA-256 of its verified JWT's subject, and the tier it was limited as.
    Jwt([u8; 32], Option<Tier>),
    /// The SHA-256 of its user id (set by a trusted proxy).
    UserId([u8; 32]),
    /// The SHA-256 of its verified client certificate's name.
    ClientCert([u8; 32]),
    /// Nothing but the client IP.
    Ip,
}

/// A tier's name as the access log recorded it (letters, digits, `_`, `.`, `-`: at most 32
/// bytes are kept; a longer name is read as none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    bytes: [u8; 64],
    len: u8,
}

impl Tier {
    fn new(name: &str) -> Option<Tier> {
        let len = u8::try_from(name.len()).ok().filter(|n| *n <= 64)?;
        let mut bytes = [0u8; 64];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Some(Tier { bytes, len })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
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
pub(super) fn parse_bytes(line: &[u8]) -> Result<Option<Record>, String> {
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
    host: Option<&'a [u8]>,
    client_ip: Option<&'a [u8]>,
    identity: Option<&'a [u8]>,
    identity_hash: Option<&'a [u8]>,
    tier: Option<&'a [u8]>,
    decision: Option<&'a [u8]>,
    cost: Option<&'a [u8]>,
    keys: Option<&'a [u8]>,
    latency_ms: Option<f64>,
    status: Option<u16>,
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
                    (2, true, b"host") => &mut f.host,
                    (2, true, b"client_ip") => &mut f.client_ip,
                    (2, true, b"identity") => &mut f.identity,
                    (2, true, b"identity_hash") => &mut f.identity_hash,
                    (2, true, b"tier") => &mut f.tier,
                    (2, true, b"decision") => &mut f.decision,
                    (2, true, b"cost") => &mut f.cost,
                    (2, true, b"keys") => &mut f.keys,
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
                if depth == 2 && in_span && key == b"status" {
                    f.status = Some(std::str::from_utf8(text).ok()?.trim().parse().ok()?);
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
            protocol: None,
            route: None,
            host: self.host.map(|h| text(h, "host")).transpose()?,
            client_ip: self.client_ip.map(|ip| text(ip, "client_ip")).transpose()?,
            identity: self
                .identity
                .map(|i| IdentityKind::from_label(i).ok_or("unknown identity"))
                .transpose()?,
            identity_hash: self
                .identity_hash
                .map(|h| text(h, "identity_hash"))
                .transpose()?,
            tier: self.tier.map(|t| text(t, "tier")).transpose()?,
            decision: self
                .decision
                .map(|d| DecisionLabel::from_label(d).ok_or("unknown decision"))
                .transpose()?,
            status: self.status,
            grpc_status: None,
            latency_ms: self.latency_ms,
            cost: self.cost.map(|c| text(c, "cost")).transpose()?,
            keys: self.keys.map(|k| text(k, "keys")).transpose()?,
            cache: None,
            wait_ms: None,
            position: None,
        })
    }
}

pub(super) fn parse_json(line: &[u8]) -> Result<Option<Record>, String> {
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
pub(super) fn parse_json_general(line: &[u8]) -> Result<Option<Record>, String> {
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
        (Some(IdentityKind::Jwt), Some(h)) => {
            RecordedIdentity::Jwt(h, span.tier.as_deref().and_then(Tier::new))
        }
        (Some(IdentityKind::UserId), Some(h)) => RecordedIdentity::UserId(h),
        (Some(IdentityKind::ClientCert), Some(h)) => RecordedIdentity::ClientCert(h),
        _ => RecordedIdentity::Ip,
    };
    // The line is written when the request has finished; the proxy decided `latency` earlier.
    let latency_us = span.latency_ms.map(|ms| (ms * 1000.0) as u64);
    Ok(Record {
        at_us: at_us.saturating_sub(latency_us.unwrap_or(0)),
        method,
        path: span.path.into_owned(),
        host: span.host.map(Cow::into_owned),
        client_ip,
        identity,
        latency_us,
        recorded: span.decision.and_then(DecisionLabel::admitted_by_limits),
        whole_second: false,
        costs: span
            .cost
            .as_deref()
            .map(access_log::parse_cost_field)
            .unwrap_or_default(),
        keys: span
            .keys
            .as_deref()
            .map(access_log::parse_keys_field)
            .unwrap_or_default(),
        status: span.status,
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
    // `$status` follows the request.
    let status = after[q2 + 1..]
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok());
    let path = target.split('?').next().unwrap_or(target);
    if !path.starts_with('/') {
        return Err("the request target is not a path".into());
    }
    Ok(Record {
        at_us,
        method,
        path: path.to_string(),
        host: None,
        client_ip: client_ip.to_canonical(),
        identity: RecordedIdentity::Ip,
        latency_us: None,
        recorded: None,
        whole_second: true,
        costs: Vec::new(),
        keys: Vec::new(),
        status,
    })
}
