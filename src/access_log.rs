//! The access log: one line per request, written by the proxy ([`crate::proxy`]) under the
//! target [`TARGET`] and read back by `floodgate replay` ([`crate::replay`]).
//!
//! The proxy opens a span per request ([`span`]) and records its fields as they become known
//! (by the names in [`field`]); with `log_format: json`, tracing-subscriber writes them as the
//! line's `span` object, which is an [`AccessRecord`]. Replay reads that object as the same type
//! (serde), so what the proxy writes and what replay reads cannot drift apart: the test below
//! writes a line through tracing-subscriber and reads it back.
//!
//! Nothing here is a secret: an API key or user id appears only as the SHA-256 of its value
//! (`identity_hash`, the digest a consumer's `keys_sha256` holds, so replay can find it).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use tracing::field::Empty;

use crate::identity::IdentityKind;
use crate::metrics::DecisionLabel;

/// The tracing target of the access log's events.
pub const TARGET: &str = "floodgate::access";

/// The span's field names, as the proxy records them and [`AccessRecord`] names them.
pub mod field {
    pub const ROUTE: &str = "route";
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
}

/// One request's span as the access log holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccessRecord<'a> {
    #[serde(borrow)]
    pub method: Cow<'a, str>,
    /// The normalised path (what was routed and limited).
    #[serde(borrow)]
    pub path: Cow<'a, str>,
    #[serde(borrow, default)]
    pub route: Option<Cow<'a, str>>,
    /// The client address whose allowance `per: ip` limits spent (an IPv6 client's prefix);
    /// absent for a request rejected before it was identified.
    #[serde(borrow, default)]
    pub client_ip: Option<Cow<'a, str>>,
    #[serde(default)]
    pub identity: Option<IdentityKind>,
    /// The hex SHA-256 of the API key (also for a consumer, or a key refused) or user id.
    #[serde(borrow, default)]
    pub identity_hash: Option<Cow<'a, str>>,
    /// The tier a verified token's subject was limited as (its claim, as the config names
    /// tiers): replay cannot tell it from the digest.
    #[serde(borrow, default)]
    pub tier: Option<Cow<'a, str>>,
    #[serde(default)]
    pub decision: Option<DecisionLabel>,
    #[serde(default)]
    pub status: Option<u16>,
    /// The gRPC status of an answer floodgate gave a gRPC call itself (a trailers-only response,
    /// whose HTTP status is 200).
    #[serde(default)]
    pub grpc_status: Option<u8>,
    /// From the request's arrival to its response head (how long a concurrency slot was held);
    /// for a request with settled costs, to its response's end.
    #[serde(default)]
    pub latency_ms: Option<f64>,
    /// Settled costs (`cost: {reserve, actual}`): per limit, `position=reserved/settled`.
    #[serde(borrow, default)]
    pub cost: Option<Cow<'a, str>>,
    /// Composite keys (`per:` with request parts): per limit, `position=digest` (32 hex digits
    /// of the key's SHA-256), so replay can tell budgets apart without the values.
    #[serde(borrow, default)]
    pub keys: Option<Cow<'a, str>>,
}

