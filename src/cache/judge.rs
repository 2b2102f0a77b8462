//! Whether an answer may be stored, and for how long it is fresh: RFC 9111's rules for a shared
//! cache (`http-cache-semantics` does the RFC's arithmetic: storability, `s-maxage` over
//! `max-age` over `Expires`, `Age` and `Date`), with the route's `ttl`, `force`, `public`,
//! `key` and `statuses` around them.
//!
//! An answer whose `Cache-Control` or `Expires` cannot be read is not stored: a malformed field
//! must never make an answer cacheable for long.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use http_cache_semantics::{CacheOptions, CachePolicy};

use super::rules::Rules;

/// How a stored answer is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Storable {
    /// How long it stays fresh from now.
    pub fresh_for: Duration,
    /// Its age when stored (the upstream's `Age`, and the time since its `Date`).
    pub age: Duration,
    /// The request headers its `Vary` names (none, usually).
    pub vary: Vec<HeaderName>,
    /// Requests carrying credentials may be served from it: the route says `public` or keys by
    /// identity, or the answer says `public` or `s-maxage` (RFC 9111 §3.5).
    pub credentialed_ok: bool,
}

/// Why an answer is not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStorable {
    Status,
    /// `no-store`, `private`, `no-cache` (without `force`), or not storable by RFC 9111.
    Directives,
    SetCookie,
    VaryStar,
    /// A `Cache-Control` or `Expires` that cannot be read.
    Malformed,
    /// Nothing fresh to keep (`max-age=0`, an `Expires` in the past).
    Expired,
    /// The request carried credentials and neither the route nor the answer says it may be
    /// shared.
    Credentialed,
}

/// The numeric directives of `Cache-Control` (their value must be digits).
const NUMERIC: [&str; 5] = [
    "max-age",
    "s-maxage",
    "stale-while-revalidate",
    "stale-if-error",
    "min-fresh",
];

/// True when every `Cache-Control` field is a list of `token` or `token=value` directives, the
/// numeric ones with digits.
pub fn cache_control_is_well_formed(headers: &HeaderMap) -> bool {
    for value in headers.get_all(header::CACHE_CONTROL) {
        let Ok(text) = value.to_str() else {
            return false;
        };
        for directive in text.split(',') {
            let directive = directive.trim();
            if directive.is_empty() {
                continue;
            }
            let (name, value) = match directive.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (directive, None),
            };
            if name.is_empty() || !name.bytes().all(is_tchar) {
                return false;
            }
            let numeric = NUMERIC.iter().any(|n| name.eq_ignore_ascii_case(n));
            match value {
                Some(v) if numeric && (v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit())) => {
                    return false;
                }
                Some(_) if numeric => {}
                None if numeric => return false,
                Some(v) => {
                    let quoted = v.len() >= 2 && v.starts_with('"') && v.ends_with('"');
                    if !quoted && (v.is_empty() || !v.bytes().all(is_tchar)) {
                        return false;
                    }
                }
                None => {}
            }
        }
    }
    true
}

/// RFC 9110 §5.6.2's token characters.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A directive of the answer's `Cache-Control`, present or not.
pub fn has_directive(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| {
            let d = d.trim();
            let n = d.split_once('=').map_or(d, |(n, _)| n.trim());
            n.eq_ignore_ascii_case(name)
        })
}

/// A single `Expires` that reads as an HTTP date.
fn expires_is_well_formed(headers: &HeaderMap) -> bool {
    let mut all = headers.get_all(header::EXPIRES).iter();
    match (all.next(), all.next()) {
        (None, _) => true,
        (Some(v), None) => v
            .to_str()
            .ok()
            .is_some_and(|t| httpdate::parse_http_date(t).is_ok()),
        (Some(_), Some(_)) => false,
    }
}

/// What a request is, for the policy: its method, URI and headers.
struct Asked<'a> {
    uri: &'a Uri,
    headers: &'a HeaderMap,
}

impl http_cache_semantics::RequestLike for Asked<'_> {
    fn uri(&self) -> Uri {
        self.uri.clone()
    }
    fn is_same_uri(&self, other: &Uri) -> bool {
        self.uri == other
    }
    fn method(&self) -> &Method {
        &Method::GET
    }
    fn headers(&self) -> &HeaderMap {
        self.headers
    }
}

struct Answered<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
}

impl http_cache_semantics::ResponseLike for Answered<'_> {
    fn status(&self) -> StatusCode {
        self.status
    }
    fn headers(&self) -> &HeaderMap {
        self.headers
    }
}

