//! The service's listener: one port for gRPC over HTTP/2 (h2c, or TLS with ALPN) and HTTP/1.1.
//!
//! - `POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: Envoy's call. The
//!   answer is a gRPC message with `grpc-status: 0`, or a trailers-only gRPC status:
//!   `INVALID_ARGUMENT` for a request that cannot be decided, `UNAVAILABLE` when the store
//!   failed under `on_error: deny`, `DEADLINE_EXCEEDED` past the caller's `grpc-timeout`.
//! - `POST /json`: envoyproxy/ratelimit's JSON, 200 when OK and 429 when over the limit.
//! - `GET /check`: forward auth ([`super::forward_auth`]).
//! - `GET /healthz`.
//!
//! Every refusal is a row of the one refusal table (`answer/table.rs`), rendered in
//! gRPC's words or as problem+json.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prost::Message;

use super::rls::{RateLimitRequest, RateLimitResponse};
use super::{Answer, Failure, Service};
use crate::answer::{self, Body, RateLimitHeaders, Rejection};
use crate::config::ServiceConfig;
use crate::grpc;

/// The gRPC method's path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The largest request message or JSON body read (a descriptor list is a few hundred bytes).
const MAX_REQUEST_BYTES: usize = 1 << 20;
/// How long a request body may take to arrive whole (a few hundred bytes: a client slower than
/// this is holding the connection, not sending).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the listener needs: the service, the config of its port.
#[derive(Clone)]
pub struct ServiceState {
    pub service: Arc<Service>,
    pub config: Arc<ServiceConfig>,
}

/// The answer to one request on the service's port (served by `server/listener.rs`, as every
/// port is).
pub async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    state: &ServiceState,
) -> Response<Body> {
    let path = req.uri().path();
    if grpc::is_grpc(req.headers()) {
        if path != SHOULD_RATE_LIMIT || req.method() != Method::POST {
            // UNIMPLEMENTED, the table's gRPC word for no route.
            return Rejection::NoRoute.respond(
                &RateLimitHeaders::none(),
                answer::Dialect::Grpc(Default::default()),
            );
        }
        return should_rate_limit(req, state).await;
    }
    match (req.method(), path) {
        (&Method::POST, "/json") => json(req, state).await,
        (&Method::GET | &Method::HEAD, "/check") => check(req, peer, state).await,
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        _ => Rejection::NoRoute.respond(&RateLimitHeaders::none(), answer::Dialect::Http),
    }
}

/// Envoy's `ShouldRateLimit`, within the caller's `grpc-timeout`.
async fn should_rate_limit(req: Request<Incoming>, state: &ServiceState) -> Response<Body> {
    let trace = state.service.proxy().telemetry().map(|t| {
        t.rpc_span(
            "envoy.service.ratelimit.v3.RateLimitService",
            "ShouldRateLimit",
            req.headers(),
        )
    });
    let response = should_rate_limit_traced(req, state).await;
    if let Some(trace) = trace {
        let code = response
            .headers()
            .get(grpc::GRPC_STATUS)
            .and_then(|v| v.to_str().ok()?.parse::<i64>().ok())
            .unwrap_or(0);
        trace.set(|| opentelemetry::KeyValue::new("rpc.grpc.status_code", code));
        if let Some(&Decision(decision)) = response.extensions().get::<Decision>() {
            trace.set(|| opentelemetry::KeyValue::new("floodgate.decision", decision));
        }
        trace.end(response.status().as_u16());
    }
    response
}

