//! proptest strategies shared by the algorithms' unit tests and the store differential tests,
//! which include this file by path (`tests/differential.rs`). Written against
//! `crate::limiter`, which that test's crate root re-exports from floodgate.

use proptest::prelude::*;

use crate::limiter::{Algorithm, AlgorithmKind, Limit};

/// One second in microseconds.
pub const SEC: u64 = 1_000_000;
/// A start time well inside an aligned window of any size used here.
pub const T0: u64 = 1_700_000_000 * SEC;

/// A limit of one of `kinds`: up to `max_units` units, a rate among some that divide a million
/// and some that do not, a span among `spans_us` (windows and leases), cost 1 or 2 (at most the
/// units).
pub fn any_limit(
    kinds: &'static [AlgorithmKind],
    max_units: u32,
    spans_us: &'static [u64],
) -> impl Strategy<Value = Limit> {
    let rate = prop_oneof![
        Just(0.5),
        Just(1.0),
        Just(3.0),
        Just(10.0),
        Just(7.3),
        Just(100.0),
        Just(250.0)
    ];
    let kind = prop::sample::select(kinds);
    let span = prop::sample::select(spans_us);
    (kind, 1u32..max_units, rate, span, 1u32..3).prop_map(|(kind, n, rate, span, cost)| {
        let span = if kind.is_bucket() {
            Algorithm::interval_for_rate(rate).expect("valid rate")
        } else {
            span
        };
        let algorithm = Algorithm::from_parts(kind, u64::from(n), span).expect("valid limit");
        Limit::new(algorithm, cost.min(n)).expect("valid cost")
    })
}

/// Arrival times from [`T0`]: `1..max_len` requests, one step in five a gap of up to
/// `max_gap_us`, the rest bursts at one instant.
pub fn arrivals(max_gap_us: u64, max_len: usize) -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec((0u64..5, 0u64..max_gap_us), 1..max_len).prop_map(|steps| {
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
