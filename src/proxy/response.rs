//! The one place where floodgate chooses its own statuses and headers: rejections become
//! `application/problem+json` responses (RFC 9457), or for a gRPC call trailers-only gRPC
//! responses ([`crate::grpc`]); admitted responses get the rate-limit headers of the configured
//! profile.

use std::io::Write as _;
use std::sync::LazyLock;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

use super::context::AfterResponse;
use crate::config::{HeaderProfile, RouteConfig};
use crate::limiter::{Limit, Verdict};
use crate::policy::LimitRef;

/// The body type of every response floodgate sends: an upstream's streamed body or its own.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body's error: hyper's, or one of floodgate's own limits ([`super::body`]).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

mod grpc;
pub use grpc::Dialect;

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
    /// An API key no consumer has, under `consumers.unknown_key: reject`: 401.
    InvalidApiKey,
    /// A bearer token that does not verify (`identity.jwt`), or none under `when_missing:
    /// reject`: 401 with `WWW-Authenticate: Bearer error="invalid_token"`, never forwarded.
    InvalidToken,
    /// A limit denied: 429 with `Retry-After`; the verdict and the limit that speaks for it.
    RateLimited(Verdict, LimitRef),
    /// The limiter store failed and `on_error` is `deny`: 503.
    LimiterUnavailable,
    /// The upstream could not be reached: 502.
    BadGateway(String),
    /// The upstream did not answer in time: 504.
    GatewayTimeout,
    /// The request body is larger than `max_body_size`: 413.
    PayloadTooLarge,
    /// The request body went silent for `timeouts.client_body`: 408.
    RequestTimeout,
    /// An HTTP/2 connection opened streams faster than its stream budget: 429.
    TooManyStreams,
    /// No slot under the upstream's learned limit within `queue_timeout`: 503 with
    /// `Retry-After`, never forwarded.
    UpstreamOverloaded,
}

/// How a route's rate-limit headers are written: built once per config load.
#[derive(Debug, Clone)]
pub struct RateLimitHeaders {
    profile: HeaderProfile,
    /// IETF profile: the route's `RateLimit-Policy` value.
    policy: Option<HeaderValue>,
    /// IETF profile: the policy names, enforced limits then shadow limits.
    names: Vec<String>,
    /// How many of the route's limits are enforced (the shadow ones' names follow).
    enforced: usize,
}

