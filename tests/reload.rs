//! What SIGHUP changes, against `config::reload`'s one list: each reloadable setting is changed
//! in the file, the process is sent SIGHUP, and the new value is seen to take effect; each
//! restart-only setting is changed and its path is found in the warning (and its running value
//! kept).

mod common;

use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{Floodgate, RedisServer, SLOW, Upstream, client, metric, raw_exchange};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Rewrites floodgate's config with `config` (its `listen: 127.0.0.1:0` kept, as it started),
/// sends SIGHUP and waits until the reload is counted.
async fn reload(fg: &Floodgate, config: &Config) {
    let before = metric(fg, r#"floodgate_config_reloads_total{result="success"}"#).await;
    std::fs::write(
        fg.config_path(),
        format!("listen: 127.0.0.1:0\n{}", config.yaml()),
    )
    .expect("rewrite the config");
    fg.signal("HUP");
    // The reload runs on its own task: a few ms; 10 s for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(fg, r#"floodgate_config_reloads_total{result="success"}"#).await == before {
        assert!(
            Instant::now() < deadline,
            "the reload was not applied: {}",
            fg.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn status_of(url: &str) -> StatusCode {
    client().get(url).send().await.expect("a response").status()
}

#[tokio::test]
async fn timeouts_and_body_size_take_effect_on_sighup() {
    let upstream = Upstream::start().await;
    let config = |response: &str, body: &str| {
        Config::new()
            .timeout("upstream_response", response)
            .with("max_body_size", body)
            .route(Route::new("all", "/", &upstream.url()))
    };
    let fg = Floodgate::start(&config("30s", "1m").yaml());
    // The upstream answers /slow after SLOW (1.5 s); a body of 2 kB is within 1m.
    assert_eq!(status_of(&fg.url("/slow")).await, StatusCode::OK);
    let post = |fg: &Floodgate| {
        let url = fg.url("/upload");
        async move {
            client()
                .post(url)
                .body(vec![b'a'; 2048])
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(post(&fg).await, StatusCode::OK);

    reload(&fg, &config("300ms", "1k")).await;
    assert!(SLOW > Duration::from_millis(300));
    assert_eq!(
        status_of(&fg.url("/slow")).await,
        StatusCode::GATEWAY_TIMEOUT
    );
    assert_eq!(post(&fg).await, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn header_read_timeout_applies_to_new_connections_after_sighup() {
    let upstream = Upstream::start().await;
    let config = |header_read: &str| {
        Config::new()
            .timeout("header_read", header_read)
            .route(Route::new("all", "/", &upstream.url()))
    };
    let fg = Floodgate::start(&config("20s").yaml());
    reload(&fg, &config("300ms")).await;
    // A connection that sends half a request head is closed once header_read passes: well
    // within 10 s now (it would take 20 s with the old value).
    let mut stream = tokio::net::TcpStream::connect(fg.addr()).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "the connection outlived the reloaded header_read"
    );
}

#[tokio::test]
async fn upstream_ca_is_read_again_on_sighup() {
    // An HTTPS upstream with a self-signed certificate: untrusted (502) until upstream_ca names
    // it, then trusted on the next request.
    let cert = common::SelfSigned::new();
    let upstream = Upstream::start_tls(cert.server_config()).await;
    let url = format!("https://localhost:{}", upstream.addr().port());
    let route = Route::new("all", "/", &url);
    let fg = Floodgate::start(&Config::new().route(route.clone()).yaml());
    assert_eq!(status_of(&fg.url("/x")).await, StatusCode::BAD_GATEWAY);
    let ca = common::yaml_path(&cert.cert_file);
    reload(&fg, &Config::new().with("upstream_ca", &ca).route(route)).await;
    assert_eq!(status_of(&fg.url("/x")).await, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stores_timeout_batching_and_leases_take_effect_on_sighup() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let config = |timeout: &str, batch: &str, leases: &str| {
        Config::new()
            .redis(&redis.url(), "deny")
            .storage("timeout", timeout)
            .storage("batch", batch)
            .storage("leases", leases)
            .route(
                Route::new("all", "/", &upstream.url())
                    .limit(Limit::token_bucket(1_000_000, 0.001).per("route")),
            )
    };
    let fg = Floodgate::start(&config("3s", "false", "disabled").yaml());
    let url = fg.url("/x");
    let pause = |ms: &str| {
        let _: String = redis.cmd(&["CLIENT", "PAUSE", ms, "ALL"]);
    };
    let burst = |n: usize| {
        let url = url.clone();
        async move {
            let mut all = tokio::task::JoinSet::new();
            for _ in 0..n {
                let url = url.clone();
                all.spawn(async move { status_of(&url).await });
            }
            for status in all.join_all().await {
                assert_eq!(status, StatusCode::OK);
            }
        }
    };
    let granted = r#"floodgate_lease_units_total{outcome="granted"}"#;

    // Before: a 3 s timeout waits out a store paused for 600 ms; without batching or leases,
    // every decision is one script call, exactly.
    pause("600");
    assert_eq!(
        status_of(&url).await,
        StatusCode::OK,
        "waited out the pause"
    );
    let before = redis.decisions();
    burst(100).await;
    assert_eq!(redis.decisions() - before, 100, "unbatched: one call each");
    assert_eq!(metric(&fg, granted).await, 0, "leases disabled");

    // Reloaded: a 400 ms timeout (on_error deny; still shorter than the pause), batching on,
    // leases on.
    reload(&fg, &config("400ms", "true", "auto")).await;
    pause("600");
    assert_eq!(
        status_of(&url).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "the paused store is given up on after 400 ms"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Bursts of 100 decisions a lease ttl (250 ms) apart take fewer calls: batched, and leased
    // (a budget is leased once this instance spent it at least twice in the ttl before). A burst
    // on a loaded 2-core machine can itself take longer than a ttl, and then the next one finds
    // no demand in the period just before: so bursts go on, three at least and ten at most,
    // until a lease has been granted.
    let before = redis.decisions();
    let mut bursts = 0;
    while bursts < 3 || (bursts < 10 && metric(&fg, granted).await == 0) {
        burst(100).await;
        bursts += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let calls = redis.decisions() - before;
    assert!(
        calls < 100 * bursts,
        "batched or leased: {calls} calls for {} decisions",
        100 * bursts
    );
    assert!(metric(&fg, granted).await > 0, "leases on after the reload");
}

#[tokio::test]
async fn restart_only_settings_are_named_in_the_warning_and_keep_their_values() {
    let upstream = Upstream::start().await;
    let route = Route::new("all", "/", &upstream.url());
    let fg = Floodgate::start(&Config::new().route(route.clone()).yaml());
    reload(
        &fg,
        &Config::new()
            .with("max_connections", "7")
            .with("resolver", "{refresh: 2s}")
            .storage("key_prefix", "\"other:\"")
            .storage("max_keys", "1000")
            .route(route),
    )
    .await;
    // The warning is written before the reload is counted; stderr is read by a thread of the
    // harness, so give it a moment (10 s for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(10);
    let warning = loop {
        let log = fg.stderr();
        if let Some(line) = log
            .lines()
            .find(|l| l.contains("take effect on restart only"))
        {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "no restart warning: {log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for path in [
        "max_connections",
        "resolver",
        "storage.key_prefix",
        "storage.max_keys",
    ] {
        assert!(warning.contains(path), "{path} not named: {warning}");
    }
    assert!(
        !warning.contains("listen"),
        "listen did not change: {warning}"
    );
    // Still serving on the same address.
    let reply = raw_exchange(
        fg.addr(),
        b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exemptions_take_effect_on_sighup() {
    let upstream = Upstream::start().await;
    let config = |exempt: Option<&str>| {
        let config = Config::new()
            .route(Route::new("all", "/", &upstream.url()).limit(Limit::fixed_window(1, "1h")));
        match exempt {
            Some(exempt) => config.with("exempt", exempt),
            None => config,
        }
    };
    let fg = Floodgate::start(&config(None).yaml());
    let url = fg.url("/x");
    assert_eq!(status_of(&url).await, StatusCode::OK);
    assert_eq!(status_of(&url).await, StatusCode::TOO_MANY_REQUESTS);
    // This test's client is 127.0.0.1: exempt after the reload, limited again after the next.
    reload(&fg, &config(Some("{networks: [127.0.0.1]}"))).await;
    assert_eq!(status_of(&url).await, StatusCode::OK);
    reload(&fg, &config(None)).await;
    assert_eq!(status_of(&url).await, StatusCode::TOO_MANY_REQUESTS);
}

/// Sends `GET path` with `Host: host` (and `extra` header lines) on a fresh connection; returns
/// the whole response.
async fn get_as_host(fg: &Floodgate, host: &str, path: &str, extra: &str) -> String {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    raw_exchange(fg.addr(), request.as_bytes()).await
}

#[tokio::test]
async fn routes_by_host_rewrites_and_header_edits_take_effect_on_sighup() {
    let (apps, billing) = (Upstream::start().await, Upstream::start().await);
    let before = Config::new().route(Route::new("all", "/", &apps.url()));
    let fg = Floodgate::start(&before.yaml());
    let reply = get_as_host(&fg, "billing.example.com", "/api/billing/invoices", "").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(apps.seen()[0].path, "/api/billing/invoices");
    // The billing API gets its own route by host, mounted at its root, told the route's name
    // (a client's value of that header replaced) and rid of a header; its answers carry one.
    let after = Config::new()
        .route(
            Route::new("billing", "/api/billing/", &billing.url())
                .with("hosts", "[billing.example.com]")
                .with("rewrite_prefix", "/")
                .with(
                    "request_headers",
                    "{set: {X-Route: \"{route}\"}, remove: [X-Debug]}",
                )
                .with("response_headers", "{set: {X-Served-By: floodgate}}"),
        )
        .route(Route::new("all", "/", &apps.url()));
    reload(&fg, &after).await;
    let reply = get_as_host(
        &fg,
        "billing.example.com",
        "/api/billing/invoices",
        "X-Route: forged\r\nX-Debug: 1\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        reply
            .to_ascii_lowercase()
            .contains("x-served-by: floodgate"),
        "{reply}"
    );
    let seen = billing.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/invoices");
    assert_eq!(seen[0].header("x-route"), Some("billing"));
    assert_eq!(seen[0].header("x-debug"), None);
    // Another host still reaches the first upstream, unchanged.
    let reply = get_as_host(&fg, "rides.example.com", "/api/billing/invoices", "").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(apps.count(), 2);
    assert_eq!(billing.count(), 1);
}

/// `underscores_in_headers` (reloadable): dropped by default, kept after SIGHUP turns it on.
/// A recording upstream sees the request head as sent.
#[tokio::test]
async fn underscores_in_headers_takes_effect_on_sighup() {
    let upstream = common::RecordingUpstream::start().await;
    let config = |keep: bool| {
        Config::new()
            .with("underscores_in_headers", &keep.to_string())
            .route(Route::new("all", "/", &upstream.url()))
    };
    let fg = Floodgate::start(&config(false).yaml());
    let request = |fg: &Floodgate| {
        format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nX_Consumer: forged\r\nConnection: close\r\n\r\n",
            fg.addr()
        )
    };
    raw_exchange(fg.addr(), request(&fg).as_bytes()).await;
    assert!(upstream.values(0, "x_consumer").is_empty());
    reload(&fg, &config(true)).await;
    raw_exchange(fg.addr(), request(&fg).as_bytes()).await;
    assert_eq!(upstream.values(1, "x_consumer"), ["forged"]);
}

/// `cache.memory` (reloadable): a smaller bound after SIGHUP evicts at once, the entries that
/// fit are kept and still served.
#[tokio::test]
async fn a_reload_to_a_smaller_cache_memory_evicts_at_once_and_keeps_the_rest() {
    let upstream = Upstream::start().await;
    let config = |memory: &str| {
        Config::new()
            .with("cache", &format!("{{memory: {memory}, max_entry: 1KiB}}"))
            .route(Route::new("c", "/", &upstream.url()).with("cache", "{ttl: 5m}"))
    };
    let fg = Floodgate::start(&config("1MiB").yaml());
    for n in 0..20 {
        let reply = client()
            .get(fg.url(&format!("/e{n}")))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), StatusCode::OK);
    }
    assert_eq!(metric(&fg, "floodgate_cache_entries").await, 20);
    // Each entry is about 400 bytes (its body, headers, key and overhead): 4 KiB keeps some.
    reload(&fg, &config("4KiB")).await;
    let entries = metric(&fg, "floodgate_cache_entries").await;
    assert!((1..20).contains(&entries), "{entries}");
    assert!(metric(&fg, "floodgate_cache_bytes").await <= 4096);
    let hit = client().get(fg.url("/e19")).send().await.unwrap();
    assert!(
        hit.headers()["cache-status"]
            .to_str()
            .unwrap()
            .contains("hit")
    );
    assert_eq!(upstream.count(), 20);
}
