//! The admin listener: `/` (the dashboard, `admin/dashboard.rs`), `/healthz` (the process serves), `/readyz` (the limiter store answers and
//! the proxy is not draining), `/metrics` (Prometheus text), `/budgets` (one client's budgets on
//! a route, spending nothing), `/top` (who is being limited right now), and the write endpoints
//! behind `admin.token_file`'s bearer token (`admin/write.rs`): `/bans`, `/overrides`, `/reset`
//! (`control.rs`). It runs with the same header-read
//! timeout as the proxy listener, keeps answering while the proxy drains (so `/readyz` can say
//! 503 to the load balancer), and stops when told.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;

mod bans;
mod budgets;
mod dashboard;
mod overrides;
mod purge;
mod query;
mod reset;
mod top;
mod write;

pub use purge::apply as apply_purge;
pub use query::AdminError;

use crate::answer;
use crate::proxy::{Body, Proxy};

/// Process-wide readiness: whether the proxy is draining (then `/readyz` answers 503).
#[derive(Debug, Default)]
pub struct Readiness {
    draining: AtomicBool,
}

impl Readiness {
    /// From now on `/readyz` answers 503.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// True once draining has started.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub proxy: Arc<Proxy>,
    pub health: Arc<Readiness>,
    /// What `providers.docker` found (empty without it).
    pub discovery: Arc<crate::provider::Status>,
    /// The names served with a certificate now, each with its certificate's expiry (seconds
    /// since the epoch): the expiry gauge's and `GET /certificates`' source.
    pub certificates: Arc<dyn Fn() -> Vec<(String, i64)> + Send + Sync>,
}

/// The certificates served now: each name, when its certificate expires (Unix seconds) and
/// the seconds left until then.
fn certificates(state: &AdminState) -> Vec<(String, i64, i64)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let served = (state.certificates)().into_iter();
    served.map(|(name, at)| (name, at, at - now)).collect()
}

/// The answer to one request on the admin port (served by `server/listener.rs`, as every
/// port is).
pub async fn handle(req: Request<Incoming>, state: &AdminState) -> Response<Body> {
    let proxy = &state.proxy;
    if req.uri().path() == "/certificates" {
        let list: Vec<serde_json::Value> = certificates(state)
            .into_iter()
            .map(|(name, not_after, left)| {
                serde_json::json!({"name": name, "not_after": not_after, "expires_in_seconds": left})
            })
            .collect();
        let mut response = Response::new(answer::full(
            serde_json::json!({ "certificates": list }).to_string(),
        ));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    if req.uri().path() == "/metrics" {
        let served = certificates(state);
        (proxy.metrics()).certificates(served.iter().map(|(name, _, left)| (name.as_str(), *left)));
        let mut response =
            Response::new(answer::full(proxy.metrics().render(proxy.core().limiter())));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        );
        return response;
    }
    if req.uri().path() == "/budgets" {
        let answer = budgets::budgets(proxy, req.uri().query().unwrap_or("")).await;
        return json_answer(answer);
    }
    if let Some(endpoint) = write_endpoint(req.uri().path()) {
        return json_answer(control_endpoint(req, proxy, endpoint).await);
    }
    if req.uri().path() == "/" {
        let mut response = Response::new(answer::full(dashboard::PAGE));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        return response;
    }
    if req.uri().path() == "/dashboard.json" {
        return json_answer(Ok(dashboard::state(proxy).await));
    }
    if req.uri().path() == "/top" {
        return json_answer(top::top(proxy, req.uri().query().unwrap_or("")));
    }
    if req.uri().path() == "/discovered" {
        return json_answer(Ok(state.discovery.to_json()));
    }
    if req.uri().path() == "/upstreams" {
        // Every route's pool: its endpoints, their state and counters.
        let routes: Vec<serde_json::Value> =
            proxy.pools().all().iter().map(|p| p.to_json()).collect();
        return json_answer(Ok(serde_json::json!({ "routes": routes })));
    }
    let (status, text) = match req.uri().path() {
        "/healthz" => (StatusCode::OK, "ok\n"),
        "/readyz" if state.health.is_draining() => (StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/readyz" if proxy.core().limiter().is_ready().await => (StatusCode::OK, "ready\n"),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "limiter store unavailable\n",
        ),
        _ => (StatusCode::NOT_FOUND, "not found\n"),
    };
    let mut response = Response::new(answer::full(text));
    *response.status_mut() = status;
    response
}

