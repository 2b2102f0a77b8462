//! The one place where floodgate chooses its own statuses and headers: rejections become
//! `application/problem+json` responses (RFC 9457), and admitted responses get the
//! `X-RateLimit-*` headers.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

use crate::limiter::Verdict;

/// The body type of every response floodgate sends: an upstream's streamed body or its own.
pub type Body = UnsyncBoxBody<Bytes, hyper::Error>;

pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
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
    /// The response for this rejection.
    pub fn into_response(self) -> Response<Body> {
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
        problem(status, error, &detail, verdict.as_ref())
    }
}

/// A problem+json response; with a verdict, a 429 carrying `Retry-After` and rate-limit headers.
fn problem(
    status: StatusCode,
    error: &str,
    detail: &str,
    verdict: Option<&Verdict>,
) -> Response<Body> {
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
        set_rate_limit_headers(response.headers_mut(), v);
    }
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    *response.body_mut() = full(body.to_string());
    response
}

/// Sets `X-RateLimit-Limit`, `-Remaining` and `-Reset` from the limit with the fewest remaining.
pub fn set_rate_limit_headers(headers: &mut HeaderMap, v: &Verdict) {
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(v.headline.limit));
    headers.insert(
        X_RATELIMIT_REMAINING,
        HeaderValue::from(v.headline.remaining),
    );
    headers.insert(X_RATELIMIT_RESET, HeaderValue::from(v.reset_unix_secs()));
}
