//! The access log: one line per request, written by the proxy ([`crate::proxy`]) under the
//! target [`TARGET`] and read back by `floodgate replay` ([`crate::replay`]).
//!
//! The proxy fills a [`Line`] (an [`AccessRecord`]) as the request goes, when the access log is
//! on ([`Line::start`]: `RUST_LOG` enables `floodgate::access` at info), and writes it once at
//! the end ([`Line::write`]) to stderr, as tracing-subscriber would have written a span's fields
//! and one event: with `log_format: json` the record is the line's `span` object, which replay
//! reads as the same type (serde), so what the proxy writes and what replay reads cannot drift
//! apart (the tests below write lines and read them back, and compare both formats with what
//! tracing-subscriber writes for the same span). Written directly because tracing's span
//! machinery (a registry entry, each field formatted as it was recorded, the event formatted
//! around it) cost about 21,000 instructions a line, as much as the refusal itself
//! (docs/performance.md).
//!
//! Nothing here is a secret: an API key or user id appears only as the SHA-256 of its value
//! (`identity_hash`, the digest a consumer's `keys_sha256` holds, so replay can find it).

use std::borrow::Cow;

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::identity::IdentityKind;
use crate::metrics::DecisionLabel;

/// The tracing target of the access log's events.
pub const TARGET: &str = "floodgate::access";

/// One request's span as the access log holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccessRecord<'a> {
    #[serde(borrow)]
    pub method: Cow<'a, str>,
    /// The normalised path (what was routed and limited).
    #[serde(borrow)]
    pub path: Cow<'a, str>,
    /// The HTTP version the client spoke: `1.0`, `1.1`, `2` or `3` (OpenTelemetry's
    /// `network.protocol.version`).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Cow<'a, str>>,
    /// The host the request named (lowercase, without the port: what a route's `hosts`
    /// compares), so that replay can route by it.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Cow<'a, str>>,
    /// The client address whose allowance `per: ip` limits spent (an IPv6 client's prefix);
    /// absent for a request rejected before it was identified.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityKind>,
    /// The hex SHA-256 of the API key (also for a consumer, or a key refused) or user id.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub identity_hash: Option<Cow<'a, str>>,
    /// The tier a verified token's subject was limited as (its claim, as the config names
    /// tiers): replay cannot tell it from the digest.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionLabel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The gRPC status of an answer floodgate gave a gRPC call itself (a trailers-only response,
    /// whose HTTP status is 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<u8>,
    /// From the request's arrival to its response head (how long a concurrency slot was held);
    /// for a request with settled costs, to its response's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// Settled costs (`cost: {reserve, actual}`): per limit, `position=reserved/settled`.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cow<'a, str>>,
    /// Composite keys (`per:` with request parts): per limit, `position=digest` (32 hex digits
    /// of the key's SHA-256), so replay can tell budgets apart without the values.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Cow<'a, str>>,
    /// On a cached route, what the cache did: `hit`, `miss`, `stale`, `collapsed`, `bypass` or
    /// `uncacheable` (replay counts what reached the upstream by it).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<Cow<'a, str>>,
    /// How long the request was held for its limits (`wait:`) before they admitted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// A waiting room's line: the client's place in it (1: next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
}

/// Whether lines are written as JSON (`log_format: json`, set once at start by `main`); text
/// otherwise.
static JSON: AtomicBool = AtomicBool::new(false);

/// Writes the access log as JSON from now on (`log_format: json`).
pub fn write_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// One request's access log line, filled in as the request goes (see the module's docs).
pub type Line = AccessRecord<'static>;

impl AccessRecord<'static> {
    /// A line for a request of `method` to `path`, if the access log is on (`RUST_LOG` enables
    /// the target `floodgate::access` at info); boxed, so that a request without one carries a
    /// pointer's worth.
    pub fn start(method: &http::Method, path: &str, version: http::Version) -> Option<Box<Line>> {
        if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
            return None;
        }
        Some(Box::new(AccessRecord {
            method: method_text(method),
            path: Cow::Owned(path.to_string()),
            protocol: Some(Cow::Borrowed(crate::logging::protocol_version(version))),
            route: None,
            host: None,
            client_ip: None,
            identity: None,
            identity_hash: None,
            tier: None,
            decision: None,
            status: None,
            grpc_status: None,
            latency_ms: None,
            cost: None,
            keys: None,
            cache: None,
            wait_ms: None,
            position: None,
        }))
    }
}

