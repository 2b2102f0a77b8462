//! End to end through the real binary: each algorithm's allow/deny sequence with its headers and
//! body, the upstream seeing exactly the admitted requests, and the leaky bucket's pacing.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{
    Floodgate, Reply, Upstream, assert_admitted, assert_rate_limited, client, get, h2c_client,
    keep_clear_of_window_boundary, next_window_start,
};
use http::StatusCode;

/// A config with one route, `/` → `upstream`, limited by `limit`.
fn one_limit(upstream: &Upstream, limit: Limit) -> String {
    Config::new()
        .route(Route::new("limited", "/", &upstream.url()).limit(limit))
        .yaml()
}

/// A route `warm` (`/warm`, no limits: it warms up the HTTP/2 connection), then `route`.
fn warm_then(route: Route) -> String {
    Config::new()
        .route(Route::new("warm", "/warm", route.upstream()))
        .route(route)
        .yaml()
}

/// Sends `n` GETs to `path` one after the other.
async fn sequentially(fg: &Floodgate, path: &str, n: usize) -> Vec<Reply> {
    let client = client();
    let mut replies = Vec::with_capacity(n);
    for _ in 0..n {
        replies.push(get(&client, &fg.url(path), &[]).await);
    }
    replies
}

fn admitted(replies: &[Reply]) -> usize {
    replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count()
}

#[tokio::test]
async fn token_bucket_admits_its_capacity_then_answers_429() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_limit(&upstream, Limit::token_bucket(3, 0.01)));
    let replies = sequentially(&fg, "/tb", 5).await;

    for (reply, remaining) in replies[..3].iter().zip([2, 1, 0]) {
        assert_admitted(reply, 3, remaining);
    }
    for reply in &replies[3..] {
        let retry_after = assert_rate_limited(reply, 3);
        // One token every 100 s: the next one is 100 s after the bucket was first drawn on, less
        // the few milliseconds the test has taken since (rounded up).
        assert!((95..=100).contains(&retry_after), "{reply:?}");
        // Fully restored once all three tokens are back: about 300 s from now.
        let reset = reply.header_u64("x-ratelimit-reset");
        assert!((290..=301).contains(&reply.secs_until(reset)), "{reply:?}");
    }
    assert_eq!(upstream.count(), admitted(&replies));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_admits_its_queue_size_then_answers_429() {
    let upstream = Upstream::start().await;
    // One request leaves every 500 ms, so admitted requests are held 0, 500 and 1000 ms. A second
    // route without limits warms up the HTTP/2 connection first, so that no connection setup
    // sits between the four requests below.
    let fg = Floodgate::start(&warm_then(
        Route::new("leaky", "/", &upstream.url()).limit(Limit::leaky_bucket(3, 2.0)),
    ));
    let client = h2c_client();
    assert_eq!(
        get(&client, &fg.url("/warm"), &[]).await.status,
        StatusCode::OK
    );

    // Four requests started 50 ms apart, so they reach floodgate in this order, all well within
    // the 500 ms it takes for the queue's first slot to drain: three fill the queue and the
    // fourth finds it full. (A leaky bucket paces a sequential client instead of rejecting it,
    // which is why these are concurrent.)
    let mut tasks = Vec::new();
    for n in 0..4 {
        let client = client.clone();
        let url = fg.url(&format!("/lb/{n}"));
        tasks.push(tokio::spawn(async move { get(&client, &url, &[]).await }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("request task"));
    }

    for (reply, remaining) in replies[..3].iter().zip([2, 1, 0]) {
        assert_admitted(reply, 3, remaining);
    }
    let retry_after = assert_rate_limited(&replies[3], 3);
    // The queue's first slot frees within 500 ms: rounded up, 1 s.
    assert_eq!(retry_after, 1, "{:?}", replies[3]);
    assert_eq!(upstream.count() - 1, admitted(&replies), "besides /warm");
}

#[tokio::test]
async fn fixed_window_admits_its_limit_then_answers_429_until_the_window_ends() {
    // Windows are aligned to the Unix epoch: stay clear of an hour boundary so that all five
    // requests fall in one window.
    keep_clear_of_window_boundary(3600, Duration::from_secs(10)).await;
    let window_end = next_window_start(3600);
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_limit(&upstream, Limit::fixed_window(3, "1h")));
    let replies = sequentially(&fg, "/fw", 5).await;

    for (reply, remaining) in replies[..3].iter().zip([2, 1, 0]) {
        assert_admitted(reply, 3, remaining);
        assert_eq!(
            reply.header_u64("x-ratelimit-reset"),
            window_end,
            "{reply:?}"
        );
    }
    for reply in &replies[3..] {
        let retry_after = assert_rate_limited(reply, 3);
        assert_eq!(
            reply.header_u64("x-ratelimit-reset"),
            window_end,
            "{reply:?}"
        );
        // The retry can pass when the window ends (whole seconds, rounded up).
        assert!(
            retry_after.abs_diff(reply.secs_until(window_end)) <= 1,
            "{reply:?}"
        );
    }
    assert_eq!(upstream.count(), admitted(&replies));
}

