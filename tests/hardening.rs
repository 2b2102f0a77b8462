//! What an attacker tries against the front door, end to end through the real binary: other
//! spellings of a limited path (over HTTP/1.1 and HTTP/2), encoded slashes, bad escapes, and
//! prefix matching at segment boundaries.

mod common;

use bytes::Bytes;
use common::config::{Config, Limit, Route};
use common::{Floodgate, TempDir, Upstream, raw_exchange};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

/// The shipped layout: a limited route, then a catch-all without limits.
fn limited_then_catch_all(upstream: &Upstream) -> Config {
    Config::new()
        .route(
            Route::new("rides", "/api/rides/request", &upstream.url())
                .with("methods", "[POST]")
                .limit(one_per_1000s()),
        )
        .route(Route::new("everything_else", "/", &upstream.url()))
}

/// One request, then one per 1000 s: no refill within a test.
fn one_per_1000s() -> Limit {
    Limit::token_bucket(1, 0.001)
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
    let fg = Floodgate::start(&limited_then_catch_all(&upstream).yaml());
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
    let fg = Floodgate::start(&limited_then_catch_all(&upstream).yaml());
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
    let fg = Floodgate::start(&limited_then_catch_all(&upstream).yaml());
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
    let fg = Floodgate::start(
        &limited_then_catch_all(&upstream)
            .with("path_normalization", "decode")
            .yaml(),
    );
    assert_eq!(post_h1(&fg, "/api%2Frides/request").await, 200);
    assert_eq!(post_h1(&fg, "/api\\rides%2frequest").await, 429);
    assert_eq!(upstream.seen()[0].path, "/api/rides/request");
}

#[tokio::test]
async fn a_query_survives_normalisation() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&limited_then_catch_all(&upstream).yaml());
    assert_eq!(post_h1(&fg, "/api//rides/request?x=1&y=%2F").await, 200);
    let seen = upstream.seen();
    assert_eq!(seen[0].path, "/api/rides/request");
}

#[tokio::test]
async fn segment_matching_stops_a_prefix_at_a_path_boundary() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(
                Route::new("rides", "/api/rides", &upstream.url())
                    .with("path_match", "segment")
                    .limit(one_per_1000s()),
            )
            .route(Route::new("rest", "/", &upstream.url()))
            .yaml(),
    );
    assert_eq!(post_h1(&fg, "/api/rides").await, 200);
    assert_eq!(post_h1(&fg, "/api/rides/7").await, 429, "same route");
    assert_eq!(post_h1(&fg, "/api/ridesX").await, 200, "another route");
    assert_eq!(post_h1(&fg, "/api/ridesX").await, 200, "and unlimited");
}

#[tokio::test]
async fn human_logs_to_a_pipe_carry_no_colour_codes() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start_with_env(
        &limited_then_catch_all(&upstream).yaml(),
        &[("RUST_LOG", "info")],
    );
    // "floodgate started" is logged at info on start; stderr is a pipe here.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !fg.stderr().contains("floodgate started") && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stderr = fg.stderr();
    assert!(stderr.contains("floodgate started"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "escape codes in {stderr:?}");
}

