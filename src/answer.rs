//! The one place where floodgate chooses its own statuses and headers, below every front end
//! (the proxy, the rate-limit service's `/json` and `/check`, its gRPC answers): rejections
//! become `application/problem+json` responses (RFC 9457), or for a gRPC call trailers-only gRPC
//! responses ([`crate::grpc`]), by one table (`answer/table.rs`); admitted responses get the
//! rate-limit headers of the configured profile.

use std::io::Write as _;
use std::sync::LazyLock;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

use crate::config::{HeaderProfile, RouteConfig};
use crate::limiter::{Limit, Ruling};
use crate::policy::LimitRef;

/// The body type of every response floodgate sends: an upstream's streamed body or its own.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body's error: hyper's, or one of floodgate's own limits ([`crate::proxy::body`]); one
/// name for it everywhere, declared beside the connections that carry bodies.
pub use crate::upstream::conn::BoxError;

mod grpc;
mod refusals;
mod table;
pub use grpc::Dialect;
pub use refusals::preflight;

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
    /// A rate-limit service request that cannot be decided as it is (an empty domain, no
    /// descriptors): 400, or gRPC `INVALID_ARGUMENT`. Nothing was spent.
    InvalidArgument(String),
    /// An API key no consumer has, under `consumers.unknown_key: reject`: 401.
    InvalidApiKey,
    /// A bearer token that does not verify (`identity.jwt`), or none under `when_missing:
    /// reject`: 401 with `WWW-Authenticate: Bearer error="invalid_token"`, never forwarded.
    InvalidToken,
    /// A limit denied: 429 with `Retry-After`; the verdict and the limit that speaks for it.
    RateLimited(Ruling, LimitRef),
    /// The limiter store failed and `on_error` is `deny`: 503.
    LimiterUnavailable,
    /// The identity is banned (by an operator, or a limit's penalty box) for this many more
    /// seconds: 429 `banned` with `Retry-After`, never forwarded.
    Banned(u64),
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
    /// The route's pool has no endpoint (a name that has not resolved yet): 503 with
    /// `Retry-After: 1`.
    NoUpstream,
    /// The request carries this floodgate's own `Via`: it came back through it (an upstream
    /// that is floodgate itself). 508, never forwarded again.
    LoopDetected,
    /// The rate-limit service could not decide within the gRPC call's own deadline
    /// (`grpc-timeout`): 504, `DEADLINE_EXCEEDED`.
    DeadlineExceeded,
    /// A waiting room's line: 503 `waiting_room` with the client's `position` and the estimated
    /// wait (`eta_seconds`: its position over the room's admission rate), never forwarded.
    WaitingRoom { position: u64, eta_secs: u64 },
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
    /// The route's own bodies for its refusals (`refusals:`), if it has any.
    templates: Option<std::sync::Arc<crate::config::Templates>>,
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
            templates: route.refusals.clone(),
        }
    }

    /// Headers that say nothing (routes without limits).
    pub fn none() -> Self {
        RateLimitHeaders {
            profile: HeaderProfile::None,
            policy: None,
            names: Vec::new(),
            enforced: 0,
            templates: None,
        }
    }

    /// A 429's header section for `v`: the template's clone with its values filled in its
    /// order (`Retry-After`, the profile's fields, `Content-Type`), so that no field is hashed
    /// and placed per refusal. `None` where there is no template (the IETF profile).
    fn refusal(&self, v: &Ruling) -> Option<HeaderMap> {
        let mut map = refusal_template(self.profile)?.clone();
        let mut values = map.values_mut();
        let mut fill = |value: HeaderValue| {
            if let Some(slot) = values.next() {
                *slot = value;
            }
        };
        fill(int_value(v.retry_after_secs()));
        if self.profile == HeaderProfile::XRateLimit {
            fill(limit_value(v.headline.limit));
            fill(int_value(v.headline.remaining));
            fill(unix_secs_value(v.reset_unix_secs()));
        }
        Some(map)
    }

    /// Writes `profile`'s fields for figures a rate-limit service computed (`/check`): `limit`
    /// units, `remaining`, the reset `reset_secs` from now (the Unix second `reset_unix`), and
    /// for a refusal `retry_secs`. The service knows no route's policy: the IETF `RateLimit`
    /// names the policy `default` and no `RateLimit-Policy` is sent.
    pub fn write_figures(
        profile: HeaderProfile,
        headers: &mut HeaderMap,
        limit: u64,
        remaining: u64,
        (reset_secs, reset_unix): (u64, u64),
        retry_secs: Option<u64>,
    ) {
        match profile {
            HeaderProfile::None => {}
            HeaderProfile::XRateLimit => {
                headers.insert(X_RATELIMIT_LIMIT, limit_value(limit));
                headers.insert(X_RATELIMIT_REMAINING, int_value(remaining));
                headers.insert(X_RATELIMIT_RESET, unix_secs_value(reset_unix));
            }
            HeaderProfile::Ietf => {
                let t = retry_secs.unwrap_or(reset_secs);
                let value = format!("\"default\";r={remaining};t={t}");
                if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
                    headers.insert(RATELIMIT, value);
                }
            }
        }
    }

    /// Writes the fields for `verdict`, whose headline limit is `limit`. On a 429, the IETF `t`
    /// is the `Retry-After` instant.
    pub fn write(&self, headers: &mut HeaderMap, v: &Ruling, limit: LimitRef) {
        match self.profile {
            HeaderProfile::None => {}
            HeaderProfile::XRateLimit => {
                headers.insert(X_RATELIMIT_LIMIT, limit_value(v.headline.limit));
                headers.insert(X_RATELIMIT_REMAINING, int_value(v.headline.remaining));
                headers.insert(X_RATELIMIT_RESET, unix_secs_value(v.reset_unix_secs()));
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

/// A body from bytes floodgate made itself.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

impl Rejection {
    /// The decision label of a refusal that is a limiting decision (a malformed request, say,
    /// decided nothing).
    pub fn label(&self) -> Option<crate::metrics::DecisionLabel> {
        self.row().label
    }

    /// The HTTP status of this rejection (what an HTTP client is answered).
    pub fn status(&self) -> StatusCode {
        self.row().status
    }

    /// The response for this rejection in `dialect`; `headers` writes a refusal's rate-limit
    /// fields.
    pub fn respond(self, headers: &RateLimitHeaders, dialect: Dialect) -> Response<Body> {
        match dialect {
            Dialect::Http => self.into_response(headers),
            Dialect::Grpc(rate_limited) => self.into_grpc_response(headers, rate_limited),
        }
    }

    /// The HTTP response for this rejection (its row of the table, `table.rs`); `headers`
    /// writes a 429's rate-limit fields.
    ///
    /// A body that never changes is built once per process; a 429's is built once around its
    /// one variable, `retry_after`, so a denial costs one allocation for its body instead of a
    /// JSON tree. Both come from `problem_json`, so they are the very bytes it would write.
    fn into_response(self, headers: &RateLimitHeaders) -> Response<Body> {
        let answer = self.row();
        let (body, retry_after) = match &self {
            Rejection::RateLimited(v, _) => {
                let retry_after = v.retry_after_secs();
                (rate_limited_body(retry_after), Some(retry_after))
            }
            Rejection::Banned(secs) => (
                Bytes::from(problem_json(
                    answer.status,
                    answer.error,
                    &http_detail(answer.message, Some(*secs)),
                    Some(*secs),
                )),
                Some(*secs),
            ),
            Rejection::WaitingRoom { position, eta_secs } => {
                let retry = waiting_room_retry(*eta_secs);
                let detail = http_detail(answer.message, Some(retry));
                let mut body = problem(answer.status, answer.error, &detail, None);
                body["position"] = (*position).into();
                body["eta_seconds"] = (*eta_secs).into();
                (Bytes::from(body.to_string()), Some(retry))
            }
            Rejection::BadRequest(_) | Rejection::BadGateway(_) | Rejection::InvalidArgument(_) => {
                (
                    Bytes::from(problem_json(
                        answer.status,
                        answer.error,
                        self.message(),
                        answer.retry_secs,
                    )),
                    answer.retry_secs,
                )
            }
            _ => {
                let body = answer.body.get_or_init(|| {
                    let detail = http_detail(answer.message, answer.retry_secs);
                    problem_json(answer.status, answer.error, &detail, answer.retry_secs).leak()
                });
                (Bytes::from_static(body.as_bytes()), answer.retry_secs)
            }
        };
        // The route's own template for this refusal, if it has one: its body (and status and
        // type) instead of the problem+json; every header below is written all the same.
        let template = (headers.templates.as_deref())
            .and_then(|t| Some((t.get(self.refusal_name()?)?, &t.route)));
        let (body, status) = match template {
            None => (body, answer.status),
            Some((template, route)) => {
                let (limit, remaining) = match &self {
                    Rejection::RateLimited(v, _) => (v.headline.limit, v.headline.remaining),
                    _ => (0, 0),
                };
                let figures = crate::config::Figures {
                    retry_after: retry_after.unwrap_or(0),
                    limit,
                    remaining,
                    route,
                };
                (template.body(&figures), template.status(answer.status))
            }
        };
        let mut response = Response::new(full(body));
        *response.status_mut() = status;
        if let Rejection::RateLimited(v, _) = &self
            && let Some(map) = headers.refusal(v)
        {
            *response.headers_mut() = map;
            if let Some((template, _)) = template {
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, template.content_type());
            }
            return response;
        }
        // Sized once for what a refusal carries (Retry-After, three or two rate-limit fields,
        // Content-Type, and a route's `response_headers`): an empty map would allocate on the
        // first insert and again as it grew.
        *response.headers_mut() = HeaderMap::with_capacity(REFUSAL_HEADERS);
        let h = response.headers_mut();
        if let Some(retry_after) = retry_after {
            h.insert(RETRY_AFTER, int_value(retry_after));
        }
        match &self {
            Rejection::RateLimited(v, limit) => headers.write(h, v, *limit),
            Rejection::InvalidToken => {
                h.insert(
                    http::header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
            }
            _ => {}
        }
        match template {
            Some((template, _)) => h.insert(CONTENT_TYPE, template.content_type()),
            None => h.insert(CONTENT_TYPE, PROBLEM_JSON),
        };
        response
    }
}

impl Rejection {
    /// For a browser (`Accept: text/html`) in a waiting room's line: a small page that says its
    /// place and refreshes itself when it may ask again (503, with `Retry-After`). `None` for
    /// any other refusal.
    pub fn page(&self) -> Option<Response<Body>> {
        let Rejection::WaitingRoom { position, eta_secs } = self else {
            return None;
        };
        let retry = waiting_room_retry(*eta_secs);
        let html = format!(
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta http-equiv=\"refresh\" content=\"{retry}\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>You are in line</title></head>\
             <body><main><h1>You are in line</h1>\
             <p>Many are asking at once. You will be let in in turn: this page asks again by itself.</p>\
             <p>Your place: <strong id=\"position\">{position}</strong>. \
             Estimated wait: <strong id=\"eta\">{eta_secs}</strong> s.</p></main></body></html>\n"
        );
        let mut response = Response::new(full(Bytes::from(html)));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER, int_value(retry));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        headers.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
        Some(response)
    }
}

/// A waiting client's `Retry-After`: its estimated wait, at least 1 s and at most 5 s (so a
/// client keeps its place, and is told soon when its turn comes).
pub fn waiting_room_retry(eta_secs: u64) -> u64 {
    eta_secs.clamp(1, 5)
}

/// A problem's `detail` for HTTP: the message, and where a retry delay is known, where to find
/// it.
fn http_detail(message: &str, retry: Option<u64>) -> std::borrow::Cow<'_, str> {
    match retry {
        Some(_) => format!("{message}; retry after the number of seconds in Retry-After").into(),
        None => message.into(),
    }
}

/// A problem+json body (RFC 9457) with floodgate's `error` code and, for a 429, `retry_after`.
fn problem_json(status: StatusCode, error: &str, detail: &str, retry_after: Option<u64>) -> String {
    problem(status, error, detail, retry_after).to_string()
}

/// [`problem_json`]'s document, for a refusal that adds fields of its own.
fn problem(
    status: StatusCode,
    error: &str,
    detail: &str,
    retry_after: Option<u64>,
) -> serde_json::Value {
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
    body
}

/// A rate-limited request's message (the table's, `table.rs`).
const RATE_LIMITED_MESSAGE: &str = "rate limit exceeded";

/// The 429 body before and after the `retry_after` number: the full body written once with a
/// number that appears nowhere else, and split there.
static RATE_LIMITED_PARTS: LazyLock<Option<(&'static str, &'static str)>> = LazyLock::new(|| {
    let sentinel = u64::MAX.to_string();
    let body = problem_json(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_exceeded",
        &http_detail(RATE_LIMITED_MESSAGE, Some(0)),
        Some(u64::MAX),
    );
    body.split_once(&sentinel)
        .map(|(head, tail)| (&*head.to_string().leak(), &*tail.to_string().leak()))
});

/// The header map's room in a refusal (see `into_response`).
const REFUSAL_HEADERS: usize = 12;

/// A 429's header section in `profile`, made once (`None` for the IETF profile, whose field is
/// formatted per answer and inserted): [`RateLimitHeaders::refusal`] clones it and fills its
/// values in order.
fn refusal_template(profile: HeaderProfile) -> Option<&'static HeaderMap> {
    static TEMPLATES: LazyLock<[Option<HeaderMap>; 2]> = LazyLock::new(|| {
        [
            made_refusal_template(HeaderProfile::XRateLimit),
            made_refusal_template(HeaderProfile::None),
        ]
    });
    match profile {
        HeaderProfile::XRateLimit => TEMPLATES[0].as_ref(),
        HeaderProfile::None => TEMPLATES[1].as_ref(),
        HeaderProfile::Ietf => None,
    }
}

