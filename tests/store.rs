//! The one store trait, held to one body: the memory store, Redis (its Lua scripts in a real
//! redis-server) and PostgreSQL (its functions in a real server) each keep budgets as
//! [`Store`] says, through a `dyn Store`, the way the guard and replay hold them. The stores
//! decide on the test's clock (`connect_for_test`; the memory store always can), so every
//! figure is exact and no assertion depends on how fast the machine is.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{PostgresServer, RedisServer};
use floodgate::limiter::postgres::PostgresStore;
use floodgate::limiter::redis::{RedisStore, RedisTarget};
use floodgate::limiter::{
    Algorithm, Ask, BudgetKey, CacheScope, CacheWrite, KeyKind, Limit, ManualClock, MemoryStore,
    Settlement, Shared, Store, wall_clock_us,
};

const SEC: u64 = 1_000_000;

/// Whose budget an ask spends: one API key or another.
fn key(budget: &'static str, who: &'static [u8]) -> BudgetKey<'static> {
    BudgetKey {
        budget,
        kind: KeyKind::ApiKey,
        value: who,
    }
}

/// Whether the store admits `asks` at `now`, leasing nothing, under `lease`.
async fn admits(store: &dyn Store, asks: &[Ask<'_>], now: u64, lease: u64) -> bool {
    let reply = store.decide_leasing_at(asks, now, lease, &[]).await;
    reply.expect("the store answers").verdict.allowed()
}

/// What every store must do, whichever it is. `now` is the test's clock: the stores decide at
/// it, and the buckets refill once an hour, so that a peek on a store's own clock (milliseconds
/// later) reads the same figures.
async fn keeps_budgets_as_every_store_must(store: &dyn Store, name: &str, now: u64) {
    assert_eq!(store.name(), name);
    store.prepare().await.expect("ready");
    store.ping().await.expect("answers");
    // Three an hour per key, refilling one every 20 minutes.
    let bucket = Limit::of(Algorithm::token_bucket(3, 3.0 / 3600.0).expect("valid"));
    let (alice, bob) = (key("store#0", b"alice"), key("store#0", b"bob"));
    let alice_asks = [Ask {
        limit: &bucket,
        key: alice,
    }];

    // A budget spends down to nothing, then denies, and each decision says what is left.
    for left in [2, 1, 0] {
        let reply = store.decide_leasing_at(&alice_asks, now, 1, &[]).await;
        let reply = reply.expect("the store answers");
        assert!(reply.verdict.allowed(), "{name}: admitted with {left} left");
        assert_eq!(reply.decisions[0].remaining, left, "{name}: what is left");
    }
    assert!(!admits(store, &alice_asks, now, 1).await, "{name}: spent");

    // All or nothing: a request that spends Alice's spent budget and Bob's fresh one is refused,
    // and Bob's budget is as it was (a peek spends nothing, twice).
    let both = [
        alice_asks[0],
        Ask {
            limit: &bucket,
            key: bob,
        },
    ];
    assert!(
        !admits(store, &both, now, 1).await,
        "{name}: all or nothing"
    );
    let bob_asks = [both[1]];
    for _ in 0..2 {
        let peeked = store.peek(&bob_asks).await.expect("peeked");
        assert_eq!(
            peeked[0].remaining_before(1),
            3,
            "{name}: Bob spent nothing"
        );
    }

    // A settled reservation that cost nothing gives its unit back.
    store
        .settle_at(&alice_asks, &[Settlement::of(1, 0, now)], Some(now))
        .await
        .expect("settled");
    assert!(admits(store, &alice_asks, now, 1).await, "{name}: refunded");
    assert!(
        !admits(store, &alice_asks, now, 1).await,
        "{name}: and spent"
    );

    // A reset budget is full again.
    store.reset(&alice_asks).await.expect("reset");
    for _ in 0..3 {
        assert!(
            admits(store, &alice_asks, now, 1).await,
            "{name}: full again"
        );
    }

    // A concurrency slot is held by its lease until that lease is released.
    let slot = Limit::of(Algorithm::concurrency(1, Duration::from_secs(60)).expect("valid"));
    let slot_asks = [Ask {
        limit: &slot,
        key: key("store#1", b"alice"),
    }];
    assert!(admits(store, &slot_asks, now, 10).await, "{name}: the slot");
    assert!(!admits(store, &slot_asks, now, 11).await, "{name}: held");
    store.release(&slot_asks, 10).await.expect("released");
    assert!(
        admits(store, &slot_asks, now, 12).await,
        "{name}: free again"
    );
}

/// What a store shared by instances keeps beside budgets: the control list and claims.
async fn keeps_what_instances_share(store: &dyn Store, name: &str) {
    let shared = store.shared().expect("a shared store keeps a control list");
    let empty = shared.control_read(None).await.expect("read");
    let empty = empty.expect("a list");
    shared
        .control_write(&[("ban:1", Some("ban ip 192.0.2.1"))])
        .await
        .expect("written");
    let read = shared.control_read(Some(empty.version.clone())).await;
    let read = read.expect("read").expect("a list");
    assert_ne!(
        read.version, empty.version,
        "{name}: a write changes the version"
    );
    assert_eq!(read.entries, Some(vec!["ban ip 192.0.2.1".to_string()]));
    let again = shared.control_read(Some(read.version.clone())).await;
    assert_eq!(
        again.expect("read").expect("a list").entries,
        None,
        "{name}: unchanged"
    );

    assert!(
        shared.claim("alert", 60 * SEC).await.expect("claimed"),
        "{name}"
    );
    assert!(
        !shared.claim("alert", 60 * SEC).await.expect("asked"),
        "{name}: held"
    );
    shared.unclaim("alert").await.expect("given up");
    assert!(
        shared.claim("alert", 60 * SEC).await.expect("claimed"),
        "{name}: again"
    );
    keeps_shared_cache_entries(shared, name).await;
}

/// `cache.shared`'s entries: written, read back with their age on the store's clock, variants
/// side by side, kept no longer than asked, and removed by every scope a purge or an
/// invalidation names (and nothing else).
async fn keeps_shared_cache_entries(shared: &dyn Shared, name: &str) {
    let write = |key: &'static str, variant: &'static str, path: &'static str, query| CacheWrite {
        route: "r",
        key,
        variant,
        host: "api.example",
        path,
        query,
        bytes: b"\0bytes\xff of an answer",
        keep_us: 60 * SEC,
    };
    let entries = [
        ("k1", "/zone/1", Some("a=1")),
        ("k2", "/zone/1", None),
        ("k3", "/zone/2", None),
        ("k4", "/other", None),
    ];
    for (key, path, query) in entries {
        shared
            .cache_write(write(key, "v1", path, query))
            .await
            .expect("written");
    }
    shared
        .cache_write(write("k1", "v2", "/zone/1", Some("a=1")))
        .await
        .expect("written");
    let read = shared.cache_read("r", "k1").await.expect("read");
    assert_eq!(read.len(), 2, "{name}: two variants");
    for variant in &read {
        assert_eq!(variant.bytes, b"\0bytes\xff of an answer", "{name}");
        assert!(
            variant.elapsed_us < 5 * SEC,
            "{name}: {}",
            variant.elapsed_us
        );
    }
    assert!(
        shared
            .cache_read("r", "nothing")
            .await
            .expect("read")
            .is_empty()
    );
    let left = |keys: &'static [&'static str]| async move {
        let mut there = Vec::new();
        for key in ["k1", "k2", "k3", "k4"] {
            if !shared.cache_read("r", key).await.expect("read").is_empty() {
                there.push(key);
            }
        }
        assert_eq!(there, keys, "{name}");
    };
    // An invalidation: one URI (its query too), every variant.
    let uri = CacheScope::Uri {
        host: "api.example",
        path: "/zone/1",
        query: Some("a=1"),
    };
    shared.cache_remove("r", uri).await.expect("removed");
    left(&["k2", "k3", "k4"]).await;
    shared
        .cache_remove("r", CacheScope::Path("/zone/1"))
        .await
        .expect("removed");
    left(&["k3", "k4"]).await;
    shared
        .cache_remove("r", CacheScope::Prefix("/zone/"))
        .await
        .expect("removed");
    left(&["k4"]).await;
    shared
        .cache_remove("other-route", CacheScope::Route)
        .await
        .expect("removed");
    left(&["k4"]).await;
    shared
        .cache_remove("r", CacheScope::Route)
        .await
        .expect("removed");
    left(&[]).await;
    // Kept no longer than asked.
    let brief = CacheWrite {
        keep_us: 1,
        ..write("k5", "v1", "/brief", None)
    };
    shared.cache_write(brief).await.expect("written");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        shared.cache_read("r", "k5").await.expect("read").is_empty(),
        "{name}: expired"
    );
}

#[tokio::test]
async fn the_memory_store_keeps_budgets_as_every_store_must() {
    let now = wall_clock_us();
    let store = MemoryStore::new(Arc::new(ManualClock::new(now)), 100);
    keeps_budgets_as_every_store_must(&store, "memory", now).await;
    assert!(
        store.shared().is_none(),
        "one instance's store shares nothing"
    );
}

#[tokio::test]
async fn redis_keeps_budgets_as_every_store_must() {
    let redis = RedisServer::start();
    let target = RedisTarget::Single(redis.url());
    let store = RedisStore::connect_for_test(&target, "fgstore:", Duration::from_secs(5));
    let store = store.expect("store");
    keeps_budgets_as_every_store_must(&store, "redis", wall_clock_us()).await;
    keeps_what_instances_share(&store, "redis").await;
}

#[tokio::test]
async fn postgres_keeps_budgets_as_every_store_must() {
    let postgres = PostgresServer::start();
    let url = postgres.url();
    let store = PostgresStore::connect_for_test(&url, "fgstore:", Duration::from_secs(5));
    let store = store.expect("store");
    keeps_budgets_as_every_store_must(&store, "postgres", wall_clock_us()).await;
    keeps_what_instances_share(&store, "postgres").await;
}
