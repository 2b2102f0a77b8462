//! Unit and property tests of the algorithms, on an injected clock (plain `now` values): no sleeps.

use proptest::prelude::*;

use super::State;
use crate::limiter::{Algorithm, AlgorithmKind, Decision, Limit, LimitError};

use super::strategies::{self, SEC, T0};

fn token_bucket(capacity: u32, per_sec: f64) -> Limit {
    Limit::of(Algorithm::token_bucket(capacity, per_sec).expect("valid bucket"))
}

fn leaky_bucket(capacity: u32, per_sec: f64) -> Limit {
    Limit::of(Algorithm::leaky_bucket(capacity, per_sec).expect("valid bucket"))
}

fn window(kind: AlgorithmKind, l: u32, window_us: u64) -> Limit {
    Limit::of(Algorithm::from_parts(kind, u64::from(l), window_us).expect("valid window"))
}

fn fixed_window(l: u32, window_us: u64) -> Limit {
    window(AlgorithmKind::FixedWindow, l, window_us)
}

fn sliding_log(l: u32, window_us: u64) -> Limit {
    window(AlgorithmKind::SlidingWindowLog, l, window_us)
}

fn sliding_counter(l: u32, window_us: u64) -> Limit {
    window(AlgorithmKind::SlidingWindowCounter, l, window_us)
}

/// Runs one request at `now` through check and (if allowed) commit, as a store does.
fn request(state: &mut State, limit: &Limit, now: u64) -> Decision {
    let d = state.check(limit, now);
    if d.allowed() {
        state.commit(limit, now, 0);
    }
    d
}

/// The allowed flags of requests at the given times.
fn pattern(limit: &Limit, times: &[u64]) -> Vec<bool> {
    let mut state = State::new(limit.algorithm().kind());
    times
        .iter()
        .map(|&t| request(&mut state, limit, t).allowed())
        .collect()
}

#[test]
fn token_bucket_allows_a_burst_of_capacity_then_the_refill_rate() {
    let l = token_bucket(3, 1.0);
    let mut s = State::new(l.algorithm().kind());
    let remaining: Vec<_> = (0..4).map(|_| request(&mut s, &l, T0)).collect();
    assert_eq!(
        remaining
            .iter()
            .map(|d| (d.allowed(), d.remaining))
            .collect::<Vec<_>>(),
        vec![(true, 2), (true, 1), (true, 0), (false, 0)]
    );
    assert_eq!(
        remaining[3].retry_after_us(),
        SEC,
        "one token takes a second to come back"
    );
    assert_eq!(
        remaining[2].reset_after_us,
        3 * SEC,
        "three tokens to refill"
    );
    // Just before the token is back: still denied. At the instant: allowed.
    assert!(!request(&mut s, &l, T0 + SEC - 1).allowed());
    let d = request(&mut s, &l, T0 + SEC);
    assert!(d.allowed() && d.remaining == 0);
    assert_eq!(d.delay_us(), 0, "a token bucket never delays");
}

#[test]
fn token_bucket_refills_only_up_to_capacity() {
    let l = token_bucket(2, 10.0);
    // An hour idle still buys a burst of only 2.
    assert_eq!(
        pattern(&l, &[T0, T0 + 3600 * SEC, T0 + 3600 * SEC, T0 + 3600 * SEC]),
        vec![true, true, true, false]
    );
}

#[test]
fn token_bucket_fractional_rates_round_the_interval_up() {
    let l = token_bucket(1, 0.5);
    assert_eq!(
        pattern(&l, &[T0, T0 + 2 * SEC - 1, T0 + 2 * SEC]),
        vec![true, false, true]
    );
    assert_eq!(Algorithm::interval_for_rate(3.0), Ok(333_334));
    assert_eq!(
        Algorithm::interval_for_rate(0.0),
        Err(LimitError::RateNotPositive)
    );
    assert_eq!(
        Algorithm::interval_for_rate(f64::NAN),
        Err(LimitError::RateNotPositive)
    );
    assert_eq!(
        Algorithm::interval_for_rate(2e6),
        Err(LimitError::RateTooHigh)
    );
}

