//! The cost of working out whose budget a request spends: [`IdentityConfig::identify`] on a
//! request with a few ordinary headers plus, in turn, an API key, a user id from a trusted proxy,
//! and an `X-Forwarded-For` chain whose walk passes 5 trusted proxies before reaching the client.
//!
//! Run: `cargo bench --bench identity` (short: `-- --warm-up-time 1 --measurement-time 2`).

use std::hint::black_box;
use std::net::IpAddr;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use floodgate::identity::{Consumer, Consumers, Identity, IdentityConfig, UnknownKey};
use http::{HeaderMap, HeaderName, HeaderValue};

fn config() -> IdentityConfig {
    IdentityConfig {
        api_key_header: HeaderName::from_static("x-api-key"),
        user_id_header: HeaderName::from_static("x-user-id"),
        trusted_proxies: ["192.168.0.0/16", "172.16.0.0/12", "10.0.0.0/8"]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect(),
        ipv6_prefix: 64,
        strip_untrusted_user_id: true,
        jwt: None,
        client_ip_header: None,
        forwarded: false,
        client_cert: false,
    }
}

/// A request's headers as a browser or SDK sends them, plus `extra`.
fn headers(extra: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("host", HeaderValue::from_static("api.example.com"));
    h.insert("user-agent", HeaderValue::from_static("bench-client/1.0"));
    h.insert("accept", HeaderValue::from_static("application/json"));
    h.insert("accept-encoding", HeaderValue::from_static("gzip, br"));
    h.insert("content-length", HeaderValue::from_static("0"));
    for (name, value) in extra {
        h.append(*name, HeaderValue::from_str(value).unwrap());
    }
    h
}

fn identify(c: &mut Criterion) {
    let config = config();
    let untrusted: IpAddr = "198.51.100.20".parse().unwrap();
    let trusted: IpAddr = "10.0.0.1".parse().unwrap();
    let client: IpAddr = "203.0.113.7".parse().unwrap();
    let xff = "203.0.113.7, 10.0.0.6, 172.16.5.5, 10.0.0.4, 192.168.1.3, 10.0.0.2";
    let cases: [(&str, HeaderMap, IpAddr, Identity<'static>); 4] = [
        (
            "api_key",
            headers(&[("x-api-key", "sk_live_0123456789abcdef0123456789abcdef")]),
            untrusted,
            Identity::ApiKey(b"sk_live_0123456789abcdef0123456789abcdef"),
        ),
        (
            "user_id_from_trusted_proxy",
            headers(&[("x-user-id", "user-42")]),
            trusted,
            Identity::UserId(b"user-42"),
        ),
        (
            "xff_walk_past_5_trusted",
            headers(&[("x-forwarded-for", xff)]),
            trusted,
            Identity::Ip(client),
        ),
        ("peer_ip", headers(&[]), untrusted, Identity::Ip(untrusted)),
    ];
    let mut group = c.benchmark_group("identify");
    group.throughput(Throughput::Elements(1));
    for (name, headers, peer, expected) in &cases {
        assert_eq!(
            config.identify(headers, *peer).unwrap(),
            *expected,
            "{name}"
        );
        group.bench_function(*name, |b| {
            b.iter(|| {
                black_box(
                    config
                        .identify(black_box(headers), black_box(*peer))
                        .is_ok(),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, identify, consumers);
criterion_main!(benches);

/// Finding a key's consumer among 100 000: one SHA-256 of the key and one hash-map lookup.
fn consumers(c: &mut Criterion) {
    use sha2::Digest;
    let mut consumers = Consumers::new(UnknownKey::Reject);
    for n in 0..100_000 {
        let index = consumers.add(Consumer {
            name: format!("consumer-{n}"),
            tier: "default".to_string(),
        });
        let digest: [u8; 32] = sha2::Sha256::digest(format!("key-{n:032}")).into();
        consumers.add_key(digest, index).unwrap();
    }
    let known = format!("key-{:032}", 4_242);
    let unknown = format!("nokey-{:032}", 4_242);
    let mut group = c.benchmark_group("consumers");
    group.throughput(Throughput::Elements(1));
    group.bench_function("find_among_100000/known", |b| {
        b.iter(|| black_box(consumers.find(black_box(known.as_bytes()))))
    });
    group.bench_function("find_among_100000/unknown", |b| {
        b.iter(|| black_box(consumers.find(black_box(unknown.as_bytes()))))
    });
    group.finish();
}
