//! The headers forwarding rewrites: hop-by-hop headers (RFC 9110 §7.6.1) removed both ways,
//! `X-Forwarded-*` set, split HTTP/2 cookie fields joined for an HTTP/1.1 hop, redirects to the
//! upstream's origin pointed at the client's.

use std::io::Write as _;
use std::net::IpAddr;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LOCATION, COOKIE, LOCATION, TE, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Version};

use crate::config::Upstream;
use crate::identity::X_FORWARDED_FOR;

pub(super) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Hop-by-hop headers (RFC 9110 §7.6.1), plus the non-standard ones proxies also drop.
const HOP_BY_HOP: [HeaderName; 8] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
];

/// Joins split `cookie` fields into one, separated by `"; "`. HTTP/2 clients may send each
/// cookie in a field of its own (RFC 9113 §8.2.3), and those MUST be joined before an HTTP/1.1
/// hop: most HTTP/1.1 servers read only one `Cookie` line or join lines with `,`.
pub(super) fn join_cookies(headers: &mut HeaderMap) {
    let mut fields = headers.get_all(COOKIE).iter();
    let (Some(first), Some(_)) = (fields.next(), fields.next()) else {
        return;
    };
    let mut joined = Vec::with_capacity(first.len() * 2);
    for field in headers.get_all(COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(field.as_bytes());
    }
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(joined)) {
        headers.insert(COOKIE, value);
    }
}

/// Rewrites `Location` and `Content-Location` values that point at `upstream`'s origin to the
/// origin the client used (`https` when it came over TLS, and its `Host`), as nginx's
/// `proxy_redirect default` does: a redirect must not send the client around the proxy. Relative
/// references and other origins are left as they are.
pub(super) fn rewrite_redirects(
    headers: &mut HeaderMap,
    upstream: &Upstream,
    client_tls: bool,
    host: &HeaderValue,
) {
    for name in [LOCATION, CONTENT_LOCATION] {
        let Some(value) = headers.get(&name) else {
            continue;
        };
        let Some(rest) = value.to_str().ok().and_then(|v| strip_origin(v, upstream)) else {
            continue;
        };
        let scheme = if client_tls { "https" } else { "http" };
        let Ok(host) = host.to_str() else { return };
        if let Ok(rewritten) = HeaderValue::from_str(&format!("{scheme}://{host}{rest}")) {
            headers.insert(name, rewritten);
        }
    }
}

/// `path` with its leading `prefix` replaced by `new` (`rewrite_prefix`, as nginx's
/// `proxy_pass http://u/new/` in a `location /prefix/`), by whole segments: what follows the
/// prefix is joined to `new` with one slash, so the result is always `new` itself or under
/// `new/` (`/api/v1` → `/internal/` never makes `/internal/../x` or `/internalx`). The request
/// path is normalised and a rewriting route matches at segment boundaries only, so what follows
/// the prefix is empty or a `/` and segments that are never `.` or `..`. A path that does not
/// start with `prefix` is `new` followed by it.
pub(crate) fn replace_prefix(path: &str, prefix: &str, new: &str) -> String {
    let rest = path.strip_prefix(prefix).unwrap_or(path);
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        return new.to_string();
    }
    let base = new.trim_end_matches('/');
    let mut out = String::with_capacity(base.len() + 1 + rest.len());
    out.push_str(base);
    out.push('/');
    out.push_str(rest);
    out
}