/// The span of one request: its method and path now, the other [`field`]s empty until the
/// proxy records them.
pub fn span(method: &http::Method, path: &str) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "request",
        method = %method,
        path = path,
        route = Empty,
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
    )
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
pub fn parse_cost_field(text: &str) -> Vec<(usize, u64)> {
    text.split(',')
        .filter_map(|item| {
            let (position, figures) = item.split_once('=')?;
            let (_, settled) = figures.split_once('/')?;
            Some((position.parse().ok()?, settled.parse().ok()?))
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

    /// What one `record_all!` of present and absent values writes, as JSON and as text.
    fn recorded_all(json: bool) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone());
        let log = || {
            let span = span(&http::Method::GET, "/x");
            let (tier, hash): (Option<&str>, Option<&str>) = (None, None);
            tracing::record_all!(
                span,
                identity = IdentityKind::Ip.as_str(),
                client_ip = %"192.0.2.1",
                tier = tier,
                identity_hash = hash
            );
            let label: Option<DecisionLabel> = Some(DecisionLabel::Denied);
            let grpc: Option<u8> = None;
            tracing::record_all!(
                span,
                decision = label.map(|l| l.as_str()),
                status = 429u16,
                grpc_status = grpc,
                latency_ms = 0.5f64,
                cost = None::<&str>
            );
            let _entered = span.enter();
            tracing::info!(target: TARGET, "request done");
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

    #[test]
    fn values_recorded_together_leave_out_the_absent_ones() {
        // The proxy records a phase's fields in one call; an absent one (no tier, no gRPC
        // status, no cost) is not written, as when it was never recorded.
        let line = recorded_all(true);
        #[derive(Deserialize)]
        struct Line<'a> {
            #[serde(borrow)]
            span: AccessRecord<'a>,
        }
        let read: Line<'_> = serde_json::from_str(line.trim()).expect(&line);
        assert_eq!(read.span.identity, Some(IdentityKind::Ip));
        assert_eq!(read.span.client_ip.as_deref(), Some("192.0.2.1"));
        assert_eq!(read.span.decision, Some(DecisionLabel::Denied));
        assert_eq!(read.span.status, Some(429));
        assert_eq!(read.span.latency_ms, Some(0.5));
        assert_eq!((read.span.tier, read.span.grpc_status), (None, None));
        assert!(
            !line.contains("tier") && !line.contains("cost") && !line.contains("null"),
            "{line}"
        );
        let text = recorded_all(false);
        assert!(
            text.contains(
                "identity=\"ip\" client_ip=192.0.2.1 decision=\"denied\" status=429 latency_ms=0.5}"
            ),
            "{text}"
        );
        assert!(!text.contains("tier") && !text.contains("  "), "{text}");
    }

    #[test]
    fn what_the_proxy_writes_is_what_replay_reads() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_span_list(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = span(&http::Method::POST, "/api/x");
            span.record(field::ROUTE, "api");
            span.record(field::CLIENT_IP, tracing::field::display("2001:db8::"));
            span.record(field::IDENTITY, IdentityKind::Consumer.as_str());
            span.record(field::IDENTITY_HASH, "ab".repeat(32).as_str());
            span.record(field::TIER, "pro");
            span.record(field::DECISION, DecisionLabel::ShadowDenied.as_str());
            span.record(field::STATUS, 200u16);
            span.record(field::GRPC_STATUS, 8u8);
            span.record(field::LATENCY_MS, 1.5f64);
            span.record(field::COST, "0=1000/187");
            let _entered = span.enter();
            tracing::info!(target: TARGET, "request done");
        });
        let line = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        #[derive(Deserialize)]
        struct Line<'a> {
            target: &'a str,
            #[serde(borrow)]
            span: AccessRecord<'a>,
        }
        let read: Line<'_> = serde_json::from_str(line.trim()).expect(&line);
        assert_eq!(read.target, TARGET);
        let hash = "ab".repeat(32);
        assert_eq!(
            read.span,
            AccessRecord {
                method: "POST".into(),
                path: "/api/x".into(),
                route: Some("api".into()),
                client_ip: Some("2001:db8::".into()),
                identity: Some(IdentityKind::Consumer),
                identity_hash: Some(hash.as_str().into()),
                tier: Some("pro".into()),
                decision: Some(DecisionLabel::ShadowDenied),
                status: Some(200),
                grpc_status: Some(8),
                latency_ms: Some(1.5),
                cost: Some("0=1000/187".into()),
                keys: None,
            }
        );
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
        assert_eq!(parse_cost_field(&text), vec![(0, 187), (2, 9)]);
        assert_eq!(parse_cost_field("0=1000/x,junk,3=1/2"), vec![(3, 2)]);
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