impl AccessRecord<'_> {
    /// Writes the line to stderr, in one write, as tracing-subscriber's format would (text or
    /// JSON, with the process' timestamp format).
    pub fn write(&self) {
        // The thread's buffer; a fresh one if it is in use or already gone (a line written as
        // the thread ends).
        let written = LINE
            .try_with(|buffer| match buffer.try_borrow_mut() {
                Ok(mut out) => {
                    self.write_with(&mut out);
                    if out.capacity() > 16 * 1024 {
                        *out = String::new();
                    }
                    true
                }
                Err(_) => false,
            })
            .unwrap_or(false);
        if !written {
            self.write_with(&mut String::new());
        }
    }

    /// Formats the line into `out` (cleared first) and writes it.
    fn write_with(&self, out: &mut String) {
        out.clear();
        let mut time = String::with_capacity(32);
        let _ = tracing_subscriber::fmt::time::FormatTime::format_time(
            &crate::logging::CachedTime,
            &mut tracing_subscriber::fmt::format::Writer::new(&mut time),
        );
        match JSON.load(Ordering::Relaxed) {
            true => self.json_into(&time, out),
            false => self.text_into(&time, out),
        }
        out.push('\n');
        // One write: lines from several threads never interleave.
        let _ = std::io::stderr().write_all(out.as_bytes());
    }

    /// The line as tracing-subscriber's full text format writes a span `request` with these
    /// fields (in the order the proxy records them) and the event `request done` in it,
    /// colourless, after `time`.
    fn text_into(&self, time: &str, out: &mut String) {
        use std::fmt::Write as _;
        out.push_str(time);
        out.push_str("  INFO request{method=");
        crate::logging::escape_into(&self.method, out).ok();
        text_str(out, "path", &self.path);
        text_opt(out, "protocol", self.protocol.as_deref());
        text_opt(out, "route", self.route.as_deref());
        text_opt(out, "host", self.host.as_deref());
        text_opt(out, "identity", self.identity.map(|i| i.as_str()));
        if let Some(ip) = &self.client_ip {
            out.push_str(" client_ip=");
            crate::logging::escape_into(ip, out).ok();
        }
        text_opt(out, "tier", self.tier.as_deref());
        text_opt(out, "identity_hash", self.identity_hash.as_deref());
        text_opt(out, "keys", self.keys.as_deref());
        text_opt(out, "decision", self.decision.map(|d| d.as_str()));
        if let Some(status) = self.status {
            let _ = write!(out, " status={status}");
        }
        if let Some(code) = self.grpc_status {
            let _ = write!(out, " grpc_status={code}");
        }
        if let Some(ms) = self.latency_ms {
            let _ = write!(out, " latency_ms={ms:?}");
        }
        text_opt(out, "cost", self.cost.as_deref());
        text_opt(out, "cache", self.cache.as_deref());
        if let Some(ms) = self.wait_ms {
            let _ = write!(out, " wait_ms={ms}");
        }
        if let Some(position) = self.position {
            let _ = write!(out, " position={position}");
        }
        out.push_str("}: floodgate::access: request done");
        text_opt(
            out,
            "route",
            self.route.as_deref().filter(|r| !r.is_empty()),
        );
        if let Some(status) = self.status {
            let _ = write!(out, " status={status}");
        }
    }

    /// The line as tracing-subscriber's JSON format writes the same span and event (`span` is
    /// this record, with the span's name).
    fn json_into(&self, time: &str, out: &mut String) {
        #[derive(Serialize)]
        struct Event<'r> {
            timestamp: &'r str,
            level: &'static str,
            fields: Fields<'r>,
            target: &'static str,
            span: Span<'r>,
        }
        #[derive(Serialize)]
        struct Fields<'r> {
            message: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            route: Option<&'r str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: Option<u16>,
        }
        #[derive(Serialize)]
        struct Span<'r> {
            #[serde(flatten)]
            record: &'r AccessRecord<'r>,
            name: &'static str,
        }
        let event = Event {
            timestamp: time,
            level: "INFO",
            fields: Fields {
                message: "request done",
                route: self.route.as_deref().filter(|r| !r.is_empty()),
                status: self.status,
            },
            target: TARGET,
            span: Span {
                record: self,
                name: "request",
            },
        };
        // Serialising these plain fields cannot fail; a failure would leave the line empty.
        if let Ok(json) = serde_json::to_string(&event) {
            out.push_str(&json);
        }
    }
}

