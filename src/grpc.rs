//! gRPC's words for floodgate's own answers: which requests are gRPC calls, the status codes
//! floodgate refuses them with, and the headers of a trailers-only response (`grpc-status`,
//! `grpc-message`, `grpc-retry-pushback-ms`, `grpc-status-details-bin`), as the gRPC over HTTP/2
//! protocol (PROTOCOL-HTTP2.md) and the retry design (gRFC A6) define them.
//!
//! A gRPC client maps an HTTP 429 or 503 to `UNAVAILABLE`, which retry policies and alerting
//! read as "the server is down". A trailers-only response (HTTP 200, the status in the only
//! HEADERS frame) says what happened in the client's own terms: `RESOURCE_EXHAUSTED` with the
//! delay after which a retry can pass, both as `grpc-retry-pushback-ms` (which gRPC's retry
//! policy obeys) and as a `google.rpc.RetryInfo` inside `grpc-status-details-bin` (which
//! application code reads through `grpc-status`'s rich error model).
//!
//! The two protobuf messages are encoded here by hand (a handful of bytes: a varint code, a
//! string, one `Any`), so no protobuf runtime is needed for them.

use std::time::Duration;

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue};

pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
pub const GRPC_STATUS_DETAILS_BIN: HeaderName = HeaderName::from_static("grpc-status-details-bin");
const APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// The gRPC status codes floodgate answers with (the numbers are the protocol's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    /// The code as `grpc-status` writes it.
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// What a rate-limited gRPC call is told (`grpc_rate_limited_status:` on a route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitedStatus {
    /// `RESOURCE_EXHAUSTED` (8): "you are over your quota", gRPC's own answer.
    #[default]
    ResourceExhausted,
    /// `UNAVAILABLE` (14), as Envoy's ratelimit filter answers unless told otherwise: for
    /// clients whose retry policies were written for it.
    Unavailable,
}

impl RateLimitedStatus {
    /// The status code it stands for.
    pub fn code(self) -> Code {
        match self {
            RateLimitedStatus::ResourceExhausted => Code::ResourceExhausted,
            RateLimitedStatus::Unavailable => Code::Unavailable,
        }
    }
}

/// True when `headers` belong to a gRPC call: its `content-type` is `application/grpc` or
/// one of its variants (`application/grpc+proto`, `application/grpc-web`…).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The `grpc-status` in `headers` (a trailers-only answer's head, or trailers), if any.
pub fn status_of(headers: &HeaderMap) -> Option<u32> {
    headers.get(GRPC_STATUS)?.to_str().ok()?.trim().parse().ok()
}

/// True for the statuses an overloaded upstream answers with: `UNAVAILABLE` (14) and
/// `RESOURCE_EXHAUSTED` (8), gRPC's 503 and 429.
pub fn is_overload(code: u32) -> bool {
    code == Code::Unavailable as u32 || code == Code::ResourceExhausted as u32
}

/// The deadline a client sent in `grpc-timeout` (`TimeoutValue TimeoutUnit`: at most 8 digits
/// and one of `H M S m u n`), or `None` when there is none or it is malformed (a malformed one
/// is ignored, as gRPC servers do).
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(GRPC_TIMEOUT)?.as_bytes();
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Writes a trailers-only response's gRPC fields into `headers`: `content-type`,
/// `grpc-status`, `grpc-message` and, when a retry can pass after `retry_after`, the pushback
/// and a `google.rpc.Status` holding a `google.rpc.RetryInfo` with that delay.
pub fn write_status(
    headers: &mut HeaderMap,
    code: Code,
    message: &str,
    retry_after: Option<Duration>,
) {
    headers.insert(http::header::CONTENT_TYPE, APPLICATION_GRPC);
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code.as_u8())));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, value);
    }
    let Some(delay) = retry_after else {
        return;
    };
    let ms = u64::try_from(delay.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
    let details = status_with_retry_info(code, message, delay);
    let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details);
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        headers.insert(GRPC_STATUS_DETAILS_BIN, value);
    }
}

