//! The differential test: the Rust algorithms (the memory store) and the Lua scripts (a real
//! redis-server) are fed the same requests at the same fake times, and must agree on every
//! decision and every header figure.

mod common;

use std::sync::Arc;

use common::RedisServer;
use floodgate::limiter::redis::{RedisStore, RedisTarget};
use floodgate::limiter::{
    Algorithm, AlgorithmKind, Ask, BudgetKey, KeyKind, Limit, ManualClock, MemoryStore,
};
use proptest::prelude::*;

// The strategies the algorithms' unit tests use too; they name `crate::limiter`.
use floodgate::limiter;
#[path = "../src/limiter/algorithm/strategies.rs"]
mod strategies;
use strategies::{SEC, T0};

/// Budget ids for the limits of one case, by position.
const BUDGETS: [&str; 3] = ["diff#0", "diff#1", "diff#2"];

/// Every algorithm, concurrency included, with windows and leases up to an hour.
fn any_limit() -> impl Strategy<Value = Limit> {
    strategies::any_limit(
        &AlgorithmKind::ALL,
        25,
        &[SEC / 10, SEC, 3 * SEC, 1_234_567, 3600 * SEC],
    )
}

/// Arrival times: bursts at one instant mixed with gaps of up to 0.7 s.
fn arrivals() -> impl Strategy<Value = Vec<u64>> {
    strategies::arrivals(700_000, 60)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn lua_scripts_decide_exactly_like_the_rust_algorithms() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = rt.block_on(async {
        RedisStore::connect_for_test(
            &RedisTarget::Single(redis.url()),
            "fgtest:",
            std::time::Duration::from_secs(2),
        )
        .expect("store")
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    };
    // Each limit spends its own budget; some are the route's, some the caller's, as `per:` does.
    proptest!(config, |(limits in prop::collection::vec((any_limit(), any::<bool>()), 1..4), times in arrivals())| {
        let identity = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_be_bytes();
        let asks: Vec<Ask<'_>> = limits.iter().enumerate().map(|(i, (limit, route_wide))| Ask {
            limit,
            key: if *route_wide {
                BudgetKey { budget: BUDGETS[i], kind: KeyKind::Route, value: &identity }
            } else {
                BudgetKey { budget: BUDGETS[i], kind: KeyKind::ApiKey, value: &identity }
            },
        }).collect();
        let memory = MemoryStore::new(Arc::new(ManualClock::new_for_test(T0)), 10);
        for (i, &t) in times.iter().enumerate() {
            // Lease tokens unique per case and request; every third request, the one before it
            // finishes and gives its concurrency leases back, in both stores.
            let lease = (u64::from_be_bytes(identity) << 16) + i as u64;
            let expected = memory.decide_at(&asks, t, lease).expect("limits given");
            let got = rt.block_on(store.decide_at_for_test(&asks, t, lease)).expect("redis answers");
            prop_assert_eq!(got, expected, "request {} at +{} µs, limits {:?}", i, t - T0, &limits);
            if i % 3 == 2 {
                memory.release(&asks, lease - 1);
                rt.block_on(store.release(&asks, lease - 1)).expect("redis answers");
            }
        }
    });
}

#[test]
fn redis_time_is_used_when_no_time_is_given() {
    let redis = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::connect(
            &RedisTarget::Single(redis.url()),
            "fgtest:",
            std::time::Duration::from_secs(2),
        )
        .expect("store");
        let limit = Limit::of(
            Algorithm::from_parts(AlgorithmKind::FixedWindow, 5, 3600 * SEC).expect("valid"),
        );
        let asks = [Ask {
            limit: &limit,
            key: BudgetKey {
                budget: "time",
                kind: KeyKind::Ip,
                value: b"\x7f\0\0\x01",
            },
        }];
        let verdict = store.decide(&asks, 0).await.expect("redis answers");
        // The production script reads no injected time: a test-clock call is refused.
        assert!(store.decide_at_for_test(&asks, T0, 0).await.is_err());
        let (secs, micros): (u64, u64) = {
            let t: Vec<String> = redis.cmd(&["TIME"]);
            (t[0].parse().unwrap(), t[1].parse().unwrap())
        };
        let redis_now = secs * SEC + micros;
        assert!(
            verdict.now_us <= redis_now && redis_now - verdict.now_us < 5 * SEC,
            "the verdict is stamped with Redis TIME"
        );
    });
}
