//! floodgate on a real Redis Cluster (3 masters, 3 replicas, made with `redis-cli --cluster
//! create` on this machine): exact shared budgets through two instances, every algorithm in one
//! atomic script with no CROSSSLOT, identities spread over every master, and `per: route` caps.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{Floodgate, RedisCluster, Upstream, client, get, hammer};
use http::StatusCode;

/// A one-route config on `cluster`. `on_error: deny` so any store error (a CROSSSLOT, say)
/// shows as a 503; a 1 s decision budget because a debug build, six redis-servers and the test
/// share two cores.
fn config(cluster: &RedisCluster, upstream: &Upstream, limits: &[Limit]) -> String {
    on_cluster(&cluster.urls(), "deny")
        .storage("timeout", "1s")
        .route(api(upstream, limits))
        .yaml()
}

/// `storage:` on the cluster's nodes at `urls`, with `on_error`.
fn on_cluster(urls: &[String], on_error: &str) -> Config {
    Config::new()
        .storage("backend", "redis_cluster")
        .storage("urls", &format!("[{}]", urls.join(", ")))
        .storage("on_error", on_error)
}

/// The one route, `/` → `upstream`, with `limits`.
fn api(upstream: &Upstream, limits: &[Limit]) -> Route {
    Route::new("api", "/", &upstream.url()).limits(limits.iter().cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_over_grant_test_passes_on_a_cluster_through_two_instances() {
    let cluster = RedisCluster::start(3);
    let upstream = Upstream::start().await;
    let yaml = config(&cluster, &upstream, &[Limit::token_bucket(10, 10.0)]);
    let a = Floodgate::start(&yaml);
    let b = Floodgate::start(&yaml);
    // The cluster client connects in the background: wait until both instances decide.
    for fg in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(&client(), &fg.url("/warm"), &[("x-api-key", "warm-up")])
            .await
            .status
            != StatusCode::OK
        {
            assert!(Instant::now() < deadline, "no decision from the cluster");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let before = upstream.count();
    let totals = hammer(
        &[a.url("/ride"), b.url("/ride")],
        "rider-1",
        64,
        Duration::from_secs(3),
    )
    .await;
    let received = (upstream.count() - before) as u32;
    eprintln!("cluster over-grant: the upstream received {received}; responses {totals:?}");
    assert!(totals.keys().all(|s| *s == 200 || *s == 429), "{totals:?}");
    // As on one Redis: 10 at once plus 10 a second for 3 s is 40, one more at the window's
    // edge at most; fewer than 36 would mean lost refills.
    assert!((36..=41).contains(&received), "received {received}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_decides_in_one_script_with_no_crossslot() {
    let cluster = RedisCluster::start(3);
    let upstream = Upstream::start().await;
    // Six limits of one client in one script call: their keys share the client's hash tag.
    // The fixed window of 3 is the one that binds.
    let fg = Floodgate::start(&config(
        &cluster,
        &upstream,
        &[
            Limit::token_bucket(10, 0.01),
            Limit::leaky_bucket(10, 1000.0),
            Limit::fixed_window(3, "1h"),
            Limit::sliding_window_log(10, "1h"),
            Limit::sliding_window_counter(10, "1h"),
            Limit::concurrency(10),
        ],
    ));
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut statuses = Vec::new();
    for n in 0..20 {
        let key = format!("client-{n}");
        let mut got = Vec::new();
        for _ in 0..5 {
            let mut status = get(&client, &fg.url("/x"), &[("x-api-key", &key)])
                .await
                .status;
            // Until the cluster client has connected, on_error: deny answers 503.
            while status == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                status = get(&client, &fg.url("/x"), &[("x-api-key", &key)])
                    .await
                    .status;
            }
            got.push(status.as_u16());
        }
        statuses.push(got);
    }
    for got in &statuses {
        assert_eq!(got, &vec![200, 200, 200, 429, 429], "{statuses:?}");
    }
    // Twenty clients' keys landed on every master: the hash tag spreads identities.
    for master in cluster.masters() {
        let keys: i64 = master.cmd(&["DBSIZE"]);
        assert!(keys > 0, "master on port {} holds no key", master.port);
    }
    assert_eq!(cluster.masters().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_route_cap_holds_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(
        &cluster,
        &upstream,
        &[Limit::fixed_window(5, "1h").per("route")],
    ));
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut admitted = 0;
    let mut n = 0;
    while n < 12 {
        let status = get(&client, &fg.url("/x"), &[("x-api-key", &format!("k{n}"))])
            .await
            .status;
        if status == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue; // not connected yet
        }
        admitted += usize::from(status == StatusCode::OK);
        n += 1;
    }
    assert_eq!(admitted, 5);
    assert_eq!(upstream.count(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_costs_no_5xx_and_limiting_resumes_after_the_promotion() {
    let mut cluster = RedisCluster::start(3);
    let upstream = Upstream::start().await;
    let urls = cluster.urls();
    let fg = Floodgate::start(
        &on_cluster(&urls, "allow")
            .storage("timeout", "200ms")
            .route(api(&upstream, &[Limit::token_bucket(1_000_000, 0.001)]))
            .yaml(),
    );
    // (A slow refill: each request's key then lives for its 1000 s of refill, long enough to be
    // found on its master below.)
    let client = client();
    let url = fg.url("/x");
    let victim = [("x-api-key", "victim")];
    // Decided by the cluster (the answer carries rate-limit headers) before the kill.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = get(&client, &url, &victim).await;
        if r.headers.contains_key("x-ratelimit-limit") {
            break;
        }
        assert!(Instant::now() < deadline, "the cluster never decided");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let holder = cluster
        .nodes
        .iter()
        .position(|n| {
            let keys: Vec<String> = n.cmd(&["KEYS", "*:api_key:*"]);
            let info: String = n.cmd(&["INFO", "replication"]);
            !keys.is_empty() && info.contains("role:master")
        })
        .expect("a master holds the victim's key");
    let killed_at = Instant::now();
    cluster.nodes[holder].kill();
    // Requests for the victim, whose master is gone: on_error: allow forwards every one, none
    // waits much past the 200 ms decision budget (the breaker then spares most of them the wait
    // altogether), and once the replica is promoted (cluster-node-timeout is 2 s) floodgate
    // finds it by itself and the cluster decides again (the answer carries rate-limit headers).
    let mut slowest = Duration::ZERO;
    let mut statuses = HashMap::new();
    let mut decided_again = None;
    while killed_at.elapsed() < Duration::from_secs(20) {
        let started = Instant::now();
        let r = get(&client, &url, &victim).await;
        slowest = slowest.max(started.elapsed());
        *statuses.entry(r.status.as_u16()).or_insert(0u32) += 1;
        if r.headers.contains_key("x-ratelimit-limit") {
            decided_again = Some(killed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "cluster master killed: decided again {decided_again:?} after the kill; slowest answer {slowest:?}; statuses {statuses:?}"
    );
    assert!(statuses.keys().all(|s| *s == 200), "{statuses:?}");
    assert!(
        decided_again.is_some(),
        "not decided again within 20 s of the kill"
    );
    // 200 ms budget plus scheduling on a loaded 2-core machine; far below the seconds a
    // client would otherwise wait on a dead master.
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    // And exact again on the promoted master: a fresh client gets its capacity and no more.
    let limited = Floodgate::start(
        &on_cluster(&urls, "deny")
            .storage("timeout", "1s")
            .route(api(&upstream, &[Limit::token_bucket(3, 0.01)]))
            .yaml(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < 5 {
        let status = get(&client, &limited.url("/x"), &victim).await.status;
        if status == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue; // connecting
        }
        got.push(status.as_u16());
    }
    assert_eq!(got, vec![200, 200, 200, 429, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_down_at_start_is_joined_when_it_comes_up() {
    let reserved = RedisCluster::reserve(3);
    let ports = reserved.ports();
    let upstream = Upstream::start().await;
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let fg = Floodgate::start(
        &on_cluster(&urls, "allow")
            .route(api(&upstream, &[Limit::token_bucket(3, 0.01)]))
            .yaml(),
    );
    let client = client();
    // No cluster yet: floodgate serves (fail open) and says it is not ready.
    assert_eq!(
        get(&client, &fg.url("/x"), &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&client, &fg.admin_url("/readyz"), &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let _cluster = RedisCluster::start_on(reserved);
    // It connects by itself (retrying with a backoff of at most 5 s) and /readyz follows.
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&client, &fg.admin_url("/readyz"), &[]).await.status != StatusCode::OK {
        assert!(
            Instant::now() < deadline,
            "never ready after the cluster came up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got: Vec<u16> = {
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(
                get(&client, &fg.url("/x"), &[("x-api-key", "late")])
                    .await
                    .status
                    .as_u16(),
            );
        }
        got
    };
    assert_eq!(
        got,
        vec![200, 200, 200, 429, 429],
        "limiting on the cluster"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_migrated_under_traffic_cause_no_5xx() {
    let cluster = RedisCluster::start(3);
    let upstream = Upstream::start().await;
    // on_error: deny, so a decision the cluster failed to make shows as a 503. A slow refill keeps
    // every identity's key alive through the test, so the migrated slots hold keys.
    let fg = Floodgate::start(&config(
        &cluster,
        &upstream,
        &[Limit::token_bucket(1_000_000, 0.001)],
    ));
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&client, &fg.url("/warm"), &[("x-api-key", "warm-up")])
        .await
        .status
        != StatusCode::OK
    {
        assert!(Instant::now() < deadline, "no decision from the cluster");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let masters = cluster.masters();
    let (from, to) = (masters[0], masters[1]);
    let id = |node: &common::RedisServer| -> String { node.cmd(&["CLUSTER", "MYID"]) };
    let (from_id, to_id, from_port) = (id(from), id(to), from.port);
    let keys_before: i64 = to.cmd(&["DBSIZE"]);
    // Eight clients cycling over 600 identities (keys in every master's slots) until the
    // reshard is over.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..8)
        .map(|task| {
            let (url, done, client) = (fg.url("/x"), done.clone(), client.clone());
            tokio::spawn(async move {
                let mut statuses = HashMap::<u16, u32>::new();
                let mut n = task;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = format!("id-{}", n % 600);
                    let status = get(&client, &url, &[("x-api-key", &key)]).await.status;
                    *statuses.entry(status.as_u16()).or_default() += 1;
                    n += 8;
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Moves 2000 of the first master's ~5461 slots, with their keys (MIGRATE), to the second.
    let reshard = tokio::task::spawn_blocking(move || {
        std::process::Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from_port}")])
            .args(["--cluster-from", &from_id, "--cluster-to", &to_id])
            .args(["--cluster-slots", "2000", "--cluster-yes"])
            .output()
            .expect("redis-cli")
    })
    .await
    .expect("reshard");
    tokio::time::sleep(Duration::from_millis(500)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut totals = HashMap::<u16, u32>::new();
    for task in load {
        for (status, n) in task.await.expect("load task") {
            *totals.entry(status).or_default() += n;
        }
    }
    assert!(
        reshard.status.success(),
        "reshard failed: {}",
        String::from_utf8_lossy(&reshard.stdout)
    );
    let keys_after: i64 = to.cmd(&["DBSIZE"]);
    eprintln!(
        "reshard of 2000 slots under traffic: statuses {totals:?}; the target master's keys {keys_before} -> {keys_after}"
    );
    assert!(keys_after > keys_before, "no key moved");
    assert_eq!(totals.keys().collect::<Vec<_>>(), vec![&200], "{totals:?}");
}

/// `cache.shared` on a cluster: what one instance fetched, the other serves from the store (its
/// entries, indexes and the scripts that write them sit in one slot, the route's hash tag: no
/// CROSSSLOT); an invalidation on one removes it from the store and from the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_cache_entries_are_served_across_instances_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let upstream = Upstream::start().await;
    // The limit makes a warm-up answer 200 only once the store decides (`on_error: deny`).
    let yaml = on_cluster(&cluster.urls(), "deny")
        .storage("timeout", "1s")
        .with("cache", "{shared: true}")
        .route(api(&upstream, &[Limit::token_bucket(10_000, 1_000.0)]).with("cache", "{ttl: 5m}"))
        .yaml();
    let (a, b) = (Floodgate::start(&yaml), Floodgate::start(&yaml));
    for fg in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(&client(), &fg.url("/warm"), &[]).await.status != StatusCode::OK {
            assert!(Instant::now() < deadline, "no decision from the cluster");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let client = client();
    let status = |reply: &common::Reply| {
        let value = reply.headers.get("cache-status");
        value
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let before = upstream.count();
    for zone in 0..10 {
        let fetched = get(&client, &a.url(&format!("/zone/{zone}")), &[]).await;
        assert!(status(&fetched).ends_with("stored"), "{}", status(&fetched));
    }
    for zone in 0..10 {
        let there = get(&client, &b.url(&format!("/zone/{zone}")), &[]).await;
        assert_eq!(there.status, StatusCode::OK);
        assert!(status(&there).contains("hit"), "{}", status(&there));
    }
    assert_eq!(upstream.count() - before, 10, "each zone fetched once");
    let posted = client.post(b.url("/zone/3")).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::OK);
    // The other instance reads the control list every 300 ms: polled for up to 5 s.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = get(&client, &a.url("/zone/3"), &[]).await;
        if status(&reply).ends_with("stored") {
            break;
        }
        assert!(Instant::now() < deadline, "the invalidation never arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