/// The decision a `ShouldRateLimit` answer carries, for its span: `ok` or `over_limit`.
#[derive(Clone, Copy)]
struct Decision(&'static str);

async fn should_rate_limit_traced(req: Request<Incoming>, state: &ServiceState) -> Response<Body> {
    let deadline = grpc::timeout(req.headers());
    let message = match read_message(req.into_body()).await {
        Ok(message) => message,
        Err(Unread::TooLarge(len)) => {
            tracing::debug!(
                len,
                max = MAX_REQUEST_BYTES,
                "ShouldRateLimit message too large"
            );
            return failure_grpc(&Failure::TooLarge);
        }
        Err(Unread::Invalid(message)) => {
            return failure_grpc(&Failure::InvalidArgument(message));
        }
    };
    tracing::trace!(bytes = %crate::limiter::hex(&message), "ShouldRateLimit message");
    let request = match RateLimitRequest::decode(message)
        .map_err(|e| format!("not a RateLimitRequest: {e}"))
    {
        Ok(request) => request,
        Err(message) => return failure_grpc(&Failure::InvalidArgument(message)),
    };
    tracing::trace!(?request, "ShouldRateLimit");
    let decided = state.service.decide(&request);
    let answer = match deadline {
        Some(deadline) => match tokio::time::timeout(deadline, decided).await {
            Ok(answer) => answer,
            Err(_) => {
                return Rejection::DeadlineExceeded.respond(
                    &RateLimitHeaders::none(),
                    answer::Dialect::Grpc(Default::default()),
                );
            }
        },
        None => decided.await,
    };
    match answer {
        Ok(answer) => {
            log_over(&request, &answer);
            let mut response = grpc_message(&answer.response);
            response
                .extensions_mut()
                .insert(Decision(match answer.over_limit() {
                    true => "over_limit",
                    false => "ok",
                }));
            response
        }
        Err(failure) => failure_grpc(&failure),
    }
}

/// `POST /json`: envoyproxy/ratelimit's JSON in and out.
async fn json(req: Request<Incoming>, state: &ServiceState) -> Response<Body> {
    let body = match read(req.into_body()).await {
        Ok(body) => body,
        Err(message) => return failure_http(&Failure::InvalidArgument(message)),
    };
    let request = serde_json::from_slice::<serde_json::Value>(&body)
        .map_err(|e| format!("the body is not JSON: {e}"))
        .and_then(|v| RateLimitRequest::from_json(&v));
    let request = match request {
        Ok(request) => request,
        Err(message) => return failure_http(&Failure::InvalidArgument(message)),
    };
    match state.service.decide(&request).await {
        Ok(answer) => {
            log_over(&request, &answer);
            let body = answer.response.to_json(super::rules::Unit::name_of);
            let mut response = Response::new(answer::full(body.to_string()));
            if answer.over_limit() {
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            }
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(failure) => failure_http(&failure),
    }
}

/// `GET /check`: forward auth.
async fn check(req: Request<Incoming>, peer: SocketAddr, state: &ServiceState) -> Response<Body> {
    let Some(config) = &state.config.forward_auth else {
        return Rejection::NoRoute.respond(&RateLimitHeaders::none(), answer::Dialect::Http);
    };
    let snapshot = state.service.proxy().snapshot();
    let request = super::forward_auth::request(
        config,
        &snapshot.identity,
        req.headers(),
        req.uri().query(),
        peer.ip(),
    );
    if request.descriptors.is_empty() {
        // Nothing to limit this request by: allowed, as Envoy allows a request without
        // descriptors.
        return text(StatusCode::OK, "");
    }
    let answer = match state.service.decide(&request).await {
        Ok(answer) => answer,
        Err(failure) => return failure_http(&failure),
    };
    log_over(&request, &answer);
    let mut response = if answer.over_limit() {
        let retry = answer.retry_after_secs.unwrap_or(1);
        let mut response = Response::new(answer::full(answer::rate_limited_body(retry)));
        *response.status_mut() =
            StatusCode::from_u16(config.deny_status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
        let h = response.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        h.insert(http::header::RETRY_AFTER, HeaderValue::from(retry));
        response
    } else {
        text(StatusCode::OK, "")
    };
    if let Some(h) = answer.headline {
        // The config's `rate_limit_headers`, as the proxy writes them.
        RateLimitHeaders::write_figures(
            snapshot.header_profile,
            response.headers_mut(),
            h.limit,
            h.remaining,
            (h.reset_secs, h.reset_unix),
            answer
                .over_limit()
                .then_some(answer.retry_after_secs.unwrap_or(1)),
        );
    }
    response
}

/// A refused descriptor names its limit in the log (at debug: a surge is many lines).
fn log_over(request: &RateLimitRequest, answer: &Answer) {
    if !answer.over_limit() || !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    for (d, s) in request.descriptors.iter().zip(&answer.response.statuses) {
        if s.code == super::rls::Code::OverLimit as i32 {
            let entries: Vec<String> = d
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            let name = s.current_limit.as_ref().map(|l| l.name.as_str());
            tracing::debug!(domain = %request.domain, descriptor = %entries.join(","), limit = ?name, "over the limit");
        }
    }
}

/// The body, read whole up to [`MAX_REQUEST_BYTES`] within [`BODY_TIMEOUT`].
async fn read(body: Incoming) -> Result<Bytes, String> {
    let limited = http_body_util::Limited::new(body, MAX_REQUEST_BYTES);
    let Ok(collected) = tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await else {
        return Err(format!(
            "the request body did not arrive within {BODY_TIMEOUT:?}"
        ));
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(format!(
            "the request is larger than {MAX_REQUEST_BYTES} bytes"
        )),
        Err(e) => Err(format!("the request body could not be read: {e}")),
    }
}

/// Why a gRPC request's message was not read.
#[derive(Debug, PartialEq)]
enum Unread {
    /// Its prefix announces more than [`MAX_REQUEST_BYTES`]: refused as the prefix arrives.
    TooLarge(u64),
    /// Anything else: malformed, compressed, cut short, too slow.
    Invalid(String),
}

/// The one message of a gRPC request body (its 5-byte prefix: not compressed, the length),
/// read within [`BODY_TIMEOUT`]. The prefix is judged as soon as it arrives: a message
/// announced larger than [`MAX_REQUEST_BYTES`] is refused then, not after the client has sent
/// (or failed to send) it.
async fn read_message<B>(body: B) -> Result<Bytes, Unread>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut buf = BytesMut::new();
        let mut want: Option<usize> = None;
        loop {
            if want.is_none() && buf.len() >= 5 {
                let compressed = buf[0];
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
                if compressed != 0 {
                    return Err(Unread::Invalid(
                        "compressed messages are not accepted".into(),
                    ));
                }
                if len as usize > MAX_REQUEST_BYTES {
                    return Err(Unread::TooLarge(u64::from(len)));
                }
                want = Some(5 + len as usize);
            }
            if let Some(want) = want
                && buf.len() > want
            {
                return Err(Unread::Invalid(
                    "the gRPC message's length does not match its prefix".into(),
                ));
            }
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(Unread::Invalid(format!(
                        "the request body could not be read: {e}"
                    )));
                }
                None => break,
            }
        }
        match want {
            None => Err(Unread::Invalid(
                "the gRPC message is shorter than its prefix".into(),
            )),
            Some(want) if buf.len() != want => Err(Unread::Invalid(
                "the gRPC message's length does not match its prefix".into(),
            )),
            Some(_) => Ok(buf.freeze().split_off(5)),
        }
    };
    match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(read) => read,
        Err(_) => Err(Unread::Invalid(format!(
            "the request body did not arrive within {BODY_TIMEOUT:?}"
        ))),
    }
}

