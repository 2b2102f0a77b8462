//! A route's `hosts:` and `headers:`: what narrows it beyond its path and methods.

use http::{HeaderMap, HeaderName, HeaderValue};

/// One entry of `hosts:`: a name, or `*.` and the labels every matching name ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// The whole name, lowercase.
    Exact(String),
    /// `*.example.com` as `.example.com`: one or more labels before it.
    Suffix(String),
}

impl HostPattern {
    /// The pattern `text` says, or why it is not one. Names are compared without case, so
    /// they are kept lowercase; a trailing dot (the root) is dropped.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let lower = text.trim_end_matches('.').to_ascii_lowercase();
        let (suffix, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.is_empty() || !name.split('.').all(label_ok) {
            return Err(format!(
                "{text:?} is not a host name (letters, digits, '-', '_' between dots; \"*.\" before one for its subdomains)"
            ));
        }
        Ok(match suffix {
            true => HostPattern::Suffix(format!(".{name}")),
            false => HostPattern::Exact(name.to_string()),
        })
    }

    /// True when `host` (lowercase, without port or trailing dot) matches.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(name) => host == name,
            // At least one label before the suffix: `example.com` is not `*.example.com`.
            HostPattern::Suffix(suffix) => {
                host.len() > suffix.len() && host.ends_with(suffix.as_str())
            }
        }
    }
}

/// One entry of `headers:`: a header that must have a value, or (`"*"`) be present.
#[derive(Debug, Clone)]
pub struct HeaderMatch {
    pub name: HeaderName,
    /// `None`: present with any value.
    pub value: Option<HeaderValue>,
}

impl HeaderMatch {
    /// True when `headers` has the header with the value asked for. The value compared is the
    /// field's combined value (RFC 9110 §5.3: every line of the field, in order, joined by
    /// commas), as a list of its comma-separated members without the white space around them,
    /// so that `X-Tenant: a` and `X-Tenant: b` on two lines are the one line `X-Tenant: a, b`
    /// and neither matches `a`: how a client splits a field cannot choose its route.
    pub fn matches(&self, headers: &HeaderMap) -> bool {
        let Some(value) = &self.value else {
            return headers.contains_key(&self.name);
        };
        let mut lines = headers.get_all(&self.name).iter();
        let Some(first) = lines.next() else {
            return false;
        };
        let mut rest = lines.peekable();
        // The common case: one line, equal to the value as it is.
        if rest.peek().is_none() && first == value {
            return true;
        }
        let members = std::iter::once(first)
            .chain(rest)
            .flat_map(|line| line.as_bytes().split(|&b| b == b','))
            .map(trim_ows)
            .filter(|m| !m.is_empty());
        let wanted = value
            .as_bytes()
            .split(|&b| b == b',')
            .map(trim_ows)
            .filter(|m| !m.is_empty());
        members.eq(wanted)
    }
}

/// `bytes` without the optional white space (space, tab) around it.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !ows(b)).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// Why a request's host is not one valid `uri-host[:port]` (RFC 9112 §3.2, RFC 3986 §3.2.2).
/// floodgate accepts what a DNS name or an address can be (letters, digits, `-`, `.`, `_`, no
/// empty label between two dots, or a bracketed IPv6 literal) and a port of digits: anything
/// else (`a@b`, `a, b`, spaces, raw UTF-8, percent escapes) is read differently by the parsers
/// behind the proxy, which could then see another host than the one routed and limited.
pub fn invalid_host(authority: &[u8]) -> Option<&'static str> {
    let (host, port) = match authority.strip_prefix(b"[") {
        Some(v6) => {
            let Some(close) = v6.iter().position(|&b| b == b']') else {
                return Some("an IPv6 host has no closing ]");
            };
            let literal = std::str::from_utf8(&v6[..close]).ok();
            if literal
                .and_then(|l| l.parse::<std::net::Ipv6Addr>().ok())
                .is_none()
            {
                return Some("the host is not an IPv6 address in brackets");
            }
            match &v6[close + 1..] {
                [] => return None,
                [b':', port @ ..] => (&[][..], port),
                _ => return Some("the host has text after its IPv6 address"),
            }
        }
        None => match authority.iter().rposition(|&b| b == b':') {
            Some(colon) => (&authority[..colon], &authority[colon + 1..]),
            None => (authority, &[][..]),
        },
    };
    if port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
        return Some("the host's port is not a number");
    }
    if host.is_empty() && !authority.starts_with(b"[") {
        return Some("the host is empty");
    }
    // One pass (this runs for every request): the characters, and no empty label (a leading
    // dot, or two in a row).
    let mut previous = b'.';
    for &b in host {
        match b {
            b'.' if previous == b'.' => return Some("the host has an empty label"),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => previous = b,
            _ => return Some("the host has a character no host name has"),
        }
    }
    None
}

