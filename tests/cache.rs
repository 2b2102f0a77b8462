//! The response cache end to end, through the real binary: one upstream fetch per key, RFC
//! 9111's storability and freshness, stale copies instead of failures and refusals, the memory
//! bound, purges, and `Cache-Status` (RFC 9211) on every answer of a cached route.
//!
//! The upstream here is a hyper server of the test's own whose answers the request's query
//! spells out (`cc=` its `Cache-Control`, `delay=` ms before the head, `size=` bytes of body,
//! `cut=1` a body cut off mid-way), whose body says how many times its path was asked
//! (`n=3`), and which the test can make answer 503 or close.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::config::{Config, Limit, Route};
use common::{Floodgate, check_names, client, get, metric};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

type OriginBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// The test's upstream.
struct Origin {
    addr: SocketAddr,
    /// Requests by path (query left off), in arrival order.
    asked: Arc<Mutex<HashMap<String, usize>>>,
    failing: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

fn query_value(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| {
            form_urlencoded::parse(format!("v={v}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
    })
}

impl Origin {
    async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let asked = Arc::new(Mutex::new(HashMap::new()));
        let failing = Arc::new(AtomicBool::new(false));
        let (log, fail) = (asked.clone(), failing.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (log, fail) = (log.clone(), fail.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| answer(req, log.clone(), fail.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Origin {
            addr,
            asked,
            failing,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests for `path` arrived.
    fn count(&self, path: &str) -> usize {
        self.asked.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    req: Request<Incoming>,
    log: Arc<Mutex<HashMap<String, usize>>>,
    failing: Arc<AtomicBool>,
) -> Result<Response<OriginBody>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let n = {
        let mut log = log.lock().unwrap();
        let n = log.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    let q = |name: &str| query_value(&query, name);
    if let Some(ms) = q("delay").and_then(|d| d.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let full = |text: String| -> OriginBody {
        http_body_util::Full::new(Bytes::from(text))
            .map_err(|never| match never {})
            .boxed()
    };
    if failing.load(Ordering::SeqCst) {
        let mut response = Response::new(full("down".into()));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return Ok(response);
    }
    let status = q("status").and_then(|s| s.parse().ok()).unwrap_or(200);
    let text = match q("size").and_then(|s| s.parse::<usize>().ok()) {
        Some(size) => "x".repeat(size),
        None => format!("n={n}"),
    };
    let body: OriginBody = if q("cut").is_some() {
        // Half the body, then the stream fails: the connection is cut mid-body.
        let half = Bytes::from(text.as_bytes()[..text.len() / 2].to_vec());
        let pieces: Vec<Result<Frame<Bytes>, std::io::Error>> =
            vec![Ok(Frame::data(half)), Err(std::io::Error::other("cut"))];
        Gapped::new(pieces, Duration::from_millis(200)).boxed()
    } else if q("chunked").is_some() {
        // The body in four pieces, no length said: sent chunked.
        let bytes = Bytes::from(text.clone());
        let quarter = bytes.len() / 4;
        let pieces = (0..4)
            .map(|i| {
                let end = if i == 3 {
                    bytes.len()
                } else {
                    (i + 1) * quarter
                };
                Ok(Frame::data(bytes.slice(i * quarter..end)))
            })
            .collect();
        Gapped::new(pieces, Duration::from_millis(10)).boxed()
    } else if let Some(ms) = q("stream").and_then(|s| s.parse().ok()) {
        // The first half at once, the rest `ms` later.
        let bytes = text.as_bytes();
        let pieces = vec![
            Ok(Frame::data(Bytes::from(bytes[..bytes.len() / 2].to_vec()))),
            Ok(Frame::data(Bytes::from(bytes[bytes.len() / 2..].to_vec()))),
        ];
        Gapped::new(pieces, Duration::from_millis(ms)).boxed()
    } else {
        full(text.clone())
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    let headers = response.headers_mut();
    if q("cut").is_some() || q("stream").is_some() {
        headers.insert("content-length", text.len().into());
    }
    if let Some(cc) = q("cc") {
        headers.insert("cache-control", cc.parse().unwrap());
    }
    if let Some(expires) = q("expires") {
        headers.insert("expires", expires.parse().unwrap());
    }
    if q("cookie").is_some() {
        headers.insert("set-cookie", "session=1".parse().unwrap());
    }
    if let Some(vary) = q("vary") {
        headers.insert("vary", vary.parse().unwrap());
        if let Some(value) = req.headers().get(vary.as_str()) {
            headers.insert("x-varied", value.clone());
        }
    }
    Ok(response)
}

/// A body of `pieces`, each after `gap` (the first at once).
struct Gapped {
    pieces: std::collections::VecDeque<Result<Frame<Bytes>, std::io::Error>>,
    gap: Duration,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    first: bool,
}

impl Gapped {
    fn new(pieces: Vec<Result<Frame<Bytes>, std::io::Error>>, gap: Duration) -> Self {
        Gapped {
            pieces: pieces.into(),
            gap,
            sleep: None,
            first: true,
        }
    }
}

impl hyper::body::Body for Gapped {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if !self.first {
            let gap = self.gap;
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
            if sleep.as_mut().poll(cx).is_pending() {
                return std::task::Poll::Pending;
            }
            self.sleep = None;
        }
        self.first = false;
        std::task::Poll::Ready(self.pieces.pop_front())
    }
}

/// One route `/c/` → `origin`, cached with `cache` (a YAML flow mapping).
fn cached(origin: &Origin, cache: &str) -> Route {
    Route::new("c", "/c/", &origin.url()).with("cache", cache)
}

fn status_of(reply: &common::Reply) -> String {
    reply
        .headers
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn three_hundred_concurrent_gets_of_a_cold_key_make_one_upstream_fetch() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    let client = client();
    // The first request's fetch takes 500 ms: the 299 others arrive while it is under way.
    let url = fg.url("/c/hot?delay=500");
    let replies = concurrent_gets(&client, &url, 300).await;
    assert_eq!(origin.count("/c/hot"), 1, "one fetch for 300 requests");
    let statuses: Vec<String> = replies.iter().map(status_of).collect();
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "n=1");
    }
    let stored = statuses.iter().filter(|s| s.ends_with("stored")).count();
    let collapsed = statuses.iter().filter(|s| s.ends_with("collapsed")).count();
    let hits = statuses
        .iter()
        .filter(|s| s.starts_with("floodgate; hit"))
        .count();
    assert_eq!(stored, 1, "{statuses:?}");
    assert_eq!(stored + collapsed + hits, 300, "{statuses:?}");
    assert!(collapsed > 0, "{statuses:?}");
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_cache_requests_total{route="c",result="miss"}"#
        )
        .await,
        1
    );
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_cache_requests_total{route="c",result="collapsed"}"#
        )
        .await,
        collapsed as u64
    );
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_requests_total{route="c",decision="cached"}"#
        )
        .await,
        299
    );
}

