//! Phase 1a, before routing: the request's head is one the upstream will read as floodgate read
//! it. Each check closes a way for a client to make floodgate route, limit or log one thing
//! and the upstream see another:
//!
//! - **one host**: the request target's authority (an absolute-form target, HTTP/2's and
//!   HTTP/3's `:authority`) when it has one, else the one `Host` field (RFC 9112 §3.2.2), valid
//!   as one `uri-host[:port]` ([`invalid_host`]) or refused with 400; a `Host` that disagrees
//!   with the target is replaced by it, so routing, `hosts:`, the log and `X-Forwarded-Host` all
//!   see the host that was routed on;
//! - **no host**: a request that names none keeps no `X-Forwarded-Host` of its own unless it
//!   comes from a trusted proxy (else the upstream would take the client's word for it);
//! - **no underscores**: a header whose name has `_` is dropped (`underscores_in_headers: false`,
//!   the default, as nginx), since CGI, WSGI and Rack read `X_Consumer` as `X-Consumer`;
//! - **no white space around HTTP/2 and HTTP/3 values** (RFC 9113 §8.2.1, RFC 9114 §4.2: a
//!   malformed request), which an HTTP/1.1 upstream would trim: ` a` must not match another
//!   route than `a`.

use http::header::HOST;
use http::{HeaderName, HeaderValue, Request, Version};

use super::body::ClientBody;
use super::forward::X_FORWARDED_HOST;
use super::snapshot::Snapshot;
use crate::answer::Rejection;
use crate::config::invalid_host;

fn bad(why: impl Into<String>) -> Rejection {
    Rejection::BadRequest(why.into())
}

/// Checks `req`'s head and makes its host one (see the module's doc). `peer`: the TCP (or
/// UDP) peer, for whether its `X-Forwarded-Host` may stand.
pub(super) fn check(
    snapshot: &Snapshot,
    req: &mut Request<ClientBody>,
    peer: std::net::IpAddr,
) -> Result<(), Rejection> {
    let names_host = one_host(req)?;
    if req.version() >= Version::HTTP_2
        && let Some(name) = padded_value(req.headers())
    {
        return Err(bad(format!(
            "the value of {name} starts or ends with white space, which HTTP/2 and HTTP/3 forbid"
        )));
    }
    if !snapshot.underscores_in_headers {
        drop_underscored(req.headers_mut());
    }
    if !names_host
        && req.headers().contains_key(X_FORWARDED_HOST)
        && !snapshot.identity.is_trusted(peer.to_canonical())
    {
        req.headers_mut().remove(X_FORWARDED_HOST);
    }
    Ok(())
}

/// One `Host` at most (exactly one on HTTP/1.1, RFC 9112 §3.2), valid, and the same as the
/// target's authority when the target has one. True when the request names a host.
fn one_host(req: &mut Request<ClientBody>) -> Result<bool, Rejection> {
    let mut fields = req.headers().get_all(HOST).iter();
    let field = fields.next();
    if fields.next().is_some() || (field.is_none() && req.version() == Version::HTTP_11) {
        return Err(bad("an HTTP/1.1 request needs exactly one Host header"));
    }
    let names_host = field.is_some() || req.uri().authority().is_some();
    let field_differs = match req.uri().authority() {
        Some(authority) => {
            let authority = authority.as_str();
            if authority.contains('@') {
                return Err(bad(
                    "the request target has user information before its host (RFC 9110 §4.2.4)",
                ));
            }
            if let Some(why) = invalid_host(authority.as_bytes()) {
                return Err(bad(format!("the request target's host: {why}")));
            }
            field.is_some_and(|f| !f.as_bytes().eq_ignore_ascii_case(authority.as_bytes()))
        }
        None => {
            // Bytes, not text: what is not a host name's character (raw UTF-8 included) is
            // refused by the one check.
            if let Some(why) = field.and_then(|f| invalid_host(f.as_bytes())) {
                return Err(bad(format!("the Host header: {why}")));
            }
            false
        }
    };
    // RFC 9112 §3.2.2: the target's host wins, and a proxy sends that one on.
    if field_differs
        && let Some(authority) = req.uri().authority()
        && let Ok(value) = HeaderValue::from_str(authority.as_str())
    {
        req.headers_mut().insert(HOST, value);
    }
    Ok(names_host)
}

/// The first field whose value starts or ends with a space or a tab.
fn padded_value(headers: &http::HeaderMap) -> Option<&HeaderName> {
    let padded = |v: &HeaderValue| {
        let b = v.as_bytes();
        matches!(b.first(), Some(b' ' | b'\t')) || matches!(b.last(), Some(b' ' | b'\t'))
    };
    headers
        .iter()
        .find_map(|(name, value)| padded(value).then_some(name))
}