thread_local! {
    /// Each thread's buffer for the line it writes.
    static LINE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// ` name="value"` as tracing's text format writes a string field (quoted, escaped).
fn text_str(out: &mut String, name: &str, value: &str) {
    out.push(' ');
    out.push_str(name);
    out.push('=');
    let _ = crate::logging::quoted_into(value, out);
}

/// [`text_str`] for a field that may be absent (then nothing is written, as for a field never
/// recorded).
fn text_opt(out: &mut String, name: &str, value: Option<&str>) {
    if let Some(value) = value {
        text_str(out, name, value);
    }
}

/// A method's text, without an allocation for the common ones.
fn method_text(method: &http::Method) -> Cow<'static, str> {
    use http::Method;
    const KNOWN: [(Method, &str); 7] = [
        (Method::GET, "GET"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::DELETE, "DELETE"),
        (Method::HEAD, "HEAD"),
        (Method::PATCH, "PATCH"),
        (Method::OPTIONS, "OPTIONS"),
    ];
    match KNOWN.iter().find(|(known, _)| known == method) {
        Some((_, text)) => Cow::Borrowed(text),
        None => Cow::Owned(method.as_str().to_string()),
    }
}

/// The access log's `cost` field: per settled limit, `position=reserved/settled`, comma
/// separated (`0=1000/187,2=1000/187`).
pub fn cost_field(figures: &[(usize, u64, u64)]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for (i, (position, reserved, settled)) in figures.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{position}={reserved}/{settled}");
    }
    out
}

/// The access log's `keys` field: per composite key, `position=digest` (hex), comma separated.
pub fn keys_field(digests: impl Iterator<Item = (usize, [u8; 16])>, out: &mut String) {
    for (position, digest) in digests {
        if !out.is_empty() {
            out.push(',');
        }
        use std::fmt::Write;
        let _ = write!(out, "{position}=");
        for byte in digest {
            let _ = write!(out, "{byte:02x}");
        }
    }
}

/// The access log's `keys` field read back.
pub fn parse_keys_field(text: &str) -> Vec<(usize, [u8; 16])> {
    text.split(',')
        .filter_map(|item| {
            let (position, hex) = item.split_once('=')?;
            if hex.len() != 32 {
                return None;
            }
            let mut digest = [0u8; 16];
            for (i, byte) in digest.iter_mut().enumerate() {
                *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
            }
            Some((position.parse().ok()?, digest))
        })
        .collect()
}