/// `n` concurrent GETs of `url`, their replies in order.
async fn concurrent_gets(client: &reqwest::Client, url: &str, n: usize) -> Vec<common::Reply> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (client, url) = (client.clone(), url.to_string());
            tokio::spawn(async move { get(&client, &url, &[]).await })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for handle in handles {
        out.push(handle.await.expect("task"));
    }
    out
}

/// A JSON answer's body.
async fn json_of(response: reqwest::Response) -> serde_json::Value {
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn a_hit_is_answered_from_memory_with_age_and_cache_status() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    let client = client();
    let first = get(&client, &fg.url("/c/a?cc=max-age%3D60"), &[]).await;
    assert_eq!(status_of(&first), "floodgate; fwd=uri-miss; stored");
    let hit = get(&client, &fg.url("/c/a?cc=max-age%3D60"), &[]).await;
    assert_eq!(hit.body, "n=1");
    assert!(
        status_of(&hit).starts_with("floodgate; hit; ttl="),
        "{}",
        status_of(&hit)
    );
    let ttl: u64 = status_of(&hit).rsplit('=').next().unwrap().parse().unwrap();
    assert!((58..=60).contains(&ttl), "{ttl}");
    assert!(hit.header_u64("age") <= 2);
    assert_eq!(origin.count("/c/a"), 1);
    // The host's port is not in the key: `Host: 127.0.0.1` shares `127.0.0.1:PORT`'s entry.
    let portless = get(
        &client,
        &fg.url("/c/a?cc=max-age%3D60"),
        &[("host", "127.0.0.1")],
    )
    .await;
    assert_eq!(portless.body, "n=1");
    // Another query is another key (`key: [query]` by default).
    let other = get(&client, &fg.url("/c/a?cc=max-age%3D60&x=1"), &[]).await;
    assert_eq!(other.body, "n=2");
    // HEAD is served from the GET's entry, without its body.
    let head = client
        .head(fg.url("/c/a?cc=max-age%3D60"))
        .send()
        .await
        .unwrap();
    assert!(
        head.headers()["cache-status"]
            .to_str()
            .unwrap()
            .contains("hit")
    );
    assert_eq!(origin.count("/c/a"), 2);
}

