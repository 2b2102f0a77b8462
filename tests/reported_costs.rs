//! What an upstream reports a call cost (`cost: {reserve, actual}`) is the upstream's word:
//! bounded at the edge (a figure that is no count settles at the reserve, one above
//! `actual.max` is charged as `actual.max`), saturating in every store, and never able to free
//! a budget, make a store's reply unreadable or open the breaker for other clients.

mod common;

use std::time::{Duration, Instant};

use common::{Floodgate, RedisServer, client, get, metric};
use reqwest::StatusCode;

/// A route `/cost` whose upstream reports in `X-Cost` what the client sends in
/// `x-report-cost`: 1000 tokens per API key, one back every 100 s (none during the test), each
/// call holding 10 and settling at the figure reported.
fn config(upstream: &str, storage: &str) -> String {
    format!(
        "admin_listen: 127.0.0.1:0\n{storage}\nroutes:\n  - name: costed\n    path_prefix: /cost\n    \
         upstream: {upstream}\n    limits:\n      - algorithm: token_bucket\n        capacity: 1000\n        \
         refill_rate: 0.01\n        cost:\n          reserve: 10\n          actual: {{header: X-Cost}}\n"
    )
}

/// Units settled and refunded so far on `fg` (one of them grows with every settlement).
async fn settled(fg: &Floodgate) -> u64 {
    let mut sum = 0;
    for outcome in ["settled", "refunded"] {
        let series = format!(
            "floodgate_cost_units_total{{route=\"costed\",limit=\"costed-0\",outcome=\"{outcome}\"}}"
        );
        sum += metric(fg, &series).await;
    }
    sum
}