#[test]
fn token_bucket_cost_spends_several_tokens() {
    let l = Limit::new(*token_bucket(5, 1.0).algorithm(), 2).unwrap();
    let mut s = State::new(l.algorithm().kind());
    let d: Vec<_> = (0..3).map(|_| request(&mut s, &l, T0)).collect();
    assert_eq!(
        d.iter()
            .map(|d| (d.allowed(), d.remaining))
            .collect::<Vec<_>>(),
        vec![(true, 3), (true, 1), (false, 1)]
    );
    assert_eq!(d[2].retry_after_us(), SEC, "one more token is needed");
}

#[test]
fn clock_going_backwards_mints_no_tokens() {
    let l = token_bucket(1, 1.0);
    // 1000 s, then 990 s, then 1000 s again: the second and third are not new budget.
    assert_eq!(
        pattern(&l, &[T0 + 1000 * SEC, T0 + 990 * SEC, T0 + 1000 * SEC]),
        vec![true, false, false]
    );
}

#[test]
fn leaky_bucket_delays_admitted_requests_to_the_leak_rate() {
    let l = leaky_bucket(3, 10.0);
    let mut s = State::new(l.algorithm().kind());
    let d: Vec<_> = (0..4).map(|_| request(&mut s, &l, T0)).collect();
    assert_eq!(
        d.iter()
            .map(|d| (d.allowed(), d.delay_us(), d.remaining))
            .collect::<Vec<_>>(),
        vec![
            (true, 0, 2),
            (true, 100_000, 1),
            (true, 200_000, 0),
            (false, 0, 0)
        ]
    );
    assert_eq!(
        d[3].retry_after_us(),
        100_000,
        "the queue has room again after one leak"
    );
    // 150 ms later the first two have left: one queued (leaving at 200 ms), room for two more.
    let later = request(&mut s, &l, T0 + 150_000);
    assert!(later.allowed());
    assert_eq!(
        later.delay_us(),
        150_000,
        "queued behind the request leaving at 200 ms"
    );
}

#[test]
fn fixed_window_counts_per_aligned_window() {
    let w = 60 * SEC;
    let start = T0 - T0 % w;
    let l = fixed_window(2, w);
    let mut s = State::new(l.algorithm().kind());
    let d: Vec<_> = [start + 10, start + 20, start + 30]
        .iter()
        .map(|&t| request(&mut s, &l, t))
        .collect();
    assert_eq!(
        d.iter()
            .map(|d| (d.allowed(), d.remaining))
            .collect::<Vec<_>>(),
        vec![(true, 1), (true, 0), (false, 0)]
    );
    assert_eq!(
        d[2].retry_after_us(),
        w - 30,
        "retry at the end of the window"
    );
    assert_eq!(d[2].reset_after_us, w - 30);
    assert!(
        request(&mut s, &l, start + w).allowed(),
        "a new window starts afresh"
    );
}

#[test]
fn fixed_window_allows_twice_the_limit_across_a_boundary() {
    // The documented weakness: `limit` at the end of one window and `limit` at the start of the
    // next. Asserted so that the test fails if someone "fixes" it silently.
    let w = 10 * SEC;
    let start = T0 - T0 % w;
    let l = fixed_window(3, w);
    let times: Vec<u64> = (0..3)
        .map(|i| start + w - 100 + i)
        .chain((0..3).map(|i| start + w + i))
        .collect();
    assert_eq!(pattern(&l, &times), vec![true; 6]);
}

#[test]
fn sliding_log_is_exact_over_any_span() {
    let w = 10 * SEC;
    let l = sliding_log(3, w);
    let mut s = State::new(l.algorithm().kind());
    for t in [T0, T0 + SEC, T0 + 2 * SEC] {
        assert!(request(&mut s, &l, t).allowed());
    }
    let denied = request(&mut s, &l, T0 + 9 * SEC);
    assert!(!denied.allowed());
    assert_eq!(
        denied.retry_after_us(),
        SEC,
        "the oldest entry leaves at T0 + 10 s"
    );
    assert_eq!(
        denied.reset_after_us,
        3 * SEC,
        "the newest entry leaves at T0 + 12 s"
    );
    assert!(!request(&mut s, &l, T0 + w - 1).allowed());
    assert!(request(&mut s, &l, T0 + w).allowed());
    // No boundary burst: the pattern that doubles a fixed window is held to the limit.
    let start = T0 - T0 % w;
    let times: Vec<u64> = (0..3)
        .map(|i| start + w - 100 + i)
        .chain((0..3).map(|i| start + w + i))
        .collect();
    assert_eq!(
        pattern(&l, &times),
        vec![true, true, true, false, false, false]
    );
}