#[tokio::test]
async fn freshness_follows_max_age_then_the_route_s_ttl_and_force_overrides_it() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(cached(&origin, "{ttl: 1s}"))
            .route(
                Route::new("forced", "/f/", &origin.url()).with("cache", "{ttl: 30s, force: true}"),
            )
            .yaml(),
    );
    let client = client();
    // No freshness from the upstream: the route's ttl (1 s). Re-asked 1.5 s later (0.5 s past
    // the ttl, far more than the cache's clock could be off), it has gone stale: fetched again.
    get(&client, &fg.url("/c/ttl"), &[]).await;
    assert_eq!(get(&client, &fg.url("/c/ttl"), &[]).await.body, "n=1");
    // The upstream's max-age=30 outlives the route's ttl of 1 s.
    get(&client, &fg.url("/c/long?cc=max-age%3D30"), &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get(&client, &fg.url("/c/ttl"), &[]).await.body, "n=2");
    assert_eq!(
        get(&client, &fg.url("/c/long?cc=max-age%3D30"), &[])
            .await
            .body,
        "n=1"
    );
    // `force`: stored for the ttl whatever the upstream says (no-cache, max-age=0).
    get(&client, &fg.url("/f/x?cc=no-cache"), &[]).await;
    let forced = get(&client, &fg.url("/f/x?cc=no-cache"), &[]).await;
    assert_eq!(forced.body, "n=1");
    get(&client, &fg.url("/f/y?cc=no-store"), &[]).await;
    assert_eq!(
        get(&client, &fg.url("/f/y?cc=no-store"), &[]).await.body,
        "n=2",
        "no-store honoured"
    );
}

#[tokio::test]
async fn what_a_shared_cache_may_not_store_is_fetched_every_time() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    let client = client();
    for (path, query) in [
        ("/c/nostore", "cc=no-store"),
        ("/c/private", "cc=private%2C%20max-age%3D60"),
        ("/c/cookie", "cookie=1"),
        ("/c/error", "status=500"),
        ("/c/malformed", "cc=max-age%3Dsoon"),
        ("/c/expires", "expires=tomorrow"),
        ("/c/varystar", "vary=*"),
    ] {
        let url = fg.url(&format!("{path}?{query}"));
        let first = get(&client, &url, &[]).await;
        assert_eq!(status_of(&first), "floodgate; fwd=uri-miss", "{path}");
        let second = get(&client, &url, &[]).await;
        assert_eq!(second.body, "n=2", "{path} was served from the cache");
    }
    assert!(
        metric(
            &fg,
            r#"floodgate_cache_requests_total{route="c",result="uncacheable"}"#
        )
        .await
            >= 14
    );
}

#[tokio::test]
async fn credentials_bypass_the_cache_unless_the_route_or_the_answer_says_public() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(cached(&origin, "{ttl: 30s}"))
            .route(
                Route::new("pub", "/p/", &origin.url()).with("cache", "{ttl: 30s, public: true}"),
            )
            .yaml(),
    );
    let client = client();
    let auth = [("authorization", "Bearer abc")];
    let first = get(&client, &fg.url("/c/me"), &auth).await;
    assert_eq!(status_of(&first), "floodgate; fwd=bypass");
    assert_eq!(get(&client, &fg.url("/c/me"), &auth).await.body, "n=2");
    // A request without credentials does not get a credentialed one's answer either.
    assert_eq!(get(&client, &fg.url("/c/me"), &[]).await.body, "n=3");
    // The answer says public: stored, and served to credentialed requests too.
    get(
        &client,
        &fg.url("/c/shared?cc=public%2C%20max-age%3D60"),
        &[("cookie", "a=b")],
    )
    .await;
    assert_eq!(
        get(
            &client,
            &fg.url("/c/shared?cc=public%2C%20max-age%3D60"),
            &[("cookie", "c=d")]
        )
        .await
        .body,
        "n=1"
    );
    // The route says public.
    get(&client, &fg.url("/p/x"), &auth).await;
    assert_eq!(
        get(&client, &fg.url("/p/x"), &[("x-api-key", "k2")])
            .await
            .body,
        "n=1"
    );
}

#[tokio::test]
async fn vary_keeps_variants_apart() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    let client = client();
    let url = fg.url("/c/v?vary=accept-language");
    let en = [("accept-language", "en")];
    let fr = [("accept-language", "fr")];
    assert_eq!(get(&client, &url, &en).await.header("x-varied"), "en");
    assert_eq!(get(&client, &url, &fr).await.header("x-varied"), "fr");
    let en_again = get(&client, &url, &en).await;
    assert_eq!(en_again.header("x-varied"), "en");
    assert_eq!(en_again.body, "n=1");
    assert_eq!(get(&client, &url, &fr).await.body, "n=2");
    assert_eq!(origin.count("/c/v"), 2);
}

#[tokio::test]
async fn a_range_passes_through_and_an_unsafe_method_invalidates() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    let client = client();
    let url = fg.url("/c/item");
    get(&client, &url, &[]).await;
    let ranged = get(&client, &url, &[("range", "bytes=0-1")]).await;
    assert_eq!(status_of(&ranged), "floodgate; fwd=bypass");
    assert_eq!(origin.count("/c/item"), 2);
    assert_eq!(get(&client, &url, &[]).await.body, "n=1");
    // A POST answered 201 removes the URI's entries: the next GET fetches.
    let posted = client
        .post(fg.url("/c/item?status=201"))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), StatusCode::CREATED);
    // (Its query differs from the GET's URI: only the same URI is invalidated.)
    assert_eq!(get(&client, &url, &[]).await.body, "n=1");
    let posted = client.post(&url).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::OK);
    assert_eq!(get(&client, &url, &[]).await.body, "n=5");
}

