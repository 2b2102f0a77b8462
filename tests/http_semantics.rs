//! HTTP at the proxy hop, with real clients where one exists (nghttp2's `nghttp` and `h2load`,
//! the `h2` crate for what no polite client sends): split HTTP/2 cookies joined for the HTTP/1.1
//! upstream, redirects to the upstream rewritten to floodgate's origin, multiplexing clients never
//! refused on an unlimited route, rapid reset (paced and unpaced) closing its connection, idle
//! HTTP/2 connections closed, a short upstream body relayed as far as it came, and the status
//! line in the client's HTTP version.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::config::{Config, Limit, Route};
use common::{Floodgate, RawUpstream, Upstream, get, h2c_client, metric, raw_exchange};
use tokio::net::TcpStream;

/// One route named `open`, `/` → `upstream_url`.
fn open(upstream_url: &str) -> Route {
    Route::new("open", "/", upstream_url)
}

/// A config of `route` alone.
fn only(route: Route) -> Config {
    Config::new().route(route)
}

/// An nghttp2 command-line tool; `scripts/test.sh` installs them (Debian's nghttp2-client).
fn nghttp2_tool(name: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} is missing: install Debian's nghttp2-client (scripts/test.sh does)"
    );
    Command::new(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_http2_cookies_reach_an_http1_upstream_as_one_header() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&only(open(&upstream.url())).yaml());
    // nghttp sends each -H as a field of its own, as browsers do with cookies over HTTP/2.
    let url = fg.url("/cookies");
    let out = tokio::task::spawn_blocking(move || {
        nghttp2_tool("nghttp")
            .args([
                "-H",
                "cookie: a=1",
                "-H",
                "cookie: b=2",
                "-H",
                "cookie: c=3",
                &url,
            ])
            .output()
            .expect("run nghttp")
    })
    .await
    .expect("nghttp task");
    assert!(out.status.success(), "nghttp: {out:?}");
    // And reqwest over h2c.
    let reply = get(
        &h2c_client(),
        &fg.url("/cookies2"),
        &[("cookie", "x=1"), ("cookie", "y=2")],
    )
    .await;
    assert_eq!(reply.status, 200);

    let seen = upstream.seen();
    let cookies = |path: &str| -> Vec<String> {
        let request = seen.iter().find(|s| s.path == path).expect("request seen");
        request
            .headers
            .get_all("cookie")
            .iter()
            .map(|v| v.to_str().expect("text").to_string())
            .collect()
    };
    assert_eq!(cookies("/cookies"), ["a=1; b=2; c=3"]);
    assert_eq!(cookies("/cookies2"), ["x=1; y=2"]);
}

#[tokio::test]
async fn redirects_to_the_upstream_point_at_floodgate_unless_the_route_says_not_to() {
    let upstream = Upstream::start().await;
    // First match wins: /redirect-kept keeps the upstream's redirects, the rest of /redirect
    // has them rewritten.
    let fg = Floodgate::start(
        &Config::new()
            .route(
                Route::new("kept", "/redirect-kept", &upstream.url())
                    .with("rewrite_redirects", "false"),
            )
            .route(Route::new("rewritten", "/redirect", &upstream.url()))
            .yaml(),
    );
    let request =
        b"GET /redirect/a HTTP/1.1\r\nHost: api.example:8443\r\nConnection: close\r\n\r\n";
    let response = raw_exchange(fg.addr(), request).await.to_ascii_lowercase();
    assert!(response.starts_with("http/1.1 302"), "{response}");
    assert!(
        response.contains("\r\nlocation: http://api.example:8443/landing?from=redirect\r\n"),
        "{response}"
    );
    assert!(
        response.contains("\r\ncontent-location: http://api.example:8443/content\r\n"),
        "{response}"
    );
    // Over HTTP/2 the client's origin is its :authority.
    let h2 = h2c_client();
    let response = h2.get(fg.url("/redirect/b")).send().await.expect("send");
    // reqwest follows the redirect: it must land on floodgate (the /landing path has no route
    // there, so 404 from floodgate), never on the upstream directly.
    assert_eq!(response.url().as_str(), fg.url("/landing?from=redirect"));
    assert_eq!(response.status(), 404);

    let request = b"GET /redirect-kept HTTP/1.1\r\nHost: api.example\r\nConnection: close\r\n\r\n";
    let response = raw_exchange(fg.addr(), request).await.to_ascii_lowercase();
    assert!(
        response.contains(&format!("\r\nlocation: {}/landing", upstream.url())),
        "rewrite_redirects: false keeps the upstream's: {response}"
    );
}