/// The write endpoints: `/bans`, `/overrides`, `/reset`, `/cache/purge`.
#[derive(Clone, Copy)]
enum WriteEndpoint {
    Bans,
    Overrides,
    Reset,
    Purge,
}

fn write_endpoint(path: &str) -> Option<WriteEndpoint> {
    let top = path.split('/').nth(1)?;
    let endpoint = match top {
        "bans" => WriteEndpoint::Bans,
        "overrides" => WriteEndpoint::Overrides,
        "reset" if path == "/reset" => WriteEndpoint::Reset,
        "cache" if path == "/cache/purge" => WriteEndpoint::Purge,
        _ => return None,
    };
    Some(endpoint)
}

/// A write endpoint: authorized, then by method (see `admin/write.rs`).
async fn control_endpoint(
    req: Request<Incoming>,
    proxy: &Proxy,
    endpoint: WriteEndpoint,
) -> Result<serde_json::Value, AdminError> {
    use http::Method;
    write::authorize(
        proxy,
        req.headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
    )?;
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let id = path.splitn(3, '/').nth(2).filter(|id| !id.is_empty());
    if let WriteEndpoint::Purge = endpoint {
        return match method {
            Method::POST => purge::post(proxy, &read_body(req).await?).await,
            _ => Err(query::bad(405, "method_not_allowed", "POST /cache/purge")),
        };
    }
    match (endpoint, method, id) {
        (WriteEndpoint::Bans, Method::GET, None) => Ok(bans::list(proxy)),
        (WriteEndpoint::Bans, Method::PUT, None) => bans::put(proxy, &read_body(req).await?).await,
        (WriteEndpoint::Bans, Method::DELETE, Some(id)) => bans::delete(proxy, id, "ban").await,
        (WriteEndpoint::Overrides, Method::GET, None) => Ok(overrides::list(proxy)),
        (WriteEndpoint::Overrides, Method::PUT, None) => {
            overrides::put(proxy, &read_body(req).await?).await
        }
        (WriteEndpoint::Overrides, Method::DELETE, Some(id)) => {
            bans::delete(proxy, id, "ovr").await
        }
        (WriteEndpoint::Reset, Method::POST, None) => {
            reset::post(proxy, &read_body(req).await?).await
        }
        (WriteEndpoint::Bans, ..) => Err(query::bad(
            405,
            "method_not_allowed",
            "GET or PUT /bans, DELETE /bans/{id}",
        )),
        (WriteEndpoint::Overrides, ..) => Err(query::bad(
            405,
            "method_not_allowed",
            "GET or PUT /overrides, DELETE /overrides/{id}",
        )),
        (WriteEndpoint::Reset, ..) => Err(query::bad(405, "method_not_allowed", "POST /reset")),
        (WriteEndpoint::Purge, ..) => {
            Err(query::bad(405, "method_not_allowed", "POST /cache/purge"))
        }
    }
}

/// A write's body: at most 64 KiB, within 10 s (a change is a few hundred bytes).
async fn read_body(req: Request<Incoming>) -> Result<bytes::Bytes, AdminError> {
    use http_body_util::BodyExt;
    let read = http_body_util::Limited::new(req.into_body(), 64 << 10).collect();
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .ok()
        .and_then(Result::ok)
        .map(|collected| collected.to_bytes())
        .ok_or_else(|| {
            query::bad(
                400,
                "bad_request",
                "the body could not be read (at most 64 KiB, within 10 s)",
            )
        })
}

/// `GET /budgets` and `GET /top`: JSON, or a problem+json error.
fn json_answer(answer: Result<serde_json::Value, AdminError>) -> Response<Body> {
    let (status, body) = match answer {
        Ok(value) => (StatusCode::OK, value),
        Err(e) => (
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            serde_json::json!({
                "type": format!("urn:floodgate:problem:{}", e.error),
                "status": e.status,
                "error": e.error,
                "detail": e.detail,
            }),
        ),
    };
    let mut response = Response::new(answer::full(body.to_string()));
    *response.status_mut() = status;
    let content_type = if status == StatusCode::OK {
        "application/json"
    } else {
        "application/problem+json"
    };
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
