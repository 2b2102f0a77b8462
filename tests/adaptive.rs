//! Adaptive concurrency end to end (`adaptive_concurrency:`, src/adaptive.rs): floodgate in
//! front of the bundled demo upstream, which nobody told floodgate the capacity of, under more
//! load than it can take; then the upstream gets sick (its knob) and heals.

mod common;

use std::time::{Duration, Instant};

use common::config::{Config, Route};
use common::{DemoUpstream, Floodgate, check_names, hammer, metric};

/// One route to `upstream`, with `adaptive_concurrency: {adaptive}` (or none).
fn config(upstream: &DemoUpstream, adaptive: Option<&str>) -> String {
    let route = Route::new("api", "/", upstream.url());
    let route = match adaptive {
        Some(bounds) => route.with("adaptive_concurrency", bounds),
        None => route,
    };
    Config::new().route(route).yaml()
}

/// The upstream's own 503s over what reached it, since `before` (its stats then).
async fn upstream_failure_rate(upstream: &DemoUpstream, before: &serde_json::Value) -> (u64, u64) {
    let now = upstream.stats().await;
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    let served = n(&now, "served") - n(before, "served");
    let rejected = n(&now, "rejected") - n(before, "rejected");
    (served, rejected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_concurrency_keeps_an_unmeasured_upstream_from_failing_and_follows_it() {
    // The demo upstream as the load test runs it: 8 workers × 50 ms (about 160 requests/s), a
    // 503 after 250 ms in its queue. 64 clients without pause are far more than it serves.
    let upstream = DemoUpstream::start(8, "50ms", "250ms");

    // Unprotected first: its queue overflows and it fails requests itself.
    let fg = Floodgate::start(&config(&upstream, None));
    let before = upstream.stats().await;
    hammer(&[fg.url("/api")], "k", 64, Duration::from_secs(3)).await;
    let (served, rejected) = upstream_failure_rate(&upstream, &before).await;
    eprintln!("unprotected: upstream served {served}, failed {rejected}");
    assert!(
        rejected > 0,
        "the load must overload the unprotected upstream"
    );
    drop(fg);

    // With adaptive concurrency and nothing else configured.
    let fg = Floodgate::start(&config(
        &upstream,
        Some("{min_limit: 4, max_limit: 200, queue_timeout: 50ms}"),
    ));
    let gauge = format!(
        "floodgate_adaptive_limit{{upstream=\"{}\"}}",
        upstream.url()
    );
    let before = upstream.stats().await;
    let totals = hammer(&[fg.url("/api")], "k", 64, Duration::from_secs(6)).await;
    let (served, rejected) = upstream_failure_rate(&upstream, &before).await;
    let limit = metric(&fg, &gauge).await;
    let overloaded = metric(
        &fg,
        r#"floodgate_requests_total{route="api",decision="overloaded"}"#,
    )
    .await;
    eprintln!(
        "adaptive: {totals:?}; upstream served {served}, failed {rejected}; learned limit {limit}; {overloaded} shed"
    );
    // The target: the upstream's own failures at most 0.5% of what reaches it.
    assert!(
        rejected * 200 <= served + rejected,
        "the upstream failed {rejected} of {}",
        served + rejected
    );
    assert!(overloaded > 0, "the excess was shed by floodgate");
    assert_eq!(
        u64::from(totals.get(&503).copied().unwrap_or(0)),
        overloaded + rejected,
        "every 503 the clients saw is floodgate's (or the upstream's few)"
    );
    assert!(
        (4..=20).contains(&limit),
        "learned about the 8 workers: {limit}"
    );

    // Sick: every request takes 3 × as long (same workers). Then healed.
    for (phase, knob) in [
        ("sick", "service_time=150ms"),
        ("healed", "service_time=50ms"),
    ] {
        upstream.set_capacity(knob).await;
        let before = upstream.stats().await;
        let started = Instant::now();
        let load = tokio::spawn({
            let url = fg.url("/api");
            async move { hammer(&[url], "k", 64, Duration::from_secs(8)).await }
        });
        let mut limits = Vec::new();
        while started.elapsed() < Duration::from_secs(8) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            limits.push(metric(&fg, &gauge).await);
        }
        load.await.unwrap();
        let (served, rejected) = upstream_failure_rate(&upstream, &before).await;
        eprintln!("{phase}: upstream served {served}, failed {rejected}; limits {limits:?}");
        assert!(
            rejected * 200 <= served + rejected,
            "{phase}: the upstream failed {rejected} of {}",
            served + rejected
        );
        // Whatever its service time, the upstream serves 8 at once: the limit stays near that.
        let tail = &limits[limits.len() / 2..];
        assert!(
            tail.iter().all(|l| (4..=20).contains(l)),
            "{phase}: limits {limits:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_flood_of_low_priority_requests_high_priority_ones_get_through() {
    let upstream = DemoUpstream::start(8, "50ms", "250ms");
    let route = |name: &str, prefix: &str, priority: &str| {
        Route::new(name, prefix, upstream.url())
            .with("priority", priority)
            .with("adaptive_concurrency", "{queue_timeout: 100ms}")
    };
    let fg = Floodgate::start(
        &Config::new()
            .route(route("rides", "/rides", "high"))
            .route(route("prefetch", "/prefetch", "low"))
            .yaml(),
    );
    // 64 clients of low priority without pause, far above what the upstream serves; 4 clients
    // of high priority beside them.
    let (low_url, high_url) = ([fg.url("/prefetch")], [fg.url("/rides")]);
    let (low, high) = tokio::join!(
        hammer(&low_url, "flood", 64, Duration::from_secs(6)),
        hammer(&high_url, "rider", 4, Duration::from_secs(6))
    );
    let ok = |t: &std::collections::HashMap<u16, u32>| t.get(&200).copied().unwrap_or(0);
    let all = |t: &std::collections::HashMap<u16, u32>| t.values().sum::<u32>();
    eprintln!("low: {low:?}; high: {high:?}");
    assert!(all(&low) > ok(&low), "the low flood was shed in part");
    // The target: high priority requests succeed at least 99% of the time.
    assert!(
        ok(&high) * 100 >= all(&high) * 99,
        "high priority: {} of {} succeeded",
        ok(&high),
        all(&high)
    );
}

/// One flooding identity (64 connections without pause) beside 4 light ones (one connection
/// each, without pause either) at one priority, before an upstream that serves about 160
/// requests a second: what share of each side's requests is answered 200.
async fn light_and_flood(upstream: &DemoUpstream, adaptive: &str) -> (f64, f64, u32) {
    let fg = Floodgate::start(
        &Config::new()
            .route(Route::new("api", "/", upstream.url()).with("adaptive_concurrency", adaptive))
            .yaml(),
    );
    let url = [fg.url("/api")];
    let run_for = Duration::from_secs(4);
    let mut lights = tokio::task::JoinSet::new();
    for i in 0..4 {
        let url = url.clone();
        lights.spawn(async move { hammer(&url, &format!("light-{i}"), 1, run_for).await });
    }
    let (flood, lights) = tokio::join!(hammer(&url, "flood", 64, run_for), lights.join_all());
    let ok = |t: &std::collections::HashMap<u16, u32>| t.get(&200).copied().unwrap_or(0);
    let all = |t: &std::collections::HashMap<u16, u32>| t.values().sum::<u32>();
    let (light_ok, light_all) = lights
        .iter()
        .fold((0, 0), |(o, a), t| (o + ok(t), a + all(t)));
    eprintln!("{adaptive}: flood {flood:?}; light {lights:?}");
    let light_503 = lights
        .iter()
        .map(|t| t.get(&503).copied().unwrap_or(0))
        .sum();
    (
        f64::from(light_ok) / f64::from(light_all.max(1)),
        f64::from(ok(&flood)) / f64::from(all(&flood).max(1)),
        light_503,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fair_queues_light_clients_are_answered_beside_a_flooding_one() {
    let upstream = DemoUpstream::start(8, "50ms", "250ms");
    // First come, first served: the light clients' requests wait behind the flood's and are
    // shed with them (a light request waits behind up to `queue_timeout` of the flood's).
    let (unfair_light, _, unfair_shed) = light_and_flood(&upstream, "{queue_timeout: 100ms}").await;
    // Fair: each light client's one request waits behind at most one request of each other
    // busy queue (the flood's two, the other lights'), a few slots' time, far under 100 ms.
    let (fair_light, fair_flood, fair_shed) =
        light_and_flood(&upstream, "{queue_timeout: 100ms, fairness: identity}").await;
    eprintln!(
        "light clients answered: {:.1}% first come first served ({unfair_shed} shed), {:.1}% fair ({fair_shed} shed); the flood {:.1}% fair",
        unfair_light * 100.0,
        fair_light * 100.0,
        fair_flood * 100.0
    );
    assert!(fair_light >= 0.95, "fair: {fair_light}");
    assert!(fair_flood < 0.5, "the 503s land on the flood: {fair_flood}");
    // The control: without fairness the same flood costs the light clients requests, with it
    // they lose fewer. How many moves with the machine's load: over 20% of theirs when nothing
    // else runs, 7.6% and 8.5% in two CI runs with builds beside them (a busy machine fills the
    // queue less), so a fixed share here failed on busy runs.
    assert!(
        unfair_shed > fair_shed && unfair_light < fair_light,
        "first come first served sheds light requests ({unfair_shed}, {unfair_light}), fair fewer ({fair_shed}, {fair_light})"
    );
}

#[test]
fn check_names_the_field_of_each_fairness_mistake() {
    let route = |adaptive: &str| {
        format!(
            "listen: 127.0.0.1:0\nroutes:\n  - {{name: api, path_prefix: /, upstream: \"http://127.0.0.1:9\", adaptive_concurrency: {adaptive}}}\n"
        )
    };
    for (adaptive, field) in [
        (
            "{fairness: loudest}",
            "routes[0].adaptive_concurrency.fairness",
        ),
        (
            "{fairness: \"header:\"}",
            "routes[0].adaptive_concurrency.fairness",
        ),
        (
            "{fairness: \"header:bad name\"}",
            "routes[0].adaptive_concurrency.fairness",
        ),
        (
            "{fairness: identity, queues: 0}",
            "routes[0].adaptive_concurrency.queues",
        ),
        (
            "{fairness: identity, queue_length: -1}",
            "routes[0].adaptive_concurrency.queue_length",
        ),
        ("{queues: 8}", "routes[0].adaptive_concurrency.queues"),
    ] {
        check_names(&route(adaptive), &[field]);
    }
}