/// Runs h2load and returns its `status codes:` line's 2xx, 4xx and total counts.
async fn h2load(url: String, requests: u32, clients: u32, streams: u32) -> (u64, u64, String) {
    let out = tokio::task::spawn_blocking(move || {
        nghttp2_tool("h2load")
            .args([
                "-n",
                &requests.to_string(),
                "-c",
                &clients.to_string(),
                "-m",
                &streams.to_string(),
                &url,
            ])
            .output()
            .expect("run h2load")
    })
    .await
    .expect("h2load task");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("status codes: "))
        .unwrap_or_else(|| panic!("no status line in h2load's output:\n{text}"));
    // "20000 2xx, 0 3xx, 0 4xx, 0 5xx"
    let count = |class: &str| -> u64 {
        line.split(", ")
            .find_map(|p| p.strip_suffix(class))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {class} in {line:?}"))
    };
    (count(" 2xx"), count(" 4xx"), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiplexing_clients_are_never_refused_on_an_unlimited_route() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&only(open(&upstream.url())).yaml());
    // 16 connections × 10 streams, then one connection × 100 streams (an edge proxy's or a
    // gRPC client's pattern): every stream completes, none is refused.
    for (requests, clients, streams) in [(10_000, 16, 10), (5_000, 1, 100)] {
        let (ok, refused, text) = h2load(fg.url("/"), requests, clients, streams).await;
        assert_eq!(
            (ok, refused),
            (u64::from(requests), 0),
            "h2load -c {clients} -m {streams}:\n{text}"
        );
    }
    assert_eq!(metric(&fg, "floodgate_http2_resets_total").await, 0);
}

/// An h2 client connection, its driver task running.
async fn h2_connect(
    fg: &Floodgate,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(fg.addr()).await.expect("connect");
    let (client, connection) = h2::client::Builder::new()
        .max_concurrent_reset_streams(100_000)
        .handshake(tcp)
        .await
        .expect("h2 handshake");
    (client, tokio::spawn(connection))
}

