//! The one table from a refusal to its answer (linkerd2-proxy's `SyntheticHttpResponse`): each
//! kind of [`Rejection`] has its HTTP status, problem type, gRPC status, message, retry delay
//! and decision label in one row, which the problem+json rendering (`response.rs`) and the
//! trailers-only gRPC rendering (`grpc.rs`) both read. Adding a refusal is one variant and one
//! row.

use std::sync::OnceLock;

use http::StatusCode;

use super::Rejection;
use crate::grpc::Code;
use crate::metrics::DecisionLabel;

/// How floodgate answers one kind of refusal.
#[derive(Debug)]
pub(super) struct Row {
    /// What an HTTP client is answered.
    pub status: StatusCode,
    /// The problem+json `error` (and `type`, `urn:floodgate:problem:{error}`).
    pub error: &'static str,
    /// What a gRPC call is answered (a rate-limited call: what its route says instead).
    pub grpc: Code,
    /// The problem's `detail` and the `grpc-message`, unless the refusal carries its own.
    pub message: &'static str,
    /// The retry delay when it is known without a verdict (a rate-limited call's comes from
    /// its verdict): `Retry-After`, the body's `retry_after`, gRPC's pushback and `RetryInfo`.
    pub retry_secs: Option<u64>,
    /// The decision it counts as (`floodgate_requests_total{decision}`), if it is one.
    pub label: Option<DecisionLabel>,
    /// Its problem+json body, written once (for a row whose body never changes).
    pub body: OnceLock<&'static str>,
}

/// A row: status, problem type, gRPC status, message, retry delay, decision label.
const fn row(
    status: StatusCode,
    error: &'static str,
    grpc: Code,
    message: &'static str,
    retry_secs: Option<u64>,
    label: Option<DecisionLabel>,
) -> Row {
    Row {
        status,
        error,
        grpc,
        message,
        retry_secs,
        label,
        body: OnceLock::new(),
    }
}

static NO_ROUTE: Row = row(
    StatusCode::NOT_FOUND,
    "no_route",
    Code::Unimplemented,
    "no route matches this request",
    None,
    None,
);
static BAD_REQUEST: Row = row(
    StatusCode::BAD_REQUEST,
    "bad_request",
    Code::Internal,
    "the request is malformed",
    None,
    None,
);
static INVALID_ARGUMENT: Row = row(
    StatusCode::BAD_REQUEST,
    "invalid_argument",
    Code::InvalidArgument,
    "the rate-limit request cannot be decided as it is",
    None,
    None,
);
static INVALID_API_KEY: Row = row(
    StatusCode::UNAUTHORIZED,
    "invalid_api_key",
    Code::Unauthenticated,
    "the API key is not known",
    None,
    Some(DecisionLabel::InvalidKey),
);
static INVALID_TOKEN: Row = row(
    StatusCode::UNAUTHORIZED,
    "invalid_token",
    Code::Unauthenticated,
    "the bearer token is missing, malformed, expired, not yet valid, or not signed by a trusted key",
    None,
    Some(DecisionLabel::InvalidKey),
);
static RATE_LIMITED: Row = row(
    StatusCode::TOO_MANY_REQUESTS,
    "rate_limit_exceeded",
    Code::ResourceExhausted,
    "rate limit exceeded",
    None,
    Some(DecisionLabel::Denied),
);
static BANNED: Row = row(
    StatusCode::TOO_MANY_REQUESTS,
    "banned",
    Code::ResourceExhausted,
    "this client is banned for a while",
    None,
    Some(DecisionLabel::Banned),
);
static LIMITER_UNAVAILABLE: Row = row(
    StatusCode::SERVICE_UNAVAILABLE,
    "rate_limiter_unavailable",
    Code::Unavailable,
    "the rate limiter cannot decide right now",
    None,
    Some(DecisionLabel::StoreError),
);
static BAD_GATEWAY: Row = row(
    StatusCode::BAD_GATEWAY,
    "upstream_unreachable",
    Code::Unavailable,
    "the upstream could not be reached",
    None,
    None,
);
static GATEWAY_TIMEOUT: Row = row(
    StatusCode::GATEWAY_TIMEOUT,
    "upstream_timeout",
    Code::DeadlineExceeded,
    "the upstream did not answer in time",
    None,
    None,
);
static PAYLOAD_TOO_LARGE: Row = row(
    StatusCode::PAYLOAD_TOO_LARGE,
    "payload_too_large",
    Code::ResourceExhausted,
    "the request body is larger than this route accepts (max_body_size)",
    None,
    None,
);
static REQUEST_TIMEOUT: Row = row(
    StatusCode::REQUEST_TIMEOUT,
    "request_body_timeout",
    Code::DeadlineExceeded,
    "the request body stopped arriving (timeouts.client_body)",
    None,
    None,
);
static TOO_MANY_STREAMS: Row = row(
    StatusCode::TOO_MANY_REQUESTS,
    "too_many_streams",
    Code::ResourceExhausted,
    "this HTTP/2 connection opens streams too fast",
    Some(1),
    None,
);
static UPSTREAM_OVERLOADED: Row = row(
    StatusCode::SERVICE_UNAVAILABLE,
    "upstream_overloaded",
    Code::Unavailable,
    "the upstream is at the limit of what it serves now",
    Some(1),
    Some(DecisionLabel::Overloaded),
);

