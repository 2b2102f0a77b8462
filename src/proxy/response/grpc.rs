//! Floodgate's own answers to a gRPC call: trailers-only gRPC responses in place of HTTP
//! statuses ([`crate::grpc`] has the protocol's words).

use bytes::Bytes;
use http::{HeaderMap, Response};

use super::{
    Body, GATEWAY_TIMEOUT_DETAIL, INVALID_API_KEY_DETAIL, INVALID_TOKEN_DETAIL,
    LIMITER_UNAVAILABLE_DETAIL, NO_ROUTE_DETAIL, RateLimitHeaders, Rejection, full,
};
use crate::grpc::{self, Code, RateLimitedStatus};

/// The words a rejection is said in: HTTP's, or gRPC's for a gRPC call (its `content-type`),
/// with the status the route gives a rate-limited call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Http,
    Grpc(RateLimitedStatus),
}

impl Dialect {
    /// The dialect of a request with `headers` on a route whose rate-limited gRPC calls get
    /// `rate_limited`.
    pub fn of(headers: &HeaderMap, rate_limited: RateLimitedStatus) -> Dialect {
        if grpc::is_grpc(headers) {
            Dialect::Grpc(rate_limited)
        } else {
            Dialect::Http
        }
    }
}

impl Rejection {
    /// The trailers-only gRPC response for this rejection: HTTP 200, the gRPC status and
    /// message in the only HEADERS frame, and the retry delay where one is known.
    pub(super) fn into_grpc_response(
        self,
        headers: &RateLimitHeaders,
        rate_limited: RateLimitedStatus,
    ) -> Response<Body> {
        let mut response = Response::new(full(Bytes::new()));
        let h = response.headers_mut();
        let one_second = Some(std::time::Duration::from_secs(1));
        let (code, message, retry): (Code, &str, _) = match &self {
            Rejection::RateLimited(v, limit) => {
                headers.write(h, v, *limit);
                let retry = std::time::Duration::from_micros(v.retry_after_us());
                (rate_limited.code(), "rate limit exceeded", Some(retry))
            }
            Rejection::NoRoute => (Code::Unimplemented, NO_ROUTE_DETAIL, None),
            Rejection::BadRequest(detail) => (Code::Internal, detail.as_str(), None),
            Rejection::InvalidApiKey => (Code::Unauthenticated, INVALID_API_KEY_DETAIL, None),
            Rejection::InvalidToken => (Code::Unauthenticated, INVALID_TOKEN_DETAIL, None),
            Rejection::LimiterUnavailable => (Code::Unavailable, LIMITER_UNAVAILABLE_DETAIL, None),
            Rejection::BadGateway(detail) => (Code::Unavailable, detail.as_str(), None),
            Rejection::GatewayTimeout => (Code::DeadlineExceeded, GATEWAY_TIMEOUT_DETAIL, None),
            Rejection::PayloadTooLarge => (
                Code::ResourceExhausted,
                "the request body is larger than this route accepts (max_body_size)",
                None,
            ),
            Rejection::RequestTimeout => (
                Code::DeadlineExceeded,
                "the request body stopped arriving (timeouts.client_body)",
                None,
            ),
            Rejection::TooManyStreams => (
                Code::ResourceExhausted,
                "this HTTP/2 connection opens streams too fast",
                one_second,
            ),
            Rejection::UpstreamOverloaded => (
                Code::Unavailable,
                "the upstream is at the limit of what it serves now",
                one_second,
            ),
        };
        grpc::write_status(h, code, message, retry);
        response
    }
}
