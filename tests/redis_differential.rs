//! The differential test: the Rust algorithms (the memory store) and the Lua scripts (a real
//! redis-server) are fed the same requests at the same fake times, and must agree on every
//! decision and every header figure.

mod redis_support;

use std::num::NonZeroU32;
use std::sync::Arc;

use floodgate::limiter::redis::{RedisStore, RedisTarget};
use floodgate::limiter::{Algorithm, BudgetKey, Limit, ManualClock, MemoryStore};
use proptest::prelude::*;
use redis_support::RedisServer;

const SEC: u64 = 1_000_000;
const T0: u64 = 1_700_000_000 * SEC;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("positive")
}

fn any_limit() -> impl Strategy<Value = Limit> {
    let rate = prop_oneof![
        Just(0.5),
        Just(1.0),
        Just(3.0),
        Just(10.0),
        Just(7.3),
        Just(250.0)
    ];
    let window = prop_oneof![
        Just(SEC / 10),
        Just(SEC),
        Just(3 * SEC),
        Just(1_234_567u64),
        Just(3600 * SEC)
    ];
    (0usize..5, 1u32..25, rate, window, 1u32..3).prop_map(|(kind, n, rate, window, cost)| {
        let interval_us = Algorithm::interval_for_rate(rate).expect("valid rate");
        let algorithm = match kind {
            0 => Algorithm::TokenBucket {
                capacity: nz(n),
                interval_us,
            },
            1 => Algorithm::LeakyBucket {
                capacity: nz(n),
                interval_us,
            },
            2 => Algorithm::FixedWindow {
                limit: nz(n),
                window_us: window,
            },
            3 => Algorithm::SlidingWindowLog {
                limit: nz(n),
                window_us: window,
            },
            _ => Algorithm::SlidingWindowCounter {
                limit: nz(n),
                window_us: window,
            },
        };
        Limit {
            algorithm,
            cost: cost.min(n),
        }
    })
}

/// Arrival times: bursts at one instant mixed with gaps of up to 0.7 s.
fn arrivals() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec((0u64..4, 0u64..700_000), 1..60).prop_map(|steps| {
        let mut t = T0;
        steps
            .into_iter()
            .map(|(burst, gap)| {
                if burst == 0 {
                    t += gap;
                }
                t
            })
            .collect()
    })
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
        RedisStore::connect(
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
    proptest!(config, |(limits in prop::collection::vec(any_limit(), 1..3), times in arrivals())| {
        let identity = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_be_bytes();
        let key = BudgetKey { route: "diff", kind: "api_key", value: &identity };
        let memory = MemoryStore::new(Arc::new(ManualClock::new_for_test(T0)), 10);
        for (i, &t) in times.iter().enumerate() {
            let expected = memory.decide_at(&key, &limits, t);
            let got = rt.block_on(store.decide_at_for_test(&key, &limits, t)).expect("redis answers");
            prop_assert_eq!(got, expected, "request {} at +{} µs, limits {:?}", i, t - T0, &limits);
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
        let limits = [Limit {
            algorithm: Algorithm::FixedWindow {
                limit: nz(5),
                window_us: 3600 * SEC,
            },
            cost: 1,
        }];
        let key = BudgetKey {
            route: "time",
            kind: "ip",
            value: b"\x7f\0\0\x01",
        };
        let verdict = store
            .decide(&key, &limits)
            .await
            .expect("redis answers")
            .expect("a verdict");
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