#[test]
fn sliding_log_keeps_no_denied_requests() {
    let l = sliding_log(2, SEC);
    let mut s = State::new(l.algorithm().kind());
    for _ in 0..100 {
        request(&mut s, &l, T0);
    }
    let State::Log { entries } = &s else {
        panic!("log state")
    };
    assert_eq!(entries.len(), 2, "memory is bounded by the limit");
}

#[test]
fn sliding_counter_weights_the_previous_window() {
    let w = 10 * SEC;
    let start = T0 - T0 % w;
    let l = sliding_counter(10, w);
    let mut s = State::new(l.algorithm().kind());
    for i in 0..10 {
        assert!(request(&mut s, &l, start + i).allowed());
    }
    // 40% into the next window the previous 10 weigh 6: four more pass, the fifth does not.
    let at = start + w + 4 * SEC;
    let d: Vec<_> = (0..5).map(|_| request(&mut s, &l, at)).collect();
    assert_eq!(
        d.iter().map(|d| d.allowed()).collect::<Vec<_>>(),
        vec![true, true, true, true, false]
    );
    assert_eq!(d[3].remaining, 0);
    // Estimate 6 + 4 = 10: room for one more once the old weight drops below 5, i.e. at 50%.
    assert_eq!(d[4].retry_after_us(), SEC);
    assert!(!request(&mut s, &l, at + SEC - 1).allowed());
    assert!(request(&mut s, &l, at + SEC).allowed());
}

#[test]
fn sliding_counter_forgets_windows_older_than_the_previous_one() {
    let w = SEC;
    let start = T0 - T0 % w;
    let l = sliding_counter(2, w);
    assert_eq!(
        pattern(&l, &[start, start + 1, start + 2 * w, start + 2 * w + 1]),
        vec![true, true, true, true]
    );
}

#[test]
fn state_expires_when_the_budget_is_full_again() {
    let l = token_bucket(5, 1.0);
    let mut s = State::new(l.algorithm().kind());
    request(&mut s, &l, T0);
    assert_eq!(s.expires_at(&l), T0 + SEC);
    let w = 60 * SEC;
    let l = sliding_log(5, w);
    let mut s = State::new(l.algorithm().kind());
    request(&mut s, &l, T0);
    assert_eq!(s.expires_at(&l), T0 + w);
}

// ---- properties ----------------------------------------------------------------------------

/// Arrival times over a few seconds.
fn arrivals() -> impl Strategy<Value = Vec<u64>> {
    strategies::arrivals(400_000, 200)
}

/// The five rate algorithms (concurrency's `Retry-After` is a fixed second, not the earliest
/// instant a retry passes, so it has tests of its own below).
fn any_limit() -> impl Strategy<Value = Limit> {
    const RATES: &[AlgorithmKind] = &[
        AlgorithmKind::TokenBucket,
        AlgorithmKind::LeakyBucket,
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindowLog,
        AlgorithmKind::SlidingWindowCounter,
    ];
    strategies::any_limit(RATES, 20, &[SEC / 10, SEC, 3 * SEC, 1_234_567])
}

