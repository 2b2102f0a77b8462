//! CORS (the Fetch standard's "CORS protocol") on a route with `cors:`, as loaded: floodgate
//! answers a preflight itself (204, never forwarded, never spending a budget), and writes the allowed
//! origin, `Vary: Origin` and the exposed headers on every answer of the route, its own 429,
//! 503 and 401 included, so that a browser's `fetch()` can read a refusal's status,
//! `Retry-After` and `X-RateLimit-Remaining` instead of failing as a network error. An origin
//! not allowed gets no CORS header at all: the browser then refuses to hand the answer over.

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderValue, Method};

/// The headers a refusal carries that a browser hides from a page unless they are exposed:
/// what `expose:` is when it is not written.
pub const DEFAULT_EXPOSE: [&str; 4] = [
    "Retry-After",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
];

/// A route's `cors:`, with its header values written once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// `None`: any origin (`["*"]`); else the origins allowed, ASCII-lowercased
    /// (`https://app.example.com`, a port when not the scheme's default).
    origins: Option<Vec<String>>,
    methods: HeaderValue,
    /// `None`: none listed; `"*"` echoes what the preflight asks for.
    headers: Option<HeaderValue>,
    expose: Option<HeaderValue>,
    credentials: bool,
    max_age: HeaderValue,
}

impl Cors {
    /// A route's CORS from checked parts (`config/route/edge.rs` checks them).
    pub fn new(
        origins: Option<Vec<String>>,
        methods: &[Method],
        headers: &[String],
        expose: &[String],
        credentials: bool,
        max_age_secs: u64,
    ) -> Option<Self> {
        let list = |items: Vec<&str>| -> Option<Option<HeaderValue>> {
            match items.is_empty() {
                true => Some(None),
                false => HeaderValue::from_str(&items.join(", ")).ok().map(Some),
            }
        };
        Some(Cors {
            origins: origins.map(|o| o.into_iter().map(|o| o.to_ascii_lowercase()).collect()),
            methods: list(methods.iter().map(Method::as_str).collect())?
                .unwrap_or(HeaderValue::from_static("GET, HEAD, POST")),
            headers: list(headers.iter().map(String::as_str).collect())?,
            expose: list(expose.iter().map(String::as_str).collect())?,
            credentials,
            max_age: HeaderValue::from(max_age_secs),
        })
    }

    /// Whether `headers` (an `OPTIONS` request's) make it a CORS preflight: an `Origin` and an
    /// `Access-Control-Request-Method`. The method asked for, if it is one.
    pub fn preflight_method(method: &Method, headers: &HeaderMap) -> Option<Method> {
        if method != Method::OPTIONS || !headers.contains_key(ORIGIN) {
            return None;
        }
        let asked = headers.get(ACCESS_CONTROL_REQUEST_METHOD)?;
        Method::from_bytes(asked.as_bytes()).ok()
    }

    /// The `Access-Control-Allow-Origin` for a request from `origin`, if it is allowed: `*` for
    /// any origin without credentials, else the origin itself (which then needs `Vary: Origin`).
    fn allow_origin(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let origin = origin?;
        match &self.origins {
            None if !self.credentials => Some(HeaderValue::from_static("*")),
            None => Some(origin.clone()),
            Some(allowed) => {
                let asked = origin.to_str().ok()?;
                (allowed.iter().any(|a| a.eq_ignore_ascii_case(asked))).then(|| origin.clone())
            }
        }
    }