impl RateLimitHeaders {
    /// The headers for `route` in `profile`.
    pub fn for_route(profile: HeaderProfile, route: &RouteConfig) -> Self {
        let limits: Vec<_> = route
            .enforced
            .limits
            .iter()
            .chain(&route.shadow.limits)
            .collect();
        let names: Vec<String> = limits.iter().map(|l| l.name().to_string()).collect();
        let policy = (profile == HeaderProfile::Ietf && !names.is_empty())
            .then(|| {
                let items: Vec<String> = limits
                    .iter()
                    .map(|l| {
                        let (quota, window) = quota_and_window(&l.limit);
                        format!("\"{}\";q={quota};w={window}", l.name())
                    })
                    .collect();
                HeaderValue::from_str(&items.join(", ")).ok()
            })
            .flatten();
        RateLimitHeaders {
            profile,
            policy,
            names,
            enforced: route.enforced.limits.len(),
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

    /// Writes the fields for `verdict`, whose headline limit is `limit`. On a 429, the IETF `t`
    /// is the `Retry-After` instant.
    pub fn write(&self, headers: &mut HeaderMap, v: &Verdict, limit: LimitRef) {
        match self.profile {
            HeaderProfile::None => {}
            HeaderProfile::XRateLimit => {
                headers.insert(X_RATELIMIT_LIMIT, int_value(v.headline.limit));
                headers.insert(X_RATELIMIT_REMAINING, int_value(v.headline.remaining));
                headers.insert(X_RATELIMIT_RESET, HeaderValue::from(v.reset_unix_secs()));
            }
            HeaderProfile::Ietf => {
                if let Some(policy) = &self.policy {
                    headers.insert(RATELIMIT_POLICY, policy.clone());
                }
                let name = self
                    .names
                    .get(limit.index(self.enforced))
                    .map_or("default", String::as_str);
                let t = if v.allowed() {
                    v.headline.reset_after_us.div_ceil(1_000_000)
                } else {
                    v.retry_after_secs()
                };
                let value = format!("\"{name}\";r={};t={t}", v.headline.remaining);
                // The string's buffer becomes the value's: no second copy.
                if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
                    headers.insert(RATELIMIT, value);
                }
            }
        }
    }
}

/// The IETF policy's quota and window (seconds) of a limit: a bucket's window is the time it
/// takes to refill from empty.
fn quota_and_window(limit: &Limit) -> (u64, u64) {
    let algorithm = limit.algorithm();
    let window_us = algorithm.budget_span_us();
    (
        u64::from(algorithm.units()),
        window_us.div_ceil(1_000_000).max(1),
    )
}

/// `body`, which runs `after` (the phase after the response) when it ends (its last frame or an
/// error is read) or is dropped (the client went away).
pub(super) fn with_after_response(body: Body, after: AfterResponse) -> Body {
    Ending { inner: body, after }.boxed_unsync()
}

struct Ending {
    inner: Body,
    after: AfterResponse,
}

impl hyper::body::Body for Ending {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => this.after.frame(frame),
            std::task::Poll::Ready(None) => this.after.run(true),
            std::task::Poll::Ready(Some(Err(_))) => this.after.run(false),
            std::task::Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Ending {
    /// Dropped before its end was polled: complete if the body says it has ended (hyper stops
    /// polling a body whose last frame it has), cut short otherwise (the client went away).
    fn drop(&mut self) {
        let complete = hyper::body::Body::is_end_stream(&self.inner);
        self.after.run(complete);
    }
}

/// A body from bytes floodgate made itself.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

const RATE_LIMITED_DETAIL: &str =
    "rate limit exceeded; retry after the number of seconds in Retry-After";
const INVALID_API_KEY_DETAIL: &str = "the API key is not known";
const INVALID_TOKEN_DETAIL: &str = "the bearer token is missing, malformed, expired, not yet valid, or not signed by a trusted key";
const NO_ROUTE_DETAIL: &str = "no route matches this request";
const LIMITER_UNAVAILABLE_DETAIL: &str = "the rate limiter cannot decide right now";
const GATEWAY_TIMEOUT_DETAIL: &str = "the upstream did not answer in time";

impl Rejection {
    /// The decision label of a refusal that is a limiting decision (a malformed request, say,
    /// decided nothing).
    pub fn label(&self) -> Option<crate::metrics::DecisionLabel> {
        use crate::metrics::DecisionLabel;
        match self {
            Rejection::InvalidApiKey | Rejection::InvalidToken => Some(DecisionLabel::InvalidKey),
            Rejection::RateLimited(..) => Some(DecisionLabel::Denied),
            Rejection::LimiterUnavailable => Some(DecisionLabel::StoreError),
            Rejection::UpstreamOverloaded => Some(DecisionLabel::Overloaded),
            _ => None,
        }
    }

    /// The HTTP status of this rejection (what an HTTP client is answered).
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::NoRoute => StatusCode::NOT_FOUND,
            Rejection::BadRequest(_) => StatusCode::BAD_REQUEST,
            Rejection::InvalidApiKey | Rejection::InvalidToken => StatusCode::UNAUTHORIZED,
            Rejection::RateLimited(..) | Rejection::TooManyStreams => StatusCode::TOO_MANY_REQUESTS,
            Rejection::LimiterUnavailable | Rejection::UpstreamOverloaded => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Rejection::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Rejection::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
            Rejection::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// The response for this rejection in `dialect`; `headers` writes a refusal's rate-limit
    /// fields.
    pub fn respond(self, headers: &RateLimitHeaders, dialect: Dialect) -> Response<Body> {
        match dialect {
            Dialect::Http => self.into_response(headers),
            Dialect::Grpc(rate_limited) => self.into_grpc_response(headers, rate_limited),
        }
    }