#[tokio::test]
async fn sliding_window_log_admits_its_limit_then_answers_429_until_the_oldest_expires() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_limit(&upstream, Limit::sliding_window_log(3, "1h")));
    let replies = sequentially(&fg, "/swl", 5).await;

    for (reply, remaining) in replies[..3].iter().zip([2, 1, 0]) {
        assert_admitted(reply, 3, remaining);
    }
    for reply in &replies[3..] {
        let retry_after = assert_rate_limited(reply, 3);
        // The oldest entry, a few milliseconds old, leaves the window an hour after it came.
        assert!((3590..=3600).contains(&retry_after), "{reply:?}");
    }
    assert_eq!(upstream.count(), admitted(&replies));
}

#[tokio::test]
async fn sliding_window_counter_admits_its_limit_then_answers_429() {
    // The counter's windows are aligned to the Unix epoch: keep all requests in one of them so
    // that the previous window's weighted count stays zero.
    keep_clear_of_window_boundary(3600, Duration::from_secs(10)).await;
    let window_end = next_window_start(3600);
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_limit(
        &upstream,
        Limit::sliding_window_counter(3, "1h"),
    ));
    let replies = sequentially(&fg, "/swc", 5).await;

    for (reply, remaining) in replies[..3].iter().zip([2, 1, 0]) {
        assert_admitted(reply, 3, remaining);
        // This window's count weighs on the estimate until the end of the next window.
        assert_eq!(
            reply.header_u64("x-ratelimit-reset"),
            window_end + 3600,
            "{reply:?}"
        );
    }
    for reply in &replies[3..] {
        let retry_after = assert_rate_limited(reply, 3);
        // A full current window passes only in the next one, once this window's 3, weighted by
        // the unelapsed share, leave room for one more: a third of the way into the next window.
        let expected = reply.secs_until(window_end) + 1200;
        assert!(retry_after.abs_diff(expected) <= 1, "{reply:?}");
    }
    assert_eq!(upstream.count(), admitted(&replies));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_requests_never_reach_the_upstream() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&one_limit(&upstream, Limit::token_bucket(5, 0.001)));
    // A burst of 20 at once, each on its own path so the upstream's log says which got through.
    let client = client();
    let mut tasks = Vec::new();
    for n in 0..20 {
        let client = client.clone();
        let path = format!("/burst/{n}");
        let url = fg.url(&path);
        tasks.push(tokio::spawn(async move {
            (path, get(&client, &url, &[]).await)
        }));
    }
    let mut admitted_paths = BTreeSet::new();
    let mut denied = 0;
    for task in tasks {
        let (path, reply) = task.await.expect("request task");
        if reply.status == StatusCode::OK {
            admitted_paths.insert(path);
        } else {
            assert_rate_limited(&reply, 5);
            denied += 1;
        }
    }
    assert_eq!(admitted_paths.len(), 5);
    assert_eq!(denied, 15);
    let upstream_paths: BTreeSet<String> = upstream.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(upstream.count(), 5, "each admitted request arrives once");
    assert_eq!(upstream_paths, admitted_paths);
}

