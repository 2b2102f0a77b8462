//! The cost of finding a request's route: [`RouteTable::position`] over 20 routes in file order, for
//! a request matching the first route, one in the middle, the last (a `/` catch-all), and, in a
//! table without a catch-all, none; and [`RouteTable::find`] over 200 routes on 20 hosts (10
//! each, `hosts:` names), for a request of the last host's last route.
//!
//! Run: `cargo bench --bench route` (short: `-- --warm-up-time 1 --measurement-time 2`).

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use floodgate::config::Config;
use floodgate::route::RouteTable;
use http::Method;

/// 19 specific routes (every other one restricted to some methods), then `catch_all` if asked.
fn table(catch_all: bool) -> RouteTable {
    let mut yaml = String::from("listen: 127.0.0.1:0\nroutes:\n");
    for i in 0..19 {
        let _ = writeln!(
            yaml,
            "  - name: svc{i:02}\n    path_prefix: /api/v1/service-{i:02}/\n    upstream: http://127.0.0.1:9000"
        );
        if i % 2 == 0 {
            yaml.push_str("    methods: [GET, POST, PUT]\n");
        }
        yaml.push_str("    limits:\n      - algorithm: token_bucket\n        capacity: 10\n        refill_rate: 5\n");
    }
    if catch_all {
        yaml.push_str(
            "  - name: everything-else\n    path_prefix: /\n    upstream: http://127.0.0.1:9000\n",
        );
    }
    let config = Config::from_yaml(&yaml).expect("valid bench config");
    RouteTable::new(config.routes)
}

fn find(c: &mut Criterion) {
    let with_catch_all = table(true);
    let without = table(false);
    assert_eq!(with_catch_all.routes().len(), 20);
    let cases: [(&str, &RouteTable, Method, &str, Option<&str>); 4] = [
        (
            "first_of_20",
            &with_catch_all,
            Method::GET,
            "/api/v1/service-00/orders/123",
            Some("svc00"),
        ),
        (
            "middle_of_20",
            &with_catch_all,
            Method::POST,
            "/api/v1/service-10/orders/123",
            Some("svc10"),
        ),
        (
            "last_of_20_catch_all",
            &with_catch_all,
            Method::GET,
            "/static/app.js",
            Some("everything-else"),
        ),
        ("no_match_19", &without, Method::GET, "/static/app.js", None),
    ];
    let mut group = c.benchmark_group("route_find");
    group.throughput(Throughput::Elements(1));
    for (name, table, method, path, expected) in &cases {
        assert_eq!(
            table
                .position(method, path)
                .map(|i| &*table.routes()[i].name),
            *expected,
            "{name}"
        );
        group.bench_function(*name, |b| {
            b.iter(|| black_box(table.position(black_box(method), black_box(path)).is_some()))
        });
    }
    group.finish();
}

/// 200 routes: 20 hosts (`api-00.example.com` …), 10 path prefixes on each.
fn by_host() -> RouteTable {
    let mut yaml = String::from("listen: 127.0.0.1:0\nroutes:\n");
    for h in 0..20 {
        for p in 0..10 {
            let _ = writeln!(
                yaml,
                "  - name: h{h:02}p{p}\n    hosts: [api-{h:02}.example.com]\n    path_prefix: /v1/resource-{p}/\n    upstream: http://127.0.0.1:9000"
            );
        }
    }
    RouteTable::new(Config::from_yaml(&yaml).expect("valid bench config").routes)
}

fn find_by_host(c: &mut Criterion) {
    let table = by_host();
    assert_eq!(table.routes().len(), 200);
    let headers = http::HeaderMap::new();
    let request = floodgate::route::Request {
        method: &Method::GET,
        host: Some("api-19.example.com"),
        headers: &headers,
        path: "/v1/resource-9/items/7",
    };
    assert_eq!(
        table.find(&request).map(|i| &*table.routes()[i].name),
        Some("h19p9")
    );
    let mut group = c.benchmark_group("route_find");
    group.throughput(Throughput::Elements(1));
    group.bench_function("last_of_200_on_20_hosts", |b| {
        b.iter(|| black_box(table.find(black_box(&request)).is_some()))
    });
    group.finish();
}

criterion_group!(benches, find, find_by_host);
criterion_main!(benches);