    /// The headers of the answer to a preflight (`req`, the preflight's headers): what the
    /// route allows when the origin is allowed; none when it is not (the browser then blocks
    /// the request it was asking about). The answer itself (204) is `answer`'s.
    pub fn preflight_headers(&self, req: &HeaderMap) -> HeaderMap {
        let mut h = HeaderMap::new();
        let Some(origin) = self.allow_origin(req.get(ORIGIN)) else {
            return h;
        };
        if origin != "*" {
            h.insert(VARY, HeaderValue::from_static("Origin"));
        }
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone());
        match (&self.headers, req.get(ACCESS_CONTROL_REQUEST_HEADERS)) {
            // `*` with credentials is not a wildcard to a browser: the names asked are echoed.
            (Some(allowed), Some(asked)) if allowed == "*" && self.credentials => {
                h.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
            }
            (Some(allowed), _) => {
                h.insert(ACCESS_CONTROL_ALLOW_HEADERS, allowed.clone());
            }
            (None, _) => {}
        }
        if self.credentials {
            h.insert(
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        h.insert(ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
        h
    }

    /// Writes the CORS headers of an answer (any answer of the route: the upstream's, a cache
    /// hit, floodgate's own refusal) to a request from `origin`; the upstream's own CORS
    /// headers are replaced, so that one policy speaks. Nothing for an origin not allowed.
    pub fn write(&self, origin: Option<&HeaderValue>, h: &mut HeaderMap) {
        let Some(allowed) = self.allow_origin(origin) else {
            return;
        };
        if allowed != "*"
            && !h.get_all(VARY).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.to_ascii_lowercase().contains("origin"))
            })
        {
            h.append(VARY, HeaderValue::from_static("Origin"));
        }
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        match &self.expose {
            Some(expose) => h.insert(ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone()),
            None => h.remove(ACCESS_CONTROL_EXPOSE_HEADERS),
        };
        if self.credentials {
            h.insert(
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: Option<&[&str]>, credentials: bool) -> Cors {
        Cors::new(
            origins.map(|o| o.iter().map(|s| s.to_string()).collect()),
            &[Method::GET, Method::POST],
            &["Content-Type".into(), "X-API-Key".into()],
            &DEFAULT_EXPOSE.map(String::from),
            credentials,
            600,
        )
        .unwrap()
    }

    fn request(origin: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(ORIGIN, HeaderValue::from_str(origin).unwrap());
        h.insert(
            ACCESS_CONTROL_REQUEST_METHOD,
            HeaderValue::from_static("POST"),
        );
        h
    }

    #[test]
    fn a_preflight_is_an_options_with_origin_and_a_method_asked() {
        let h = request("https://app.example.com");
        assert_eq!(
            Cors::preflight_method(&Method::OPTIONS, &h),
            Some(Method::POST)
        );
        assert_eq!(Cors::preflight_method(&Method::GET, &h), None);
        let mut no_origin = h.clone();
        no_origin.remove(ORIGIN);
        assert_eq!(Cors::preflight_method(&Method::OPTIONS, &no_origin), None);
        let mut no_method = h;
        no_method.remove(ACCESS_CONTROL_REQUEST_METHOD);
        assert_eq!(Cors::preflight_method(&Method::OPTIONS, &no_method), None);
    }

    #[test]
    fn an_allowed_origin_is_echoed_with_vary_and_a_disallowed_one_gets_nothing() {
        let c = cors(Some(&["https://App.example.com"]), false);
        let h = &c.preflight_headers(&request("https://app.example.com"));
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example.com");
        assert_eq!(h[VARY], "Origin");
        assert_eq!(h[ACCESS_CONTROL_ALLOW_METHODS], "GET, POST");
        assert_eq!(h[ACCESS_CONTROL_ALLOW_HEADERS], "Content-Type, X-API-Key");
        assert_eq!(h[ACCESS_CONTROL_MAX_AGE], "600");
        assert!(!h.contains_key(ACCESS_CONTROL_ALLOW_CREDENTIALS));

        let refused = c.preflight_headers(&request("https://evil.example"));
        assert!(refused.is_empty(), "{refused:?}");

        let mut answer = HeaderMap::new();
        c.write(
            Some(&HeaderValue::from_static("https://evil.example")),
            &mut answer,
        );
        assert!(answer.is_empty());
        c.write(None, &mut answer);
        assert!(answer.is_empty());
    }

    #[test]
    fn every_answer_exposes_the_rate_limit_headers_and_replaces_the_upstreams_origin() {
        let c = cors(Some(&["https://app.example.com"]), false);
        let mut h = HeaderMap::new();
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
        h.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
        c.write(
            Some(&HeaderValue::from_static("https://app.example.com")),
            &mut h,
        );
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example.com");
        let vary: Vec<_> = h.get_all(VARY).iter().collect();
        assert_eq!(vary, ["Accept-Encoding", "Origin"]);
        assert_eq!(
            h[ACCESS_CONTROL_EXPOSE_HEADERS],
            "Retry-After, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset"
        );
        // Written twice (a refusal's answer passing the end of the pipeline once more): one Vary.
        c.write(
            Some(&HeaderValue::from_static("https://app.example.com")),
            &mut h,
        );
        assert_eq!(h.get_all(VARY).iter().count(), 2);
    }

    #[test]
    fn any_origin_is_a_star_without_credentials_and_the_origin_with_them() {
        let any = cors(None, false);
        let mut h = HeaderMap::new();
        any.write(Some(&HeaderValue::from_static("https://x.example")), &mut h);
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert!(!h.contains_key(VARY));

        let with = cors(None, true);
        let mut h = HeaderMap::new();
        with.write(Some(&HeaderValue::from_static("https://x.example")), &mut h);
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "https://x.example");
        assert_eq!(h[ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        assert_eq!(h[VARY], "Origin");
    }
}