proptest! {
    #[test]
    fn token_bucket_never_admits_more_than_capacity_plus_refill(
        capacity in 1u32..30, rate in prop_oneof![Just(1.0), Just(3.0), Just(10.0), Just(0.7)], times in arrivals()
    ) {
        let l = token_bucket(capacity, rate);
        let interval = Algorithm::interval_for_rate(rate).unwrap();
        let allowed: Vec<u64> = times.iter().zip(pattern(&l, &times)).filter(|(_, a)| *a).map(|(t, _)| *t).collect();
        for (i, &from) in allowed.iter().enumerate() {
            for (j, &to) in allowed.iter().enumerate().skip(i) {
                // Requests i..=j were admitted within [from, to].
                let admitted = (j - i + 1) as u64;
                prop_assert!(admitted <= u64::from(capacity) + (to - from) / interval,
                    "{admitted} admitted in {} µs with capacity {capacity}", to - from);
            }
        }
    }

    #[test]
    fn leaky_bucket_releases_at_most_the_leak_rate(
        capacity in 1u32..30, rate in prop_oneof![Just(1.0), Just(3.0), Just(10.0)], times in arrivals()
    ) {
        let l = leaky_bucket(capacity, rate);
        let interval = Algorithm::interval_for_rate(rate).unwrap();
        let mut s = State::new(l.algorithm().kind());
        let mut releases = Vec::new();
        for &t in &times {
            let d = request(&mut s, &l, t);
            if d.allowed() {
                prop_assert!(d.delay_us() < u64::from(capacity) * interval, "waits at most a full queue");
                releases.push(t + d.delay_us());
            }
        }
        for pair in releases.windows(2) {
            prop_assert!(pair[1] >= pair[0] + interval, "released {} µs apart", pair[1] - pair[0]);
        }
    }

    #[test]
    fn fixed_window_never_exceeds_the_limit_inside_one_window(l in 1u32..20, times in arrivals()) {
        let w = SEC;
        let lim = fixed_window(l, w);
        let mut per_window = std::collections::HashMap::new();
        for (t, allowed) in times.iter().zip(pattern(&lim, &times)) {
            if allowed {
                *per_window.entry(t / w).or_insert(0u32) += 1;
            }
        }
        prop_assert!(per_window.values().all(|&n| n <= l));
    }

    #[test]
    fn sliding_log_never_exceeds_the_limit_in_any_window_long_span(l in 1u32..20, times in arrivals()) {
        let w = SEC;
        let lim = sliding_log(l, w);
        let allowed: Vec<u64> = times.iter().zip(pattern(&lim, &times)).filter(|(_, a)| *a).map(|(t, _)| *t).collect();
        for &end in &allowed {
            let in_span = allowed.iter().filter(|&&t| t + w > end && t <= end).count();
            prop_assert!(in_span <= l as usize, "{in_span} in the window ending at {end}");
        }
    }

    #[test]
    fn sliding_counter_never_exceeds_the_limit_inside_one_aligned_window(l in 1u32..20, times in arrivals()) {
        let w = SEC;
        let lim = sliding_counter(l, w);
        let mut per_window = std::collections::HashMap::new();
        for (t, allowed) in times.iter().zip(pattern(&lim, &times)) {
            if allowed {
                *per_window.entry(t / w).or_insert(0u32) += 1;
            }
        }
        prop_assert!(per_window.values().all(|&n| n <= l));
    }

    #[test]
    fn remaining_is_how_many_more_pass_right_now(lim in any_limit(), times in arrivals()) {
        let mut s = State::new(lim.algorithm().kind());
        for &t in &times {
            let d = request(&mut s, &lim, t);
            prop_assert!(d.remaining <= d.limit);
            if d.allowed() {
                // Exactly `remaining / cost` more requests pass at this instant.
                let mut probe = s.clone();
                let expected = d.remaining / u64::from(lim.cost());
                for k in 0..expected {
                    prop_assert!(request(&mut probe, &lim, t).allowed(), "request {k} of {expected} denied");
                }
                prop_assert!(!request(&mut probe, &lim, t).allowed(), "more than {expected} passed");
            }
        }
    }

    #[test]
    fn retry_after_is_the_earliest_moment_a_retry_passes(lim in any_limit(), times in arrivals()) {
        let mut s = State::new(lim.algorithm().kind());
        for &t in &times {
            let d = request(&mut s, &lim, t);
            if !d.allowed() {
                prop_assert!(d.retry_after_us() > 0);
                let mut at_retry = s.clone();
                prop_assert!(at_retry.check(&lim, t + d.retry_after_us()).allowed(), "denied at the retry instant");
                let mut just_before = s.clone();
                prop_assert!(!just_before.check(&lim, t + d.retry_after_us() - 1).allowed(), "retry_after is not the earliest");
            }
        }
    }
}

