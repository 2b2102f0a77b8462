//! Floodgate's own answers to a gRPC call: trailers-only gRPC responses in place of HTTP
//! statuses ([`crate::grpc`] has the protocol's words).

use bytes::Bytes;
use http::{HeaderMap, Response};

use super::{Body, RateLimitHeaders, Rejection, full};
use crate::grpc::{self, RateLimitedStatus};

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
    /// The trailers-only gRPC response for this rejection (its row of the table, `table.rs`):
    /// HTTP 200, the gRPC status and message in the only HEADERS frame, and the retry delay
    /// where one is known.
    pub(super) fn into_grpc_response(
        self,
        headers: &RateLimitHeaders,
        rate_limited: RateLimitedStatus,
    ) -> Response<Body> {
        let mut response = Response::new(full(Bytes::new()));
        let h = response.headers_mut();
        let answer = self.row();
        let (code, retry) = match &self {
            Rejection::RateLimited(v, limit) => {
                headers.write(h, v, *limit);
                let retry = std::time::Duration::from_micros(v.retry_after_us());
                (rate_limited.code(), Some(retry))
            }
            Rejection::Banned(secs) => (answer.grpc, Some(std::time::Duration::from_secs(*secs))),
            _ => (
                answer.grpc,
                answer.retry_secs.map(std::time::Duration::from_secs),
            ),
        };
        let message = self.message();
        grpc::write_status(h, code, message, retry);
        response
    }
}