/// One call by `key`, the upstream reporting `figure` (none: the header is absent); waits (a
/// few ms; up to `DRAIN_DEADLINE` on a loaded machine) until its settlement has been made.
async fn call(fg: &Floodgate, key: &str, figure: Option<&str>) -> common::Reply {
    let before = settled(fg).await;
    let mut headers = vec![("x-api-key", key)];
    if let Some(figure) = figure {
        headers.push(("x-report-cost", figure));
    }
    let reply = get(&client(), &fg.url("/cost"), &headers).await;
    if reply.status == StatusCode::OK {
        let deadline = Instant::now() + common::DRAIN_DEADLINE;
        while settled(fg).await == before {
            assert!(Instant::now() < deadline, "never settled: {}", fg.stderr());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The settlement is spawned once counted (a remote store): let it land.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reply
}

/// Figures no counter holds: `1e30`, `2^64 - 1`, `2^55 - 300`, `1e10`, `1e15`. Each is charged
/// as `actual.max` (the capacity): the budget is spent, and the next call refused.
const HUGE: [&str; 5] = [
    "1e30",
    "18446744073709551615",
    "36028797018963668",
    "10000000000",
    "1000000000000000",
];

/// Figures that are no count: settled at the reserve.
const NOT_COUNTS: [&str; 5] = ["-5", "NaN", "inf", "ten", "-1e30"];

async fn reported_figures_are_bounded(fg: &Floodgate) {
    for (i, figure) in HUGE.iter().enumerate() {
        let key = format!("mallory-{i}");
        let first = call(fg, &key, Some(figure)).await;
        assert_eq!(first.status, StatusCode::OK, "{figure}");
        assert_eq!(first.header_u64("x-ratelimit-remaining"), 990);
        // Charged 990 more: nothing left, and the store still answers for this key.
        let next = call(fg, &key, None).await;
        assert_eq!(
            next.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{figure}: {next:?}"
        );
        assert_eq!(next.header_u64("x-ratelimit-limit"), 1000, "{figure}");
        assert_eq!(next.header_u64("x-ratelimit-remaining"), 0, "{figure}");
    }
    for (i, figure) in NOT_COUNTS.iter().enumerate() {
        let key = format!("junk-{i}");
        assert_eq!(call(fg, &key, Some(figure)).await.status, StatusCode::OK);
        let next = call(fg, &key, None).await;
        assert_eq!(next.status, StatusCode::OK, "{figure}");
        assert_eq!(
            next.header_u64("x-ratelimit-remaining"),
            980,
            "{figure}: at the reserve"
        );
    }
    // A fraction is rounded up: 12.2 is 13.
    assert_eq!(
        call(fg, "fraction", Some("12.2")).await.status,
        StatusCode::OK
    );
    let next = call(fg, "fraction", Some("0")).await;
    assert_eq!(next.header_u64("x-ratelimit-remaining"), 1000 - 13 - 10);
    // Everyone else keeps their limits, decided by the store (its headers), nothing failed
    // open.
    for n in 1..=3 {
        let reply = call(fg, "alice", Some("10")).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header_u64("x-ratelimit-remaining"), 1000 - 10 * n);
    }
    let failed = "floodgate_requests_total{route=\"costed\",decision=\"store_error\"}";
    assert_eq!(metric(fg, failed).await, 0, "no decision failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_figures_are_bounded_on_the_memory_store() {
    let upstream = common::Upstream::start().await;
    let fg = Floodgate::start(&config(&upstream.url(), ""));
    reported_figures_are_bounded(&fg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_figures_are_bounded_on_redis_and_never_open_its_breaker() {
    let redis = RedisServer::start();
    let upstream = common::Upstream::start().await;
    let storage = format!(
        "storage:\n  backend: redis\n  url: {}\n  on_error: allow\n  timeout: 2s",
        redis.url()
    );
    let fg = Floodgate::start(&config(&upstream.url(), &storage));
    reported_figures_are_bounded(&fg).await;
    let metrics = get(&client(), &fg.admin_url("/metrics"), &[]).await.body;
    assert!(
        metrics.contains("floodgate_store_breaker_state{state=\"closed\"} 1"),
        "{metrics}"
    );
}

/// What the store keeps for `key` (`/budgets`): the tokens left (`None` while the store does
/// not answer).
async fn remaining(fg: &Floodgate, key: &str) -> Option<u64> {
    let url = fg.admin_url(&format!("/budgets?route=costed&api_key={key}"));
    let reply = get(&client(), &url, &[]).await;
    (reply.status == StatusCode::OK).then(|| {
        reply.json()["limits"][0]["remaining"]
            .as_u64()
            .unwrap_or_else(|| panic!("no remaining in {}", reply.body))
    })
}

/// Waits (at most `DRAIN_DEADLINE`, far past the retries' 5 s backoff: a loaded machine) until `key` has `want` left.
async fn until_remaining(fg: &Floodgate, key: &str, want: u64) {
    let deadline = Instant::now() + common::DRAIN_DEADLINE;
    loop {
        let left = remaining(fg, key).await;
        if left == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} has {left:?} left, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Redis with a decision timeout of `timeout` and `on_error: allow`.
fn on_redis(redis: &RedisServer, timeout: &str) -> String {
    format!(
        "storage:\n  backend: redis\n  url: {}\n  on_error: allow\n  timeout: {timeout}",
        redis.url()
    )
}

/// A settlement the store could not take when the response ended (Redis paused past the
/// decision timeout) is tried again and lands: the budget ends at what the call used, not at
/// its reserve. Before, it was logged and lost.
///
/// Timing: the upstream answers after 600 ms; Redis is paused 100 ms into that for 1.5 s, so
/// the settlement meets a paused Redis whatever the load, and the retries (every 0.1 to 5 s)
/// meet it awake again well within the 10 s the test waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_that_fails_is_tried_again_until_it_lands() {
    let redis = RedisServer::start();
    let upstream = common::Upstream::start().await;
    let fg = Floodgate::start(&config(&upstream.url(), &on_redis(&redis, "200ms")));
    let url = fg.url("/cost");
    let call = tokio::spawn(async move {
        let headers = [
            ("x-api-key", "grace"),
            ("x-report-cost", "4"),
            ("x-delay-ms", "600"),
        ];
        get(&client(), &url, &headers).await
    });
    // Redis stalls once the request has been decided and forwarded (the upstream holds it for
    // 600 ms, then the settlement is due inside the 1.5 s stall). A fixed 100 ms here let a
    // loaded CI machine stall the decision itself, which then failed open.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while upstream.count() == 0 {
        assert!(std::time::Instant::now() < deadline, "never forwarded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _: String = redis.cmd(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let reply = call.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header_u64("x-ratelimit-remaining"),
        990,
        "the reserve held"
    );
    // Reserved 10, used 4: 6 come back once Redis answers again.
    until_remaining(&fg, "grace", 1000 - 4).await;
}

/// A decision answered after the request gave up on it (it failed open at the 50 ms timeout,
/// and Redis, stalled, decided it later): the reserve it spent is given back, since nothing
/// will settle it. Before, the budget kept it.
///
/// Timing: Redis stalls for 150 ms from just before the request is sent: the request gives up
/// 50 ms after it was sent, and Redis answers when the stall ends, before the connection's own
/// response timeout (250 ms after the send), so the answer reaches the batch driver late. A
/// delay of up to 100 ms in sending the request still fails it open (the test checks that it
/// did), and one of up to 100 ms in reading the answer still finds it in time. (A 240 ms stall
/// with a 100 ms timeout left 10 ms for the latter, and a loaded CI machine missed it once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_to_a_request_that_failed_open_spends_nothing() {
    let redis = RedisServer::start();
    let upstream = common::Upstream::start().await;
    let fg = Floodgate::start(&config(&upstream.url(), &on_redis(&redis, "50ms")));
    // The key exists, and the connection is up, before the pause.
    let first = call(&fg, "heidi", Some("10")).await;
    assert_eq!(first.status, StatusCode::OK);
    let _: String = redis.cmd(&["CLIENT", "PAUSE", "150", "ALL"]);
    let reply = get(
        &client(),
        &fg.url("/cost"),
        &[("x-api-key", "heidi"), ("x-report-cost", "10")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "failed open");
    assert!(
        reply.headers.get("x-ratelimit-remaining").is_none(),
        "no store decided it"
    );
    // Wait for the pause to end and the late answer's give-back to land: then only the first
    // call's 10 are spent.
    tokio::time::sleep(Duration::from_millis(500)).await;
    until_remaining(&fg, "heidi", 990).await;
}

/// An HTTP/1.1 upstream that answers every request chunked, the cost only in a trailer it
/// declares (`Trailer: X-Cost`), as an API that learns its cost while streaming does.
async fn trailer_upstream(cost: &'static str) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut seen = Vec::new();
                loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    // One answer per request head (the requests here have no body).
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Cost\r\n\r\n\
                             5\r\nhello\r\n0\r\nX-Cost: {cost}\r\n\r\n"
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// The contract reads `actual` from a "response header or trailer": over HTTP/1.1 too, from a
/// chunked trailer (e9faff0 settled such a call at its reserve).
#[tokio::test]
async fn a_cost_in_an_http1_chunked_trailer_is_settled() {
    let upstream = trailer_upstream("7").await;
    let fg = Floodgate::start(&config(&format!("http://{upstream}"), ""));
    let before = settled(&fg).await;
    let reply = get(&client(), &fg.url("/cost"), &[("x-api-key", "chunked")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "hello");
    let deadline = Instant::now() + common::DRAIN_DEADLINE;
    while settled(&fg).await == before {
        assert!(Instant::now() < deadline, "never settled: {}", fg.stderr());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // 1000 less 7 (the trailer's figure), not less 10 (the reserve).
    until_remaining(&fg, "chunked", 993).await;
}
