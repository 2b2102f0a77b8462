//! A cached answer's key: the route, the host (without its port, lowercased), the path as the
//! client sent it (normalised), and the parts the route's `key:` adds (the query by default, a
//! header's value, whose the request is). The method is not in it: only GET answers are stored,
//! and HEAD is served from them.

use std::sync::Arc;

use http::HeaderMap;

use super::rules::{KeyPart, Rules};

/// Where an entry sits: what purges and invalidations match on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub route: Arc<str>,
    pub host: Box<str>,
    pub path: Box<str>,
    pub query: Option<Box<str>>,
}

/// A request's key.
#[derive(Debug, Clone)]
pub struct Key {
    pub bytes: Vec<u8>,
}

impl Place {
    /// The place of a request for `path` and `query` on `host` (its port dropped) by `route`.
    pub fn of(route: &Arc<str>, host: Option<&str>, path: &str, query: Option<&str>) -> Place {
        Place {
            route: route.clone(),
            host: bare_host(host.unwrap_or("")).into(),
            path: path.into(),
            query: query.map(Into::into),
        }
    }
}

/// What the key reads of a request.
pub struct Parts<'a> {
    pub route: &'a Arc<str>,
    /// The request's host, without its port and lowercased (as `config::request_host` gives
    /// it).
    pub host: Option<&'a str>,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    /// Whose the request is (its kind's byte and its value), when the key holds it.
    pub identity: Option<(u8, &'a [u8])>,
}

/// The host without a port, lowercased.
pub fn bare_host(host: &str) -> std::borrow::Cow<'_, str> {
    let host = match host.rfind(':') {
        // `[::1]:8080`, `example.com:8080`; a bare IPv6 literal keeps its colons.
        Some(i)
            if !host[i..].contains(']') && (host.starts_with('[') || !host[..i].contains(':')) =>
        {
            &host[..i]
        }
        _ => host,
    };
    match host.bytes().any(|b| b.is_ascii_uppercase()) {
        true => std::borrow::Cow::Owned(host.to_ascii_lowercase()),
        false => std::borrow::Cow::Borrowed(host),
    }
}

impl Key {
    /// The key of a request, by the route's rules.
    pub fn of(rules: &Rules, parts: &Parts<'_>) -> Key {
        let host = parts.host.unwrap_or("");
        let mut bytes = Vec::with_capacity(
            parts.route.len() + host.len() + parts.path.len() + parts.query.map_or(0, str::len) + 8,
        );
        bytes.extend_from_slice(parts.route.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(host.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(parts.path.as_bytes());
        for part in &rules.key {
            bytes.push(0);
            match part {
                KeyPart::Query => {
                    bytes.push(b'q');
                    if let Some(query) = parts.query {
                        bytes.push(b'?');
                        bytes.extend_from_slice(query.as_bytes());
                    }
                }
                KeyPart::Header(name) => {
                    bytes.push(b'h');
                    bytes.extend_from_slice(name.as_str().as_bytes());
                    // Every value of the header, in order; none is not an empty one.
                    for value in parts.headers.get_all(name) {
                        bytes.push(b'=');
                        bytes.extend_from_slice(value.as_bytes());
                    }
                }
                KeyPart::Identity => {
                    bytes.push(b'i');
                    if let Some((kind, value)) = parts.identity {
                        bytes.push(kind);
                        bytes.extend_from_slice(value);
                    }
                }
            }
        }
        Key { bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(key: Vec<KeyPart>) -> Rules {
        Rules {
            key,
            ..Rules::default()
        }
    }

    fn key(rules: &Rules, host: &str, path: &str, query: Option<&str>, headers: &HeaderMap) -> Key {
        let route: Arc<str> = "r".into();
        Key::of(
            rules,
            &Parts {
                route: &route,
                host: Some(host),
                path,
                query,
                headers,
                identity: None,
            },
        )
    }

    #[test]
    fn the_host_s_port_and_case_do_not_split_the_cache() {
        let rules = rules(vec![KeyPart::Query]);
        let none = HeaderMap::new();
        // The proxy keys by the host as `config::request_host` gives it (no port, lowercase);
        // a place is made from the host as the request named it.
        let a = key(&rules, &bare_host("Example.com:8080"), "/a", None, &none);
        let b = key(&rules, "example.com", "/a", None, &none);
        assert_eq!(a.bytes, b.bytes);
        assert_eq!(
            &*Place::of(&"r".into(), Some("Example.com:8080"), "/a", None).host,
            "example.com"
        );
        assert_eq!(bare_host("[::1]:80"), "[::1]");
        assert_eq!(bare_host("[::1]"), "[::1]");
    }

    #[test]
    fn the_query_is_in_the_key_only_when_the_route_says_so() {
        let none = HeaderMap::new();
        let with = rules(vec![KeyPart::Query]);
        assert_ne!(
            key(&with, "h", "/a", Some("x=1"), &none).bytes,
            key(&with, "h", "/a", Some("x=2"), &none).bytes
        );
        // `?` with nothing after it is not the same as no query.
        assert_ne!(
            key(&with, "h", "/a", Some(""), &none).bytes,
            key(&with, "h", "/a", None, &none).bytes
        );
        let without = rules(vec![]);
        assert_eq!(
            key(&without, "h", "/a", Some("x=1"), &none).bytes,
            key(&without, "h", "/a", Some("x=2"), &none).bytes
        );
    }

    #[test]
    fn a_header_part_keeps_values_and_absence_apart() {
        let rules = rules(vec![KeyPart::Header(http::HeaderName::from_static(
            "x-zone",
        ))]);
        let mut a = HeaderMap::new();
        a.insert("x-zone", "1".parse().unwrap());
        let mut empty = HeaderMap::new();
        empty.insert("x-zone", "".parse().unwrap());
        let none = HeaderMap::new();
        let ka = key(&rules, "h", "/a", None, &a).bytes;
        let ke = key(&rules, "h", "/a", None, &empty).bytes;
        let kn = key(&rules, "h", "/a", None, &none).bytes;
        assert_ne!(ka, ke);
        assert_ne!(ke, kn);
        assert_ne!(ka, kn);
    }
}