/// The access log's `cost` field read back: per position, the settled units.
pub fn parse_cost_field(text: &str) -> Vec<(usize, u64, u64)> {
    text.split(',')
        .filter_map(|item| {
            let (position, figures) = item.split_once('=')?;
            let (reserved, settled) = figures.split_once('/')?;
            Some((
                position.parse().ok()?,
                reserved.parse().ok()?,
                settled.parse().ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The reference span's field names ([`AccessRecord`]'s).
    mod field {
        pub const PROTOCOL: &str = "protocol";
        pub const ROUTE: &str = "route";
        pub const HOST: &str = "host";
        pub const CLIENT_IP: &str = "client_ip";
        pub const IDENTITY: &str = "identity";
        pub const IDENTITY_HASH: &str = "identity_hash";
        pub const TIER: &str = "tier";
        pub const DECISION: &str = "decision";
        pub const STATUS: &str = "status";
        pub const GRPC_STATUS: &str = "grpc_status";
        pub const LATENCY_MS: &str = "latency_ms";
        pub const COST: &str = "cost";
        pub const KEYS: &str = "keys";
        pub const CACHE: &str = "cache";
        pub const WAIT_MS: &str = "wait_ms";
        pub const POSITION: &str = "position";
    }

    /// The span the proxy opened per request until the access log was written directly: the
    /// reference the direct writer is held to.
    fn reference_span(method: &http::Method, path: &str) -> tracing::Span {
        use tracing::field::Empty;
        tracing::info_span!(
            target: TARGET,
            "request",
            method = %method,
            path = path,
            protocol = Empty,
            route = Empty,
            host = Empty,
            client_ip = Empty,
            identity = Empty,
            identity_hash = Empty,
            tier = Empty,
            decision = Empty,
            status = Empty,
            grpc_status = Empty,
            latency_ms = Empty,
            cost = Empty,
            keys = Empty,
            cache = Empty,
            wait_ms = Empty,
            position = Empty,
        )
    }

    /// What tracing-subscriber writes for `line` as the proxy recorded it (the fields in the
    /// order the phases set them, then the event), without the time.
    fn written_by_tracing(line: &Line, json: bool) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone());
        let log = || {
            let span = reference_span(
                &http::Method::from_bytes(line.method.as_bytes()).unwrap(),
                &line.path,
            );
            if let Some(protocol) = &line.protocol {
                span.record(field::PROTOCOL, protocol.as_ref());
            }
            if let Some(route) = &line.route {
                span.record(field::ROUTE, route.as_ref());
            }
            if let Some(host) = &line.host {
                span.record(field::HOST, host.as_ref());
            }
            if let Some(identity) = line.identity {
                span.record(field::IDENTITY, identity.as_str());
            }
            if let Some(ip) = &line.client_ip {
                span.record(field::CLIENT_IP, tracing::field::display(ip));
            }
            if let Some(tier) = &line.tier {
                span.record(field::TIER, tier.as_ref());
            }
            if let Some(hash) = &line.identity_hash {
                span.record(field::IDENTITY_HASH, hash.as_ref());
            }
            if let Some(keys) = &line.keys {
                span.record(field::KEYS, keys.as_ref());
            }
            if let Some(decision) = line.decision {
                span.record(field::DECISION, decision.as_str());
            }
            if let Some(status) = line.status {
                span.record(field::STATUS, status);
            }
            if let Some(code) = line.grpc_status {
                span.record(field::GRPC_STATUS, code);
            }
            if let Some(ms) = line.latency_ms {
                span.record(field::LATENCY_MS, ms);
            }
            if let Some(cost) = &line.cost {
                span.record(field::COST, cost.as_ref());
            }
            if let Some(cache) = &line.cache {
                span.record(field::CACHE, cache.as_ref());
            }
            if let Some(ms) = line.wait_ms {
                span.record(field::WAIT_MS, ms);
            }
            if let Some(position) = line.position {
                span.record(field::POSITION, position);
            }
            let _entered = span.enter();
            tracing::info!(
                target: TARGET,
                route = line.route.as_deref().filter(|r| !r.is_empty()),
                status = line.status,
                "request done"
            );
        };
        if json {
            let subscriber = builder.json().with_span_list(false).finish();
            tracing::subscriber::with_default(subscriber, log);
        } else {
            let subscriber = builder.fmt_fields(crate::logging::EscapedFields).finish();
            tracing::subscriber::with_default(subscriber, log);
        }
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    /// Lines as the proxy fills them: everything set; a refusal before identity; a path and
    /// values that need escaping.
    fn lines() -> Vec<Line> {
        let mut full = *Box::new(AccessRecord {
            method: "POST".into(),
            path: "/api/x".into(),
            protocol: Some("3".into()),
            route: Some("api".into()),
            host: Some("billing.example.com".into()),
            client_ip: Some("2001:db8::".into()),
            identity: Some(IdentityKind::Consumer),
            identity_hash: Some("ab".repeat(32).into()),
            tier: Some("pro".into()),
            decision: Some(DecisionLabel::ShadowDenied),
            status: Some(200),
            grpc_status: Some(8),
            latency_ms: Some(1.5),
            cost: Some("0=1000/187".into()),
            keys: Some(format!("0={}", "07".repeat(16)).into()),
            cache: Some("collapsed".into()),
            wait_ms: Some(120),
            position: Some(3),
        });
        let bare = AccessRecord {
            method: "GET".into(),
            path: "/nowhere".into(),
            protocol: None,
            route: None,
            host: None,
            client_ip: None,
            identity: None,
            identity_hash: None,
            tier: None,
            decision: None,
            status: Some(404),
            grpc_status: None,
            latency_ms: Some(0.25),
            cost: None,
            keys: None,
            cache: None,
            wait_ms: None,
            position: None,
        };
        let mut odd = full.clone();
        odd.method = "PURGE".into();
        odd.path = "/a b/\"quoted\"/back\\slash/caf\u{e9}/\u{1b}[2J".into();
        odd.tier = Some("line\nbreak".into());
        odd.latency_ms = Some(1.0);
        full.latency_ms = Some(3.6011480000000002);
        vec![full, bare, odd]
    }

    #[test]
    fn a_text_line_is_what_tracing_wrote_for_the_requests_span() {
        for line in lines() {
            let mut ours = String::new();
            line.text_into("TIME", &mut ours);
            let theirs = written_by_tracing(&line, false);
            // tracing without a timer starts at the level; ours after the time and two spaces
            // (the level right-aligned in five, as tracing writes it after a time).
            let ours = ours.strip_prefix("TIME  INFO ").unwrap();
            let theirs = theirs.trim_start().strip_prefix("INFO ").unwrap();
            assert_eq!(format!("{ours}\n"), theirs);
        }
    }

    #[test]
    fn a_json_line_is_what_tracing_wrote_and_what_replay_reads() {
        for line in lines() {
            let mut ours = String::new();
            line.json_into("2026-11-28T16:27:00.123456Z", &mut ours);
            let theirs = written_by_tracing(&line, true);
            let mut ours_value: serde_json::Value = serde_json::from_str(&ours).expect(&ours);
            let theirs_value: serde_json::Value = serde_json::from_str(theirs.trim()).unwrap();
            assert_eq!(ours_value["timestamp"], "2026-11-28T16:27:00.123456Z");
            ours_value.as_object_mut().unwrap().remove("timestamp");
            assert_eq!(ours_value, theirs_value, "{ours}");
            // Replay's two readers take it back whole.
            #[derive(Deserialize)]
            struct Read<'a> {
                target: &'a str,
                #[serde(borrow)]
                span: AccessRecord<'a>,
            }
            let read: Read<'_> = serde_json::from_str(&ours).unwrap();
            assert_eq!(read.target, TARGET);
            // (serde_json reads a float back within a unit in the last place.)
            let (Some(a), Some(b)) = (read.span.latency_ms, line.latency_ms) else {
                panic!("no latency: {ours}");
            };
            assert!((a - b).abs() <= b * 1e-15, "{a} {b}");
            let mut read = read.span;
            read.latency_ms = line.latency_ms;
            assert_eq!(read, line);
        }
    }

    #[test]
    fn the_access_log_is_off_unless_its_target_is_enabled() {
        // No subscriber here: nothing is enabled, and no line is started.
        assert!(Line::start(&http::Method::GET, "/", http::Version::HTTP_11).is_none());
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "warn,floodgate::access=info",
            ))
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let line = Line::start(&http::Method::GET, "/x", http::Version::HTTP_11).expect("on");
            assert_eq!((line.method.as_ref(), line.path.as_ref()), ("GET", "/x"));
        });
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,floodgate::access=warn",
            ))
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            assert!(Line::start(&http::Method::GET, "/x", http::Version::HTTP_11).is_none());
        });
    }

    #[test]
    fn the_keys_field_reads_back_what_was_written() {
        let mut text = String::new();
        keys_field([(0, [0xab; 16]), (3, [7; 16])].into_iter(), &mut text);
        assert_eq!(text, format!("0={},3={}", "ab".repeat(16), "07".repeat(16)));
        assert_eq!(parse_keys_field(&text), vec![(0, [0xab; 16]), (3, [7; 16])]);
        assert_eq!(parse_keys_field("0=abc,x=00"), vec![]);
    }

    #[test]
    fn the_cost_field_reads_back_what_was_written() {
        let text = cost_field(&[(0, 1000, 187), (2, 5, 9)]);
        assert_eq!(text, "0=1000/187,2=5/9");
        assert_eq!(parse_cost_field(&text), vec![(0, 1000, 187), (2, 5, 9)]);
        assert_eq!(parse_cost_field("0=1000/x,junk,3=1/2"), vec![(3, 1, 2)]);
    }

    #[test]
    fn every_label_is_written_and_read_by_one_name() {
        for kind in IdentityKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(
                IdentityKind::from_label(kind.as_str().as_bytes()),
                Some(kind)
            );
        }
        for label in DecisionLabel::ALL {
            let json = serde_json::to_string(&label).unwrap();
            assert_eq!(json, format!("\"{}\"", label.as_str()));
            assert_eq!(
                DecisionLabel::from_label(label.as_str().as_bytes()),
                Some(label)
            );
        }
    }
}