fn concurrency(l: u32, lease_us: u64) -> Limit {
    Limit::of(Algorithm::from_parts(AlgorithmKind::Concurrency, u64::from(l), lease_us).unwrap())
}

#[test]
fn concurrency_admits_up_to_the_limit_in_flight_and_frees_on_release() {
    let l = concurrency(2, 60 * SEC);
    let mut s = State::new(AlgorithmKind::Concurrency);
    let take = |s: &mut State, lease: u64| {
        let d = s.check(&l, T0);
        if d.allowed() {
            s.commit(&l, T0, lease);
        }
        d
    };
    assert_eq!(take(&mut s, 1).remaining, 1);
    assert_eq!(take(&mut s, 2).remaining, 0);
    let denied = take(&mut s, 3);
    assert!(!denied.allowed());
    assert_eq!(denied.retry_after_us(), SEC, "Retry-After: 1");
    s.release(1);
    assert!(
        take(&mut s, 4).allowed(),
        "a finished request's slot is free"
    );
    s.release(99); // an unknown lease releases nothing
    assert!(!take(&mut s, 5).allowed());
}

#[test]
fn concurrency_leases_end_on_their_own() {
    let l = concurrency(1, 10 * SEC);
    let mut s = State::new(AlgorithmKind::Concurrency);
    assert!(request(&mut s, &l, T0).allowed());
    assert!(
        !request(&mut s, &l, T0 + 10 * SEC - 1).allowed(),
        "held until the lease ends"
    );
    assert!(
        request(&mut s, &l, T0 + 10 * SEC).allowed(),
        "a lost release is not forever"
    );
    assert_eq!(s.expires_at(&l), T0 + 20 * SEC);
}

#[test]
fn a_settled_charge_puts_a_bucket_in_debt_until_it_refills_past_it() {
    use crate::limiter::Settlement;
    // 100 units, 10 a second. A request reserves 50, then costs 150 (the most a figure is
    // charged as: `actual.max` is at most the capacity): 100 more are charged, 50 beyond what
    // the bucket held.
    let limit = token_bucket(100, 10.0).settled();
    let mut state = State::Gcra { tat: 0 };
    assert!(request(&mut state, &limit.costing(50), T0).allowed());
    state.settle(&limit, T0 + SEC, &Settlement::of(50, 150, T0));
    // At T0 + 1 s: 150 spent, 10 refilled: 40 in debt; one unit passes once 41 have come
    // back, 4.1 s later.
    let one = limit.costing(1);
    let denied = request(&mut state, &one, T0 + SEC);
    assert!(!denied.allowed());
    assert_eq!(denied.retry_after_us(), 4_100_000);
    assert!(!request(&mut state, &one, T0 + 5 * SEC).allowed());
    assert!(request(&mut state, &one, T0 + 5 * SEC + 100_000).allowed());
}

#[test]
fn a_refund_comes_back_only_while_it_still_counts() {
    use crate::limiter::Settlement;
    // A window of 100 an hour: a reserve of 80 that cost 30 gives 50 back in its window...
    let limit = fixed_window(100, 3600 * SEC).settled();
    let mut state = State::Window { start: 0, count: 0 };
    assert!(request(&mut state, &limit.costing(80), T0).allowed());
    assert!(!request(&mut state, &limit.costing(30), T0).allowed());
    state.settle(&limit, T0 + SEC, &Settlement::of(80, 30, T0));
    assert!(request(&mut state, &limit.costing(70), T0 + SEC).allowed());
    // ...but not in the next window: the units it held went with their window.
    let next = T0 - T0 % (3600 * SEC) + 3600 * SEC;
    assert!(request(&mut state, &limit.costing(100), next).allowed());
    state.settle(&limit, next + SEC, &Settlement::of(70, 0, T0 + SEC));
    assert!(!request(&mut state, &limit.costing(1), next + SEC).allowed());
    // A bucket refilled past a refund gains nothing from it: never more than full.
    let bucket = token_bucket(10, 1.0).settled();
    let mut state = State::Gcra { tat: 0 };
    assert!(request(&mut state, &bucket.costing(10), T0).allowed());
    state.settle(&bucket, T0 + 20 * SEC, &Settlement::of(10, 0, T0));
    assert!(request(&mut state, &bucket.costing(10), T0 + 20 * SEC).allowed());
    assert!(!request(&mut state, &bucket.costing(1), T0 + 20 * SEC).allowed());
}

