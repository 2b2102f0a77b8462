//! The differential tests: the Rust algorithms (the memory store) and each remote store's
//! server-side code (the Lua scripts in a real redis-server, the PL/pgSQL functions in a real
//! PostgreSQL) are fed the same requests at the same fake times, and must agree on every decision
//! and every header figure.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{PostgresServer, RedisServer};
use floodgate::limiter::calendar::{Calendar, Period};
use floodgate::limiter::hold::HeldBucket;
use floodgate::limiter::lease::LeaseAsk;
use floodgate::limiter::postgres::PostgresStore;
use floodgate::limiter::redis::{RedisStore, RedisTarget};
use floodgate::limiter::wire::Reply;
use floodgate::limiter::{
    Algorithm, AlgorithmKind, Ask, BudgetKey, KeyKind, LeaseId, Limit, LimiterError, ManualClock,
    MemoryStore, Settlement, Store, StoreUs, Verdict,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

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

/// What a remote store under test must do on a fake clock.
trait OnFakeClock {
    async fn decide_at(
        &self,
        asks: &[Ask<'_>],
        now: u64,
        lease: LeaseId,
    ) -> Result<Verdict, LimiterError>;
    async fn release(&self, asks: &[Ask<'_>], lease: LeaseId) -> Result<(), LimiterError>;
}

impl<S: Store> OnFakeClock for S {
    async fn decide_at(
        &self,
        asks: &[Ask<'_>],
        now: u64,
        lease: LeaseId,
    ) -> Result<Verdict, LimiterError> {
        Ok(self.decide_leasing_at(asks, now, lease, &[]).await?.verdict)
    }
    async fn release(&self, asks: &[Ask<'_>], lease: LeaseId) -> Result<(), LimiterError> {
        Store::release(self, asks, lease).await
    }
}

/// Runs 96 generated cases (1 to 3 limits, up to 60 requests) through the memory store and
/// `store`, comparing every verdict.
fn agrees_with_the_rust_algorithms(rt: &tokio::runtime::Runtime, store: &impl OnFakeClock) {
    let case = AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    };
    // Each limit spends its own budget; some are the route's, some the caller's, as `per:` does.
    proptest!(config, |(limits in prop::collection::vec((any_limit(), any::<bool>()), 1..4), times in arrivals())| {
        let identity = case.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        let asks: Vec<Ask<'_>> = limits.iter().enumerate().map(|(i, (limit, route_wide))| Ask {
            limit,
            key: BudgetKey {
                budget: BUDGETS[i],
                kind: if *route_wide { KeyKind::Route } else { KeyKind::ApiKey },
                value: &identity,
            },
        }).collect();
        let memory = MemoryStore::new(Arc::new(ManualClock::new(T0)), 10);
        for (i, &t) in times.iter().enumerate() {
            // Lease tokens unique per case and request; every third request, the one before it
            // finishes and gives its concurrency leases back, in both stores.
            let lease = (u64::from_be_bytes(identity) << 16) + i as u64;
            let expected = memory.decide_at(&asks, t, lease).expect("limits given");
            let got = rt.block_on(store.decide_at(&asks, t, lease))
                .map_err(|e| TestCaseError::fail(format!("the store failed: {e}")))?;
            prop_assert_eq!(got, expected, "request {} at +{} µs, limits {:?}", i, t - T0, &limits);
            if i % 3 == 2 {
                memory.release(&asks, lease - 1);
                rt.block_on(store.release(&asks, lease - 1))
                    .map_err(|e| TestCaseError::fail(format!("the store failed: {e}")))?;
            }
        }
    });
}

/// A Redis store on `redis`, on a test clock.
fn redis_store(rt: &tokio::runtime::Runtime, redis: &RedisServer) -> RedisStore {
    rt.block_on(async {
        RedisStore::connect_for_test(
            &RedisTarget::Single(redis.url()),
            "fgtest:",
            std::time::Duration::from_secs(2),
        )
        .expect("store")
    })
}

#[test]
fn lua_scripts_decide_exactly_like_the_rust_algorithms() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = redis_store(&rt, &redis);
    agrees_with_the_rust_algorithms(&rt, &store);
}

/// A PostgreSQL store on `postgres` (on a test clock when `test_clock`), once it has installed
/// its schema (it does so in a background task at start, which runs only while the runtime
/// does).
fn postgres_store(
    rt: &tokio::runtime::Runtime,
    postgres: &PostgresServer,
    test_clock: bool,
) -> PostgresStore {
    rt.block_on(async {
        let timeout = std::time::Duration::from_secs(2);
        let store = if test_clock {
            PostgresStore::connect_for_test(&postgres.url(), "fgtest:", timeout)
        } else {
            PostgresStore::connect(&postgres.url(), "fgtest:", timeout)
        }
        .expect("store");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while let Err(e) = store.ping().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the PostgreSQL store never became ready: {e}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        store
    })
}

#[test]
fn sql_functions_decide_exactly_like_the_rust_algorithms() {
    let postgres = PostgresServer::start();
    let rt = runtime();
    let store = postgres_store(&rt, &postgres, true);
    agrees_with_the_rust_algorithms(&rt, &store);
}

/// A remote store's decision with leases, on a fake clock.
trait LeasesOnFakeClock {
    async fn decide_leasing_at_now(
        &self,
        asks: &[Ask<'_>],
        now: u64,
        wants: &[LeaseAsk],
    ) -> Result<Reply, LimiterError>;
}

impl<S: Store> LeasesOnFakeClock for S {
    async fn decide_leasing_at_now(
        &self,
        asks: &[Ask<'_>],
        now: u64,
        wants: &[LeaseAsk],
    ) -> Result<Reply, LimiterError> {
        self.decide_leasing_at(asks, now, 1, wants).await
    }
}

/// Runs 64 generated cases through `store` and the Rust model of a leased token bucket
/// ([`HeldBucket`]): requests that lease, and leases that end, are released early or expire,
/// giving back some of their units, or whole decisions given back (an answer that came late). Every decision and every lease must agree, and so must a
/// plain decision after each step (the holds' effect on the bucket).
fn leases_agree_with_the_rust_model(rt: &tokio::runtime::Runtime, store: &impl LeasesOnFakeClock) {
    let case = AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    };
    let steps = prop::collection::vec(
        (
            prop_oneof![Just(0u64), 0u64..50_000, 200_000u64..400_000],
            0u32..20,
            // Which earlier lease (if any) ends with this request, and how much of it is left.
            prop::option::of((any::<prop::sample::Index>(), any::<prop::sample::Index>())),
        ),
        1..40,
    );
    proptest!(config, |(
        capacity in 2u32..40,
        per_second in prop_oneof![Just(1.0f64), Just(10.0), Just(1_000.0)],
        cost in 1u32..3,
        lease_us in prop_oneof![Just(100_000u64), Just(250_000), Just(SEC)],
        steps in steps,
    )| {
        let identity = case.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        let limit = Limit::new(Algorithm::token_bucket(capacity, per_second).unwrap(), cost).unwrap();
        let asks = [Ask {
            limit: &limit,
            key: BudgetKey { budget: "leases", kind: KeyKind::ApiKey, value: &identity },
        }];
        let mut model = HeldBucket::default();
        // Decisions allowed and not yet given back: (store time, requests' worth leased).
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut t = T0;
        for (i, (step, want, ends)) in steps.into_iter().enumerate() {
            t += step;
            let mut ask = LeaseAsk { want, lease_us, ..LeaseAsk::default() };
            if let Some((which, left)) = ends.filter(|_| !out.is_empty()) {
                let (at, lent) = out.remove(which.index(out.len()));
                // What a lease left, or (one more) all of it and the decision's own request's
                // worth, as an answer that came too late gives back.
                ask.lent = lent;
                ask.back = left.index(lent as usize + 2) as u64;
                ask.back_at = StoreUs(at);
            }
            let (expected, leased) = model.decide(&limit, t, &ask);
            let got = rt.block_on(store.decide_leasing_at_now(&asks, t, &[ask]))
                .map_err(|e| TestCaseError::fail(format!("the store failed: {e}")))?;
            prop_assert_eq!(got.decisions[0], expected, "request {} at +{} µs: {:?}", i, t - T0, ask);
            prop_assert_eq!(got.leased.first().copied().unwrap_or(0), leased, "request {} leased", i);
            if expected.allowed() {
                out.push((t, leased));
            }
        }
    });
}

#[test]
fn lua_leases_hold_a_bucket_exactly_like_the_rust_model() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = redis_store(&rt, &redis);
    leases_agree_with_the_rust_model(&rt, &store);
}

#[test]
fn sql_leases_hold_a_bucket_exactly_like_the_rust_model() {
    let postgres = PostgresServer::start();
    let rt = runtime();
    let store = postgres_store(&rt, &postgres, true);
    leases_agree_with_the_rust_model(&rt, &store);
}

/// A sliding window log of 5 an hour, spent within one microsecond of the store's clock (as the
/// decisions of one batch are): two admitted, then a third that gives back a late answer's
/// request's worth (one entry of that microsecond) before it is admitted. Two units remain
/// counted, so exactly three more are admitted. (A log that names an entry by its count within
/// the microsecond re-used the second entry's name for the third, which replaced it: four more.)
fn a_log_spent_within_one_microsecond_counts_every_admission(
    rt: &tokio::runtime::Runtime,
    store: &impl LeasesOnFakeClock,
) {
    let limit = Limit::of(
        Algorithm::from_parts(AlgorithmKind::SlidingWindowLog, 5, 3600 * SEC).expect("valid"),
    );
    let asks = [Ask {
        limit: &limit,
        key: BudgetKey {
            budget: "one-microsecond",
            kind: KeyKind::ApiKey,
            value: b"k",
        },
    }];
    let decide = |ask: LeaseAsk| {
        rt.block_on(store.decide_leasing_at_now(&asks, T0, &[ask]))
            .expect("the store answers")
            .verdict
            .allowed()
    };
    let plain = LeaseAsk::default();
    assert!(decide(plain) && decide(plain));
    let late_answers_own = LeaseAsk {
        back: 1,
        back_at: StoreUs(T0),
        lease_us: SEC,
        ..LeaseAsk::default()
    };
    assert!(decide(late_answers_own));
    let more = (0..6).filter(|_| decide(plain)).count();
    assert_eq!(more, 3, "admitted after 3 of 5, one given back");
}

#[test]
fn lua_log_counts_every_admission_within_one_microsecond() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = redis_store(&rt, &redis);
    a_log_spent_within_one_microsecond_counts_every_admission(&rt, &store);
}

#[test]
fn sql_log_counts_every_admission_within_one_microsecond() {
    let postgres = PostgresServer::start();
    let rt = runtime();
    let store = postgres_store(&rt, &postgres, true);
    a_log_spent_within_one_microsecond_counts_every_admission(&rt, &store);
}

/// A one-hour fixed window of 5 on a fixed IP: long enough that no test crosses a window.
fn hour_window() -> Limit {
    Limit::of(Algorithm::from_parts(AlgorithmKind::FixedWindow, 5, 3600 * SEC).expect("valid"))
}

fn ask(limit: &Limit) -> Ask<'_> {
    Ask {
        limit,
        key: BudgetKey {
            budget: "time",
            kind: KeyKind::Ip,
            value: b"\x7f\0\0\x01",
        },
    }
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
        let limit = hour_window();
        let asks = [ask(&limit)];
        let verdict = store.decide(&asks, 0).await.expect("redis answers").verdict;
        // The production script reads no injected time: a test-clock call is refused.
        assert!(store.decide_leasing_at(&asks, T0, 0, &[]).await.is_err());
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

#[test]
fn the_database_clock_is_used_when_no_time_is_given() {
    let postgres = PostgresServer::start();
    let rt = runtime();
    let store = postgres_store(&rt, &postgres, false);
    let limit = hour_window();
    let asks = [ask(&limit)];
    let verdict = rt
        .block_on(store.decide(&asks, 0))
        .expect("postgres answers")
        .verdict;
    // The production store reads no injected time: a test-clock call is refused.
    assert!(
        rt.block_on(store.decide_leasing_at(&asks, T0, 0, &[]))
            .is_err()
    );
    let db_now: u64 = postgres
        .psql("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
        .parse()
        .expect("a number");
    assert!(
        verdict.now_us <= db_now && db_now - verdict.now_us < 5 * SEC,
        "the verdict is stamped with the database's clock: {} vs {db_now}",
        verdict.now_us
    );
}

/// µs since the epoch of an RFC 3339 instant.
fn instant(s: &str) -> u64 {
    s.parse::<jiff::Timestamp>()
        .expect("an RFC 3339 instant")
        .as_microsecond() as u64
}

/// A daily quota of 3 in `America/New_York`, decided by the memory store and `store` on a fake
/// clock around the two days of 2026 whose length is not 24 hours: each store resets it at local
/// midnight, and the two agree on every verdict.
fn quota_resets_at_local_midnight(rt: &tokio::runtime::Runtime, store: &impl OnFakeClock) {
    let calendar = Calendar::new(Period::Day, "America/New_York").expect("a zone");
    let limit = Limit::of(Algorithm::quota(3, calendar).expect("valid"));
    let asks = [Ask {
        limit: &limit,
        key: BudgetKey {
            budget: "quota",
            kind: KeyKind::ApiKey,
            value: b"rider",
        },
    }];
    let memory = MemoryStore::new(Arc::new(ManualClock::new(T0)), 10);
    let mut lease = 0;
    let mut decide = |at: &str| {
        lease += 1;
        let t = instant(at);
        let expected = memory.decide_at(&asks, t, lease).expect("a limit");
        let got = rt
            .block_on(store.decide_at(&asks, t, lease))
            .expect("the store answers");
        assert_eq!(got, expected, "at {at}");
        got
    };
    // 2026-03-08 is 23 hours long in New York (02:00 EST became 03:00 EDT).
    for _ in 0..3 {
        assert!(decide("2026-03-08T00:00:00-05:00").allowed());
    }
    let denied = decide("2026-03-08T22:00:00-04:00");
    assert!(!denied.allowed());
    assert_eq!(
        denied.retry_after_us(),
        2 * 3600 * SEC,
        "until local midnight"
    );
    assert_eq!(
        denied.reset_unix_secs() * SEC,
        instant("2026-03-09T00:00:00-04:00")
    );
    assert!(!decide("2026-03-08T23:59:59.999999-04:00").allowed());
    // 24 hours after the day began it is 01:00: the quota turned an hour before.
    let next_day = decide("2026-03-09T00:00:00-04:00");
    assert!(next_day.allowed());
    assert_eq!(next_day.headline.remaining, 2);
    // 2026-11-01 is 25 hours long (02:00 EDT became 01:00 EST): 23:30 EST is still that day.
    for _ in 0..3 {
        assert!(decide("2026-11-01T00:30:00-04:00").allowed());
    }
    let late = decide("2026-11-01T23:30:00-05:00");
    assert!(!late.allowed());
    assert_eq!(late.retry_after_us(), 1800 * SEC);
    assert!(decide("2026-11-02T00:00:00-05:00").allowed());
}

#[test]
fn lua_quota_resets_at_local_midnight_across_dst_changes() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = redis_store(&rt, &redis);
    quota_resets_at_local_midnight(&rt, &store);
}

#[test]
fn sql_quota_resets_at_local_midnight_across_dst_changes() {
    let postgres = PostgresServer::start();
    let rt = runtime();
    let store = postgres_store(&rt, &postgres, true);
    quota_resets_at_local_midnight(&rt, &store);
}

/// What a remote store must do to settle reserved costs on a fake clock.
trait SettlesOnFakeClock: OnFakeClock {
    async fn settle_at(
        &self,
        asks: &[Ask<'_>],
        settlements: &[Settlement],
        now: u64,
    ) -> Result<(), LimiterError>;
}

impl<S: Store> SettlesOnFakeClock for S {
    async fn settle_at(
        &self,
        asks: &[Ask<'_>],
        settlements: &[Settlement],
        now: u64,
    ) -> Result<(), LimiterError> {
        Store::settle_at(self, asks, settlements, Some(now)).await
    }
}

/// The algorithms a settled cost works with.
const SETTLEABLE: [AlgorithmKind; 4] = [
    AlgorithmKind::TokenBucket,
    AlgorithmKind::FixedWindow,
    AlgorithmKind::SlidingWindowCounter,
    AlgorithmKind::Quota,
];

/// Figures an upstream may report that no counter can hold: `2^64 - 1` (what `1e30` saturates
/// at), `2^55 - 300` (past a double's exact integers), `1e10` and `1e15` tokens.
const HUGE: [u64; 4] = [
    u64::MAX,
    (1 << 55) - 300,
    10_000_000_000,
    1_000_000_000_000_000,
];

/// Reserve, then settle: 96 generated cases of one settled limit, each request reserving 1 to
/// the limit's units and settling, at the next request's time, at 0 to 3 times the limit (so
/// refunds, charges into debt and even settlements) or at a [`HUGE`] figure; the memory store
/// and `store` must agree on every verdict, and the store must go on answering (a settlement
/// that wrote a state it cannot read back would fail the next decision).
fn settlements_agree_with_the_rust_algorithms(
    rt: &tokio::runtime::Runtime,
    store: &impl SettlesOnFakeClock,
) {
    let case = AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    };
    let limit = strategies::any_limit(&SETTLEABLE, 25, &[SEC / 10, SEC, 3 * SEC, 3600 * SEC]);
    let steps = prop::collection::vec((1u32..1000, 0u64..80), 1..40);
    proptest!(config, |(limit in limit, times in arrivals(), steps in steps)| {
        let identity = case.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        let limit = limit.settled();
        let units = limit.algorithm().units();
        let memory = MemoryStore::new(Arc::new(ManualClock::new(T0)), 10);
        let key = BudgetKey { budget: "settle", kind: KeyKind::ApiKey, value: &identity };
        // The reservation waiting to be settled: its limit and settlement.
        let mut pending: Option<(Limit, Settlement)> = None;
        for (i, (&t, &(reserve, actual_pct))) in times.iter().zip(&steps).enumerate() {
            if let Some((reserved_limit, settlement)) = pending.take() {
                let asks = [Ask { limit: &reserved_limit, key }];
                memory.settle_at(&asks, &[settlement], t);
                rt.block_on(store.settle_at(&asks, &[settlement], t))
                    .map_err(|e| TestCaseError::fail(format!("the store failed to settle: {e}")))?;
            }
            let costed = limit.costing(reserve % units + 1);
            let asks = [Ask { limit: &costed, key }];
            let lease = (u64::from_be_bytes(identity) << 16) + i as u64;
            let expected = memory.decide_at(&asks, t, lease).expect("a limit");
            let got = rt.block_on(store.decide_at(&asks, t, lease))
                .map_err(|e| TestCaseError::fail(format!("the store failed: {e}")))?;
            prop_assert_eq!(got, expected, "request {} at +{} µs, {:?}", i, t - T0, &costed);
            if got.allowed() {
                let actual = match actual_pct.checked_sub(75) {
                    Some(huge) => HUGE[huge as usize % HUGE.len()],
                    None => u64::from(units) * actual_pct / 25,
                };
                pending = Some((costed, Settlement::of(u64::from(costed.cost()), actual, got.now_us)));
            }
        }
    });
}

#[test]
fn lua_settles_reserved_costs_exactly_like_the_rust_algorithms() {
    let redis = RedisServer::start();
    let rt = runtime();
    let store = redis_store(&rt, &redis);
    settlements_agree_with_the_rust_algorithms(&rt, &store);
}

#[test]
fn sql_settles_reserved_costs_exactly_like_the_rust_algorithms() {
    let postgres = PostgresServer::start();
    let rt = runtime();
    let store = postgres_store(&rt, &postgres, true);
    settlements_agree_with_the_rust_algorithms(&rt, &store);
}
