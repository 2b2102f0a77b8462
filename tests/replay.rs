//! `floodgate replay` against the live proxy: floodgate (memory store) serves a sequence of
//! requests and writes its JSON access log; replaying that log with the same config must reach
//! the same decision for every request, in every mode: plain keys, consumers with tiers (unknown
//! keys rejected, or anonymous), and global `shadow: true` beside a route's shadow limit.

mod common;

use common::config::{Config, Limit, Route};
use common::{
    Floodgate, TempFile, Upstream, client, floodgate_command, get, metric, replay_own_log,
};
use http::StatusCode;

#[tokio::test]
async fn replaying_the_proxys_own_log_agrees_with_every_decision_it_made() {
    let upstream = Upstream::start().await;
    // Limits whose decisions do not hang on milliseconds (the log's timestamps are the ends of
    // requests, replay decides at end minus latency): slow refills and hour-long sliding windows.
    let yaml = Config::new()
        .with("log_format", "json")
        .route(Route::new("api", "/api", &upstream.url()).limits([
            Limit::token_bucket(4, 0.01),
            Limit::sliding_window_log(15, "1h").per("route"),
            Limit::token_bucket(9, 0.01).per("ip"),
        ]))
        .route(Route::new("open", "/", &upstream.url()))
        .yaml();
    let fg = Floodgate::start_with_env(&yaml, &[("RUST_LOG", "warn,floodgate::access=info")]);
    let client = client();
    let mut live_allowed = 0;
    let mut live_denied = 0;
    for i in 0..40 {
        let key = format!("key-{}", i % 5);
        let headers: Vec<(&str, &str)> = if i % 7 == 0 {
            vec![] // no key: the IP's own budget
        } else {
            vec![("x-api-key", key.as_str())]
        };
        match get(&client, &fg.url("/api/thing"), &headers).await.status {
            StatusCode::OK => live_allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => live_denied += 1,
            other => panic!("unexpected {other}"),
        }
    }
    get(&client, &fg.url("/other"), &[]).await;
    assert!(
        live_denied > 0 && live_allowed > 0,
        "{live_allowed} / {live_denied}"
    );
    // Give the log lines of the last requests a moment to be written out.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let report = replay_own_log(&fg);
    let api = &report["routes"][0];
    assert_eq!(api["name"], "api");
    assert_eq!(api["requests"], 40);
    assert_eq!(api["allowed"], live_allowed);
    assert_eq!(api["denied"], live_denied);
    assert_eq!(api["agreement"]["compared"], 40);
    assert_eq!(api["agreement"]["agreed"], 40, "{report}");
    assert_eq!(report["routes"][1]["requests"], 1);
    assert_eq!(report["malformed"]["total"], 0);
    // The raw keys never reach the log.
    assert!(!fg.stderr().contains("key-1"));
}

#[tokio::test]
async fn replay_agrees_with_the_live_proxy_in_every_mode() {
    let upstream = Upstream::start().await;
    // Limits that do not hang on milliseconds (slow refills, hour-long windows), per tier.
    let tiered = vec![
        Limit::token_bucket(5, 0.01).tiers(&["pro"]),
        Limit::token_bucket(2, 0.01).tiers(&["default", "anonymous"]),
        Limit::fixed_window(9, "1h").per("ip"),
    ];
    let logged = Config::new().with("log_format", "json");
    let modes = [
        (
            "consumers, unknown keys rejected",
            logged.clone().consumers("reject"),
            tiered.clone(),
        ),
        (
            "consumers, unknown keys anonymous",
            logged.clone().consumers("anonymous"),
            tiered.clone(),
        ),
        (
            "behind a trusted proxy (user ids, forwarded addresses), unknown keys anonymous",
            logged
                .clone()
                .consumers("anonymous")
                .trusted_proxies("[127.0.0.1]"),
            tiered.clone(),
        ),
        (
            "behind a trusted proxy, no consumers (every key its own identity)",
            logged.clone().trusted_proxies("[127.0.0.1]"),
            vec![
                Limit::token_bucket(2, 0.01),
                Limit::fixed_window(6, "1h").per("ip"),
            ],
        ),
        (
            "global shadow mode, and a route's shadow limit",
            logged.with("shadow", "true"),
            vec![
                Limit::token_bucket(3, 0.01),
                Limit::fixed_window(12, "1h").per("route").shadow(),
            ],
        ),
    ];
    for (mode, config, limits) in modes {
        let yaml = config
            .route(Route::new("api", "/", &upstream.url()).limits(limits))
            .yaml();
        let fg = Floodgate::start_with_env(&yaml, &[("RUST_LOG", "warn,floodgate::access=info")]);
        let client = client();
        let mut live = std::collections::HashMap::<u16, u64>::new();
        for i in 0..40 {
            // Keys of both consumers, of none, and no key; a user id on every third request and
            // a forwarded address on every fourth (believed only from a trusted proxy).
            let key = ["test", "test2", "bar", "nope", ""][i % 5];
            let user = format!("user-{}", i % 2);
            let forwarded = format!("203.0.113.{}", i % 3);
            let mut headers: Vec<(&str, &str)> = Vec::new();
            if !key.is_empty() {
                headers.push(("x-api-key", key));
            }
            if i % 3 == 0 {
                headers.push(("x-user-id", &user));
            }
            if i % 4 == 1 {
                headers.push(("x-forwarded-for", &forwarded));
            }
            let status = get(&client, &fg.url("/thing"), &headers).await.status;
            *live.entry(status.as_u16()).or_default() += 1;
        }
        let shadow_denied = metric(
            &fg,
            r#"floodgate_requests_total{route="api",decision="shadow_denied"}"#,
        )
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let report = replay_own_log(&fg);
        let api = &report["routes"][0];
        let count = |status| live.get(&status).copied().unwrap_or(0);
        eprintln!("{mode}: live {live:?}, {shadow_denied} shadow_denied; replay {api}");
        assert_eq!(api["requests"], 40, "{mode}");
        assert_eq!(api["allowed"], count(200), "{mode}");
        assert_eq!(api["denied"], count(429), "{mode}");
        assert_eq!(api["invalid_key"], count(401), "{mode}");
        assert_eq!(api["shadow_denied"], shadow_denied, "{mode}");
        assert_eq!(
            api["agreement"]["agreed"], api["agreement"]["compared"],
            "{mode}"
        );
        assert!(
            count(429) + shadow_denied + count(401) > 0,
            "{mode}: nothing was limited"
        );
    }
}