/// Whether the answer `status`/`headers` to a GET of `uri` with request headers `request` may
/// be stored under `rules`, and how; `credentialed`: the request carried `Authorization`,
/// `Cookie` or the API key.
pub fn judge(
    rules: &Rules,
    uri: &Uri,
    request: &HeaderMap,
    credentialed: bool,
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Result<Storable, NotStorable> {
    if !rules.statuses.contains(&status.as_u16()) {
        return Err(NotStorable::Status);
    }
    if !cache_control_is_well_formed(headers) || !expires_is_well_formed(headers) {
        return Err(NotStorable::Malformed);
    }
    if headers.contains_key(header::SET_COOKIE) {
        return Err(NotStorable::SetCookie);
    }
    let mut vary = Vec::new();
    for value in headers.get_all(header::VARY) {
        let Ok(text) = value.to_str() else {
            return Err(NotStorable::Malformed);
        };
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return Err(NotStorable::VaryStar);
            }
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(name) if !vary.contains(&name) => vary.push(name),
                Ok(_) => {}
                Err(_) => return Err(NotStorable::Malformed),
            }
        }
    }
    let says_shared = has_directive(headers, "public") || has_directive(headers, "s-maxage");
    if credentialed && !rules.shares_credentialed() && !says_shared {
        return Err(NotStorable::Credentialed);
    }
    // The policy sees the request without its credentials when the route or the answer says it
    // may be shared (RFC 9111 §3.5 is then met, by the route's word or the answer's).
    let stripped;
    let request = if request.contains_key(header::AUTHORIZATION) {
        let mut without = request.clone();
        without.remove(header::AUTHORIZATION);
        stripped = without;
        &stripped
    } else {
        request
    };
    let options = CacheOptions {
        shared: true,
        // No heuristic freshness: where the upstream gives none, the route's `ttl` does.
        cache_heuristic: 0.0,
        ..CacheOptions::default()
    };
    let policy = CachePolicy::new_options(
        &Asked {
            uri,
            headers: request,
        },
        &Answered { status, headers },
        now,
        options,
    );
    if !policy.is_storable() {
        return Err(NotStorable::Directives);
    }
    let age = policy.age(now);
    let explicit = has_directive(headers, "max-age")
        || has_directive(headers, "s-maxage")
        || headers.contains_key(header::EXPIRES);
    let fresh_for = if rules.force {
        rules.ttl
    } else if has_directive(headers, "no-cache") || has_directive(headers, "proxy-revalidate") {
        // Every use must be revalidated: floodgate does not revalidate, so it does not store.
        return Err(NotStorable::Directives);
    } else if explicit {
        policy.time_to_live(now)
    } else {
        rules.ttl.saturating_sub(age)
    };
    if fresh_for.is_zero() {
        return Err(NotStorable::Expired);
    }
    Ok(Storable {
        fresh_for,
        age,
        vary,
        credentialed_ok: rules.shares_credentialed() || says_shared,
    })
}

/// The request's values of the headers an answer varies on.
pub fn vary_values(
    names: &[HeaderName],
    request: &HeaderMap,
) -> Vec<(HeaderName, Option<HeaderValue>)> {
    names
        .iter()
        .map(|name| (name.clone(), joined(request, name)))
        .collect()
}