#[tokio::test]
async fn a_client_cannot_bust_the_cache_unless_it_is_a_trusted_proxy() {
    let origin = Origin::start().await;
    let client = client();
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    get(&client, &fg.url("/c/b"), &[]).await;
    for busting in [
        ("cache-control", "no-cache"),
        ("cache-control", "max-age=0"),
        ("pragma", "no-cache"),
    ] {
        assert_eq!(
            get(&client, &fg.url("/c/b"), &[busting]).await.body,
            "n=1",
            "{busting:?}"
        );
    }
    drop(fg);
    let trusting = Floodgate::start(
        &Config::new()
            .trusted_proxies("[127.0.0.1/32]")
            .route(cached(&origin, "{ttl: 30s}"))
            .yaml(),
    );
    get(&client, &trusting.url("/c/t"), &[]).await;
    let fresh = get(
        &client,
        &trusting.url("/c/t"),
        &[("cache-control", "no-cache")],
    )
    .await;
    assert_eq!(fresh.body, "n=2");
    assert_eq!(status_of(&fresh), "floodgate; fwd=request; stored");
    assert_eq!(get(&client, &trusting.url("/c/t"), &[]).await.body, "n=2");
}

#[tokio::test]
async fn a_stale_copy_stands_in_for_an_error_and_says_so() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(cached(&origin, "{ttl: 1s, stale_if_error: 5m}"))
            .yaml(),
    );
    let client = client();
    assert_eq!(get(&client, &fg.url("/c/s"), &[]).await.body, "n=1");
    // 1.5 s on the copy is stale (its ttl is 1 s); the upstream answers 503.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    origin.fail(true);
    let stale = get(&client, &fg.url("/c/s"), &[]).await;
    assert_eq!(stale.status, StatusCode::OK);
    assert_eq!(stale.body, "n=1");
    assert!(
        status_of(&stale).ends_with("detail=error"),
        "{}",
        status_of(&stale)
    );
    assert!(status_of(&stale).contains("ttl=-"), "{}", status_of(&stale));
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_cache_stale_total{route="c",reason="error"}"#
        )
        .await,
        1
    );
    // Killed outright (nothing listening): the copy still stands in.
    let addr = origin.addr;
    drop(origin);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the origin is gone"
    );
    let stale = get(&client, &fg.url("/c/s"), &[]).await;
    assert_eq!((stale.status, stale.body.as_str()), (StatusCode::OK, "n=1"));
    // A key never stored has no copy: the error is the client's.
    assert_eq!(
        get(&client, &fg.url("/c/never"), &[]).await.status,
        StatusCode::BAD_GATEWAY
    );
}

#[tokio::test]
async fn stale_while_revalidate_answers_at_once_and_refreshes_behind() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(cached(&origin, "{ttl: 1s, stale_while_revalidate: 30s}"))
            .yaml(),
    );
    let client = client();
    get(&client, &fg.url("/c/r?delay=300"), &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Stale: answered at once from the copy (the refresh takes 300 ms behind it).
    let started = std::time::Instant::now();
    let stale = get(&client, &fg.url("/c/r?delay=300"), &[]).await;
    assert_eq!(stale.body, "n=1");
    assert!(
        status_of(&stale).ends_with("detail=revalidating"),
        "{}",
        status_of(&stale)
    );
    // (Not a timing assertion on floodgate: the copy came back before the refresh could.)
    let _ = started;
    // The refresh lands; one fetch for it however many ask meanwhile.
    for _ in 0..5 {
        get(&client, &fg.url("/c/r?delay=300"), &[]).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let fresh = get(&client, &fg.url("/c/r?delay=300"), &[]).await;
    assert_eq!(fresh.body, "n=2");
    assert!(status_of(&fresh).starts_with("floodgate; hit; ttl="));
    assert_eq!(origin.count("/c/r"), 2);
}

#[tokio::test]
async fn a_client_over_its_limit_gets_the_stale_copy_with_zero_remaining() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(
                cached(&origin, "{ttl: 1s, stale_if_limited: 1m}")
                    .limit(Limit::token_bucket(1, 0.01)),
            )
            .yaml(),
    );
    let client = client();
    get(&client, &fg.url("/c/l"), &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Stale, and the bucket is empty: the copy instead of a 429.
    let limited = get(&client, &fg.url("/c/l"), &[]).await;
    assert_eq!(limited.status, StatusCode::OK);
    assert_eq!(limited.body, "n=1");
    assert!(
        status_of(&limited).ends_with("detail=limited"),
        "{}",
        status_of(&limited)
    );
    assert_eq!(limited.header("x-ratelimit-remaining"), "0");
    assert_eq!(origin.count("/c/l"), 1);
    // A key with no copy is refused as before.
    assert_eq!(
        get(&client, &fg.url("/c/other"), &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_cache_stale_total{route="c",reason="limited"}"#
        )
        .await,
        1
    );
}