#[test]
fn an_oversized_config_file_is_refused_with_a_reason() {
    let mut yaml = String::from("listen: 127.0.0.1:0\n");
    while yaml.len() <= 17 << 20 {
        yaml.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    let file = common::TempFile::new(&yaml);
    let out = common::floodgate_command(&[
        "check".as_ref(),
        "--config".as_ref(),
        file.path().as_os_str(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the most floodgate reads"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A route to the upstream, with `timeouts.header_read` at 300 ms.
fn quick(upstream: &Upstream) -> Config {
    route_to(&upstream.url()).timeout("header_read", "300ms")
}

/// Sends `opening` (maybe nothing), then waits for floodgate to close the connection; how long
/// it took, or `None` past 5 s (far past the 300 ms configured, far short of the 10 s default).
async fn closed_after(fg: &Floodgate, opening: &[u8]) -> Option<Duration> {
    closed_after_at(fg.addr(), opening).await
}

async fn closed_after_at(addr: std::net::SocketAddr, opening: &[u8]) -> Option<Duration> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(opening).await.expect("write");
    let started = Instant::now();
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {} // a response or an h2 frame before the close
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_send_a_request_are_closed() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).yaml());
    // Silent from the start (hyper's protocol detection used to wait forever).
    assert!(
        closed_after(&fg, b"").await.is_some(),
        "a silent connection"
    );
    // Half an HTTP/2 preface.
    assert!(
        closed_after(&fg, b"PRI * HTTP/2.0\r\n").await.is_some(),
        "a partial preface"
    );
    assert_eq!(upstream.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_to_the_admin_listener_is_closed_too() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).yaml());
    let admin: std::net::SocketAddr = fg
        .admin_url("")
        .trim_start_matches("http://")
        .parse()
        .expect("admin address");
    assert!(
        closed_after_at(admin, b"").await.is_some(),
        "a silent admin connection"
    );
}

#[tokio::test]
async fn a_request_without_a_host_or_with_two_is_refused() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).yaml());
    let none = raw_exchange(fg.addr(), b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert!(none.starts_with("HTTP/1.1 400"), "{none}");
    let two = raw_exchange(
        fg.addr(),
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(two.starts_with("HTTP/1.1 400"), "{two}");
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn a_malformed_chunked_body_is_the_clients_error() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).yaml());
    for body in [
        "zz\r\nhello\r\n0\r\n\r\n",
        "-5\r\nhello\r\n0\r\n\r\n",
        "ffffffffffffffffffff\r\nx\r\n",
    ] {
        let request = format!(
            "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{body}"
        );
        let response = raw_exchange(fg.addr(), request.as_bytes()).await;
        assert!(
            response.starts_with("HTTP/1.1 400"),
            "{body:?} answered {response}"
        );
    }
}

#[tokio::test]
async fn a_body_over_max_body_size_gets_413() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).with("max_body_size", "1k").yaml());
    // Announced too large: refused before anything is forwarded.
    let big = format!(
        "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\nConnection: close\r\n\r\n{}",
        "a".repeat(2048)
    );
    let response = raw_exchange(fg.addr(), big.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(response.contains("payload_too_large"));
    assert_eq!(upstream.count(), 0);
    // Chunked, and only too large once streamed.
    let chunk = "a".repeat(600);
    let chunked = format!(
        "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n"
    );
    let response = raw_exchange(fg.addr(), chunked.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    // Within the limit: forwarded.
    let small =
        "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    assert!(
        raw_exchange(fg.addr(), small.as_bytes())
            .await
            .starts_with("HTTP/1.1 200")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_goes_silent_gets_408() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).timeout("client_body", "300ms").yaml());
    let mut stream = TcpStream::connect(fg.addr()).await.expect("connect");
    // One byte of a thousand, then silence.
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\na")
        .await
        .expect("write");
    let started = Instant::now();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response)).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    // 300 ms configured; well under the 60 s default.
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// An upstream that answers every connection with `response`, byte for byte, then holds the
/// connection open (silent) for 10 s.
async fn raw_upstream(response: &'static [u8]) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(response).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
            });
        }
    });
    addr
}

/// One route, `/` → `upstream_url`.
fn route_to(upstream_url: &str) -> Config {
    Config::new().route(Route::new("all", "/", upstream_url))
}