    /// The HTTP response for this rejection; `headers` writes a 429's rate-limit fields.
    ///
    /// The bodies that never change (404, 503, 504) are built once; a 429's is built once around
    /// its one variable, `retry_after`, so a denial costs one allocation for its body instead of a
    /// JSON tree. Both come from `problem_json`, so they are the very bytes it would write.
    fn into_response(self, headers: &RateLimitHeaders) -> Response<Body> {
        let (status, body) = match self {
            Rejection::RateLimited(v, limit) => {
                let retry_after = v.retry_after_secs();
                let mut response = Response::new(full(rate_limited_body(retry_after)));
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                let h = response.headers_mut();
                h.insert(RETRY_AFTER, int_value(retry_after));
                headers.write(h, &v, limit);
                h.insert(CONTENT_TYPE, PROBLEM_JSON);
                return response;
            }
            Rejection::NoRoute => (StatusCode::NOT_FOUND, static_body(&NO_ROUTE_BODY)),
            Rejection::InvalidApiKey => {
                (StatusCode::UNAUTHORIZED, static_body(&INVALID_API_KEY_BODY))
            }
            Rejection::InvalidToken => {
                let mut response = Response::new(full(Bytes::from(problem_json(
                    StatusCode::UNAUTHORIZED,
                    "invalid_token",
                    INVALID_TOKEN_DETAIL,
                    None,
                ))));
                *response.status_mut() = StatusCode::UNAUTHORIZED;
                let h = response.headers_mut();
                h.insert(
                    http::header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
                h.insert(CONTENT_TYPE, PROBLEM_JSON);
                return response;
            }
            Rejection::LimiterUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                static_body(&LIMITER_UNAVAILABLE_BODY),
            ),
            Rejection::GatewayTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                static_body(&GATEWAY_TIMEOUT_BODY),
            ),
            Rejection::UpstreamOverloaded => {
                let mut response = Response::new(full(Bytes::from(problem_json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "upstream_overloaded",
                    "the upstream is at the limit of what it serves now; retry after the number of seconds in Retry-After",
                    Some(1),
                ))));
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                response.headers_mut().insert(RETRY_AFTER, int_value(1));
                response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
                return response;
            }
            Rejection::TooManyStreams => {
                let mut response = Response::new(full(Bytes::from(problem_json(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_streams",
                    "this HTTP/2 connection opens streams too fast",
                    Some(1),
                ))));
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                response.headers_mut().insert(RETRY_AFTER, int_value(1));
                response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
                return response;
            }
            Rejection::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                Bytes::from(problem_json(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "the request body is larger than this route accepts (max_body_size)",
                    None,
                )),
            ),
            Rejection::RequestTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                Bytes::from(problem_json(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_body_timeout",
                    "the request body stopped arriving (timeouts.client_body)",
                    None,
                )),
            ),
            Rejection::BadRequest(detail) => (
                StatusCode::BAD_REQUEST,
                Bytes::from(problem_json(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    &detail,
                    None,
                )),
            ),
            Rejection::BadGateway(detail) => (
                StatusCode::BAD_GATEWAY,
                Bytes::from(problem_json(
                    StatusCode::BAD_GATEWAY,
                    "upstream_unreachable",
                    &detail,
                    None,
                )),
            ),
        };
        let mut response = Response::new(full(body));
        *response.status_mut() = status;
        response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
        response
    }
}

/// A problem+json body (RFC 9457) with floodgate's `error` code and, for a 429, `retry_after`.
fn problem_json(status: StatusCode, error: &str, detail: &str, retry_after: Option<u64>) -> String {
    let title = status.canonical_reason().unwrap_or("Error");
    let mut body = serde_json::json!({
        "type": format!("urn:floodgate:problem:{error}"),
        "title": title,
        "status": status.as_u16(),
        "error": error,
        "detail": detail,
    });
    if let Some(retry_after) = retry_after {
        body["retry_after"] = retry_after.into();
    }
    body.to_string()
}

static NO_ROUTE_BODY: LazyLock<&'static str> =
    LazyLock::new(|| problem_json(StatusCode::NOT_FOUND, "no_route", NO_ROUTE_DETAIL, None).leak());
static INVALID_API_KEY_BODY: LazyLock<&'static str> = LazyLock::new(|| {
    problem_json(
        StatusCode::UNAUTHORIZED,
        "invalid_api_key",
        INVALID_API_KEY_DETAIL,
        None,
    )
    .leak()
});
static LIMITER_UNAVAILABLE_BODY: LazyLock<&'static str> = LazyLock::new(|| {
    problem_json(
        StatusCode::SERVICE_UNAVAILABLE,
        "rate_limiter_unavailable",
        LIMITER_UNAVAILABLE_DETAIL,
        None,
    )
    .leak()
});
static GATEWAY_TIMEOUT_BODY: LazyLock<&'static str> = LazyLock::new(|| {
    problem_json(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream_timeout",
        GATEWAY_TIMEOUT_DETAIL,
        None,
    )
    .leak()
});

/// A body built once for the process: cloning it copies nothing.
fn static_body(body: &LazyLock<&'static str>) -> Bytes {
    Bytes::from_static(body.as_bytes())
}

/// The 429 body before and after the `retry_after` number: the full body written once with a
/// number that appears nowhere else, and split there.
static RATE_LIMITED_PARTS: LazyLock<Option<(&'static str, &'static str)>> = LazyLock::new(|| {
    let sentinel = u64::MAX.to_string();
    let body = problem_json(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_exceeded",
        RATE_LIMITED_DETAIL,
        Some(u64::MAX),
    );
    body.split_once(&sentinel)
        .map(|(head, tail)| (&*head.to_string().leak(), &*tail.to_string().leak()))
});