#[tokio::test]
async fn an_overloaded_upstream_s_stale_copy_stands_in_for_the_503() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(cached(&origin, "{ttl: 1s, stale_if_overloaded: 1m}").with(
                "adaptive_concurrency",
                "{min_limit: 1, max_limit: 1, queue_timeout: 50ms}",
            ))
            .yaml(),
    );
    let client = client();
    get(&client, &fg.url("/c/o"), &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // One slow request holds the only slot (2 s at the upstream); the next cannot get one
    // within 50 ms: stale instead of 503.
    let slow = tokio::spawn({
        let (client, url) = (client.clone(), fg.url("/c/busy?delay=2000"));
        async move { get(&client, &url, &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stale = get(&client, &fg.url("/c/o"), &[]).await;
    assert_eq!(stale.status, StatusCode::OK);
    assert_eq!(stale.body, "n=1");
    assert!(
        status_of(&stale).ends_with("detail=overloaded"),
        "{}",
        status_of(&stale)
    );
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn thousands_of_entries_never_hold_more_than_cache_memory() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .with("cache", "{memory: 1MiB, max_entry: 256KiB}")
            .route(cached(&origin, "{ttl: 5m}"))
            .yaml(),
    );
    let client = client();
    for n in 0..2000 {
        let reply = get(&client, &fg.url(&format!("/c/e{n}?size=65536")), &[]).await;
        assert_eq!(reply.body.len(), 65536);
        if n % 250 == 0 {
            assert!(metric(&fg, "floodgate_cache_bytes").await <= 1 << 20);
        }
    }
    let bytes = metric(&fg, "floodgate_cache_bytes").await;
    let entries = metric(&fg, "floodgate_cache_entries").await;
    assert!(bytes <= 1 << 20, "{bytes}");
    assert!(
        (10..=16).contains(&entries),
        "{entries} entries of 64 KiB in 1 MiB"
    );
    assert!(metric(&fg, "floodgate_cache_evictions_total").await >= 1900);
    // An answer over max_entry arrives whole, and is not kept.
    let big = get(&client, &fg.url("/c/big?size=300000"), &[]).await;
    assert_eq!(big.body.len(), 300_000);
    assert_eq!(
        get(&client, &fg.url("/c/big?size=300000"), &[])
            .await
            .body
            .len(),
        300_000
    );
    assert_eq!(origin.count("/c/big"), 2);
    // Without a Content-Length it is found too large only as it streams: the key is then
    // remembered as not storable, so the next request does not wait on a fetch of it.
    let url = fg.url("/c/chunky?size=300000&chunked=1");
    let first = get(&client, &url, &[]).await;
    assert_eq!(first.body.len(), 300_000);
    assert!(
        first.headers.get("content-length").is_none(),
        "sent chunked"
    );
    let second = get(&client, &url, &[]).await;
    assert_eq!(second.body.len(), 300_000);
    assert_eq!(status_of(&second), "floodgate; fwd=uri-miss");
    assert_eq!(origin.count("/c/chunky"), 2);
}

#[tokio::test]
async fn waiters_read_the_body_as_it_streams_and_a_cut_fill_fails_every_waiter() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    let client = client();
    // The upstream sends half the body, then stalls 2 s: a waiter has its first bytes long
    // before the end (read it chunk by chunk).
    let url = fg.url("/c/streamed?size=20000&stream=2000");
    let leader = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { get(&client, &url, &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut waiter = client.get(&url).send().await.unwrap();
    assert!(
        waiter.headers()["cache-status"]
            .to_str()
            .unwrap()
            .ends_with("collapsed")
    );
    let first = tokio::time::timeout(Duration::from_millis(1500), waiter.chunk())
        .await
        .expect("the first half arrives before the rest is sent")
        .unwrap()
        .unwrap();
    assert!(!first.is_empty() && first.len() <= 10_000);
    let mut whole = first.len();
    while let Some(chunk) = waiter.chunk().await.unwrap() {
        whole += chunk.len();
    }
    assert_eq!(whole, 20_000);
    assert_eq!(leader.await.unwrap().body.len(), 20_000);
    assert_eq!(origin.count("/c/streamed"), 1);

    // Cut mid-body: the leader and every waiter see an error, never a short body that looks
    // whole; nothing is stored.
    let cut = fg.url("/c/cut?size=20000&cut=1&delay=200");
    let reads: Vec<_> = (0..5)
        .map(|_| {
            let (client, url) = (client.clone(), cut.clone());
            tokio::spawn(async move { client.get(&url).send().await?.bytes().await })
        })
        .collect();
    for read in reads {
        assert!(
            read.await.unwrap().is_err(),
            "a cut answer must not read as whole"
        );
    }
    assert!(origin.count("/c/cut") >= 1);
    let again = client.get(&cut).send().await.unwrap().bytes().await;
    assert!(again.is_err());
    assert!(origin.count("/c/cut") >= 2, "a cut answer is not stored");
}

#[tokio::test]
async fn a_waiter_whose_client_leaves_frees_its_place() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    let client = client();
    let url = fg.url("/c/slow?delay=1500");
    let leader = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { get(&client, &url, &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Waiters that give up (their connections dropped at 200 ms, long before the head).
    let gone: Vec<_> = (0..20)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let request = reqwest::Client::new()
                    .get(&url)
                    .timeout(Duration::from_millis(200));
                request.send().await
            })
        })
        .collect();
    for waiter in gone {
        let sent = waiter.await.unwrap();
        assert!(sent.is_err(), "{sent:?}");
    }
    assert_eq!(leader.await.unwrap().body, "n=1");
    // The fill completed for whoever stayed; the next one is a hit.
    let hit = get(&client, &url, &[]).await;
    assert!(status_of(&hit).contains("hit"), "{}", status_of(&hit));
    assert_eq!(origin.count("/c/slow"), 1);
}

#[tokio::test]
async fn an_answer_that_cannot_be_stored_releases_its_waiters_a_few_at_a_time() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(&Config::new().route(cached(&origin, "{ttl: 30s}")).yaml());
    let client = client();
    // A private answer on a cached route: 50 requests, each answered by the upstream itself,
    // and never more than a few at once beyond the first.
    let url = fg.url("/c/mine?cc=private&delay=200");
    let replies = concurrent_gets(&client, &url, 50).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK);
    }
    let mut bodies: Vec<_> = replies.iter().map(|r| r.body.clone()).collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 50, "every one was the upstream's own answer");
}