/// Opens `batch` streams to `path`, waits `pause` (so floodgate has accepted them and is working
/// on them), resets them all, and repeats `batches` times or until the connection is refused.
/// Returns how many streams were opened.
async fn rapid_reset(
    fg: &Floodgate,
    path: &str,
    batches: usize,
    batch: usize,
    pause: Duration,
) -> (usize, tokio::task::JoinHandle<Result<(), h2::Error>>) {
    let (mut client, connection) = h2_connect(fg).await;
    let uri = format!("http://{}{path}", fg.addr());
    let mut opened = 0;
    'attack: for _ in 0..batches {
        let mut streams = Vec::with_capacity(batch);
        for _ in 0..batch {
            let Ok(ready) = client.clone().ready().await else {
                break 'attack;
            };
            client = ready;
            let request = http::Request::get(uri.as_str()).body(()).expect("request");
            match client.send_request(request, true) {
                Ok((_response, stream)) => streams.push(stream),
                Err(_) => break 'attack,
            }
            opened += 1;
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        for mut stream in streams {
            stream.send_reset(h2::Reason::CANCEL);
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause / 2).await;
        }
    }
    (opened, connection)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_paced_under_hypers_threshold_closes_its_connection() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(
        &only(open(&upstream.url()))
            .with("http2_max_resets_per_second", "50")
            .yaml(),
    );
    // 16 streams at a time (hyper counts streams reset before it accepts them, up to 64; these
    // are accepted first: 60 ms is ample even for a debug build on a loaded machine), each reset
    // while floodgate waits on the slow upstream.
    // 60 batches would put 960 requests on the upstream; the budget is 50/s with a burst of 100.
    let started = Instant::now();
    let (opened, connection) = rapid_reset(&fg, "/slow", 60, 16, Duration::from_millis(60)).await;
    let closed = tokio::time::timeout(Duration::from_secs(5), connection).await;
    assert!(
        closed.is_ok(),
        "the connection is still open after {opened} abandoned streams"
    );
    // What reached the upstream: the burst, what refilled meanwhile, and the batch in flight
    // when the GOAWAY came (the loop can run longer than planned on a slow machine: count it).
    let refilled = (started.elapsed().as_secs_f64() * 50.0).ceil() as usize;
    assert!(
        upstream.count() <= 100 + refilled + 16,
        "{} requests reached the upstream ({opened} streams opened in {:?})",
        upstream.count(),
        started.elapsed()
    );
    assert!(
        opened < 60 * 16,
        "the attack ran to its end: {opened} streams"
    );
    assert_eq!(
        metric(&fg, "floodgate_connections_closed_total{reason=\"resets\"}").await,
        1
    );
    assert!(metric(&fg, "floodgate_http2_resets_total").await > 100);
    // A well-behaved client on a new connection is served.
    assert_eq!(get(&h2c_client(), &fg.url("/after"), &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpaced_rapid_reset_is_cut_off_before_it_reaches_the_upstream_at_will() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&only(open(&upstream.url())).yaml());
    // 5,000 streams, each reset as soon as it is sent.
    let (opened, connection) = rapid_reset(&fg, "/slow", 5_000, 1, Duration::ZERO).await;
    let closed = tokio::time::timeout(Duration::from_secs(5), connection).await;
    assert!(
        closed.is_ok(),
        "the connection is still open after {opened} resets"
    );
    // Whichever defence closed it (hyper's for streams reset before acceptance, floodgate's for
    // the rest: a burst of 200), the upstream saw at most the burst and the streams in flight
    // (256 per connection).
    // (Whether the client got all 5,000 out before the GOAWAY reached it is a race: not asserted.)
    assert!(
        upstream.count() <= 200 + 256,
        "{} of {opened} reached the upstream",
        upstream.count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_on_a_limited_route_reaches_the_upstream_no_faster_than_its_limits() {
    let upstream = Upstream::start().await;
    let fg =
        Floodgate::start(&only(open(&upstream.url()).limit(Limit::token_bucket(10, 5.0))).yaml());
    let started = Instant::now();
    let (opened, _connection) = rapid_reset(&fg, "/slow", 20, 16, Duration::from_millis(30)).await;
    // Denied streams are answered 429 at once (not abandoned); admitted ones spend the budget
    // whether or not the client resets them. Capacity 10, 5/s refilled while the attack lasted.
    let allowed = 10 + (started.elapsed().as_secs_f64() * 5.0).ceil() as usize;
    assert!(
        upstream.count() <= allowed,
        "{} of {opened} streams reached the upstream, the limits allow {allowed}",
        upstream.count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_with_no_open_stream_is_closed_after_the_idle_timeout() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&only(open(&upstream.url())).timeout("idle", "1s").yaml());
    // A client that completes the handshake (and answers pings) but never opens a stream.
    let started = Instant::now();
    let (_client, connection) = h2_connect(&fg).await;
    // idle is 1 s; 8 s leaves room for a loaded CI machine, and is far short of "never".
    let closed = tokio::time::timeout(Duration::from_secs(8), connection).await;
    assert!(closed.is_ok(), "still open after {:?}", started.elapsed());
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed too early"
    );

    // A stream in progress keeps the connection: /slow takes 1.5 s, longer than idle.
    let (client, connection) = h2_connect(&fg).await;
    let mut client = client.ready().await.expect("ready");
    let request = http::Request::get(format!("http://{}/slow", fg.addr()))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send");
    let response = response.await.expect("the slow stream is answered");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.expect("the body arrives whole");
    }
    drop(client);
    let closed = tokio::time::timeout(Duration::from_secs(8), connection).await;
    assert!(
        closed.is_ok(),
        "idle after its stream, the connection closes too"
    );
    assert!(metric(&fg, "floodgate_connections_closed_total{reason=\"idle\"}").await >= 2);
}

#[tokio::test]
async fn a_body_the_upstream_cuts_short_is_relayed_as_far_as_it_came() {
    let upstream =
        RawUpstream::start(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789").await;
    let fg = Floodgate::start(&only(open(&upstream.url())).yaml());
    let response = raw_exchange(
        fg.addr(),
        b"GET /short HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response:?}");
    assert!(
        response
            .to_ascii_lowercase()
            .contains("\r\ncontent-length: 100\r\n"),
        "{response:?}"
    );
    assert!(response.ends_with("\r\n\r\n0123456789"), "{response:?}");
    // The log names the route.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fg.stderr().contains("ended the response body early") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = fg.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("ended the response body early"))
        .unwrap_or_else(|| panic!("not logged:\n{log}"));
    assert!(line.contains("open"), "the route is named: {line}");
}

#[tokio::test]
async fn the_status_line_is_in_the_clients_http_version_not_the_upstreams() {
    let upstream = RawUpstream::start(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let fg = Floodgate::start(&only(open(&upstream.url())).yaml());
    let response = raw_exchange(
        fg.addr(),
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response:?}");
    assert!(response.ends_with("\r\n\r\nok"), "{response:?}");
}