#[test]
fn replay_reports_text_by_default_and_rejects_a_bad_config() {
    let config = TempFile::new(
        &Config::new()
            .with("listen", "127.0.0.1:0")
            .route(Route::new("api", "/", "http://127.0.0.1:9").limit(Limit::fixed_window(1, "1h")))
            .yaml(),
    );
    let log = TempFile::new(
        r#"203.0.113.1 - - [22/Nov/2026:10:00:00 +0000] "GET /a HTTP/1.1" 200 1 "-" "-"
203.0.113.1 - - [22/Nov/2026:10:00:00 +0000] "GET /b HTTP/1.1" 200 1 "-" "-"
garbage
"#,
    );
    let out = floodgate_command(&[
        "replay".as_ref(),
        "--config".as_ref(),
        config.path().as_os_str(),
        log.path().as_os_str(),
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2 requests"), "{text}");
    assert!(text.contains(":3: not a combined log line"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("api") && l.contains(" 1 ") && l.contains("50.00%")),
        "{text}"
    );
    let bad = TempFile::new("listen: nowhere\n");
    let out = floodgate_command(&[
        "replay".as_ref(),
        "--config".as_ref(),
        bad.path().as_os_str(),
        log.path().as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("listen"));
}

/// Composite keys (`per:` with a header and a query parameter): the log holds each key's digest,
/// never its value, and replay spends one budget per digest, as the proxy spent one per key:
/// every decision agrees.
#[tokio::test]
async fn replay_tells_composite_budgets_apart_by_their_logged_digests() {
    let upstream = Upstream::start().await;
    let yaml = Config::new()
        .with("log_format", "json")
        .route(Route::new("api", "/api", &upstream.url()).limits([
            Limit::fixed_window(2, "1h").per(r#"[identity, "header:X-Tenant"]"#),
            Limit::fixed_window(3, "1h").per(r#""query:team""#),
        ]))
        .yaml();
    let fg = Floodgate::start_with_env(&yaml, &[("RUST_LOG", "warn,floodgate::access=info")]);
    let client = client();
    let (mut allowed, mut denied) = (0, 0);
    for i in 0..30 {
        let tenant = format!("tenant-secret-{}", i % 3);
        let url = fg.url(&format!("/api/x?team=team-secret-{}", i % 4));
        let headers = [("x-api-key", "one-key"), ("x-tenant", tenant.as_str())];
        match get(&client, &url, &headers).await.status {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            other => panic!("unexpected {other}"),
        }
    }
    // Three tenants of 2 each, four teams of 3: some of each, and the mix is not what one
    // budget for all would give (2).
    assert!(allowed > 2 && denied > 0, "{allowed} / {denied}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let report = replay_own_log(&fg);
    let api = &report["routes"][0];
    assert_eq!(api["allowed"], allowed, "{report}");
    assert_eq!(api["agreement"]["agreed"], 30, "{report}");
    let log = fg.stderr();
    assert!(log.contains("\"keys\":\"0="), "the digests are logged");
    assert!(!log.contains("tenant-secret"), "no header value in the log");
    assert!(!log.contains("team-secret"), "no query value in the log");
}