/// The 429 body for `retry_after`: what [`problem_json`] writes, in one allocation.
fn rate_limited_body(retry_after: u64) -> Bytes {
    let Some((head, tail)) = *RATE_LIMITED_PARTS else {
        // Cannot happen (the body always holds its number), but never panic on a request.
        return Bytes::from(problem_json(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            RATE_LIMITED_DETAIL,
            Some(retry_after),
        ));
    };
    let mut body = Vec::with_capacity(head.len() + 20 + tail.len());
    body.extend_from_slice(head.as_bytes());
    let _ = write!(body, "{retry_after}");
    body.extend_from_slice(tail.as_bytes());
    Bytes::from(body)
}

/// Header values for the integers below this are made once (most `Retry-After`s, limits and
/// remaining counts are small); larger ones are formatted per response.
const SMALL_INTS: usize = 1024;

static SMALL_INT_VALUES: LazyLock<Box<[HeaderValue]>> = LazyLock::new(|| {
    (0..SMALL_INTS)
        .map(|n| HeaderValue::from_static(n.to_string().leak()))
        .collect()
});

/// The decimal header value of `n`, without an allocation when `n` is small.
fn int_value(n: u64) -> HeaderValue {
    match usize::try_from(n)
        .ok()
        .and_then(|i| SMALL_INT_VALUES.get(i))
    {
        Some(value) => value.clone(),
        None => HeaderValue::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Decision;
    use crate::limiter::Figures;

    /// The whole body of a response floodgate made itself.
    fn body_of(response: Response<Body>) -> String {
        let bytes = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async { response.into_body().collect().await.unwrap().to_bytes() });
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn the_prebuilt_429_body_is_what_serde_json_writes() {
        for retry_after in [0, 1, 9, 10, 59, 1_000, 123_456_789, u64::MAX] {
            assert_eq!(
                std::str::from_utf8(&rate_limited_body(retry_after)).unwrap(),
                problem_json(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_exceeded",
                    RATE_LIMITED_DETAIL,
                    Some(retry_after)
                )
            );
        }
        let body: serde_json::Value = serde_json::from_slice(&rate_limited_body(7)).unwrap();
        assert_eq!(body["error"], "rate_limit_exceeded");
        assert_eq!(body["retry_after"], 7);
        assert_eq!(body["status"], 429);
    }

    #[test]
    fn a_429_carries_retry_after_content_type_and_the_same_number_in_its_body() {
        let headline = Decision::deny(
            Figures {
                limit: 5,
                remaining: 0,
                reset_after_us: 4_000_000,
            },
            2_500_000,
        );
        let verdict = Verdict {
            now_us: 1_700_000_000_000_000,
            headline,
            headline_index: 0,
            outcome: crate::limiter::Outcome::Denied {
                retry_after_us: 2_500_000,
            },
        };
        let response = Rejection::RateLimited(verdict, LimitRef::Enforced(0))
            .into_response(&RateLimitHeaders::none());
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[RETRY_AFTER], "3");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        let body: serde_json::Value = serde_json::from_str(&body_of(response)).unwrap();
        assert_eq!(body["retry_after"], 3);
    }

    #[test]
    fn the_prebuilt_bodies_are_what_serde_json_writes() {
        let cases = [
            (
                Rejection::NoRoute,
                StatusCode::NOT_FOUND,
                "no_route",
                NO_ROUTE_DETAIL,
            ),
            (
                Rejection::LimiterUnavailable,
                StatusCode::SERVICE_UNAVAILABLE,
                "rate_limiter_unavailable",
                LIMITER_UNAVAILABLE_DETAIL,
            ),
            (
                Rejection::GatewayTimeout,
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                GATEWAY_TIMEOUT_DETAIL,
            ),
        ];
        for (rejection, status, error, detail) in cases {
            let response = rejection.into_response(&RateLimitHeaders::none());
            assert_eq!(response.status(), status);
            assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
            assert_eq!(body_of(response), problem_json(status, error, detail, None));
        }
    }

    #[test]
    fn an_overloaded_upstream_is_a_503_with_retry_after_and_its_own_error() {
        let response = Rejection::UpstreamOverloaded.into_response(&RateLimitHeaders::none());
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        let body: serde_json::Value = serde_json::from_str(&body_of(response)).unwrap();
        assert_eq!(body["error"], "upstream_overloaded");
        assert_eq!(body["retry_after"], 1);
    }

    #[test]
    fn small_and_large_integers_make_the_same_header_values() {
        for n in [0, 1, 42, 1_023, 1_024, 1_700_000_000, u64::MAX] {
            assert_eq!(int_value(n), HeaderValue::from(n), "{n}");
        }
    }
}
