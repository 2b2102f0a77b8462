//! The cost of one limiter decision.
//!
//! - `algorithm/*`: [`State::check`] + [`State::commit`] on the pure functions, one identity, the
//!   clock advanced by hand between calls. `allow` keeps every request inside the limit (the
//!   sliding log then holds ~1000 timestamps and drops one per call); `deny` saturates the limit
//!   after the first call.
//! - `memory_store/*`: [`MemoryStore::decide`] with the system clock, the way the proxy calls it,
//!   rotating over 1000 API keys (all pre-inserted), on a token bucket that admits everything and
//!   on one that denies everything.
//!
//! - `tiers/*`: [`policy::asks`], the step that picks a route's limits for a request, on three
//!   limits without `tiers:` and on the same three with `tiers:` lists of two names each (the
//!   request's tier matching the second name of each): what comparing tier names costs.
//!
//! Run: `cargo bench --bench limiter` (short: `-- --warm-up-time 1 --measurement-time 2`).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use floodgate::config::Config;
use floodgate::limiter::algorithm::State;
use floodgate::limiter::{
    Algorithm, AlgorithmKind, Ask, BudgetKey, KeyKind, Limit, MemoryStore, SystemClock,
};
use floodgate::policy;

const T0: u64 = 1_700_000_000_000_000;
const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3_600 * SECOND;

fn limit(kind: AlgorithmKind, units: u64, span_us: u64) -> Limit {
    Limit::of(Algorithm::from_parts(kind, units, span_us).unwrap())
}

/// (name, limit that admits every call at `step_us` apart, limit that denies after the first).
fn cases() -> Vec<(&'static str, Limit, Limit)> {
    vec![
        (
            "token_bucket",
            // 10 000/s refill, calls 1 ms apart: always a full bucket.
            limit(AlgorithmKind::TokenBucket, 100, 100),
            limit(AlgorithmKind::TokenBucket, 1, HOUR),
        ),
        (
            "leaky_bucket",
            limit(AlgorithmKind::LeakyBucket, 100, 100),
            limit(AlgorithmKind::LeakyBucket, 1, HOUR),
        ),
        (
            "fixed_window",
            limit(AlgorithmKind::FixedWindow, 10_000, SECOND),
            limit(AlgorithmKind::FixedWindow, 1, HOUR),
        ),
        (
            "sliding_window_log",
            // ~1000 entries live in the window; each call pushes one and expires one.
            limit(AlgorithmKind::SlidingWindowLog, 2_000, SECOND),
            limit(AlgorithmKind::SlidingWindowLog, 1, HOUR),
        ),
        (
            "sliding_window_counter",
            limit(AlgorithmKind::SlidingWindowCounter, 10_000, SECOND),
            limit(AlgorithmKind::SlidingWindowCounter, 1, HOUR),
        ),
    ]
}

/// One decision as the memory store takes it: check, then commit if allowed.
fn decide(state: &mut State, limit: &Limit, now: u64) -> bool {
    let d = state.check(limit, now);
    if d.allowed() {
        state.commit(limit, now, 0);
    }
    d.allowed()
}

fn algorithms(c: &mut Criterion) {
    let mut group = c.benchmark_group("algorithm");
    group.throughput(Throughput::Elements(1));
    for (name, allow, deny) in cases() {
        for (outcome, limit, step_us) in [("allow", allow, 1_000), ("deny", deny, 1)] {
            let mut state = State::new(limit.algorithm().kind());
            let mut now = T0;
            // Reach the steady state first (a full log, a saturated limit).
            for _ in 0..5_000 {
                now += step_us;
                decide(&mut state, &limit, now);
            }
            let expected = outcome == "allow";
            assert_eq!(
                decide(&mut state, &limit, now + step_us),
                expected,
                "{name}/{outcome}"
            );
            now += step_us;
            group.bench_function(format!("{name}/{outcome}"), |b| {
                b.iter(|| {
                    now += step_us;
                    black_box(decide(&mut state, black_box(&limit), now))
                })
            });
        }
    }
    group.finish();
}