/// `grpc-message`'s encoding: UTF-8, with every byte outside printable ASCII, and `%` itself,
/// written as `%XX`.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// A `google.rpc.Status { code, message, details: [Any(RetryInfo { retry_delay })] }`, encoded.
fn status_with_retry_info(code: Code, message: &str, delay: Duration) -> Vec<u8> {
    // google.protobuf.Duration { int64 seconds = 1; int32 nanos = 2; }
    let mut duration = Vec::with_capacity(12);
    if delay.as_secs() > 0 {
        varint_field(&mut duration, 1, delay.as_secs());
    }
    if delay.subsec_nanos() > 0 {
        varint_field(&mut duration, 2, u64::from(delay.subsec_nanos()));
    }
    // google.rpc.RetryInfo { google.protobuf.Duration retry_delay = 1; }
    let mut retry_info = Vec::with_capacity(duration.len() + 2);
    bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any { string type_url = 1; bytes value = 2; }
    let mut any = Vec::with_capacity(RETRY_INFO_TYPE_URL.len() + retry_info.len() + 4);
    bytes_field(&mut any, 1, RETRY_INFO_TYPE_URL.as_bytes());
    bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status { int32 code = 1; string message = 2; repeated Any details = 3; }
    let mut status = Vec::with_capacity(message.len() + any.len() + 8);
    varint_field(&mut status, 1, u64::from(code.as_u8()));
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A varint field (wire type 0).
fn varint_field(out: &mut Vec<u8>, field: u64, n: u64) {
    varint(out, field << 3);
    varint(out, n);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        assert!(is_grpc(&headers(&[("content-type", "application/grpc")])));
        assert!(is_grpc(&headers(&[(
            "content-type",
            "application/grpc+proto"
        )])));
        assert!(!is_grpc(&headers(&[("content-type", "application/json")])));
        assert!(!is_grpc(&headers(&[])));
    }

    #[test]
    fn grpc_timeouts_are_read_in_every_unit_and_malformed_ones_ignored() {
        let t = |v: &'static str| timeout(&headers(&[("grpc-timeout", v)]));
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("2M"), Some(Duration::from_secs(120)));
        assert_eq!(t("3S"), Some(Duration::from_secs(3)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(t("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "m", "100", "123456789m", "1x", "-1m", "1.5S", " 1S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            percent_encode("over 100% — slow"),
            "over 100%25 %E2%80%94 slow"
        );
    }

    /// Reads a protobuf message's fields as (number, wire type, varint or bytes).
    fn fields(mut b: &[u8]) -> Vec<(u64, u64, u64, Vec<u8>)> {
        fn read_varint(b: &mut &[u8]) -> u64 {
            let (mut n, mut shift) = (0u64, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                n |= u64::from(byte & 0x7f) << shift;
                if byte < 0x80 {
                    return n;
                }
                shift += 7;
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let key = read_varint(&mut b);
            match key & 7 {
                0 => out.push((key >> 3, 0, read_varint(&mut b), Vec::new())),
                2 => {
                    let len = read_varint(&mut b) as usize;
                    out.push((key >> 3, 2, 0, b[..len].to_vec()));
                    b = &b[len..];
                }
                other => panic!("unexpected wire type {other}"),
            }
        }
        out
    }

    #[test]
    fn a_refusal_with_a_retry_carries_pushback_and_a_status_holding_retry_info() {
        let mut h = HeaderMap::new();
        write_status(
            &mut h,
            Code::ResourceExhausted,
            "rate limit exceeded",
            Some(Duration::from_micros(2_500_001)),
        );
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(h["grpc-message"], "rate limit exceeded");
        assert_eq!(
            h["grpc-retry-pushback-ms"], "2501",
            "rounded up to the millisecond"
        );
        let bin = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(h["grpc-status-details-bin"].as_bytes())
            .unwrap();
        let status = fields(&bin);
        assert_eq!(status[0], (1, 0, 8, vec![]));
        assert_eq!(status[1], (2, 2, 0, b"rate limit exceeded".to_vec()));
        let any = fields(&status[2].3);
        assert_eq!(any[0].3, RETRY_INFO_TYPE_URL.as_bytes());
        let retry_info = fields(&any[1].3);
        let delay = fields(&retry_info[0].3);
        assert_eq!(delay, [(1, 0, 2, vec![]), (2, 0, 500_001_000, vec![])]);
    }

    #[test]
    fn a_refusal_without_a_retry_time_has_no_pushback() {
        let mut h = HeaderMap::new();
        write_status(&mut h, Code::Unimplemented, "no route", None);
        assert_eq!(h["grpc-status"], "12");
        assert!(!h.contains_key(GRPC_RETRY_PUSHBACK_MS));
        assert!(!h.contains_key(GRPC_STATUS_DETAILS_BIN));
    }
}