static WAITING_ROOM: Row = row(
    StatusCode::SERVICE_UNAVAILABLE,
    "waiting_room",
    Code::Unavailable,
    "many are asking at once: you are in line, and will be let in in turn",
    None,
    Some(DecisionLabel::Waiting),
);

static NO_UPSTREAM: Row = row(
    StatusCode::SERVICE_UNAVAILABLE,
    "no_upstream",
    Code::Unavailable,
    "the route's upstream has no endpoint (its name has not resolved)",
    Some(1),
    None,
);

static LOOP_DETECTED: Row = row(
    StatusCode::LOOP_DETECTED,
    "loop_detected",
    Code::Internal,
    "the request came back through this floodgate: its upstream leads to itself",
    None,
    None,
);
static DEADLINE_EXCEEDED: Row = row(
    StatusCode::GATEWAY_TIMEOUT,
    "deadline_exceeded",
    Code::DeadlineExceeded,
    "no decision within the call's deadline",
    None,
    None,
);

impl Rejection {
    /// This refusal's row of the table.
    pub(super) fn row(&self) -> &'static Row {
        match self {
            Rejection::NoRoute => &NO_ROUTE,
            Rejection::BadRequest(_) => &BAD_REQUEST,
            Rejection::InvalidArgument(_) => &INVALID_ARGUMENT,
            Rejection::InvalidApiKey => &INVALID_API_KEY,
            Rejection::InvalidToken => &INVALID_TOKEN,
            Rejection::RateLimited(..) => &RATE_LIMITED,
            Rejection::LimiterUnavailable => &LIMITER_UNAVAILABLE,
            Rejection::Banned(_) => &BANNED,
            Rejection::BadGateway(_) => &BAD_GATEWAY,
            Rejection::GatewayTimeout => &GATEWAY_TIMEOUT,
            Rejection::PayloadTooLarge => &PAYLOAD_TOO_LARGE,
            Rejection::RequestTimeout => &REQUEST_TIMEOUT,
            Rejection::TooManyStreams => &TOO_MANY_STREAMS,
            Rejection::UpstreamOverloaded => &UPSTREAM_OVERLOADED,
            Rejection::NoUpstream => &NO_UPSTREAM,
            Rejection::LoopDetected => &LOOP_DETECTED,
            Rejection::DeadlineExceeded => &DEADLINE_EXCEEDED,
            Rejection::WaitingRoom { .. } => &WAITING_ROOM,
        }
    }

    /// The message it is said with: its own (what was malformed, why the upstream failed), or
    /// its row's.
    pub(super) fn message(&self) -> &str {
        match self {
            Rejection::BadRequest(detail)
            | Rejection::BadGateway(detail)
            | Rejection::InvalidArgument(detail) => detail,
            other => other.row().message,
        }
    }
}
