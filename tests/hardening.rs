//! What an attacker tries against the front door, end to end through the real binary: other
//! spellings of a limited path (over HTTP/1.1 and HTTP/2), encoded slashes, bad escapes, and
//! prefix matching at segment boundaries.

mod common;

use bytes::Bytes;
use common::{Floodgate, Upstream, raw_exchange};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

/// The shipped layout: a limited route, then a catch-all without limits.
fn limited_then_catch_all(upstream: &Upstream, extra: &str) -> String {
    format!(
        "{extra}
routes:
  - name: rides
    path_prefix: /api/rides/request
    methods: [POST]
    upstream: {0}
    limits:
      - {{algorithm: token_bucket, capacity: 1, refill_rate: 0.001}}
  - name: everything_else
    path_prefix: /
    upstream: {0}
",
        upstream.url()
    )
}

/// The spellings of `/api/rides/request` that used to reach the unlimited catch-all.
const SPELLINGS: [&str; 7] = [
    "/api/rides/request",
    "//api/rides/request",
    "/api//rides/request",
    "/api/./rides/request",
    "/api/x/../rides/request",
    "/api/rides/%72equest",
    "/%61pi/rides/request",
];

/// The status of `POST {target}` sent over HTTP/1.1 byte for byte (no client normalises it).
async fn post_h1(fg: &Floodgate, target: &str) -> u16 {
    let request = format!(
        "POST {target} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let response = raw_exchange(fg.addr(), request.as_bytes()).await;
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {response:?}"))
}

/// The status of `POST {path}` over cleartext HTTP/2, the `:path` exactly as given.
async fn post_h2(fg: &Floodgate, path: &str) -> u16 {
    let stream = TcpStream::connect(fg.addr()).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let uri: http::Uri = http::Uri::builder()
        .scheme("http")
        .authority(fg.addr().to_string())
        .path_and_query(path)
        .build()
        .expect("uri");
    let request = http::Request::post(uri)
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    status
}

#[tokio::test]
async fn every_spelling_of_a_limited_path_spends_its_budget_over_http1() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&limited_then_catch_all(&upstream, ""));
    let mut statuses = Vec::new();
    for spelling in SPELLINGS {
        statuses.push(post_h1(&fg, spelling).await);
    }
    assert_eq!(
        statuses,
        vec![200, 429, 429, 429, 429, 429, 429],
        "{SPELLINGS:?}"
    );
    // The upstream saw the normalised path, once.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/api/rides/request");
}

#[tokio::test]
async fn every_spelling_of_a_limited_path_spends_its_budget_over_h2() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&limited_then_catch_all(&upstream, ""));
    let mut statuses = Vec::new();
    for spelling in SPELLINGS {
        statuses.push(post_h2(&fg, spelling).await);
    }
    assert_eq!(
        statuses,
        vec![200, 429, 429, 429, 429, 429, 429],
        "{SPELLINGS:?}"
    );
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn encoded_slashes_and_bad_escapes_are_refused_by_default() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&limited_then_catch_all(&upstream, ""));
    for target in [
        "/api%2Frides/request",
        "/api%5Crides/request",
        "/api\\rides/request",
        "/api/rides/%zzrequest",
        "/api/rides/request%",
    ] {
        assert_eq!(post_h1(&fg, target).await, 400, "{target}");
    }
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn decode_turns_encoded_slashes_into_the_limited_path() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&limited_then_catch_all(
        &upstream,
        "path_normalization: decode",
    ));
    assert_eq!(post_h1(&fg, "/api%2Frides/request").await, 200);
    assert_eq!(post_h1(&fg, "/api\\rides%2frequest").await, 429);
    assert_eq!(upstream.seen()[0].path, "/api/rides/request");
}

#[tokio::test]
async fn a_query_survives_normalisation() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&limited_then_catch_all(&upstream, ""));
    assert_eq!(post_h1(&fg, "/api//rides/request?x=1&y=%2F").await, 200);
    let seen = upstream.seen();
    assert_eq!(seen[0].path, "/api/rides/request");
}

#[tokio::test]
async fn segment_matching_stops_a_prefix_at_a_path_boundary() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&format!(
        "routes:
  - name: rides
    path_prefix: /api/rides
    path_match: segment
    upstream: {0}
    limits:
      - {{algorithm: token_bucket, capacity: 1, refill_rate: 0.001}}
  - name: rest
    path_prefix: /
    upstream: {0}
",
        upstream.url()
    ));
    assert_eq!(post_h1(&fg, "/api/rides").await, 200);
    assert_eq!(post_h1(&fg, "/api/rides/7").await, 429, "same route");
    assert_eq!(post_h1(&fg, "/api/ridesX").await, 200, "another route");
    assert_eq!(post_h1(&fg, "/api/ridesX").await, 200, "and unlimited");
}