#[tokio::test]
async fn a_response_with_content_length_and_chunked_is_relayed_chunked_whole() {
    let addr = raw_upstream(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    let fg = Floodgate::start(&route_to(&format!("http://{addr}")).yaml());
    let response = raw_exchange(
        fg.addr(),
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        !response
            .to_ascii_lowercase()
            .contains("content-length: 100"),
        "{response}"
    );
    assert!(
        response.contains("hello") && response.contains(" world"),
        "{response}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_body_that_goes_silent_is_cut_off() {
    // Headers and one chunk, then nothing (the raw upstream holds the connection 10 s).
    let addr =
        raw_upstream(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n").await;
    let fg = Floodgate::start(
        &route_to(&format!("http://{addr}"))
            .timeout("upstream_body", "300ms")
            .yaml(),
    );
    let mut stream = TcpStream::connect(fg.addr()).await.expect("connect");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let started = Instant::now();
    let mut response = Vec::new();
    let read =
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response)).await;
    let text = String::from_utf8_lossy(&response);
    // Closed well before the upstream's 10 s, and without the last chunk: a truncated body
    // never looks complete.
    assert!(read.is_ok(), "still open after 5 s: {text}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(text.contains("hello"), "{text}");
    assert!(!text.ends_with("0\r\n\r\n"), "{text}");
}

#[tokio::test]
async fn an_untrusted_user_id_is_not_forwarded() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).yaml());
    let request = b"GET /x HTTP/1.1\r\nHost: x\r\nX-User-Id: admin\r\nConnection: close\r\n\r\n";
    assert!(
        raw_exchange(fg.addr(), request)
            .await
            .starts_with("HTTP/1.1 200")
    );
    assert_eq!(upstream.seen()[0].header("x-user-id"), None);
    // The operator can keep it (an upstream that checks the header's origin itself).
    let keep = Floodgate::start(
        &quick(&upstream)
            .set("identity", "strip_untrusted_user_id", "false")
            .yaml(),
    );
    assert!(
        raw_exchange(keep.addr(), request)
            .await
            .starts_with("HTTP/1.1 200")
    );
    assert_eq!(upstream.seen()[1].header("x-user-id"), Some("admin"));
}

