//! What the policy tests share: one route limited as they say, on the memory store or Redis,
//! and requests made one after the other.

use super::config::{Config, Limit, Route};
use super::*;

/// A fresh key per call: a client rotating keys.
pub fn random_key(n: usize) -> String {
    format!("rotating-{n}-{}", std::process::id())
}

/// `base` with one route, `/` → `upstream`, limited by `limits`.
pub fn one_route(upstream: &Upstream, base: Config, limits: &[Limit]) -> String {
    base.route(Route::new("api", "/", &upstream.url()).limits(limits.iter().cloned()))
        .yaml()
}

/// Storage on `redis`, failing closed (a store error would show as a 503).
pub fn on_redis(redis: &RedisServer) -> Config {
    Config::new().redis(&redis.url(), "deny")
}

/// The statuses of GET / with each header set, one request after the other.
pub async fn statuses(fg: &Floodgate, requests: &[Vec<(&str, &str)>]) -> Vec<u16> {
    let client = client();
    let mut out = Vec::new();
    for headers in requests {
        out.push(get(&client, &fg.url("/"), headers).await.status.as_u16());
    }
    out
}

pub fn with_key(key: &str) -> Vec<(&str, &str)> {
    vec![("x-api-key", key)]
}

/// GET `path` with a key of its own, as a task: for requests that must be in flight together.
pub fn spawn_get(fg: &Floodgate, path: &str, n: usize) -> tokio::task::JoinHandle<Option<Reply>> {
    let url = fg.url(path);
    tokio::spawn(async move {
        let response = client()
            .get(url)
            .header("x-api-key", random_key(n))
            .send()
            .await
            .ok()?;
        Some(Reply::read(response).await)
    })
}