#[test]
fn a_huge_settled_figure_saturates_at_one_limit_of_debt_and_never_wraps() {
    use crate::limiter::Settlement;
    // 1000 units, 1 a second; a reserve of 200 admitted (800 left), then a figure no counter
    // holds. Before: u64::MAX wrapped the tat (the bucket read full: "Remaining: 999").
    for huge in [u64::MAX, (1 << 55) - 300, 10_000_000_000] {
        let limit = token_bucket(1000, 1.0).settled();
        let mut state = State::Gcra { tat: 0 };
        assert!(request(&mut state, &limit.costing(200), T0).allowed());
        state.settle(&limit, T0, &Settlement::of(200, huge, T0));
        // Charged one limit more (the most a settlement takes): 200 + 1000 spent, 200 in debt.
        let denied = request(&mut state, &limit.costing(1), T0);
        assert!(!denied.allowed(), "{huge}");
        assert_eq!(denied.remaining, 0);
        assert_eq!(denied.retry_after_us(), 201 * SEC, "{huge}");
        // Settled again and again: the debt stays at one limit.
        for _ in 0..3 {
            state.settle(&limit, T0, &Settlement::of(1, huge, T0));
        }
        assert_eq!(
            request(&mut state, &limit.costing(1), T0).retry_after_us(),
            1001 * SEC
        );

        for window in [
            fixed_window(1000, 60 * SEC),
            sliding_counter(1000, 60 * SEC),
        ] {
            let limit = window.settled();
            let mut state = State::new(limit.algorithm().kind());
            assert!(request(&mut state, &limit.costing(200), T0).allowed());
            for _ in 0..3 {
                state.settle(&limit, T0, &Settlement::of(200, huge, T0));
            }
            let denied = request(&mut state, &limit.costing(1), T0);
            assert!(!denied.allowed());
            assert_eq!(denied.remaining, 0);
            assert_eq!(state.expires_at(&limit), expires(&limit, T0), "{limit:?}");
        }
    }
}

/// Where a window's state expires when it was written at `now`.
fn expires(limit: &crate::limiter::Limit, now: u64) -> u64 {
    let span = limit.algorithm().span_us();
    let start = now - now % span;
    match limit.algorithm().kind() {
        AlgorithmKind::SlidingWindowCounter => start + 2 * span,
        _ => start + span,
    }
}

#[test]
fn a_renewed_lease_outlives_its_first_end_and_an_ended_one_stays_ended() {
    let l = concurrency(2, 10 * SEC);
    let mut s = State::new(AlgorithmKind::Concurrency);
    for lease in [1, 2] {
        assert!(s.check(&l, T0).allowed());
        s.commit(&l, T0, lease);
    }
    // Lease 1 renewed at 8 s: it ends at 18 s; lease 2 ends at 10 s as granted.
    s.renew(1, T0 + 18 * SEC);
    let d = s.check(&l, T0 + 12 * SEC);
    assert_eq!(d.remaining, 0, "lease 1 counts, lease 2 has ended");
    assert!(s.check(&l, T0 + 12 * SEC).allowed());
    assert!(s.check(&l, T0 + 18 * SEC).allowed());
    // A lease that ended is not brought back by a late renewal.
    let mut s = State::new(AlgorithmKind::Concurrency);
    assert!(s.check(&l, T0).allowed());
    s.commit(&l, T0, 7);
    let _ = s.check(&l, T0 + 11 * SEC); // the ended lease is dropped as time passes
    s.renew(7, T0 + 21 * SEC);
    assert_eq!(s.check(&l, T0 + 11 * SEC).remaining, 1);
}
