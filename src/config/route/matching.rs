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
    /// True when `headers` has the header (one of its values equal to the one asked for).
    pub fn matches(&self, headers: &HeaderMap) -> bool {
        match &self.value {
            None => headers.contains_key(&self.name),
            Some(value) => headers.get_all(&self.name).iter().any(|v| v == value),
        }
    }
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
    }

    #[test]
    fn a_header_matches_by_value_or_presence() {
        let mut headers = HeaderMap::new();
        headers.append("x-canary", HeaderValue::from_static("0"));
        headers.append("x-canary", HeaderValue::from_static("1"));
        let one = HeaderMatch {
            name: HeaderName::from_static("x-canary"),
            value: Some(HeaderValue::from_static("1")),
        };
        assert!(one.matches(&headers));
        let present = HeaderMatch {
            name: HeaderName::from_static("x-canary"),
            value: None,
        };
        assert!(present.matches(&headers));
        assert!(!present.matches(&HeaderMap::new()));
    }
}
