//! floodgate behind Redis Sentinel: a real master, replica and three sentinels on this machine.
//! The master is killed under load; floodgate fails open meanwhile, finds the promoted replica
//! through the sentinels by itself, and limits exactly again.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{Floodgate, RedisSentinelSet, Upstream, client, get};
use http::StatusCode;

fn config(set: &RedisSentinelSet, upstream: &Upstream, on_error: &str, limit: Limit) -> String {
    let sentinels = format!("[{}]", set.sentinel_urls().join(", "));
    Config::new()
        .storage("backend", "redis_sentinel")
        .storage("sentinels", &sentinels)
        .storage("master_name", "mymaster")
        .storage("on_error", on_error)
        .storage("timeout", "200ms")
        .route(Route::new("api", "/", &upstream.url()).limit(limit))
        .yaml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_followed_to_the_promoted_replica() {
    let mut set = RedisSentinelSet::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(
        &set,
        &upstream,
        "allow",
        Limit::token_bucket(1_000_000, 0.001),
    ));
    let client = client();
    let url = fg.url("/x");
    let key = [("x-api-key", "rider")];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get(&client, &url, &key)
        .await
        .headers
        .contains_key("x-ratelimit-limit")
    {
        assert!(Instant::now() < deadline, "never decided through Sentinel");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_at = Instant::now();
    set.master.kill();
    let mut slowest = Duration::ZERO;
    let mut statuses = HashMap::new();
    let mut decided_again = None;
    while killed_at.elapsed() < Duration::from_secs(30) {
        let started = Instant::now();
        let r = get(&client, &url, &key).await;
        slowest = slowest.max(started.elapsed());
        *statuses.entry(r.status.as_u16()).or_insert(0u32) += 1;
        if r.headers.contains_key("x-ratelimit-limit") {
            decided_again = Some(killed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "sentinel failover: decided again {decided_again:?} after the kill; slowest answer {slowest:?}; statuses {statuses:?}"
    );
    assert!(statuses.keys().all(|s| *s == 200), "{statuses:?}");
    // 200 ms decision budget plus scheduling on a loaded machine.
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    assert!(
        decided_again.is_some(),
        "not decided again within 30 s of the kill"
    );
    // The replica is the master now, and floodgate writes there.
    let role: String = set.replica.cmd(&["INFO", "replication"]);
    assert!(role.contains("role:master"), "{role}");
    // Exact again: a fresh client gets its capacity and no more.
    let limited = Floodgate::start(&config(
        &set,
        &upstream,
        "deny",
        Limit::token_bucket(3, 0.01),
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < 5 {
        let status = get(&client, &limited.url("/x"), &key).await.status;
        if status == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        got.push(status.as_u16());
    }
    assert_eq!(got, vec![200, 200, 200, 429, 429]);
}
