//! Limits of their own kind, end to end through the real binary: concurrency (slots held while
//! in flight and freed however a request ends), calendar quotas (refused until local midnight),
//! and a budget keyed by a JSON field of the body; on the memory store and on Redis.

mod common;

use common::RedisServer;
use common::config::{Config, Limit, Route};
use common::policy::{on_redis, one_route, spawn_get, statuses};
use common::{Floodgate, Upstream, client, get, metric};
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_never_lets_more_than_n_reach_a_slow_upstream() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        Config::new(),
        &[Limit::concurrency(3).per("route")],
    ));
    // Twelve clients at once against an upstream that takes 1.5 s (common::SLOW) per request.
    let tasks: Vec<_> = (0..12).map(|n| spawn_get(&fg, "/slow", n)).collect();
    let mut admitted = 0;
    for task in tasks {
        let reply = task.await.unwrap().expect("a reply");
        match reply.status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(reply.header("retry-after"), "1");
                assert_eq!(reply.header("x-ratelimit-limit"), "3");
                assert_eq!(reply.header("x-ratelimit-remaining"), "0");
            }
            other => panic!("unexpected {other}"),
        }
    }
    // The property: never more than 3 at the upstream. At least 3 got through; more only if this
    // machine stalled for a whole 1.5 s between two sends (a slot then frees and is reused).
    assert!(
        upstream.max_in_flight() <= 3,
        "{}",
        upstream.max_in_flight()
    );
    assert!(admitted >= 3, "{admitted}");
    // Every response has ended: all three slots are free again.
    let replies = statuses(&fg, &[vec![], vec![], vec![]]).await;
    assert_eq!(replies, vec![200, 200, 200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_slot_is_freed_when_the_client_goes_away() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        Config::new(),
        &[Limit::concurrency(1).per("route")],
    ));
    // The client gives up after 200 ms on a request the upstream answers after 1.5 s.
    let gone = client()
        .get(fg.url("/slow"))
        .timeout(std::time::Duration::from_millis(200))
        .send()
        .await;
    assert!(gone.is_err(), "the client timed out");
    // floodgate sees the connection close and drops the request, and its lease with it. Polled
    // for up to 1 s (well under the 1.5 s the upstream would take to free it by finishing).
    let started = std::time::Instant::now();
    let status = loop {
        let status = get(&client(), &fg.url("/"), &[]).await.status;
        if status == StatusCode::OK || started.elapsed() > std::time::Duration::from_secs(1) {
            break status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(
        status,
        StatusCode::OK,
        "the slot came back before the upstream finished"
    );
}

#[tokio::test]
async fn a_concurrency_slot_is_freed_when_the_upstream_times_out() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        Config::new().timeout("upstream_response", "300ms"),
        &[Limit::concurrency(1).per("route")],
    ));
    let first = get(&client(), &fg.url("/hang"), &[]).await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        get(&client(), &fg.url("/"), &[]).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_shadow_concurrency_limit_gives_its_slots_back() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_route(
        &upstream,
        Config::new(),
        &[Limit::concurrency(1).per("route").shadow()],
    ));
    let client = client();
    // One at a time: each request's slot is free again before the next, so none would have
    // been denied.
    for _ in 0..3 {
        assert_eq!(get(&client, &fg.url("/"), &[]).await.status, StatusCode::OK);
    }
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_requests_total{route="api",decision="shadow_denied"}"#
        )
        .await,
        0
    );
}

/// The first instant of the day after the one holding `unix_ms`, in `zone`, as Unix seconds.
fn next_local_midnight(unix_ms: u64, zone: &str) -> u64 {
    let now = jiff::Timestamp::from_millisecond(unix_ms as i64)
        .unwrap()
        .in_tz(zone)
        .unwrap();
    let tomorrow = now.date().tomorrow().unwrap();
    tomorrow
        .in_tz(zone)
        .unwrap()
        .start_of_day()
        .unwrap()
        .timestamp()
        .as_second() as u64
}