/// A redirect (`Location`, `Content-Location`) under the forwarded prefix `new` comes back under
/// the route's `prefix`, so the client's next request matches the route again: an
/// absolute-path value (`/login`), or an absolute URL on the client's origin (after
/// [`rewrite_redirects`]). Other origins, and paths outside `new`, are left as they are.
pub(in crate::proxy) fn prefix_redirects(
    headers: &mut HeaderMap,
    new: &str,
    prefix: &str,
    client: &super::ClientSide,
) {
    for name in [LOCATION, CONTENT_LOCATION] {
        let Some(value) = headers.get(&name).and_then(|v| v.to_str().ok()) else {
            continue;
        };
        // The origin part kept as it is, and the path after it.
        let (origin, path) = match value.split_once("://") {
            Some((scheme, rest)) => {
                let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
                let authority = &rest[..end];
                let ours = client.origin.as_ref().is_some_and(|(_, host)| {
                    host.to_str()
                        .is_ok_and(|h| h.eq_ignore_ascii_case(authority))
                });
                if !ours {
                    continue;
                }
                (&value[..scheme.len() + 3 + end], &rest[end..])
            }
            None if value.starts_with('/') && !value.starts_with("//") => ("", value),
            None => continue,
        };
        if !path.starts_with(new) {
            continue;
        }
        let back = replace_prefix(path, new, prefix);
        if let Ok(value) = HeaderValue::from_str(&format!("{origin}{back}")) {
            headers.insert(name, value);
        }
    }
}

/// What follows `upstream`'s origin in the absolute URL `value` (the path, query and fragment,
/// possibly empty), or `None` when `value` is not on that origin. Scheme and host compare
/// without case, and a default port (80, 443) may be written or left out.
fn strip_origin<'v>(value: &'v str, upstream: &Upstream) -> Option<&'v str> {
    let (scheme, rest) = value.split_once("://")?;
    if !scheme.eq_ignore_ascii_case(upstream.scheme.as_str()) {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority: http::uri::Authority = authority.parse().ok()?;
    let default_port = if upstream.scheme == http::uri::Scheme::HTTPS {
        443
    } else {
        80
    };
    let port = |a: &http::uri::Authority| a.port_u16().unwrap_or(default_port);
    let same = authority
        .host()
        .eq_ignore_ascii_case(upstream.authority.host())
        && port(&authority) == port(&upstream.authority);
    same.then_some(tail)
}

/// True for an HTTP/1.1 `Connection: upgrade` + `Upgrade: websocket` request.
pub(in crate::proxy) fn is_websocket_upgrade<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && header_has_token(req.headers(), &CONNECTION, "upgrade")
        && header_has_token(req.headers(), &UPGRADE, "websocket")
}

pub(super) fn header_has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// Removes the hop-by-hop headers and every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // The `Connection` lines are copied out (a reference count each, no bytes) so that the names
    // in them can be removed as they are read, looked up by `&str` without building `HeaderName`s.
    let mut lines = headers.get_all(CONNECTION).iter();
    if let Some(first) = lines.next().cloned() {
        let more: Vec<HeaderValue> = lines.cloned().collect();
        for line in std::iter::once(&first).chain(&more) {
            let Ok(line) = line.to_str() else { continue };
            for token in line.split(',') {
                // A token that is no header name (empty, spaces) matches nothing.
                headers.remove(token.trim());
            }
        }
    }
    // One look at the names present first, and only those removed: most requests carry none
    // of these and most responses one or two (`Connection: keep-alive`), and a pass of
    // comparisons costs less than ten removals that each hash a name.
    let mut found: [Option<HeaderName>; 4] = Default::default();
    let mut count = 0;
    for name in headers.keys() {
        if name == UPGRADE || HOP_BY_HOP.contains(name) {
            if let Some(slot) = found.get_mut(count) {
                *slot = Some(name.clone());
            }
            count += 1;
        }
    }
    if count > found.len() {
        for name in HOP_BY_HOP {
            headers.remove(name);
        }
        headers.remove(UPGRADE);
    } else {
        for name in found.into_iter().flatten() {
            headers.remove(name);
        }
    }
}

/// Removes the fields a client's `Connection` lists (RFC 9110 §7.6.1: they are for this hop
/// only) before the route's `request_headers` are applied, so that `Connection: X-Consumer`
/// cannot take away a field floodgate sets; `Connection` itself stays only to say `upgrade`
/// (a WebSocket's), for the forwarding step, which removes the hop-by-hop fields it knows.
/// `Host` and `TE` are not removed here: the forwarding step reads them.
pub fn strip_connection_listed(headers: &mut HeaderMap) {
    if !headers.contains_key(CONNECTION) {
        return;
    }
    let lines: Vec<HeaderValue> = headers.get_all(CONNECTION).iter().cloned().collect();
    let mut upgrade = false;
    for line in &lines {
        let Ok(line) = line.to_str() else { continue };
        for token in line.split(',').map(str::trim) {
            if token.eq_ignore_ascii_case("upgrade") {
                upgrade = true;
            } else if !token.eq_ignore_ascii_case("host") && !token.eq_ignore_ascii_case("te") {
                headers.remove(token);
            }
        }
    }
    match upgrade {
        true => {
            headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        }
        false => {
            headers.remove(CONNECTION);
        }
    }
}

