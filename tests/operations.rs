//! What operators rely on: metrics, readiness, hot reload, graceful shutdown, shadow mode and the
//! IETF header profile, against the real floodgate binary.

mod common;

use std::time::{Duration, Instant};

use common::RedisServer;
use common::config::{Config, Limit, Route};
use common::{Floodgate, SLOW, Upstream, client, keyed_status, sample};

/// The route `api`: every path to `upstream`, with `limits`.
fn route(upstream: &Upstream, limits: &[Limit]) -> Route {
    limits
        .iter()
        .fold(Route::new("api", "/", &upstream.url()), |route, limit| {
            route.limit(limit.clone())
        })
}

/// A token bucket of 2 that refills once in 100 s: within a test, two requests and no more.
fn capacity_2() -> Limit {
    Limit::token_bucket(2, 0.01)
}

async fn text(url: &str) -> (u16, String) {
    let r = client().get(url).send().await.expect("admin answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_allowed_and_denied_requests() {
    let upstream = Upstream::start().await;
    let floodgate = Floodgate::start(
        &Config::new()
            .route(route(&upstream, &[capacity_2()]))
            .yaml(),
    );
    for _ in 0..5 {
        keyed_status(&floodgate.url("/x"), "k").await;
    }
    let (code, metrics) = text(&floodgate.admin_url("/metrics")).await;
    assert_eq!(code, 200);
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_requests_total{route="api",decision="allowed"}"#
        ),
        2.0,
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_requests_total{route="api",decision="denied"}"#
        ),
        3.0
    );
    assert_eq!(
        sample(&metrics, "floodgate_limiter_decision_seconds_count"),
        5.0
    );
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_upstream_responses_total{route="api",class="2xx"}"#
        ),
        2.0
    );
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_upstream_latency_seconds_count{route="api"}"#
        ),
        2.0
    );
    assert!(metrics.contains("# TYPE floodgate_limiter_decision_seconds histogram"));
    // The gauge exists under its exact name (its value is whatever connections are open).
    sample(&metrics, "floodgate_open_connections");
    let (code, _) = text(&floodgate.admin_url("/healthz")).await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_redis() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let config = Config::new()
        .storage("backend", "redis")
        .storage("url", &redis.url())
        .storage("on_error", "allow")
        .route(route(&upstream, &[capacity_2()]))
        .yaml();
    let floodgate = Floodgate::start(&config);
    let ready = floodgate.admin_url("/readyz");
    assert_eq!(text(&ready).await.0, 200);
    redis.kill();
    assert_eq!(text(&ready).await.0, 503, "not ready while Redis is down");
    assert_eq!(
        text(&floodgate.admin_url("/healthz")).await.0,
        200,
        "but alive"
    );
    // store errors are counted and the request is labelled store_error (fail-open forwards it)
    assert_eq!(keyed_status(&floodgate.url("/x"), "k").await, 200);
    let (_, metrics) = text(&floodgate.admin_url("/metrics")).await;
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_requests_total{route="api",decision="store_error"}"#
        ),
        1.0
    );
    assert!(sample(&metrics, "floodgate_store_errors_total") >= 1.0);
    redis.restart();
    // The connection manager reconnects on the next command; allow it a few seconds.
    let deadline = Instant::now() + Duration::from_secs(5);
    while text(&ready).await.0 != 200 {
        assert!(Instant::now() < deadline, "readyz did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_limit_while_a_request_is_in_flight() {
    let upstream = Upstream::start().await;
    let generous = Limit::token_bucket(100, 0.01);
    let floodgate = Floodgate::start(&Config::new().route(route(&upstream, &[generous])).yaml());
    // A long request (the upstream takes SLOW) on its own connection.
    let slow_url = floodgate.url("/slow");
    let in_flight = tokio::spawn(async move { keyed_status(&slow_url, "slowpoke").await });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let tight = Config::new()
        .with("listen", "127.0.0.1:0")
        .route(route(&upstream, &[capacity_2()]))
        .yaml();
    std::fs::write(floodgate.config_path(), tight).expect("rewrite config");
    floodgate.signal("HUP");
    // The reload is applied asynchronously; poll until the new limit (capacity 2) shows.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let key = format!("k{}", Instant::now().elapsed().as_nanos());
        let statuses = [
            keyed_status(&floodgate.url("/x"), &key).await,
            keyed_status(&floodgate.url("/x"), &key).await,
            keyed_status(&floodgate.url("/x"), &key).await,
        ];
        if statuses == [200, 200, 429] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new limit did not apply: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        in_flight.await.expect("in-flight task"),
        200,
        "the in-flight request completed"
    );
    let (_, metrics) = text(&floodgate.admin_url("/metrics")).await;
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_config_reloads_total{result="success"}"#
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_on_sighup_keeps_the_running_one() {
    let upstream = Upstream::start().await;
    let floodgate = Floodgate::start(
        &Config::new()
            .route(route(&upstream, &[capacity_2()]))
            .yaml(),
    );
    let url = floodgate.url("/x");
    assert_eq!(keyed_status(&url, "a").await, 200);
    std::fs::write(floodgate.config_path(), "listen: 127.0.0.1:0\nroutes: [{name: x, path_prefix: nope, upstream: \"http://127.0.0.1:1\"}]\n")
        .expect("rewrite config");
    floodgate.signal("HUP");
    let metrics_url = floodgate.admin_url("/metrics");
    let deadline = Instant::now() + Duration::from_secs(5);
    while sample(
        &text(&metrics_url).await.1,
        r#"floodgate_config_reloads_total{result="failure"}"#,
    ) < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the failed reload was not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The old config still serves: same route, same budget (one spent already).
    assert_eq!(keyed_status(&url, "a").await, 200);
    assert_eq!(keyed_status(&url, "a").await, 429);
    let log = floodgate.stderr();
    assert!(
        log.contains("routes[0].path_prefix"),
        "the rejected reload names the field: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let upstream = Upstream::start().await;
    let mut floodgate = Floodgate::start(
        &Config::new()
            .route(route(&upstream, &[capacity_2()]))
            .yaml(),
    );
    let ready = floodgate.admin_url("/readyz");
    let slow_url = floodgate.url("/slow");
    let started = Instant::now();
    let in_flight = tokio::spawn(async move {
        let r = client()
            .get(&slow_url)
            .send()
            .await
            .expect("answered, not cut off");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    floodgate.signal("TERM");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        text(&ready).await.0,
        503,
        "readyz turns 503 at once while draining"
    );
    let (code, body) = in_flight.await.expect("in-flight task");
    assert_eq!((code, body.as_str()), (200, "slow but done"));
    assert!(started.elapsed() >= SLOW, "the request ran to its end");
    let exit = floodgate
        .wait_exit(Duration::from_secs(10))
        .expect("floodgate exited after draining");
    assert!(exit.success(), "exit status {exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_limit_forwards_what_it_would_deny_and_counts_it() {
    let upstream = Upstream::start().await;
    let limits = [
        Limit::token_bucket(100, 1.0),
        Limit::fixed_window(2, "1h").shadow(),
    ];
    let floodgate = Floodgate::start(&Config::new().route(route(&upstream, &limits)).yaml());
    let client = client();
    let mut remaining = Vec::new();
    for _ in 0..4 {
        let r = client
            .get(floodgate.url("/x"))
            .header("x-api-key", "k")
            .send()
            .await
            .expect("answer");
        assert_eq!(r.status().as_u16(), 200, "a shadow limit never denies");
        remaining.push(
            r.headers()["x-ratelimit-remaining"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(upstream.count(), 4, "everything reached the upstream");
    // The headers speak for the budget with the fewest remaining: the shadow window's.
    assert_eq!(remaining, vec!["1", "0", "0", "0"]);
    let (_, metrics) = text(&floodgate.admin_url("/metrics")).await;
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_requests_total{route="api",decision="shadow_denied"}"#
        ),
        2.0
    );
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_requests_total{route="api",decision="allowed"}"#
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_shadow_mode_never_denies() {
    let upstream = Upstream::start().await;
    let floodgate = Floodgate::start(
        &Config::new()
            .with("shadow", "true")
            .route(route(&upstream, &[capacity_2()]))
            .yaml(),
    );
    for _ in 0..4 {
        assert_eq!(keyed_status(&floodgate.url("/x"), "k").await, 200);
    }
    let (_, metrics) = text(&floodgate.admin_url("/metrics")).await;
    assert_eq!(
        sample(
            &metrics,
            r#"floodgate_requests_total{route="api",decision="shadow_denied"}"#
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ietf_profile_sends_ratelimit_policy_and_ratelimit() {
    let upstream = Upstream::start().await;
    let limits = [Limit::fixed_window(2, "1h"), Limit::token_bucket(10, 1.0)];
    let floodgate = Floodgate::start(
        &Config::new()
            .with("rate_limit_headers", "ietf")
            .route(route(&upstream, &limits))
            .yaml(),
    );
    common::keep_clear_of_window_boundary(3600, Duration::from_secs(5)).await;
    let client = client();
    let first = client
        .get(floodgate.url("/x"))
        .header("x-api-key", "k")
        .send()
        .await
        .expect("answer");
    assert_eq!(
        first.headers()["ratelimit-policy"],
        r#""api-0";q=2;w=3600, "api-1";q=10;w=10"#
    );
    assert!(
        first.headers().get("x-ratelimit-limit").is_none(),
        "one profile at a time"
    );
    let value = first.headers()["ratelimit"].to_str().unwrap().to_string();
    assert!(value.starts_with(r#""api-0";r=1;t="#), "{value}");
    client
        .get(floodgate.url("/x"))
        .header("x-api-key", "k")
        .send()
        .await
        .expect("answer");
    let denied = client
        .get(floodgate.url("/x"))
        .header("x-api-key", "k")
        .send()
        .await
        .expect("answer");
    assert_eq!(denied.status().as_u16(), 429);
    let retry_after = denied.headers()["retry-after"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        denied.headers()["ratelimit"].to_str().unwrap(),
        format!(r#""api-0";r=0;t={retry_after}"#),
        "t and Retry-After name the same instant"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_only_uses_metrics_floodgate_exports() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // With adaptive_concurrency, so that its gauge has a series.
    let config = Config::new()
        .storage("backend", "redis")
        .storage("url", &redis.url())
        .route(route(&upstream, &[capacity_2()]).with("adaptive_concurrency", "{}"))
        .yaml();
    let floodgate = Floodgate::start(&config);
    keyed_status(&floodgate.url("/x"), "k").await;
    let (_, metrics) = text(&floodgate.admin_url("/metrics")).await;
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/grafana-dashboard.json"
    ))
    .expect("the dashboard exists");
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut names = Vec::new();
    for panel in json["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            // Prometheus targets only (the /top table reads the admin endpoint instead).
            let Some(expr) = target["expr"].as_str() else {
                continue;
            };
            let mut rest = expr;
            while let Some(at) = rest.find("floodgate_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                names.push(name);
            }
        }
    }
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        assert!(
            metrics.lines().any(|l| l.starts_with(&name)),
            "the dashboard queries {name}, which /metrics does not export"
        );
    }
}
