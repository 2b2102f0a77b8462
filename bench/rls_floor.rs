//! The floor any external rate limiter has behind Envoy: a `RateLimitService` that does no work.
//! Every `ShouldRateLimit` call is answered `OK` at once (a fixed 2-byte message, `overall_code:
//! OK`, and `grpc-status: 0`), over h2c on hyper, as floodgate's service is served. Measured by
//! `scripts/bench_service.sh` beside Envoy alone and Envoy + floodgate.
//!
//! `rls_floor ADDR` prints `listening on http://ADDR` once bound (ADDR may be `127.0.0.1:0`).

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `RateLimitResponse { overall_code: OK }` framed: not compressed, 2 bytes, field 1 = 1.
const OK_MESSAGE: &[u8] = &[0, 0, 0, 0, 2, 0x08, 0x01];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .ok_or("usage: rls_floor ADDR")?
        .parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(addr).await?;
        println!("listening on http://{}", listener.local_addr()?);
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = service_fn(|req: hyper::Request<Incoming>| async move {
                    // The request is read to its end (as any server must), and not decoded.
                    let _ = req.into_body().collect().await;
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", HeaderValue::from_static("0"));
                    let body = Full::new(Bytes::from_static(OK_MESSAGE))
                        .map_err(|never: Infallible| match never {})
                        .with_trailers(async move { Some(Ok(trailers)) });
                    let mut response = Response::new(body);
                    response
                        .headers_mut()
                        .insert("content-type", HeaderValue::from_static("application/grpc"));
                    Ok::<_, Infallible>(response)
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