#[tokio::test]
async fn a_route_without_limits_is_proxied_unlimited_without_rate_limit_headers() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(
        &Config::new()
            .route(Route::new("open", "/", &upstream.url()))
            .yaml(),
    );
    for reply in sequentially(&fg, "/open", 20).await {
        assert_eq!(reply.status, StatusCode::OK);
        assert!(
            reply.headers.get("x-ratelimit-limit").is_none(),
            "{reply:?}"
        );
    }
    assert_eq!(upstream.count(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_spaces_admitted_requests_at_the_upstream() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&warm_then(
        Route::new("paced", "/", &upstream.url()).limit(Limit::leaky_bucket(5, 10.0)),
    ));
    // One warmed-up HTTP/2 connection carries all six requests, so they reach floodgate within
    // a millisecond or two of each other: well inside the 100 ms after which the queue's first
    // slot would drain and let a sixth in.
    let client = h2c_client();
    assert_eq!(
        get(&client, &fg.url("/warm"), &[]).await.status,
        StatusCode::OK
    );

    let mut tasks = Vec::new();
    for n in 0..6 {
        let client = client.clone();
        let url = fg.url(&format!("/paced/{n}"));
        tasks.push(tokio::spawn(async move {
            let reply = get(&client, &url, &[]).await;
            (reply, Instant::now())
        }));
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("request task"));
    }

    let denied: Vec<_> = replies
        .iter()
        .filter(|(r, _)| r.status != StatusCode::OK)
        .collect();
    assert_eq!(denied.len(), 1, "five fit the queue, the sixth does not");
    let (denied_reply, denied_at) = denied[0];
    assert_rate_limited(denied_reply, 5);

    let mut arrivals: Vec<Instant> = upstream
        .seen()
        .into_iter()
        .filter(|s| s.path.starts_with("/paced"))
        .map(|s| s.at)
        .collect();
    arrivals.sort();
    assert_eq!(arrivals.len(), 5);
    // Floodgate holds the k-th admitted request until (first decision + k × 100 ms), so the
    // targets are exactly 100 ms apart whatever the arrival jitter. What moves a forward off its
    // target is lateness: timer granularity (1 ms), a wake-up delayed by scheduling on a loaded
    // 2-core machine, the hop to the upstream. A gap shrinks by one request's lateness relative
    // to the next one's, so 70 ms allows 30 ms of it, and a span of 350 ms (of a nominal 400)
    // allows 50 ms; unpaced forwarding would put all five within a few milliseconds.
    let gaps: Vec<Duration> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    for gap in &gaps {
        assert!(*gap >= Duration::from_millis(70), "gaps {gaps:?}");
    }
    assert!(
        arrivals[4] - arrivals[0] >= Duration::from_millis(350),
        "gaps {gaps:?}"
    );
    // The rejected request does not wait in the queue: it is answered before the last admitted
    // one (held about 400 ms) is even forwarded.
    assert!(*denied_at < arrivals[4], "429 came after the queue drained");
}

mod config_builder {
    use super::*;

    #[test]
    fn renders_the_yaml_floodgate_reads() {
        let yaml = Config::new()
            .storage("backend", "memory")
            .route(
                Route::new("api", "/api", "http://127.0.0.1:9")
                    .with("priority", "high")
                    .limit(Limit::token_bucket(5, 0.5))
                    .limit(Limit::fixed_window(9, "1h").per("route")),
            )
            .yaml();
        assert_eq!(
            yaml,
            "admin_listen: 127.0.0.1:0\nstorage:\n  backend: memory\nroutes:\n  - name: api\n    path_prefix: /api\n    upstream: http://127.0.0.1:9\n    priority: high\n    limits:\n      - {algorithm: token_bucket, capacity: 5, refill_rate: 0.5}\n      - {algorithm: fixed_window, limit: 9, window: 1h, per: route}\n"
        );
    }

    /// Every part of the builder, read back by floodgate's own parser: a key the builder
    /// misplaced would be a config error or a default here.
    #[test]
    fn every_part_is_read_by_floodgate_where_it_belongs() {
        let yaml = Config::new()
            .with("listen", "127.0.0.1:0")
            .with("shadow", "true")
            .consumers("anonymous")
            .trusted_proxies("[10.0.0.0/8]")
            .timeout("idle", "7s")
            .redis("redis://127.0.0.1:9", "local")
            .storage("timeout", "20ms")
            .route(Route::new("api", "/api", "http://127.0.0.1:9").limits([
                Limit::token_bucket(5, 0.5).tiers(&["pro", "default"]),
                Limit::fixed_window(9, "1h").per("route").shadow(),
                Limit::concurrency(3).per("ip"),
            ]))
            .route(Route::new("rest", "/", "http://127.0.0.1:9"))
            .yaml();
        let config = floodgate::config::Config::from_yaml(&yaml).expect(&yaml);
        assert!(config.shadow);
        assert_eq!(config.consumers.expect("consumers").iter().count(), 2);
        assert_eq!(config.identity.trusted_proxies.len(), 1);
        assert_eq!(config.timeouts.idle, std::time::Duration::from_secs(7));
        assert_eq!(config.storage.timeout, std::time::Duration::from_millis(20));
        assert_eq!(config.storage.on_error, floodgate::limiter::OnError::Local);
        let names: Vec<&str> = config.routes.iter().map(|r| &*r.name).collect();
        assert_eq!(names, ["api", "rest"]);
        let api = &config.routes[0];
        assert_eq!(api.enforced.limits.len(), 2);
        assert_eq!(api.shadow.limits.len(), 1);
        assert!(api.enforced.limits[0].applies_to("pro"));
        assert!(!api.enforced.limits[0].applies_to("anonymous"));
    }
}