/// [`refusal_template`]'s map for `profile`, its values placeholders. Its index has room for a
/// route's `response_headers` too (added to the clone, they grow only its list of fields).
fn made_refusal_template(profile: HeaderProfile) -> Option<HeaderMap> {
    let mut map = HeaderMap::with_capacity(REFUSAL_HEADERS);
    let zero = HeaderValue::from_static("0");
    map.insert(RETRY_AFTER, zero.clone());
    match profile {
        HeaderProfile::XRateLimit => {
            map.insert(X_RATELIMIT_LIMIT, zero.clone());
            map.insert(X_RATELIMIT_REMAINING, zero.clone());
            map.insert(X_RATELIMIT_RESET, zero);
        }
        HeaderProfile::None => {}
        HeaderProfile::Ietf => return None,
    }
    map.insert(CONTENT_TYPE, PROBLEM_JSON);
    Some(map)
}

/// The 429 bodies for the small `retry_after`s (below [`SMALL_INTS`]: most are seconds), each
/// made the first time it is needed and kept (at most 1,024 of about 190 bytes), so that a
/// refusal in a surge shares its body instead of writing one.
static RATE_LIMITED_BODIES: LazyLock<Box<[std::sync::OnceLock<&'static [u8]>]>> =
    LazyLock::new(|| {
        (0..SMALL_INTS)
            .map(|_| std::sync::OnceLock::new())
            .collect()
    });

/// The 429 body for `retry_after`: what `problem_json` writes; shared when `retry_after` is
/// small, else written in one allocation.
pub fn rate_limited_body(retry_after: u64) -> Bytes {
    if let Some(slot) = usize::try_from(retry_after)
        .ok()
        .and_then(|i| RATE_LIMITED_BODIES.get(i))
    {
        let body = slot.get_or_init(|| written_rate_limited_body(retry_after).to_vec().leak());
        return Bytes::from_static(body);
    }
    written_rate_limited_body(retry_after)
}

/// The 429 body for `retry_after`, written around the number.
fn written_rate_limited_body(retry_after: u64) -> Bytes {
    let Some((head, tail)) = *RATE_LIMITED_PARTS else {
        // Cannot happen (the body always holds its number), but never panic on a request.
        return Bytes::from(problem_json(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            &http_detail(RATE_LIMITED_MESSAGE, Some(retry_after)),
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

thread_local! {
    /// The last Unix second each thread wrote as a header value (`X-RateLimit-Reset`), and
    /// that value: within a second, most answers name the same one (a fixed window's end, or
    /// now plus a full bucket's refill), so it is formatted once and shared, as nginx caches its
    /// `Date`.
    static LAST_UNIX_SECS: std::cell::RefCell<(u64, HeaderValue)> =
        const { std::cell::RefCell::new((0, HeaderValue::from_static("0"))) };
    /// The same for the last limit too large for the shared values (`X-RateLimit-Limit`): a
    /// route's limit is one number, so a thread's answers name the same one (a GitHub-style
    /// 5,000 an hour, say) and it is formatted once.
    static LAST_LIMIT: std::cell::RefCell<(u64, HeaderValue)> =
        const { std::cell::RefCell::new((0, HeaderValue::from_static("0"))) };
}

/// The decimal header value of `secs`, a Unix second: shared with the thread's previous answer
/// when it names the same second.
fn unix_secs_value(secs: u64) -> HeaderValue {
    shared_value(&LAST_UNIX_SECS, secs)
}

/// The decimal header value of `limit`, a limit's units: shared with the thread's previous
/// answer when it names the same limit.
fn limit_value(limit: u64) -> HeaderValue {
    shared_value(&LAST_LIMIT, limit)
}

/// The decimal header value of `n`: a shared value when small, else the one `last` holds when
/// it is `n`'s, else formatted and kept there.
fn shared_value(
    last: &'static std::thread::LocalKey<std::cell::RefCell<(u64, HeaderValue)>>,
    n: u64,
) -> HeaderValue {
    if n < SMALL_INTS as u64 {
        return int_value(n);
    }
    // (Formatted afresh if the thread's cache is in use or already gone.)
    last.try_with(|last| {
        let mut last = last.try_borrow_mut().ok()?;
        if last.0 != n {
            *last = (n, HeaderValue::from(n));
        }
        Some(last.1.clone())
    })
    .ok()
    .flatten()
    .unwrap_or_else(|| HeaderValue::from(n))
}

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
                    &http_detail(RATE_LIMITED_MESSAGE, Some(retry_after)),
                    Some(retry_after)
                )
            );
        }
        let body: serde_json::Value = serde_json::from_slice(&rate_limited_body(7)).unwrap();
        assert_eq!(body["error"], "rate_limit_exceeded");
        assert_eq!(body["retry_after"], 7);
        assert_eq!(body["status"], 429);
    }

    /// A denial of a limit of 5, retry after 2.5 s.
    fn denied() -> Ruling {
        let headline = Decision::deny(
            Figures {
                limit: 5,
                remaining: 0,
                reset_after_us: 4_000_000,
            },
            2_500_000,
        );
        Ruling {
            now_us: 1_700_000_000_000_000,
            headline,
            headline_index: 0,
            outcome: crate::limiter::Outcome::Denied {
                retry_after_us: 2_500_000,
            },
            denied: 1,
        }
    }

    #[test]
    fn a_429_carries_retry_after_content_type_and_the_same_number_in_its_body() {
        let verdict = denied();
        let response = Rejection::RateLimited(verdict, LimitRef::Enforced(0))
            .into_response(&RateLimitHeaders::none());
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[RETRY_AFTER], "3");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        let body: serde_json::Value = serde_json::from_str(&body_of(response)).unwrap();
        assert_eq!(body["retry_after"], 3);
    }

    /// A 429's header section from the template (cloned, its values filled in order) is the one
    /// the fields' inserts write: the same fields in the same order with the same values, for
    /// small numbers (shared values) and large ones, in each profile that has a template.
    #[test]
    fn a_refusals_template_writes_what_its_inserts_would() {
        let mut large = denied();
        large.headline.limit = 5_000;
        large.headline.remaining = 4_000;
        large.outcome = crate::limiter::Outcome::Denied {
            retry_after_us: 3_600_000_000,
        };
        for profile in [HeaderProfile::XRateLimit, HeaderProfile::None] {
            let headers = RateLimitHeaders {
                profile,
                ..RateLimitHeaders::none()
            };
            for v in [denied(), large] {
                let response =
                    Rejection::RateLimited(v, LimitRef::Enforced(0)).into_response(&headers);
                let mut expected = HeaderMap::new();
                expected.insert(RETRY_AFTER, HeaderValue::from(v.retry_after_secs()));
                RateLimitHeaders::write_figures(
                    profile,
                    &mut expected,
                    v.headline.limit,
                    v.headline.remaining,
                    (0, v.reset_unix_secs()),
                    Some(v.retry_after_secs()),
                );
                expected.insert(CONTENT_TYPE, PROBLEM_JSON);
                let got: Vec<_> = response.headers().iter().collect();
                let want: Vec<_> = expected.iter().collect();
                assert_eq!(got, want, "{profile:?}");
            }
        }
        assert!(refusal_template(HeaderProfile::Ietf).is_none());
        assert!(made_refusal_template(HeaderProfile::Ietf).is_none());
    }

    /// Every kind of refusal once, with a verdict where one is needed.
    fn every_rejection() -> Vec<Rejection> {
        let verdict = denied();
        vec![
            Rejection::NoRoute,
            Rejection::BadRequest("two Host headers".into()),
            Rejection::InvalidApiKey,
            Rejection::InvalidToken,
            Rejection::RateLimited(verdict, LimitRef::Enforced(0)),
            Rejection::LimiterUnavailable,
            Rejection::BadGateway("cannot connect to the upstream".into()),
            Rejection::GatewayTimeout,
            Rejection::PayloadTooLarge,
            Rejection::RequestTimeout,
            Rejection::TooManyStreams,
            Rejection::UpstreamOverloaded,
            Rejection::Banned(7),
            Rejection::InvalidArgument("the domain is empty".into()),
            Rejection::NoUpstream,
            Rejection::LoopDetected,
            Rejection::DeadlineExceeded,
        ]
    }

    #[test]
    fn every_refusal_says_its_row_in_http_and_in_grpc() {
        for rejection in every_rejection() {
            let answer = rejection.row();
            let message = rejection.message().to_string();
            // HTTP: the row's status and problem type, the message, its retry delay; a body
            // built once is what serde_json writes.
            let response = rejection.clone().into_response(&RateLimitHeaders::none());
            assert_eq!(response.status(), answer.status, "{rejection:?}");
            assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
            let retry = response
                .headers()
                .get(RETRY_AFTER)
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            let text = body_of(response);
            assert_eq!(
                text,
                problem_json(
                    answer.status,
                    answer.error,
                    &http_detail(&message, retry),
                    retry
                ),
                "{rejection:?}"
            );
            // A ban carries its own delay (how long it has left).
            assert_eq!(
                retry.is_some(),
                answer.retry_secs.is_some()
                    || answer.label == Some(crate::metrics::DecisionLabel::Denied)
                    || matches!(rejection, Rejection::Banned(_)),
                "{rejection:?}"
            );
            // gRPC: a trailers-only 200 with the row's code (a rate-limited call: the
            // route's), the same message.
            let rate_limited = crate::grpc::RateLimitedStatus::Unavailable;
            let grpc = rejection
                .clone()
                .respond(&RateLimitHeaders::none(), Dialect::Grpc(rate_limited));
            assert_eq!(grpc.status(), StatusCode::OK);
            let code = match rejection {
                Rejection::RateLimited(..) => rate_limited.code(),
                _ => answer.grpc,
            };
            assert_eq!(
                grpc.headers()[crate::grpc::GRPC_STATUS],
                code.as_u8().to_string().as_str(),
                "{rejection:?}"
            );
            assert_eq!(rejection.label(), answer.label);
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

    #[test]
    fn a_unix_second_or_a_limit_is_written_again_when_it_changes() {
        // The thread's cache: the same second twice, then the next, then back, then a small
        // figure (from the shared table).
        for n in [
            1_700_000_000,
            1_700_000_000,
            1_700_000_001,
            1_700_000_000,
            7,
            u64::MAX,
        ] {
            assert_eq!(unix_secs_value(n), HeaderValue::from(n), "{n}");
            // A limit's cache is its own: interleaved, neither hands out the other's value.
            assert_eq!(
                limit_value(n.saturating_add(1)),
                HeaderValue::from(n.saturating_add(1)),
                "{n}"
            );
        }
    }

    #[test]
    fn a_shared_429_body_is_the_one_written_for_its_retry_after() {
        // Twice each: the first makes the shared body, the second takes it; 1,024 and above
        // are written per answer.
        for retry_after in [0, 1, 1, 1_023, 1_023, 1_024, 1_024] {
            assert_eq!(
                rate_limited_body(retry_after),
                written_rate_limited_body(retry_after),
                "{retry_after}"
            );
        }
        let body: serde_json::Value = serde_json::from_slice(&rate_limited_body(1)).unwrap();
        assert_eq!(body["retry_after"], 1);
    }
}