fn memory_store(c: &mut Criterion) {
    const KEYS: usize = 1_000;
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| format!("bench-key-{i:04}").into_bytes())
        .collect();
    let allow = [limit(AlgorithmKind::TokenBucket, 1_000_000_000, 1)];
    let deny = [limit(AlgorithmKind::TokenBucket, 1, 1_000 * SECOND)];
    let mut group = c.benchmark_group("memory_store");
    group.throughput(Throughput::Elements(1));
    for (outcome, limits) in [("allow", &allow), ("deny", &deny)] {
        let store = MemoryStore::new(SystemClock::default(), 1_000_000);
        let limit = &limits[0];
        let key = |i: usize| {
            [Ask {
                limit,
                key: BudgetKey {
                    budget: "bench#0#0a1b2c3d",
                    kind: KeyKind::ApiKey,
                    value: &keys[i],
                },
            }]
        };
        // Every key is tracked before measuring; the deny store has spent each key's one token.
        for i in 0..KEYS {
            store.decide(&key(i));
        }
        assert_eq!(store.decide(&key(0)).unwrap().allowed(), outcome == "allow");
        let mut i = 0;
        group.bench_function(format!("decide_1000_keys/{outcome}"), |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                black_box(store.decide(black_box(&key(i))))
            })
        });
    }
    group.finish();
}

/// What the round-2 policies add to a decision on the memory store: the same token bucket alone,
/// then with a `per: ip` ceiling and a `per: route` cap beside it (three budgets, three entries,
/// up to three shard locks), over 1000 rotating keys.
fn policies(c: &mut Criterion) {
    const KEYS: usize = 1_000;
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| format!("bench-key-{i:04}").into_bytes())
        .collect();
    let own = limit(AlgorithmKind::TokenBucket, 1_000_000_000, 1);
    let ip_ceiling = limit(AlgorithmKind::TokenBucket, 1_000_000_000, 1);
    let route_cap = limit(AlgorithmKind::SlidingWindowCounter, 1_000_000_000, SECOND);
    let store = MemoryStore::new(SystemClock::default(), 1_000_000);
    let mut group = c.benchmark_group("policies");
    group.throughput(Throughput::Elements(1));
    let mut i = 0;
    group.bench_function("one_limit", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let asks = [Ask {
                limit: &own,
                key: BudgetKey {
                    budget: "r#0#aa",
                    kind: KeyKind::ApiKey,
                    value: &keys[i],
                },
            }];
            black_box(store.decide(black_box(&asks)))
        })
    });
    group.bench_function("identity_ip_and_route_limits", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let asks = [
                Ask {
                    limit: &own,
                    key: BudgetKey {
                        budget: "r#0#aa",
                        kind: KeyKind::ApiKey,
                        value: &keys[i],
                    },
                },
                Ask {
                    limit: &ip_ceiling,
                    key: BudgetKey {
                        budget: "r#1#bb",
                        kind: KeyKind::Ip,
                        value: &[127, 0, 0, 1],
                    },
                },
                Ask {
                    limit: &route_cap,
                    key: BudgetKey {
                        budget: "r#2#cc",
                        kind: KeyKind::Route,
                        value: b"",
                    },
                },
            ];
            black_box(store.decide(black_box(&asks)))
        })
    });
    group.finish();
}

/// [`policy::asks`] on three limits, with and without `tiers:`.
fn tiers(c: &mut Criterion) {
    let route = |tiers: &str| {
        let yaml = format!(
            "listen: 127.0.0.1:0
consumers:
  entries:
    - {{name: a, tier: pro, keys_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]}}
routes:
  - name: api
    path_prefix: /
    upstream: http://127.0.0.1:9
    limits:
      - {{algorithm: token_bucket, capacity: 5, refill_rate: 1{tiers}}}
      - {{algorithm: fixed_window, limit: 100, window: 1h, per: ip{tiers}}}
      - {{algorithm: sliding_window_counter, limit: 1000, window: 1m, per: route{tiers}}}
"
        );
        Config::from_yaml(&yaml)
            .expect("bench config")
            .routes
            .remove(0)
    };
    let plain = route("");
    let tiered = route(", tiers: [anonymous, pro]");
    let mut group = c.benchmark_group("tiers");
    group.throughput(Throughput::Elements(1));
    for (name, route) in [("three_limits", &plain), ("three_tiered_limits", &tiered)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let asks = policy::asks(
                    black_box(&route.enforced),
                    black_box("pro"),
                    Some((KeyKind::ApiKey, b"key".as_slice())),
                    Some([127, 0, 0, 1].as_slice()),
                );
                black_box(asks.asks.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, algorithms, memory_store, policies, tiers);
criterion_main!(benches);