/// An upstream that answers the first request on each connection (keep-alive, no
/// `Connection: close`), then, when the next request arrives on that connection, closes it
/// unanswered: its idle timer fired just as floodgate reused the connection.
async fn closes_reused_connections() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                if matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await;
                    let _ = stream.read(&mut buf).await; // the reuse: close without answering
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_idempotent_request_on_a_connection_the_upstream_just_closed_is_retried() {
    let fg = Floodgate::start(
        &route_to(&format!("http://{}", closes_reused_connections().await)).yaml(),
    );
    let client = common::client();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(
            common::get(&client, &fg.url("/x"), &[])
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(statuses, vec![200; 20], "no spurious 502");
}

#[tokio::test]
async fn a_request_with_a_body_is_not_sent_twice() {
    let fg = Floodgate::start(
        &route_to(&format!("http://{}", closes_reused_connections().await)).yaml(),
    );
    let client = common::client();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let response = client
            .post(fg.url("/x"))
            .body("payload")
            .send()
            .await
            .expect("response");
        statuses.push(response.status().as_u16());
    }
    // Every other POST lands on a reused connection the upstream closes: 502, never retried.
    assert!(
        statuses.contains(&200) && statuses.contains(&502),
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_stream_cap_an_http2_connection_opening_streams_too_fast_is_answered_429() {
    let upstream = Upstream::start().await;
    // No cap by default (tests/http_semantics.rs): this one is opted into.
    let fg = Floodgate::start(
        &quick(&upstream)
            .with("http2_max_streams_per_second", "1000")
            .yaml(),
    );
    let stream = TcpStream::connect(fg.addr()).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    // 3000 streams at once on one connection, to a cheap answer (no upstream). The budget is a
    // burst of 500 then 1000/s: unless this takes over 2.5 s (it takes a fraction of one, even in
    // a debug build on a loaded machine), some are refused.
    let tasks: Vec<_> = (0..3000)
        .map(|_| {
            let mut sender = sender.clone();
            let uri: http::Uri = format!("http://{}/x", fg.addr()).parse().expect("uri");
            tokio::spawn(async move {
                let request = http::Request::get(uri)
                    .body(Empty::<Bytes>::new())
                    .expect("request");
                match sender.send_request(request).await {
                    Ok(response) => response.status().as_u16(),
                    Err(_) => 0,
                }
            })
        })
        .collect();
    let mut statuses = std::collections::HashMap::<u16, usize>::new();
    for task in tasks {
        *statuses.entry(task.await.expect("task")).or_default() += 1;
    }
    let refused = statuses.get(&429).copied().unwrap_or(0);
    let lost = statuses.get(&0).copied().unwrap_or(0); // no response reached the client
    assert!(refused > 0, "no stream refused: {statuses:?}");
    assert!(upstream.count() < 3000);
    // Every refusal is counted: at least the 429s the client saw, at most those plus streams
    // whose answer never reached it.
    let counted = common::metric(&fg, "floodgate_http2_streams_refused_total").await as usize;
    assert!(
        (refused..=refused + lost).contains(&counted),
        "counted {counted}, statuses {statuses:?}"
    );
    // Another connection has a budget of its own.
    assert_eq!(post_h2(&fg, "/fine").await, 200);
}

/// Sends a request head and then a chunked body of `megabytes` MiB in 64 KiB chunks, as a client
/// like Python's requests does (all of it, then it reads the answer), and returns whether the
/// whole body could be written, and the response head as far as it can be read.
async fn upload(addr: std::net::SocketAddr, head: &str, megabytes: usize) -> (bool, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write head");
    let chunk = format!("10000\r\n{}\r\n", "a".repeat(0x10000));
    let mut written = true;
    for _ in 0..megabytes * 16 {
        if stream.write_all(chunk.as_bytes()).await.is_err() {
            written = false;
            break;
        }
    }
    written &= stream.write_all(b"0\r\n\r\n").await.is_ok();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Ok(Ok(n @ 1..)) => out.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    (written, String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn a_client_still_sending_reads_the_answer_given_before_its_body_was_read() {
    // floodgate answers 413 after 1 MiB of a 16 MiB upload, and 429 before reading any of it.
    // Closed while the client is still sending (more than the sockets' buffers hold), the
    // connection is reset and the client's next write fails (a broken pipe): a client that
    // sends its whole body before it reads, as most do, never reads the answer. floodgate reads
    // and discards the rest (lingering close), so every upload is taken whole and answered.
    let upstream = Upstream::start().await;
    let config = Config::new()
        .with("max_body_size", "1m")
        .route(
            Route::new("limited", "/limited", &upstream.url()).limit(Limit::fixed_window(1, "1h")),
        )
        .route(Route::new("all", "/", &upstream.url()));
    let fg = Floodgate::start(&config.yaml());
    let chunked = |path: &str| {
        format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    };
    for attempt in 0..3 {
        let (written, answer) = upload(fg.addr(), &chunked("/upload"), 16).await;
        assert!(
            written,
            "attempt {attempt}: the connection was closed under the upload"
        );
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "attempt {attempt}: {answer:?}"
        );
    }
    // The first request spends the window's one; the others are refused unread.
    let small =
        "POST /limited HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
    assert!(
        raw_exchange(fg.addr(), small.as_bytes())
            .await
            .starts_with("HTTP/1.1 200")
    );
    for attempt in 0..3 {
        let (written, answer) = upload(fg.addr(), &chunked("/limited"), 16).await;
        assert!(
            written,
            "attempt {attempt}: the connection was closed under the upload"
        );
        assert!(
            answer.starts_with("HTTP/1.1 429"),
            "attempt {attempt}: {answer:?}"
        );
    }
}

/// Reads one response from a keep-alive connection: its head, then its `Content-Length` bytes.
async fn read_response(stream: &mut TcpStream) -> String {
    let head = common::read_head(stream).await;
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .expect("a Content-Length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.expect("the body");
    head + &String::from_utf8_lossy(&body)
}

/// On a keep-alive connection, the head after the first is bounded by `header_read` (300 ms)
/// too, whether nothing comes or half a head: floodgate keeps that deadline per connection
/// (`src/server/head.rs`), not as hyper's timer per request. Bounds: the close comes no sooner
/// than 200 ms after the first answer was read (the deadline is 300 ms after floodgate began
/// waiting for the head, which is before the client read the answer; 100 ms of slack for a
/// loaded machine's scheduling), and within 5 s (the default header_read is 10 s: a deadline
/// that was never kept would show as none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_head_on_a_kept_alive_connection_is_bounded_by_header_read() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).yaml());
    for next in [&b""[..], b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaa"] {
        let mut stream = TcpStream::connect(fg.addr()).await.expect("connect");
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let first = read_response(&mut stream).await;
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        let answered = Instant::now();
        stream.write_all(next).await.expect("write");
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return answered.elapsed(),
                    Ok(_) => {} // a 408 before the close
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{next:?}: the connection outlived header_read"));
        assert!(
            closed >= Duration::from_millis(200),
            "{next:?}: closed after {closed:?}, before header_read"
        );
    }
}

/// A request whose answer takes longer than `header_read` (the upstream's `/slow`, 1.5 s,
/// against 300 ms) is answered, and its connection serves the next request: the head deadline
/// is not pending while a request is in service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_slower_than_header_read_keeps_its_connection() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&quick(&upstream).yaml());
    let mut stream = TcpStream::connect(fg.addr()).await.expect("connect");
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let slow = read_response(&mut stream).await;
    assert!(slow.starts_with("HTTP/1.1 200"), "{slow}");
    assert!(slow.ends_with("slow but done"), "{slow}");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let next = read_response(&mut stream).await;
    assert!(next.starts_with("HTTP/1.1 200"), "{next}");
    assert_eq!(upstream.count(), 2);
}

/// floodgate with `max_connections: 2`, `timeouts.header_read` as given, and the admin and
/// rate-limit service ports beside the proxy's (one listener implementation serves all three).
fn three_ports(upstream: &Upstream, rules: &TempDir, header_read: &str) -> Floodgate {
    std::fs::write(
        rules.path().join("edge.yaml"),
        "domain: edge\ndescriptors: []\n",
    )
    .expect("write rules");
    let service = format!(
        "\n  listen: 127.0.0.1:0\n  config: [{}]",
        rules.path().display()
    );
    let config = route_to(&upstream.url())
        .with("max_connections", "2")
        .with("service", &service)
        .timeout("header_read", header_read);
    Floodgate::start(&config.yaml())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_and_service_ports_close_a_silent_or_half_sent_head() {
    let upstream = Upstream::start().await;
    let rules = TempDir::new("rules");
    let fg = three_ports(&upstream, &rules, "300ms");
    let admin: std::net::SocketAddr = (fg.admin_url("").trim_start_matches("http://"))
        .parse()
        .expect("admin address");
    for (port, addr) in [("admin", admin), ("service", fg.service_addr())] {
        for opening in [&b""[..], b"GET /healthz HTTP/1.1\r\nHost: x\r\n"] {
            assert!(
                closed_after_at(addr, opening).await.is_some(),
                "{port}: {:?} was not closed",
                String::from_utf8_lossy(opening)
            );
        }
    }
}

/// Two connections open on a port at `max_connections: 2`: a third is not served until one of
/// them closes. (The third's request waits in the kernel's backlog: floodgate does not accept
/// it. 1 s without an answer stands for "never": an accepted connection is answered in
/// milliseconds, and the two held connections, silent, are closed only after `header_read`,
/// 5 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_and_service_ports_hold_to_max_connections() {
    let upstream = Upstream::start().await;
    let rules = TempDir::new("rules");
    let fg = three_ports(&upstream, &rules, "5s");
    let admin: std::net::SocketAddr = (fg.admin_url("").trim_start_matches("http://"))
        .parse()
        .expect("admin address");
    for (port, addr) in [("admin", admin), ("service", fg.service_addr())] {
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(TcpStream::connect(addr).await.expect("connect"));
        }
        // Accepted by then (each holds a place).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut third = TcpStream::connect(addr).await.expect("connect");
        third
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_secs(1), third.read(&mut buf)).await;
        assert!(
            early.is_err(),
            "{port}: a third connection was served at max_connections 2"
        );
        // One of the two closes: the third is accepted and answered.
        drop(held.pop());
        let n = tokio::time::timeout(Duration::from_secs(3), third.read(&mut buf))
            .await
            .expect("answered once a connection closed")
            .expect("read");
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 "),
            "{port}: {:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        drop(held);
    }
}