/// Every value of `name` in `headers`, joined by commas (RFC 9110 §5.3); `None` when absent.
pub fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    let mut rest = values.peekable();
    if rest.peek().is_none() {
        return Some(first.clone());
    }
    let mut text = first.as_bytes().to_vec();
    for v in rest {
        text.extend_from_slice(b", ");
        text.extend_from_slice(v.as_bytes());
    }
    HeaderValue::from_bytes(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            ttl: Duration::from_secs(5),
            ..Rules::default()
        }
    }

    fn answer(fields: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn verdict(
        rules: &Rules,
        credentialed: bool,
        status: u16,
        fields: &[(&str, &str)],
    ) -> Result<Storable, NotStorable> {
        let now = SystemTime::now();
        let mut res = answer(fields);
        res.insert(header::DATE, httpdate::fmt_http_date(now).parse().unwrap());
        judge(
            rules,
            &"http://h/a".parse().unwrap(),
            &HeaderMap::new(),
            credentialed,
            StatusCode::from_u16(status).unwrap(),
            &res,
            now,
        )
    }

    #[test]
    fn freshness_comes_from_max_age_then_s_maxage_then_the_route_s_ttl() {
        let r = rules();
        assert_eq!(
            verdict(&r, false, 200, &[("cache-control", "max-age=60")])
                .unwrap()
                .fresh_for,
            Duration::from_secs(60)
        );
        assert_eq!(
            verdict(
                &r,
                false,
                200,
                &[("cache-control", "max-age=60, s-maxage=30")]
            )
            .unwrap()
            .fresh_for,
            Duration::from_secs(30)
        );
        assert_eq!(
            verdict(&r, false, 200, &[]).unwrap().fresh_for,
            Duration::from_secs(5)
        );
        // The upstream's Age is spent from the freshness.
        assert_eq!(
            verdict(
                &r,
                false,
                200,
                &[("cache-control", "max-age=60"), ("age", "20")]
            )
            .unwrap()
            .fresh_for,
            Duration::from_secs(40)
        );
        // `force`: the route's ttl, whatever the upstream says (no-store still honoured).
        let forced = Rules {
            force: true,
            ..rules()
        };
        assert_eq!(
            verdict(&forced, false, 200, &[("cache-control", "max-age=60")])
                .unwrap()
                .fresh_for,
            Duration::from_secs(5)
        );
        assert_eq!(
            verdict(&forced, false, 200, &[("cache-control", "no-store")]),
            Err(NotStorable::Directives)
        );
        assert_eq!(
            verdict(&forced, false, 200, &[("cache-control", "private")]),
            Err(NotStorable::Directives)
        );
    }

    #[test]
    fn what_a_shared_cache_must_not_store_is_not_stored() {
        let r = rules();
        assert_eq!(
            verdict(&r, false, 200, &[("cache-control", "no-store")]),
            Err(NotStorable::Directives)
        );
        assert_eq!(
            verdict(&r, false, 200, &[("cache-control", "private, max-age=60")]),
            Err(NotStorable::Directives)
        );
        assert_eq!(
            verdict(&r, false, 200, &[("cache-control", "no-cache")]),
            Err(NotStorable::Directives)
        );
        assert_eq!(
            verdict(&r, false, 200, &[("set-cookie", "a=b")]),
            Err(NotStorable::SetCookie)
        );
        assert_eq!(
            verdict(&r, false, 200, &[("vary", "*")]),
            Err(NotStorable::VaryStar)
        );
        assert_eq!(
            verdict(&r, false, 500, &[("cache-control", "max-age=60")]),
            Err(NotStorable::Status)
        );
        assert_eq!(
            verdict(&r, false, 200, &[("cache-control", "max-age=0")]),
            Err(NotStorable::Expired)
        );
        assert_eq!(
            verdict(&r, false, 200, &[("expires", "0")]),
            Err(NotStorable::Malformed)
        );
        assert!(verdict(&r, false, 404, &[]).is_ok());
    }

    #[test]
    fn a_malformed_cache_control_or_expires_is_never_cacheable() {
        let r = rules();
        for bad in [
            "max-age=abc",
            "max-age=",
            "max-age",
            "max-age=1 0",
            "max age=10",
            "public, max-age=-1",
        ] {
            assert_eq!(
                verdict(&r, false, 200, &[("cache-control", bad)]),
                Err(NotStorable::Malformed),
                "{bad}"
            );
        }
        assert_eq!(
            verdict(&r, false, 200, &[("expires", "tomorrow")]),
            Err(NotStorable::Malformed)
        );
        assert_eq!(
            verdict(
                &r,
                false,
                200,
                &[
                    ("expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
                    ("expires", "Thu, 01 Jan 2099 00:00:00 GMT")
                ]
            ),
            Err(NotStorable::Malformed)
        );
        // Well-formed extensions pass.
        assert!(
            verdict(
                &r,
                false,
                200,
                &[("cache-control", "max-age=10, community=\"UCI\", immutable")]
            )
            .is_ok()
        );
    }

    #[test]
    fn credentialed_requests_are_stored_only_when_the_route_or_the_answer_says_so() {
        let r = rules();
        assert_eq!(
            verdict(&r, true, 200, &[("cache-control", "max-age=60")]),
            Err(NotStorable::Credentialed)
        );
        let shared = verdict(&r, true, 200, &[("cache-control", "public, max-age=60")]).unwrap();
        assert!(shared.credentialed_ok);
        assert!(
            verdict(&r, true, 200, &[("cache-control", "s-maxage=60")])
                .unwrap()
                .credentialed_ok
        );
        let public = Rules {
            public: true,
            ..rules()
        };
        assert!(
            verdict(&public, true, 200, &[("cache-control", "max-age=60")])
                .unwrap()
                .credentialed_ok
        );
        // An answer to a request without credentials does not serve credentialed ones unless said.
        assert!(!verdict(&r, false, 200, &[]).unwrap().credentialed_ok);
    }

    #[test]
    fn vary_names_are_kept_and_values_joined() {
        let r = rules();
        let v = verdict(
            &r,
            false,
            200,
            &[("vary", "Accept-Encoding, accept-language")],
        )
        .unwrap();
        assert_eq!(
            v.vary,
            vec![header::ACCEPT_ENCODING, header::ACCEPT_LANGUAGE]
        );
        let req = answer(&[("accept-encoding", "gzip"), ("accept-encoding", "br")]);
        assert_eq!(
            vary_values(&v.vary, &req),
            vec![
                (
                    header::ACCEPT_ENCODING,
                    Some(HeaderValue::from_static("gzip, br"))
                ),
                (header::ACCEPT_LANGUAGE, None)
            ]
        );
    }
}
