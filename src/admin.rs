//! The admin listener: `/healthz` (the process serves), `/readyz` (the limiter store answers and
//! the proxy is not draining), `/metrics` (Prometheus text).

use std::convert::Infallible;
use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::proxy::{Body, Proxy, response};
use crate::server::Health;

/// Serves the admin endpoints until the process exits.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>, health: Arc<Health>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let proxy = proxy.clone();
        let health = health.clone();
        let service = service_fn(move |req| {
            let proxy = proxy.clone();
            let health = health.clone();
            async move { Ok::<_, Infallible>(handle(req, &proxy, &health).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(conn);
    }
}

async fn handle(req: Request<Incoming>, proxy: &Proxy, health: &Health) -> Response<Body> {
    if req.uri().path() == "/metrics" {
        let mut response = Response::new(response::full(proxy.metrics().render(proxy.limiter())));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        return response;
    }
    let (status, text) = match req.uri().path() {
        "/healthz" => (StatusCode::OK, "ok\n"),
        "/readyz" if health.is_draining() => (StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/readyz" if proxy.limiter().is_ready().await => (StatusCode::OK, "ready\n"),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "limiter store unavailable\n",
        ),
        _ => (StatusCode::NOT_FOUND, "not found\n"),
    };
    let mut response = Response::new(response::full(text));
    *response.status_mut() = status;
    response
}