/// A daily quota's 429 points at the next midnight in the quota's zone, on the memory store and
/// on Redis (whose script is handed the period's end and decides on its own clock).
async fn a_daily_quota_refuses_until_local_midnight(base: Config) {
    let upstream = Upstream::start().await;
    let zones = [
        ("kolkata", "Asia/Kolkata"),
        ("new_york", "America/New_York"),
    ];
    let mut config = base;
    for (name, zone) in zones {
        config = config.route(
            Route::new(name, &format!("/{name}"), &upstream.url())
                .limit(Limit::quota(2, "day", zone)),
        );
    }
    let fg = Floodgate::start(&config.yaml());
    let client = client();
    for (name, zone) in zones {
        let url = fg.url(&format!("/{name}"));
        let key = [("x-api-key", "rider")];
        for _ in 0..2 {
            assert_eq!(get(&client, &url, &key).await.status, 200);
        }
        let refused = get(&client, &url, &key).await;
        assert_eq!(refused.status, 429, "{zone}");
        let midnight = next_local_midnight(refused.received_unix_ms, zone);
        let header = |n: &str| -> u64 { refused.headers[n].to_str().unwrap().parse().unwrap() };
        assert_eq!(header("x-ratelimit-reset"), midnight, "{zone}");
        // Retry-After is whole seconds until then, rounded up, from the decision's instant (a
        // moment before the response arrived: one second either way).
        let until = midnight as i64 - (refused.received_unix_ms / 1000) as i64;
        let retry = header("retry-after") as i64;
        assert!(
            (retry - until).abs() <= 1,
            "{zone}: {retry} s, midnight in {until} s"
        );
        assert_eq!(header("x-ratelimit-limit"), 2);
        assert_eq!(header("x-ratelimit-remaining"), 0);
    }
    assert_eq!(upstream.seen().len(), 4);
}

#[tokio::test]
async fn a_daily_quota_refuses_until_local_midnight_on_the_memory_store() {
    a_daily_quota_refuses_until_local_midnight(Config::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_quota_refuses_until_local_midnight_on_redis() {
    let redis = RedisServer::start();
    a_daily_quota_refuses_until_local_midnight(on_redis(&redis)).await;
}

#[test]
fn check_names_every_bad_quota_field() {
    let yaml = Config::new()
        .with("listen", "127.0.0.1:0")
        .route(
            Route::new("api", "/", "http://127.0.0.1:9")
                .limit(Limit::quota(10, "day", "Mars/Olympus_Mons"))
                .limit(Limit::quota(10, "fortnight", "UTC"))
                .limit(Limit::quota(10, "week", "UTC").with("window", "1h"))
                .limit(Limit::fixed_window(1, "1h").with("period", "day")),
        )
        .yaml();
    common::check_names(
        &yaml,
        &[
            "routes[0].limits[0].timezone",
            "routes[0].limits[1].period",
            "routes[0].limits[2].window",
            "routes[0].limits[3].period",
        ],
    );
}

/// `per: [identity, "json:model"]`: the JSON body's field keys the budget; the body reaches the
/// upstream byte for byte; a body that is not JSON, or lacks the field, spends the identity's
/// budget; one past `max_body_size` is refused with 413 before anything is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_field_of_the_body_keys_a_budget_and_the_body_goes_on_intact() {
    let upstream = Upstream::start().await;
    let yaml = Config::new()
        .with("max_body_size", "4kb")
        .route(
            Route::new("chat", "/echo", &upstream.url())
                .limit(Limit::fixed_window(1, "1h").per(r#"[identity, "json:model"]"#)),
        )
        .yaml();
    let fg = Floodgate::start(&yaml);
    let client = client();
    let post = |key: &'static str, body: String| {
        let request = client
            .post(fg.url("/echo"))
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .body(body);
        async move { common::Reply::read(request.send().await.expect("send")).await }
    };
    let small = r#"{"model": "small", "messages": [{"role": "user", "content": "hi"}]}"#;
    let first = post("a", small.to_string()).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, small, "the upstream got the body as sent");
    assert_eq!(post("a", r#"{"model": "large"}"#.into()).await.status, 200);
    assert_eq!(post("a", small.to_string()).await.status, 429);
    assert_eq!(post("b", small.to_string()).await.status, 200);
    // No model (or no JSON): a's own budget, once.
    assert_eq!(post("a", r#"{"messages": []}"#.into()).await.status, 200);
    assert_eq!(post("a", "model=small".into()).await.status, 429);
    let big = format!(r#"{{"model": "x", "pad": "{}"}}"#, "y".repeat(8000));
    let refused = post("c", big).await;
    assert_eq!(refused.status, 413);
    assert_eq!(upstream.seen().len(), 4);
}