/// The host a request names, as a route's `hosts` compares it: the request target's authority
/// when it has one (an absolute-form target, or HTTP/2's `:authority`, which nginx also prefers
/// to `Host`), else the `Host` header; lowercase, without the port or a trailing dot. `None`:
/// the request names none (an HTTP/1.0 request without `Host`).
pub fn request_host<'a>(
    uri: &'a http::Uri,
    headers: &'a HeaderMap,
) -> Option<std::borrow::Cow<'a, str>> {
    let raw = match uri.host() {
        Some(host) => host,
        None => {
            let value = headers.get(http::header::HOST)?.to_str().ok()?;
            // `Host: name:port`, or an IPv6 literal in brackets.
            match value.strip_prefix('[') {
                Some(v6) => return v6.split(']').next().map(|h| h.to_ascii_lowercase().into()),
                None => value.rsplit_once(':').map_or(value, |(host, _)| host),
            }
        }
    };
    let raw = raw.trim_end_matches('.');
    Some(match raw.bytes().any(|b| b.is_ascii_uppercase()) {
        true => raw.to_ascii_lowercase().into(),
        false => raw.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_exactly_or_by_their_labels_without_case() {
        let exact = HostPattern::parse("Billing.Example.com.").unwrap();
        assert!(exact.matches("billing.example.com"));
        assert!(!exact.matches("x.billing.example.com"));
        let any = HostPattern::parse("*.example.com").unwrap();
        assert!(any.matches("billing.example.com"));
        assert!(any.matches("a.b.example.com"));
        assert!(!any.matches("example.com"));
        assert!(!any.matches("badexample.com"));
        for bad in [
            "",
            "*.",
            "a..b",
            "ex ample.com",
            "*example.com",
            "a.*.com",
            "-.:80",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_request_host_is_the_targets_authority_else_host_without_port_or_case() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::HOST,
            HeaderValue::from_static("Rides.Example.com:8080"),
        );
        let origin_form: http::Uri = "/v1/x".parse().unwrap();
        assert_eq!(
            request_host(&origin_form, &headers).as_deref(),
            Some("rides.example.com")
        );
        let absolute: http::Uri = "http://billing.example.com./v1".parse().unwrap();
        assert_eq!(
            request_host(&absolute, &headers).as_deref(),
            Some("billing.example.com")
        );
        headers.insert(http::header::HOST, HeaderValue::from_static("[::1]:8080"));
        assert_eq!(request_host(&origin_form, &headers).as_deref(), Some("::1"));
        assert_eq!(request_host(&origin_form, &HeaderMap::new()), None);
        for (host, want) in [
            ("a.example", Some("a.example")),
            ("a.example.:80", Some("a.example")),
            ("127.0.0.1:8080", Some("127.0.0.1")),
            ("A.B.example", Some("a.b.example")),
            ("localhost:", Some("localhost")),
        ] {
            headers.insert(http::header::HOST, HeaderValue::from_static(host));
            assert_eq!(
                request_host(&origin_form, &headers).as_deref(),
                want,
                "{host:?}"
            );
        }
        // Not text (`HeaderValue::to_str` refuses it): no host.
        headers.insert(
            http::header::HOST,
            HeaderValue::from_bytes(b"caf\xc3\xa9.example").unwrap(),
        );
        assert_eq!(request_host(&origin_form, &headers), None);
    }

    #[test]
    fn hosts_are_one_valid_name_or_address_with_an_optional_port() {
        for good in [
            "a.example",
            "A.Example:8080",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:8443",
            "under_score.example.",
            "localhost:",
        ] {
            assert_eq!(invalid_host(good.as_bytes()), None, "{good:?}");
        }
        for bad in [
            "b.example@a.example",
            "a.example, b.example",
            "other.test,a.example",
            "b\u{fc}cher.example",
            "a.example:80:80",
            "a.example:http",
            "a..example",
            ".a.example",
            "[::1",
            "[nothing]",
            "[::1]x",
            "a%2eexample",
            "a example",
            "",
            ":80",
        ] {
            assert!(invalid_host(bad.as_bytes()).is_some(), "{bad:?}");
        }
    }

    /// The combined value decides, however the client splits the field into lines.
    #[test]
    fn a_header_matches_on_the_fields_combined_value() {
        let tenant = HeaderMatch {
            name: HeaderName::from_static("x-tenant"),
            value: Some(HeaderValue::from_static("a")),
        };
        let with = |lines: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for line in lines {
                headers.append("x-tenant", HeaderValue::from_static(line));
            }
            tenant.matches(&headers)
        };
        assert!(with(&["a"]));
        assert!(
            with(&["a,"]),
            "an empty member is no member (RFC 9110 §5.6.1)"
        );
        assert!(!with(&["a", "b"]), "two lines are the one value \"a, b\"");
        assert!(!with(&["a, b"]));
        assert!(!with(&["b", "a"]));
        assert!(!with(&[]));
        let pair = HeaderMatch {
            name: HeaderName::from_static("x-tenant"),
            value: Some(HeaderValue::from_static("a, b")),
        };
        let mut headers = HeaderMap::new();
        headers.append("x-tenant", HeaderValue::from_static("a"));
        headers.append("x-tenant", HeaderValue::from_static("b"));
        assert!(pair.matches(&headers));
        headers.insert("x-tenant", HeaderValue::from_static("a,b"));
        assert!(pair.matches(&headers));
    }

    #[test]
    fn a_header_matches_by_value_or_presence() {
        let mut headers = HeaderMap::new();
        headers.append("x-canary", HeaderValue::from_static("1"));
        let one = HeaderMatch {
            name: HeaderName::from_static("x-canary"),
            value: Some(HeaderValue::from_static("1")),
        };
        assert!(one.matches(&headers));
        headers.append("x-canary", HeaderValue::from_static("0"));
        assert!(!one.matches(&headers), "the field is \"1, 0\"");
        let present = HeaderMatch {
            name: HeaderName::from_static("x-canary"),
            value: None,
        };
        assert!(present.matches(&headers));
        assert!(!present.matches(&HeaderMap::new()));
    }
}
