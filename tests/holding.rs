//! `wait:` on a limit: a request its limit would refuse with a retry within `wait` is held and
//! decided again then, instead of a 429 (`decision="delayed"`), spending only when admitted;
//! `max_waiting` bounds the held requests per limit and instance; exact across instances on a
//! shared store. Real floodgate processes, a real upstream (and Redis), port 0.

mod common;

use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{Floodgate, Upstream, client, get, metric};
use http::StatusCode;

/// One route `/` → `upstream` whose one limit is `limit`, per identity (the API key).
fn route(upstream: &Upstream, limit: Limit) -> Route {
    Route::new("api", "/", &upstream.url()).limit(limit)
}

/// `n` GETs of `url` at once with API key `key`: each one's status and when it was answered
/// (from the first's sending).
async fn at_once(urls: &[String], key: &str, n: usize) -> Vec<(StatusCode, Duration)> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (url, key) = (urls[i % urls.len()].clone(), key.to_string());
            tokio::spawn(async move {
                let reply = get(&client(), &url, &[("x-api-key", &key)]).await;
                (reply.status, started.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_retry_comes_within_wait_is_held_and_admitted_then() {
    let upstream = Upstream::start().await;
    // 2 at once, then one every 100 ms; a refused request may wait up to 1 s.
    let limit = Limit::token_bucket(2, 10.0).with("wait", "1s");
    let fg = Floodgate::start_with_env(
        &Config::new().route(route(&upstream, limit)).yaml(),
        &[("RUST_LOG", "warn,floodgate::access=info")],
    );
    let replies = at_once(&[fg.url("/ride")], "rider", 6).await;
    eprintln!("{replies:?}");
    assert!(
        replies.iter().all(|(s, _)| *s == StatusCode::OK),
        "{replies:?}"
    );
    assert_eq!(upstream.count(), 6);
    // Four of them waited for a token each: the last no sooner than the fourth token's refill
    // (400 ms; 50 ms less for the bucket's rounding). Only a lower bound: a slow machine makes
    // it later, never sooner.
    let last = replies.iter().map(|(_, at)| *at).max().unwrap();
    assert!(last >= Duration::from_millis(350), "{last:?}");
    let delayed = metric(
        &fg,
        r#"floodgate_requests_total{route="api",decision="delayed"}"#,
    )
    .await;
    let allowed = metric(
        &fg,
        r#"floodgate_requests_total{route="api",decision="allowed"}"#,
    )
    .await;
    assert_eq!((allowed, delayed), (2, 4));
    // The access log says so, with the wait.
    let deadline = Instant::now() + Duration::from_secs(5);
    while fg.stderr().matches("decision=\"delayed\"").count() < 4 {
        assert!(Instant::now() < deadline, "{}", fg.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = fg.stderr();
    let waits = log
        .lines()
        .filter(|l| l.contains("decision=\"delayed\"") && l.contains(" wait_ms="));
    assert_eq!(waits.count(), 4, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_beyond_wait_and_past_max_waiting_is_refused_at_once() {
    let upstream = Upstream::start().await;
    // One at once, then one every 200 ms, a wait of 2 s, but at most 2 held at once.
    let limit = Limit::token_bucket(1, 5.0)
        .with("wait", "2s")
        .with("max_waiting", "2");
    let fg = Floodgate::start(&Config::new().route(route(&upstream, limit)).yaml());
    let replies = at_once(&[fg.url("/ride")], "rider", 10).await;
    let ok = replies.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    let refused = replies
        .iter()
        .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((ok, refused), (3, 7), "one at once, two held: {replies:?}");
    assert_eq!(upstream.count(), 3);
    // A retry that is further off than `wait`: refused at once.
    let fg = Floodgate::start(
        &Config::new()
            .route(route(
                &upstream,
                Limit::token_bucket(1, 0.5).with("wait", "500ms"),
            ))
            .yaml(),
    );
    let replies = at_once(&[fg.url("/ride")], "rider", 2).await;
    let statuses: Vec<_> = replies.iter().map(|(s, _)| s.as_u16()).collect();
    assert!(
        statuses.contains(&200) && statuses.contains(&429),
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_hold_and_never_admit_more_than_the_budget() {
    let redis = common::RedisServer::start();
    let upstream = Upstream::start().await;
    // 2 at once, then 10 a second; held for up to 500 ms: at most 2 + 5 (+1 at the window's
    // edge) of 16 requests through both instances, the rest refused after their wait.
    let limit = Limit::token_bucket(2, 10.0).with("wait", "500ms");
    let yaml = Config::new()
        .redis(&redis.url(), "deny")
        .storage("timeout", "1s")
        .route(route(&upstream, limit))
        .yaml();
    let (a, b) = (Floodgate::start(&yaml), Floodgate::start(&yaml));
    let replies = at_once(&[a.url("/ride"), b.url("/ride")], "rider", 16).await;
    let ok = replies.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    eprintln!("{replies:?}");
    assert!(
        replies
            .iter()
            .all(|(s, _)| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS),
        "{replies:?}"
    );
    assert!((5..=8).contains(&ok), "{ok} admitted: {replies:?}");
    assert_eq!(upstream.count(), ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_whose_client_leaves_spends_nothing() {
    let upstream = Upstream::start().await;
    // One a second; a refused request may wait up to 5 s.
    let limit = Limit::token_bucket(1, 1.0).with("wait", "5s");
    let fg = Floodgate::start(&Config::new().route(route(&upstream, limit)).yaml());
    let url = fg.url("/ride");
    assert_eq!(
        get(&client(), &url, &[("x-api-key", "k")]).await.status,
        StatusCode::OK
    );
    // Held for the next token (1 s away); its client gives up after 200 ms.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    assert!(
        impatient
            .get(&url)
            .header("x-api-key", "k")
            .send()
            .await
            .is_err()
    );
    // Past the refill (1.3 s after the first: 300 ms of slack for the refill's rounding and a
    // slow machine), the token is still there: the request that left spent nothing.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let reply = get(&client(), &url, &[("x-api-key", "k")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        upstream.count(),
        2,
        "the held request never reached the upstream"
    );
    let delayed = metric(
        &fg,
        r#"floodgate_requests_total{route="api",decision="delayed"}"#,
    )
    .await;
    assert_eq!(
        delayed, 0,
        "the last request was not held: the token was there"
    );
}

#[test]
fn check_names_a_negative_wait_and_a_bad_max_waiting() {
    let route = |extra: &str| {
        format!(
            "listen: 127.0.0.1:0\nroutes:\n  - name: api\n    path_prefix: /\n    upstream: http://127.0.0.1:9\n    limits:\n      - {{algorithm: token_bucket, capacity: 2, refill_rate: 1, {extra}}}\n"
        )
    };
    common::check_names(&route("wait: -1s"), &["routes[0].limits[0].wait"]);
    common::check_names(&route("wait: soon"), &["routes[0].limits[0].wait"]);
    common::check_names(
        &route("max_waiting: 0"),
        &["routes[0].limits[0].max_waiting"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_is_then_held_does_not_count_toward_the_penalty_box() {
    let upstream = Upstream::start().await;
    // One at once, then one every 100 ms, held up to 1 s; two denials within a minute ban.
    let limit = Limit::token_bucket(1, 10.0)
        .with("wait", "1s")
        .with("penalty", "{denials: 2, within: 1m, ban: 1m}");
    let fg = Floodgate::start(&Config::new().route(route(&upstream, limit)).yaml());
    // Four at once: one admitted, three held (each refused at least once on the way) and
    // admitted: nothing was denied in the end, so nobody is banned.
    let replies = at_once(&[fg.url("/ride")], "rider", 4).await;
    assert!(
        replies.iter().all(|(s, _)| *s == StatusCode::OK),
        "{replies:?}"
    );
    let reply = get(&client(), &fg.url("/ride"), &[("x-api-key", "rider")]).await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "banned for waiting: {}",
        reply.body
    );
    // Refusals that are final still count: a bucket whose retry is beyond `wait` refuses at
    // once, and the second such denial bans.
    let limit = Limit::token_bucket(1, 0.01)
        .with("wait", "1s")
        .with("penalty", "{denials: 2, within: 1m, ban: 1m}");
    let fg = Floodgate::start(&Config::new().route(route(&upstream, limit)).yaml());
    let url = fg.url("/ride");
    let statuses = [
        get(&client(), &url, &[("x-api-key", "k")]).await,
        get(&client(), &url, &[("x-api-key", "k")]).await,
        get(&client(), &url, &[("x-api-key", "k")]).await,
        get(&client(), &url, &[("x-api-key", "k")]).await,
    ];
    let codes: Vec<_> = statuses.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(codes, [200, 429, 429, 429]);
    assert!(statuses[3].body.contains("banned"), "{}", statuses[3].body);
}