#[tokio::test]
async fn a_purge_removes_what_it_names_and_a_bad_body_removes_nothing() {
    let origin = Origin::start().await;
    let token = common::TempFile::new("s3cret\n");
    let fg = Floodgate::start(
        &Config::new()
            .with(
                "admin",
                &format!("{{token_file: {}}}", token.path().display()),
            )
            .route(cached(&origin, "{ttl: 5m}"))
            .yaml(),
    );
    let client = client();
    for path in ["/c/a?x=1", "/c/a?x=2", "/c/b/1", "/c/b/2", "/c/z"] {
        get(&client, &fg.url(path), &[]).await;
    }
    let purge = |body: &'static str| {
        client
            .post(fg.admin_url("/cache/purge"))
            .header("authorization", "Bearer s3cret")
            .body(body)
            .send()
    };
    let bad = purge(r#"{"route": "c", "paths": "/c/a"}"#).await.unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert!(bad.text().await.unwrap().contains("paths"));
    assert_eq!(metric(&fg, "floodgate_cache_entries").await, 5);
    let unauthorized = client
        .post(fg.admin_url("/cache/purge"))
        .body(r#"{"route":"c"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);
    let one = json_of(purge(r#"{"route": "c", "path": "/c/a"}"#).await.unwrap()).await;
    assert_eq!(one["purged"], 2);
    let prefix = json_of(purge(r#"{"route": "c", "prefix": "/c/b/"}"#).await.unwrap()).await;
    assert_eq!(prefix["purged"], 2);
    let all = json_of(purge(r#"{"route": "c"}"#).await.unwrap()).await;
    assert_eq!(all["purged"], 1);
    assert_eq!(get(&client, &fg.url("/c/z"), &[]).await.body, "n=2");
}

#[tokio::test]
async fn a_purge_on_one_instance_reaches_every_instance_sharing_the_store() {
    let redis = common::RedisServer::start();
    let origin = Origin::start().await;
    let token = common::TempFile::new("s3cret\n");
    let config = Config::new()
        .redis(&redis.url(), "allow")
        .with(
            "admin",
            &format!("{{token_file: {}}}", token.path().display()),
        )
        .route(cached(&origin, "{ttl: 5m}"))
        .yaml();
    let (a, b) = (Floodgate::start(&config), Floodgate::start(&config));
    let client = client();
    for fg in [&a, &b] {
        for path in ["/c/x", "/c/y"] {
            get(&client, &fg.url(path), &[]).await;
            // A hit, or a follower of the fill still ending (a client has the whole body once it
            // read `Content-Length` bytes, before the fill hears its end): no fetch either way.
            let status = status_of(&get(&client, &fg.url(path), &[]).await);
            assert!(
                status.contains("hit") || status.contains("collapsed"),
                "{status}"
            );
        }
    }
    assert_eq!((origin.count("/c/x"), origin.count("/c/y")), (2, 2));
    let purged = client
        .post(a.admin_url("/cache/purge"))
        .header("authorization", "Bearer s3cret")
        .body(r#"{"route": "c", "path": "/c/x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(json_of(purged).await["purged"], 1);
    // The purging instance fetches /c/x again at once and keeps that copy: its follower, which
    // reads the purge too, does not purge it again.
    assert!(status_of(&get(&client, &a.url("/c/x"), &[]).await).contains("stored"));
    // The other instance reads the shared list every 300 ms (the contract says within a
    // second): polled every 100 ms for up to 5 s, so a slow machine is not a failure, until its
    // copy of /c/x is gone. A hit fills nothing, so the polling itself changes nothing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let status = status_of(&get(&client, &b.url("/c/x"), &[]).await);
        if status.contains("stored") {
            break;
        }
        assert!(status.contains("hit"), "{status}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the purge never reached the other instance"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        origin.count("/c/x"),
        4,
        "each instance fetched it once more"
    );
    // What the purge did not name stays, on both, and so does the purging one's new copy: read
    // after 700 ms, past two of each follower's reads of the list (every 300 ms), so the purging
    // instance's own follower has seen its purge (and skipped it) by then.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for fg in [&a, &b] {
        assert!(status_of(&get(&client, &fg.url("/c/y"), &[]).await).contains("hit"));
        assert!(status_of(&get(&client, &fg.url("/c/x"), &[]).await).contains("hit"));
    }
    assert_eq!((origin.count("/c/x"), origin.count("/c/y")), (4, 2));
}

#[tokio::test]
async fn a_fresh_hit_spends_only_what_cache_hit_cost_asks() {
    let origin = Origin::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(
                cached(&origin, "{ttl: 5m}")
                    .limit(Limit::token_bucket(3, 0.001).with("cache_hit_cost", "1"))
                    .limit(Limit::token_bucket(1, 0.001)),
            )
            .yaml(),
    );
    let client = client();
    // The miss spends both limits; the hits spend only the first (1 each), until it is empty.
    let statuses: Vec<StatusCode> = {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(get(&client, &fg.url("/c/h"), &[]).await.status);
        }
        out
    };
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(origin.count("/c/h"), 1);
}

#[test]
fn check_names_the_field_of_each_cache_mistake() {
    let route = |cache: &str| {
        format!(
            "listen: 127.0.0.1:0\nroutes:\n  - name: c\n    path_prefix: /\n    upstream: http://127.0.0.1:9\n    cache: {cache}\n"
        )
    };
    check_names(&route("{ttl: 0s}"), &["routes[0].cache.ttl"]);
    check_names(
        &route("{key: [query, cookie]}"),
        &["routes[0].cache.key[1]"],
    );
    check_names(
        &route("{statuses: [200, 99]}"),
        &["routes[0].cache.statuses[1]"],
    );
    check_names(
        &route("{stale_if_error: soon}"),
        &["routes[0].cache.stale_if_error"],
    );
    check_names(
        &format!(
            "cache: {{memory: 1MiB, max_entry: 2MiB}}\n{}",
            route("{ttl: 1s}")
        ),
        &["cache.max_entry"],
    );
    check_names(
        &format!("cache: {{shared: true}}\n{}", route("{ttl: 1s}")),
        &["cache.shared"],
    );
}

/// `cache.shared` on the store `storage` configures: two instances, 150 concurrent GETs each of
/// a cold key whose fetch takes 500 ms, make one upstream fetch between them; a key one of them
/// fetched is then a hit on the other, without a fetch of its own.
async fn two_instances_make_one_fetch_per_key(storage: Config) {
    let origin = Origin::start().await;
    let config = storage
        .with("cache", "{shared: true}")
        .route(cached(&origin, "{ttl: 30s}"))
        .yaml();
    let (a, b) = (Floodgate::start(&config), Floodgate::start(&config));
    let client = client();
    let (url_a, url_b) = (a.url("/c/hot?delay=500"), b.url("/c/hot?delay=500"));
    let (on_a, on_b) = tokio::join!(
        concurrent_gets(&client, &url_a, 150),
        concurrent_gets(&client, &url_b, 150),
    );
    assert_eq!(origin.count("/c/hot"), 1, "one fetch for 2 × 150 requests");
    let statuses: Vec<String> = on_a.iter().chain(&on_b).map(status_of).collect();
    for reply in on_a.iter().chain(&on_b) {
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "n=1");
    }
    let stored = statuses.iter().filter(|s| s.ends_with("stored")).count();
    assert_eq!(stored, 1, "{statuses:?}");
    // The instance that did not fetch served it from the store's copy: hits and followers.
    for status in &statuses {
        assert!(
            status.ends_with("stored") || status.ends_with("collapsed") || status.contains("hit"),
            "{status}"
        );
    }
    let first = get(&client, &b.url("/c/other"), &[]).await;
    assert!(status_of(&first).ends_with("stored"));
    // Right after: the fetching instance writes the entry to the store before it gives up its
    // claim, so the other finds either the entry or the claim (and waits for the entry).
    let there = get(&client, &a.url("/c/other"), &[]).await;
    assert!(status_of(&there).contains("hit"), "{}", status_of(&there));
    assert_eq!(there.body, first.body);
    assert_eq!(origin.count("/c/other"), 1);
}

#[tokio::test]
async fn two_instances_sharing_redis_make_one_upstream_fetch_per_key() {
    let redis = common::RedisServer::start();
    two_instances_make_one_fetch_per_key(Config::new().redis(&redis.url(), "allow")).await;
}

#[tokio::test]
async fn two_instances_sharing_postgres_make_one_upstream_fetch_per_key() {
    let postgres = common::PostgresServer::start();
    let storage = Config::new()
        .storage("backend", "postgres")
        .storage("url", &postgres.url())
        .storage("timeout", "2s");
    two_instances_make_one_fetch_per_key(storage).await;
}

/// Polls `url` every 100 ms, for up to 5 s (a slow machine is not a failure; the contract
/// says every instance within a second, and instances read the shared list every 300 ms),
/// until its answer is fetched afresh (`stored`); every answer before it is the old copy.
async fn until_fetched_again(client: &reqwest::Client, url: &str) -> common::Reply {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let reply = get(client, url, &[]).await;
        let status = status_of(&reply);
        if status.ends_with("stored") {
            return reply;
        }
        assert!(status.contains("hit"), "{status}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the invalidation never reached {url}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn with_shared_an_unsafe_method_or_a_purge_on_one_instance_removes_the_entry_everywhere() {
    let redis = common::RedisServer::start();
    let origin = Origin::start().await;
    let token = common::TempFile::new("s3cret\n");
    let config = Config::new()
        .redis(&redis.url(), "allow")
        .with("cache", "{shared: true}")
        .with(
            "admin",
            &format!("{{token_file: {}}}", token.path().display()),
        )
        .route(cached(&origin, "{ttl: 5m}"))
        .yaml();
    let (a, b) = (Floodgate::start(&config), Floodgate::start(&config));
    let client = client();
    assert!(status_of(&get(&client, &a.url("/c/x"), &[]).await).ends_with("stored"));
    assert!(status_of(&get(&client, &b.url("/c/x"), &[]).await).contains("hit"));
    assert_eq!(origin.count("/c/x"), 1);
    // A POST on one instance, answered 200: the URI's entries go on both, and from the store.
    let posted = client.post(a.url("/c/x")).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::OK);
    let fresh = until_fetched_again(&client, &b.url("/c/x")).await;
    assert_eq!(fresh.body, "n=3", "fetched once more, after the POST");
    // The instance that took the POST finds the other's new copy in the store.
    let on_a = get(&client, &a.url("/c/x"), &[]).await;
    assert!(status_of(&on_a).contains("hit"), "{}", status_of(&on_a));
    assert_eq!(on_a.body, "n=3");
    assert_eq!(origin.count("/c/x"), 3);
    // A purge on one instance: neither the other instance nor the store keeps the copy, so the
    // purging instance's next read is fetched afresh, not found in the store.
    let purged = client
        .post(b.admin_url("/cache/purge"))
        .header("authorization", "Bearer s3cret")
        .body(r#"{"route": "c"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(purged.status(), StatusCode::OK);
    let again = until_fetched_again(&client, &a.url("/c/x")).await;
    assert_eq!(again.body, "n=4");
    assert_eq!(origin.count("/c/x"), 4);
}

#[tokio::test]
async fn with_shared_a_failed_store_leaves_each_instance_caching_on_its_own() {
    let mut redis = common::RedisServer::start();
    let origin = Origin::start().await;
    let config = Config::new()
        .redis(&redis.url(), "allow")
        .with("cache", "{shared: true}")
        .route(cached(&origin, "{ttl: 30s}"))
        .yaml();
    let fg = Floodgate::start(&config);
    let client = client();
    assert!(status_of(&get(&client, &fg.url("/c/warm"), &[]).await).ends_with("stored"));
    redis.kill();
    // Never an error: a cold key is fetched once for 50 concurrent requests (coalesced here),
    // and served from this instance's memory after.
    let replies = concurrent_gets(&client, &fg.url("/c/hot?delay=300"), 50).await;
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "n=1");
    }
    assert_eq!(origin.count("/c/hot"), 1);
    let hot = get(&client, &fg.url("/c/hot?delay=300"), &[]).await;
    assert!(status_of(&hot).contains("hit"), "{}", status_of(&hot));
    assert!(status_of(&get(&client, &fg.url("/c/warm"), &[]).await).contains("hit"));
    assert_eq!(origin.count("/c/warm"), 1);
}
