//! What every answer of the demo upstream is made of: its body type, and a JSON answer.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};

/// Every response's body: whole, or an event stream (`chat.rs`).
pub type DemoBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BodyError>;

/// Why a response body broke off (only a stream cut on purpose, `x-demo-cut-after`).
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A response with a JSON body and `Content-Type: application/json`.
pub(crate) fn json_response(status: StatusCode, body: serde_json::Value) -> Response<DemoBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