/// Appends the client's address to `X-Forwarded-For`, keeping earlier hops in one header line.
pub(super) fn append_forwarded_for(headers: &mut HeaderMap, client_ip: IpAddr) {
    // One buffer, formatted into directly, that becomes the header value without a copy.
    let mut value = Vec::with_capacity(48);
    for line in headers.get_all(X_FORWARDED_FOR) {
        if !value.is_empty() {
            value.extend_from_slice(b", ");
        }
        value.extend_from_slice(line.as_bytes());
    }
    if !value.is_empty() {
        value.extend_from_slice(b", ");
    }
    push_ip(&mut value, client_ip);
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
        headers.insert(X_FORWARDED_FOR, v);
    }
}

/// Writes `ip` as `Display` does; an IPv4 address digit by digit (`write!` costs about a
/// thousand instructions a request, a fifth of forwarding's own header work).
pub(in crate::proxy) fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        IpAddr::V6(_) => {
            let _ = write!(out, "{ip}");
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamProtocol;
    use http::Uri;

    #[test]
    fn a_prefix_is_replaced_with_one_slash_where_the_two_meet() {
        assert_eq!(
            replace_prefix("/api/rides/request", "/api/rides/", "/"),
            "/request"
        );
        assert_eq!(
            replace_prefix("/api/rides/request", "/api/rides", "/"),
            "/request"
        );
        assert_eq!(replace_prefix("/api/rides", "/api/rides", "/"), "/");
        assert_eq!(replace_prefix("/api/rides/x", "/api/rides", "/v2"), "/v2/x");
        assert_eq!(
            replace_prefix("/api/rides/x", "/api/rides/", "/v2/"),
            "/v2/x"
        );
        // By whole segments, never as a plain string (nginx's off-by-slash): what follows the
        // prefix is always under the new prefix.
        assert_eq!(replace_prefix("/api/ridesX", "/api/rides", "/v2"), "/v2/X");
        assert_eq!(
            replace_prefix("/api/rides/x", "/api/rides/", "/v2"),
            "/v2/x"
        );
    }

    #[test]
    fn a_redirect_under_the_forwarded_prefix_comes_back_under_the_routes() {
        let client = super::super::ClientSide {
            version: http::Version::HTTP_11,
            origin: Some((false, HeaderValue::from_static("front.test:8080"))),
        };
        let back = |location: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(LOCATION, HeaderValue::from_str(location).unwrap());
            prefix_redirects(&mut headers, "/", "/api/rides/", &client);
            headers[LOCATION].to_str().unwrap().to_string()
        };
        assert_eq!(back("/login?next=1"), "/api/rides/login?next=1");
        assert_eq!(
            back("http://front.test:8080/login"),
            "http://front.test:8080/api/rides/login"
        );
        // Another origin, and a protocol-relative reference, are left alone.
        assert_eq!(
            back("http://elsewhere.test/login"),
            "http://elsewhere.test/login"
        );
        assert_eq!(back("//elsewhere.test/login"), "//elsewhere.test/login");
        assert_eq!(back("relative/path"), "relative/path");
        let mut headers = HeaderMap::new();
        headers.insert(LOCATION, HeaderValue::from_static("/v1/other"));
        prefix_redirects(&mut headers, "/v2/", "/api/", &client);
        assert_eq!(
            headers[LOCATION], "/v1/other",
            "outside the forwarded prefix"
        );
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.30.40",
            "255.255.255.255",
            "192.168.100.9",
            "::1",
            "2001:db8::7",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(String::from_utf8(out).unwrap(), ip.to_string());
        }
    }

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_removed() {
        let mut headers = HeaderMap::new();
        headers.append(
            CONNECTION,
            HeaderValue::from_static("Keep-Alive, X-Trace ,,"),
        );
        headers.append(CONNECTION, HeaderValue::from_static("x-other"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-trace", HeaderValue::from_static("1"));
        headers.insert("x-other", HeaderValue::from_static("2"));
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        headers.insert(UPGRADE, HeaderValue::from_static("h2c"));
        headers.insert("x-kept", HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn split_cookie_fields_are_joined_into_one() {
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, HeaderValue::from_static("a=1"));
        headers.append(COOKIE, HeaderValue::from_static("b=2"));
        headers.append(COOKIE, HeaderValue::from_static("c=3; d=4"));
        join_cookies(&mut headers);
        let fields: Vec<_> = headers.get_all(COOKIE).iter().collect();
        assert_eq!(fields, ["a=1; b=2; c=3; d=4"]);

        let mut one = HeaderMap::new();
        one.insert(COOKIE, HeaderValue::from_static("a=1; b=2"));
        join_cookies(&mut one);
        assert_eq!(one[COOKIE], "a=1; b=2");
    }

    fn upstream(url: &str) -> Upstream {
        let uri: Uri = url.parse().unwrap();
        let authority = uri.authority().unwrap().clone();
        Upstream {
            scheme: uri.scheme().unwrap().clone(),
            host_header: HeaderValue::from_str(authority.as_str()).unwrap(),
            host: authority.host().into(),
            authority,
            protocol: UpstreamProtocol::Http1,
        }
    }

    #[test]
    fn redirects_to_the_upstream_origin_are_rewritten_to_the_clients() {
        let up = upstream("http://127.0.0.1:9000");
        let rewrite = |location: &str, tls: bool| {
            let mut headers = HeaderMap::new();
            headers.insert(LOCATION, HeaderValue::from_str(location).unwrap());
            headers.insert(CONTENT_LOCATION, HeaderValue::from_str(location).unwrap());
            rewrite_redirects(
                &mut headers,
                &up,
                tls,
                &HeaderValue::from_static("api.example"),
            );
            assert_eq!(headers[LOCATION], headers[CONTENT_LOCATION]);
            headers[LOCATION].to_str().unwrap().to_string()
        };
        assert_eq!(
            rewrite("http://127.0.0.1:9000/a?b=1#c", false),
            "http://api.example/a?b=1#c"
        );
        assert_eq!(
            rewrite("HTTP://127.0.0.1:9000", true),
            "https://api.example"
        );
        assert_eq!(
            rewrite("http://127.0.0.1:9000?q", false),
            "http://api.example?q"
        );
        // Other origins, other ports, relative references and look-alike hosts stay.
        for kept in [
            "http://127.0.0.1:9001/a",
            "https://127.0.0.1:9000/a",
            "http://127.0.0.1:90000/a",
            "http://127.0.0.1:9000.evil.example/a",
            "/relative",
            "//127.0.0.1:9000/scheme-relative",
        ] {
            assert_eq!(rewrite(kept, false), kept);
        }
        // A default port may be written or left out.
        let up80 = upstream("http://backend");
        let mut headers = HeaderMap::new();
        headers.insert(LOCATION, HeaderValue::from_static("http://BACKEND:80/x"));
        rewrite_redirects(
            &mut headers,
            &up80,
            false,
            &HeaderValue::from_static("h:8080"),
        );
        assert_eq!(headers[LOCATION], "http://h:8080/x");
    }

    #[test]
    fn the_client_is_appended_to_forwarded_for_in_one_line() {
        let mut headers = HeaderMap::new();
        append_forwarded_for(&mut headers, "192.0.2.1".parse().unwrap());
        assert_eq!(headers[X_FORWARDED_FOR], "192.0.2.1");
        headers.append(X_FORWARDED_FOR, HeaderValue::from_static("198.51.100.2"));
        append_forwarded_for(&mut headers, "2001:db8::1".parse().unwrap());
        let lines: Vec<_> = headers.get_all(X_FORWARDED_FOR).iter().collect();
        assert_eq!(lines, ["192.0.2.1, 198.51.100.2, 2001:db8::1"]);
    }
}