fn grpc_message(message: &RateLimitResponse) -> Response<Body> {
    let len = message.encoded_len();
    let mut framed = BytesMut::with_capacity(5 + len);
    framed.put_u8(0);
    framed.put_u32(len as u32);
    // Encoding into a buffer sized by `encoded_len` cannot fail.
    let _ = message.encode(&mut framed);
    let mut trailers = HeaderMap::new();
    trailers.insert(grpc::GRPC_STATUS, HeaderValue::from_static("0"));
    let body = http_body_util::Full::new(framed.freeze())
        .map_err(|never| match never {})
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed_unsync();
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A failure as its row of the refusal table says, in gRPC's words.
fn failure_grpc(failure: &Failure) -> Response<Body> {
    rejection(failure).respond(
        &RateLimitHeaders::none(),
        answer::Dialect::Grpc(Default::default()),
    )
}

/// A failure as problem+json.
fn failure_http(failure: &Failure) -> Response<Body> {
    rejection(failure).respond(&RateLimitHeaders::none(), answer::Dialect::Http)
}

fn rejection(failure: &Failure) -> Rejection {
    match failure {
        Failure::InvalidArgument(message) => Rejection::InvalidArgument(message.clone()),
        Failure::TooLarge => Rejection::PayloadTooLarge,
        Failure::Unavailable => Rejection::LimiterUnavailable,
    }
}

fn text(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(answer::full(text));
    *response.status_mut() = status;
    response
}