/// Removes every field whose name has an underscore.
fn drop_underscored(headers: &mut http::HeaderMap) {
    let underscored = |name: &HeaderName| name.as_str().as_bytes().contains(&b'_');
    if !headers.keys().any(underscored) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|n| underscored(n)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, target: &str, headers: &[(&str, &str)]) -> Request<ClientBody> {
        let mut builder = Request::builder().version(version).uri(target);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder
            .body(ClientBody::Read(bytes::Bytes::new()))
            .expect("request")
    }

    fn snapshot(yaml: &str) -> Snapshot {
        let config = crate::config::Config::from_yaml(&format!(
            "listen: 127.0.0.1:0\n{yaml}routes:\n  - {{name: a, path_prefix: /, upstream: \"http://127.0.0.1:1\"}}\n"
        ))
        .expect("config");
        Snapshot::for_test(&config)
    }

    const PEER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    #[test]
    fn the_targets_host_replaces_a_host_header_that_disagrees() {
        let snapshot = snapshot("");
        let mut req = request(
            Version::HTTP_11,
            "http://b.example/x",
            &[("host", "a.example")],
        );
        check(&snapshot, &mut req, PEER).expect("valid");
        assert_eq!(req.headers()[HOST], "b.example");
        // Case alone is no disagreement: the field is left as it came.
        let mut req = request(
            Version::HTTP_11,
            "http://b.example/x",
            &[("host", "B.example")],
        );
        check(&snapshot, &mut req, PEER).expect("valid");
        assert_eq!(req.headers()[HOST], "B.example");
    }

    #[test]
    fn hosts_a_parser_would_read_otherwise_are_refused() {
        let snapshot = snapshot("");
        for host in [
            "b.example@a.example",
            "a.example, b.example",
            "other.test, a.example",
            "",
        ] {
            let mut req = request(Version::HTTP_11, "/", &[("host", host)]);
            assert!(check(&snapshot, &mut req, PEER).is_err(), "{host:?}");
        }
        let mut req = request(Version::HTTP_11, "/", &[]);
        req.headers_mut().insert(
            HOST,
            HeaderValue::from_bytes("b\u{fc}cher.example".as_bytes()).unwrap(),
        );
        assert!(check(&snapshot, &mut req, PEER).is_err());
        let mut req = request(
            Version::HTTP_11,
            "http://user@b.example/",
            &[("host", "b.example")],
        );
        assert!(check(&snapshot, &mut req, PEER).is_err());
        let mut two = request(Version::HTTP_11, "/", &[("host", "a.example")]);
        two.headers_mut()
            .append(HOST, HeaderValue::from_static("a.example"));
        assert!(check(&snapshot, &mut two, PEER).is_err());
    }

    #[test]
    fn a_request_without_a_host_keeps_no_forwarded_host_but_a_trusted_proxys() {
        let untrusted = snapshot("");
        let mut req = request(
            Version::HTTP_10,
            "/",
            &[("x-forwarded-host", "forged.example")],
        );
        check(&untrusted, &mut req, PEER).expect("valid");
        assert!(!req.headers().contains_key(X_FORWARDED_HOST));
        let trusted = snapshot("identity:\n  trusted_proxies: [192.0.2.0/24]\n");
        let mut req = request(
            Version::HTTP_10,
            "/",
            &[("x-forwarded-host", "api.example")],
        );
        check(&trusted, &mut req, PEER).expect("valid");
        assert_eq!(req.headers()[X_FORWARDED_HOST], "api.example");
    }

    #[test]
    fn underscored_names_are_dropped_unless_allowed() {
        let dropping = snapshot("");
        let mut req = request(
            Version::HTTP_11,
            "/",
            &[("host", "a"), ("x_consumer", "forged"), ("x-kept", "1")],
        );
        check(&dropping, &mut req, PEER).expect("valid");
        assert!(!req.headers().contains_key("x_consumer"));
        assert!(req.headers().contains_key("x-kept"));
        let keeping = snapshot("underscores_in_headers: true\n");
        let mut req = request(
            Version::HTTP_11,
            "/",
            &[("host", "a"), ("x_consumer", "kept")],
        );
        check(&keeping, &mut req, PEER).expect("valid");
        assert_eq!(req.headers()["x_consumer"], "kept");
    }

    #[test]
    fn http2_values_with_white_space_around_them_are_malformed() {
        let snapshot = snapshot("");
        for value in [" a", "a\t", "\ta "] {
            let mut req = request(Version::HTTP_2, "http://a.example/", &[("x-tenant", value)]);
            assert!(check(&snapshot, &mut req, PEER).is_err(), "{value:?}");
            // An HTTP/1.1 parser trims them before floodgate sees them (httparse).
        }
        let mut req = request(Version::HTTP_2, "http://a.example/", &[("x-tenant", "a b")]);
        assert!(check(&snapshot, &mut req, PEER).is_ok());
    }
}
