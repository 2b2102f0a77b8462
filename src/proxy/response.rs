//! The one place where floodgate chooses its own statuses and headers: rejections become
//! `application/problem+json` responses (RFC 9457), and admitted responses get the rate-limit
//! headers of the configured profile.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

use crate::config::{HeaderProfile, RouteConfig};
use crate::limiter::{Limit, Verdict};

/// The body type of every response floodgate sends: an upstream's streamed body or its own.
pub type Body = UnsyncBoxBody<Bytes, hyper::Error>;

pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// Why floodgate answers a request itself instead of (or after failing at) forwarding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// No route matches: 404.
    NoRoute,
    /// The request is malformed in a way floodgate cares about: 400.
    BadRequest(String),
    /// A limit denied: 429 with `Retry-After`.
    RateLimited(Verdict),
    /// The limiter store failed and `on_error` is `deny`: 503.
    LimiterUnavailable,
    /// The upstream could not be reached: 502.
    BadGateway(String),
    /// The upstream did not answer in time: 504.
    GatewayTimeout,
}

/// How a route's rate-limit headers are written: built once per config load.
#[derive(Debug, Clone)]
pub struct RateLimitHeaders {
    profile: HeaderProfile,
    /// IETF profile: the route's `RateLimit-Policy` value.
    policy: Option<HeaderValue>,
    /// IETF profile: the policy names, enforced limits then shadow limits.
    names: Vec<String>,
    /// How many of `names` are enforced limits.
    enforced: usize,
}

impl RateLimitHeaders {
    /// The headers for `route` in `profile`.
    pub fn for_route(profile: HeaderProfile, route: &RouteConfig) -> Self {
        let names: Vec<String> = route
            .limit_names
            .iter()
            .chain(&route.shadow_limit_names)
            .cloned()
            .collect();
        let policy = (profile == HeaderProfile::Ietf && !names.is_empty())
            .then(|| {
                let limits = route.limits.iter().chain(&route.shadow_limits);
                let items: Vec<String> = names
                    .iter()
                    .zip(limits)
                    .map(|(name, limit)| {
                        let (quota, window) = quota_and_window(limit);
                        format!("\"{name}\";q={quota};w={window}")
                    })
                    .collect();
                HeaderValue::from_str(&items.join(", ")).ok()
            })
            .flatten();
        RateLimitHeaders {
            profile,
            policy,
            names,
            enforced: route.limits.len(),
        }
    }

    /// Headers that say nothing (routes without limits).
    pub fn none() -> Self {
        RateLimitHeaders {
            profile: HeaderProfile::None,
            policy: None,
            names: Vec::new(),
            enforced: 0,
        }
    }

    /// Writes the fields for `verdict`; `shadow` says the verdict came from the shadow limits.
    /// On a 429, the IETF `t` is the `Retry-After` instant.
    pub fn write(&self, headers: &mut HeaderMap, v: &Verdict, shadow: bool) {
        match self.profile {
            HeaderProfile::None => {}
            HeaderProfile::XRateLimit => {
                headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(v.headline.limit));
                headers.insert(
                    X_RATELIMIT_REMAINING,
                    HeaderValue::from(v.headline.remaining),
                );
                headers.insert(X_RATELIMIT_RESET, HeaderValue::from(v.reset_unix_secs()));
            }
            HeaderProfile::Ietf => {
                if let Some(policy) = &self.policy {
                    headers.insert(RATELIMIT_POLICY, policy.clone());
                }
                let index = if shadow {
                    self.enforced + v.headline_index
                } else {
                    v.headline_index
                };
                let name = self.names.get(index).map_or("default", String::as_str);
                let t = if v.allowed {
                    v.headline.reset_after_us.div_ceil(1_000_000)
                } else {
                    v.retry_after_secs()
                };
                let value = format!("\"{name}\";r={};t={t}", v.headline.remaining);
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(RATELIMIT, value);
                }
            }
        }
    }
}

/// The IETF policy's quota and window (seconds) of a limit: a bucket's window is the time it
/// takes to refill from empty.
fn quota_and_window(limit: &Limit) -> (u64, u64) {
    let (units, span) = limit.algorithm.parameters();
    let window_us = if limit.algorithm.is_bucket() {
        units * span
    } else {
        span
    };
    (units, window_us.div_ceil(1_000_000).max(1))
}

/// A body from bytes floodgate made itself.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> Body {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

impl Rejection {
    /// The response for this rejection; `headers` writes a 429's rate-limit fields.
    pub fn into_response(self, headers: &RateLimitHeaders) -> Response<Body> {
        let (status, error, detail, verdict) = match self {
            Rejection::NoRoute => (
                StatusCode::NOT_FOUND,
                "no_route",
                "no route matches this request".to_string(),
                None,
            ),
            Rejection::BadRequest(detail) => (StatusCode::BAD_REQUEST, "bad_request", detail, None),
            Rejection::RateLimited(v) => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "rate limit exceeded; retry after the number of seconds in Retry-After".to_string(),
                Some(v),
            ),
            Rejection::LimiterUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "rate_limiter_unavailable",
                "the rate limiter cannot decide right now".to_string(),
                None,
            ),
            Rejection::BadGateway(detail) => (
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                detail,
                None,
            ),
            Rejection::GatewayTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                "the upstream did not answer in time".to_string(),
                None,
            ),
        };
        let title = status.canonical_reason().unwrap_or("Error");
        let mut body = serde_json::json!({
            "type": format!("urn:floodgate:problem:{error}"),
            "title": title,
            "status": status.as_u16(),
            "error": error,
            "detail": detail,
        });
        let mut response = Response::new(empty());
        if let Some(v) = verdict {
            let retry_after = v.retry_after_secs();
            body["retry_after"] = retry_after.into();
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(retry_after));
            headers.write(response.headers_mut(), &v, false);
        }
        *response.status_mut() = status;
        response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
        *response.body_mut() = full(body.to_string());
        response
    }
}
