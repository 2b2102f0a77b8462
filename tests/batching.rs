//! Batched decisions on a real redis-server (`storage.batch`, src/limiter/redis/batch.rs):
//! concurrent decisions leave in fewer calls than there are decisions, and spend exactly what one
//! call each would; an error in one decision of a batch fails that decision alone; with batching
//! off every decision is a call of its own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::RedisServer;
use floodgate::limiter::redis::{RedisStore, RedisTarget};
use floodgate::limiter::{Algorithm, Ask, BudgetKey, KeyKind, Limit, Store};

/// A token bucket of `capacity` that refills once an hour: within a test it only drains.
fn bucket(capacity: u32) -> Limit {
    Limit::of(Algorithm::token_bucket(capacity, 1.0 / 3600.0).expect("limit"))
}

fn ask<'a>(limit: &'a Limit, client: &'a [u8]) -> Ask<'a> {
    Ask {
        limit,
        key: BudgetKey {
            budget: "batch",
            kind: KeyKind::ApiKey,
            value: client,
        },
    }
}

async fn store(redis: &RedisServer, batched: bool) -> Arc<RedisStore> {
    let store = RedisStore::connect(
        &RedisTarget::Single(redis.url()),
        "fgbatch:",
        Duration::from_secs(2),
    )
    .expect("store");
    let store = if batched { store.batched() } else { store };
    store.prepare().await.expect("library loaded");
    Arc::new(store)
}

/// `n` decisions at once, all on `client`'s bucket of `capacity`; how many were allowed.
async fn decide_at_once(
    store: &Arc<RedisStore>,
    n: usize,
    capacity: u32,
    client: &'static [u8],
) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let limit = bucket(capacity);
                let asks = [ask(&limit, client)];
                store
                    .decide(&asks, i as u64)
                    .await
                    .expect("decided")
                    .verdict
                    .allowed()
            })
        })
        .collect();
    let mut allowed = 0;
    for task in tasks {
        allowed += usize::from(task.await.expect("task"));
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_leave_together_and_spend_exactly() {
    let redis = RedisServer::start();
    let store = store(&redis, true).await;
    let before = redis.decisions();
    // 400 decisions at once on one bucket of 150: exactly 150 allowed, as one call each would.
    let allowed = decide_at_once(&store, 400, 150, b"hot").await;
    assert_eq!(allowed, 150);
    let calls = redis.decisions() - before;
    eprintln!("{calls} script calls for 400 concurrent decisions");
    // While one call is in flight the next ones wait and leave together: far fewer calls than
    // decisions (how few depends on how the tasks interleave; any batching at all shows here).
    assert!(calls < 400, "{calls} calls for 400 decisions");
    assert!(
        calls >= 400_u64.div_ceil(64),
        "at most 64 per call: {calls}"
    );
    // An idle store adds no wait: a lone decision is a call of its own, answered.
    let limit = bucket(1);
    assert!(
        store
            .decide(&[ask(&limit, b"alone")], 1)
            .await
            .expect("decided")
            .verdict
            .allowed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_batching_every_decision_is_a_call_of_its_own() {
    let redis = RedisServer::start();
    let store = store(&redis, false).await;
    let before = redis.decisions();
    assert_eq!(decide_at_once(&store, 100, 30, b"hot").await, 30);
    assert_eq!(redis.decisions() - before, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_in_one_decision_of_a_batch_fails_that_decision_alone() {
    let redis = RedisServer::start();
    let _store = store(&redis, true).await;
    let functions: Vec<redis::Value> = redis.cmd(&["FUNCTION", "LIST"]);
    let text = format!("{functions:?}");
    let name = text
        .split('"')
        .find(|s| s.starts_with("floodgate_batch_"))
        .unwrap_or_else(|| panic!("no batch function in {text}"))
        .to_string();
    // Two decisions in one call: the first names an algorithm the script does not know, the
    // second is an ordinary token bucket (capacity 10, one token per 100 ms); nine arguments a
    // limit (decide.lua).
    let reply: Vec<redis::Value> = redis::cmd("FCALL")
        .arg(&name)
        .arg(2)
        .arg("fgbatch:bad")
        .arg("fgbatch:good")
        .arg("-")
        .arg(2)
        .arg(1)
        .arg(1)
        .arg("no_such_algorithm")
        .arg(1)
        .arg(1)
        .arg(1)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(2)
        .arg(1)
        .arg("token_bucket")
        .arg(10)
        .arg(100_000)
        .arg(1)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(0)
        .query(&mut redis.connection().expect("connect"))
        .expect("the batch call itself succeeds");
    assert_eq!(reply.len(), 3, "{reply:?}");
    match &reply[1] {
        redis::Value::BulkString(text) => {
            let text = String::from_utf8_lossy(text);
            assert!(
                text.starts_with("error: ") && text.contains("no_such_algorithm"),
                "{text}"
            );
        }
        other => panic!("the bad decision's answer is {other:?}"),
    }
    match &reply[2] {
        redis::Value::Array(items) => assert_eq!(items[0], redis::Value::Int(1), "allowed"),
        other => panic!("the good decision's answer is {other:?}"),
    }
    let stored: Option<String> = redis.cmd(&["GET", "fgbatch:good"]);
    assert!(stored.is_some(), "the good decision was spent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_batches_go_per_hash_tag_and_spend_exactly() {
    let cluster = common::RedisCluster::start(3);
    let store = RedisStore::connect(
        &RedisTarget::Cluster(cluster.urls()),
        "fgbatch:",
        Duration::from_secs(2),
    )
    .expect("store")
    .batched();
    store.prepare().await.expect("connected");
    let store = Arc::new(store);
    let calls = || -> u64 { cluster.masters().iter().map(|m| m.decisions()).sum() };
    let before = calls();
    // 300 decisions at once on one hot bucket of 100 and, beside them, 8 decisions on each of 25
    // other clients' buckets of 5 (their keys spread over the masters' slots).
    static CLIENTS: [&[u8]; 25] = [
        b"c00", b"c01", b"c02", b"c03", b"c04", b"c05", b"c06", b"c07", b"c08", b"c09", b"c10",
        b"c11", b"c12", b"c13", b"c14", b"c15", b"c16", b"c17", b"c18", b"c19", b"c20", b"c21",
        b"c22", b"c23", b"c24",
    ];
    let others: Vec<_> = CLIENTS
        .iter()
        .map(|client| {
            let store = store.clone();
            tokio::spawn(async move { decide_at_once(&store, 8, 5, client).await })
        })
        .collect();
    let hot = decide_at_once(&store, 300, 100, b"hot").await;
    let mut small = Vec::new();
    for task in others {
        small.push(task.await.expect("task"));
    }
    let others = small;
    assert_eq!(hot, 100, "exactly the hot bucket's capacity");
    assert!(
        others.iter().all(|&n| n == 5),
        "each small bucket exactly: {others:?}"
    );
    let made = calls() - before;
    eprintln!("{made} script calls for 500 concurrent decisions on a cluster");
    assert!(made < 500, "{made} calls for 500 decisions");
}
