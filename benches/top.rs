//! The heavy-hitter table's cost on the request path (`src/top.rs`): a request from an identity
//! already counted, and a request from a new identity each time (a million distinct keys, so
//! every one replaces the smallest of the 128 counters).

use criterion::{Criterion, criterion_group, criterion_main};
use floodgate::identity::Identity;
use floodgate::top::TopTable;

fn top(c: &mut Criterion) {
    let mut group = c.benchmark_group("top");
    let table = TopTable::default();
    table.record(
        &Identity::ApiKey(b"a-hot-api-key-of-32-characters!!"),
        true,
        1,
    );
    group.bench_function("record, identity already counted", |b| {
        b.iter(|| {
            table.record(
                &Identity::ApiKey(b"a-hot-api-key-of-32-characters!!"),
                true,
                1,
            )
        })
    });
    let table = TopTable::default();
    let mut i: u64 = 0;
    let mut key = *b"key-0000000000000000000000000000";
    group.bench_function("record, a new identity each time (1M distinct)", |b| {
        b.iter(|| {
            i = (i + 1) % 1_000_000;
            key[4..12].copy_from_slice(&i.to_be_bytes());
            table.record(&Identity::ApiKey(&key), i.is_multiple_of(2), 1)
        })
    });
    group.finish();
}

criterion_group!(benches, top);
criterion_main!(benches);
