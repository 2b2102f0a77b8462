//! The fast path against the full one: `Proxy::begin` answers what floodgate decides without
//! waiting (a refusal, a cache hit, a preflight, a 404) before any future of the pipeline's
//! exists; `Proxy::handle_unhurried` runs the same phases with the decision first polled inside
//! the pipeline's future, as every request was before. Generated sequences of requests go to
//! two proxies built from one config, each on a memory store of its own on a clock that stands
//! still: every answer must be the same, status, headers and body, byte for byte; and every one
//! of floodgate's own answers must have come from the fast path.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use common::Upstream;
use common::config::{Config, Limit, Route};
use floodgate::limiter::{Limiter, ManualClock, MemoryStore};
use floodgate::metrics::Metrics;
use floodgate::proxy::body::Incoming;
use floodgate::proxy::{Proxy, Step};
use http::{Method, Request};
use http_body_util::BodyExt;
use proptest::prelude::*;

const T0: u64 = 1_700_000_000_000_000;

/// One generated request.
#[derive(Debug, Clone)]
struct Asked {
    method: Method,
    path: &'static str,
    key: Option<&'static str>,
    origin: Option<&'static str>,
    /// `Access-Control-Request-Method` (with OPTIONS: a preflight).
    preflight: bool,
    accept_html: bool,
    grpc: bool,
    peer: u8,
}

fn asked() -> impl Strategy<Value = Asked> {
    (
        prop::sample::select(vec![
            Method::GET,
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::OPTIONS,
        ]),
        prop::sample::select(vec![
            "/api",
            "/api/items?page=2",
            "/cached/a",
            "/cached/b",
            "/cached/../api/x",
            "/nowhere",
            "/api/%2e%2e/cached/a",
        ]),
        prop::option::of(prop::sample::select(vec!["k1", "k2", "k3"])),
        prop::option::of(prop::sample::select(vec![
            "https://app.example",
            "https://evil.example",
        ])),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.1),
        0u8..3,
    )
        .prop_map(
            |(method, path, key, origin, preflight, accept_html, grpc, peer)| Asked {
                method,
                path,
                key,
                origin,
                preflight,
                accept_html,
                grpc,
                peer,
            },
        )
}

impl Asked {
    fn request(&self) -> Request<Incoming> {
        let mut req = Request::builder()
            .method(self.method.clone())
            .uri(self.path)
            .header("host", "api.example");
        if let Some(key) = self.key {
            req = req.header("x-api-key", key);
        }
        if let Some(origin) = self.origin {
            req = req.header("origin", origin);
        }
        if self.preflight {
            req = req.header("access-control-request-method", "GET");
        }
        if self.accept_html {
            req = req.header("accept", "text/html");
        }
        if self.grpc {
            req = req.header("content-type", "application/grpc");
        }
        let empty = http_body_util::Empty::<Bytes>::new().map_err(|never| match never {});
        req.body(Incoming::Other(Box::pin(empty))).expect("request")
    }

    fn peer(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1 + self.peer], 40_000))
    }
}

/// An answer as the client reads it.
#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Bytes,
}

async fn read(response: http::Response<floodgate::proxy::Body>) -> Answer {
    let (parts, body) = response.into_parts();
    let headers = parts
        .headers
        .iter()
        // The upstream's `Date` is its clock's, read for each proxy's request apart.
        .filter(|(name, _)| *name != http::header::DATE)
        .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
        .collect();
    let body = body.collect().await.expect("body").to_bytes();
    Answer {
        status: parts.status.as_u16(),
        headers,
        body,
    }
}

/// A route with CORS, response headers and a bucket of two per key (or address); a cached route
/// with a bucket of three that serves a stale copy instead of a 429. The buckets refill once in
/// 1,000 s on a clock that stands still: every figure in an answer is the same for both proxies.
fn config(upstream: &Upstream) -> floodgate::config::Config {
    let yaml = Config::new()
        .with("listen", "127.0.0.1:0")
        .route(
            Route::new("api", "/api", &upstream.url())
                .with(
                    "cors",
                    "{origins: [\"https://app.example\"], headers: [X-API-Key]}",
                )
                .with("response_headers", "{set: {X-Served-By: floodgate}}")
                .limit(Limit::token_bucket(2, 0.001)),
        )
        .route(
            Route::new("cached", "/cached", &upstream.url())
                .with("cache", "{ttl: 1h, public: true, stale_if_limited: 1h}")
                .limit(Limit::token_bucket(3, 0.001)),
        )
        .yaml();
    floodgate::config::Config::from_yaml(&yaml).expect("config")
}

fn proxy(config: &floodgate::config::Config) -> Proxy {
    let clock = Arc::new(ManualClock::new(T0));
    let limiter = Limiter::Memory(Arc::new(MemoryStore::new(clock, 1000)));
    let metrics = Arc::new(Metrics::with_limiter(&limiter));
    Proxy::new(config, limiter, metrics)
}

/// The `Cache-Status` and `Age` of a cache hit are read off each proxy's own entry, whose age
/// is its `Instant`'s: the two proxies' entries are made and read microseconds apart, so their
/// whole seconds agree except when a second ends between the two (then by one).
fn same_but_for_age(fast: &Answer, full: &Answer) -> bool {
    if fast.status != full.status || fast.body != full.body {
        return false;
    }
    let numbers = |v: &[u8]| -> Vec<i64> {
        String::from_utf8_lossy(v)
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    fast.headers.len() == full.headers.len()
        && fast.headers.iter().zip(&full.headers).all(|(a, b)| {
            a.0 == b.0
                && (a.1 == b.1
                    || ((a.0 == "age" || a.0 == "cache-status")
                        && numbers(&a.1)
                            .iter()
                            .zip(numbers(&b.1))
                            .all(|(x, y)| (x - y).abs() <= 1)))
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_fast_path_answers_as_the_full_one_does(sequence in prop::collection::vec(asked(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let upstream = Upstream::start().await;
            let config = config(&upstream);
            let (fast, full) = (proxy(&config), proxy(&config));
            for asked in &sequence {
                let (answer, answered_now) = match fast.begin(asked.request(), asked.peer()) {
                    Step::Answered(response) => (read(response).await, true),
                    Step::Going(going) => (read(fast.go_on(going).await).await, false),
                };
                let expected = read(full.handle_unhurried(asked.request(), asked.peer()).await).await;
                prop_assert!(
                    same_but_for_age(&answer, &expected),
                    "{asked:?}: fast {answer:?}, full {expected:?}"
                );
                // floodgate's own answers come from the fast path, a forwarded one never
                // does. The upstream sends only 200s without `grpc-status` (a refused gRPC
                // call is a 200 that has one); a cache hit says so in `Cache-Status`.
                let has = |name: &str| answer.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice());
                let hit = has("cache-status").is_some_and(|v| v.windows(5).any(|w| w == b"; hit"));
                let from_upstream = answer.status == 200 && has("grpc-status").is_none() && !hit;
                prop_assert_eq!(answered_now, !from_upstream, "{:?}: {:?}", asked, answer);
            }
            Ok(())
        })?;
    }
}
