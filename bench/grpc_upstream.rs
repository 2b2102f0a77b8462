//! A gRPC upstream that costs as little as possible, for `scripts/bench-grpc.sh`: HTTP/2 by prior
//! knowledge (h2c) on one thread, reading each call's request message to its end and answering
//! it with one fixed message (`hi`) and `grpc-status: 0` in trailers, whatever the method.
//!
//! `grpc_upstream ADDR` prints `listening on http://ADDR` once bound (ADDR may be
//! `127.0.0.1:0`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The answer: an uncompressed gRPC message of two bytes.
const MESSAGE: &[u8] = b"\x00\x00\x00\x00\x02hi";

async fn call(request: http::Request<Incoming>) -> Result<Response<Frames>, Infallible> {
    // Read the request to its end, as a gRPC server does before it answers a unary call.
    let _ = request.into_body().collect().await;
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let frames = Frames(VecDeque::from([
        Frame::data(Bytes::from_static(MESSAGE)),
        Frame::trailers(trailers),
    ]));
    let mut response = Response::new(frames);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    Ok(response)
}

/// A body of frames that are all ready: the message, then the trailers.
struct Frames(VecDeque<Frame<Bytes>>);

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service_fn(call))
                .await;
        });
    }
}
