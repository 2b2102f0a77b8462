//! Waiting rooms (`waiting_room:`): at most `active` clients admitted at once, every instance
//! together on a shared store; the others told their place in line (first come, first served),
//! an estimated wait and `Retry-After`, or a page that asks again by itself. Real floodgate
//! processes, a real upstream (and Redis), port 0.

mod common;

use std::time::Duration;

use common::config::{Config, Limit, Route};
use common::{Floodgate, Upstream, check_names, client, get, metric};
use http::StatusCode;

/// The route `rides` → `upstream` (with `limits`), in the room `concert` of `room` (a YAML flow
/// mapping's keys beyond name and routes).
fn in_room(config: Config, upstream: &Upstream, limits: &[Limit], room: &str) -> String {
    config
        .with(
            "waiting_room",
            &format!("[{{name: concert, routes: [rides], {room}}}]"),
        )
        .route(Route::new("rides", "/", &upstream.url()).limits(limits.iter().cloned()))
        .yaml()
}

async fn ask(url: &str, key: &str) -> common::Reply {
    get(&client(), url, &[("x-api-key", key)]).await
}

fn body(reply: &common::Reply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_active_clients_are_admitted_and_the_rest_wait_their_turn() {
    let upstream = Upstream::start().await;
    let yaml = in_room(
        Config::new(),
        &upstream,
        &[],
        "active: 2, admit_rate: 100, session: 1s, activate: always",
    );
    let fg = Floodgate::start_with_env(&yaml, &[("RUST_LOG", "warn,floodgate::access=info")]);
    let url = fg.url("/ride");
    assert_eq!(ask(&url, "k0").await.status, StatusCode::OK);
    assert_eq!(ask(&url, "k1").await.status, StatusCode::OK);
    // Full: the next two wait, in the order they came, told when to ask again.
    for (key, position) in [("k2", 1), ("k3", 2)] {
        let reply = ask(&url, key).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{key}");
        let problem = body(&reply);
        assert_eq!(problem["error"], "waiting_room");
        assert_eq!(problem["position"], position);
        assert_eq!(
            problem["eta_seconds"], 1,
            "{position} over 100 a second, rounded up"
        );
        assert_eq!(reply.headers["retry-after"], "1");
    }
    // Asking again keeps one's place; an admitted client stays admitted.
    assert_eq!(body(&ask(&url, "k3").await)["position"], 2);
    assert_eq!(ask(&url, "k0").await.status, StatusCode::OK);
    // A browser gets a page that asks again by itself.
    let page = get(
        &client(),
        &url,
        &[("x-api-key", "k3"), ("accept", "text/html")],
    )
    .await;
    assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        page.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(
        page.body.contains("http-equiv=\"refresh\""),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("<strong id=\"position\">2</strong>"),
        "{}",
        page.body
    );
    // k1 goes quiet while k0 keeps asking: past k1's session (1 s; 1.3 s allows for a slow
    // machine) its place goes to the first in line, k2, and k3 moves up.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(ask(&url, "k0").await.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(ask(&url, "k2").await.status, StatusCode::OK);
    assert_eq!(body(&ask(&url, "k3").await)["position"], 1);
    // A client back after its session starts again at the back.
    assert_eq!(body(&ask(&url, "k1").await)["position"], 2);
    let metrics = |name: &str| format!("floodgate_waiting_room_{name}{{room=\"concert\"}}");
    assert_eq!(metric(&fg, &metrics("active")).await, 2);
    assert_eq!(metric(&fg, &metrics("waiting")).await, 2);
    assert_eq!(metric(&fg, &metrics("admitted_total")).await, 3);
    let waiting = metric(
        &fg,
        r#"floodgate_requests_total{route="rides",decision="waiting"}"#,
    );
    assert!(waiting.await >= 5);
    assert_eq!(
        upstream.count(),
        5,
        "waiting requests never reach the upstream"
    );
    // The access log says each waiting request's place.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let logged = "decision=\"waiting\" status=503";
    while !fg
        .stderr()
        .lines()
        .any(|l| l.contains(logged) && l.contains(" position=2"))
    {
        assert!(std::time::Instant::now() < deadline, "{}", fg.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two instances on the store `storage` configures share one line and one count: ten
/// clients, one after another, each to one instance then the other, `active: 3`.
async fn two_instances_share_one_line(storage: Config) {
    let upstream = Upstream::start().await;
    let yaml = in_room(
        storage,
        &upstream,
        &[],
        "active: 3, admit_rate: 100, session: 1m, activate: always",
    );
    let (a, b) = (Floodgate::start(&yaml), Floodgate::start(&yaml));
    // Ten clients, one after another, each to one instance then the other.
    let mut statuses = Vec::new();
    for i in 0..10 {
        let fg = if i % 2 == 0 { &a } else { &b };
        let reply = ask(&fg.url("/ride"), &format!("rider-{i}")).await;
        statuses.push((reply.status.as_u16(), body(&reply)["position"].as_u64()));
    }
    let admitted = statuses.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(admitted, 3, "{statuses:?}");
    let positions: Vec<_> = statuses.iter().filter_map(|(_, p)| *p).collect();
    assert_eq!(
        positions,
        (1..=7).collect::<Vec<_>>(),
        "first come, first served across both"
    );
    // Each instance says the room's figures, every instance together.
    for fg in [&a, &b] {
        let active = metric(fg, r#"floodgate_waiting_room_active{room="concert"}"#).await;
        assert_eq!(active, 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_one_line_and_one_count() {
    let redis = common::RedisServer::start();
    two_instances_share_one_line(Config::new().redis(&redis.url(), "allow")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_postgres_share_one_line_and_one_count() {
    let postgres = common::PostgresServer::start();
    let storage = Config::new()
        .storage("backend", "postgres")
        .storage("url", &postgres.url())
        .storage("timeout", "2s");
    two_instances_share_one_line(storage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_room_opens_only_once_its_route_refuses_for_capacity() {
    let upstream = Upstream::start().await;
    // Everyone together may spend 2 (then one in 1,000 s): past it the route refuses for
    // capacity, and the room (`activate: overloaded`, the default) opens.
    let limit = Limit::token_bucket(2, 0.001).per("route");
    let yaml = in_room(
        Config::new(),
        &upstream,
        &[limit],
        "active: 1, admit_rate: 100, session: 1m",
    );
    let fg = Floodgate::start(&yaml);
    let url = fg.url("/ride");
    // Closed: nobody waits.
    assert_eq!(ask(&url, "a").await.status, StatusCode::OK);
    assert_eq!(ask(&url, "b").await.status, StatusCode::OK);
    assert_eq!(ask(&url, "c").await.status, StatusCode::TOO_MANY_REQUESTS);
    // Open now: the first to ask is admitted (and meets the spent budget), the next waits.
    assert_eq!(ask(&url, "d").await.status, StatusCode::TOO_MANY_REQUESTS);
    let e = ask(&url, "e").await;
    assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body(&e)["error"], "waiting_room");
    assert_eq!(body(&e)["position"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bypass_tier_passes_a_full_room() {
    let upstream = Upstream::start().await;
    // The test consumers: the key "test" is acme's (tier pro), "bar" the hobbyist's; any
    // other key is ignored (the client is its address).
    let yaml = in_room(
        Config::new().consumers("anonymous"),
        &upstream,
        &[],
        "active: 1, admit_rate: 100, session: 1m, activate: always, bypass_tiers: [pro]",
    );
    let fg = Floodgate::start(&yaml);
    let url = fg.url("/ride");
    assert_eq!(ask(&url, "bar").await.status, StatusCode::OK);
    assert_eq!(
        ask(&url, "unknown").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        ask(&url, "test").await.status,
        StatusCode::OK,
        "pro passes the line"
    );
    assert_eq!(upstream.count(), 2);
}

#[test]
fn check_names_the_field_of_each_room_mistake() {
    let yaml = |room: &str, storage: &str| {
        format!(
            "listen: 127.0.0.1:0\n{storage}waiting_room: [{room}]\nroutes:\n  - {{name: rides, path_prefix: /, upstream: \"http://127.0.0.1:9\"}}\n"
        )
    };
    let ok = "name: concert, routes: [rides], admit_rate: 10";
    check_names(
        &yaml(
            "{name: concert, routes: [fares], active: 5, admit_rate: 10}",
            "",
        ),
        &["waiting_room[0].routes[0]"],
    );
    check_names(
        &yaml(&format!("{{{ok}, active: 0}}"), ""),
        &["waiting_room[0].active"],
    );
    check_names(
        &yaml(
            "{name: concert, routes: [rides], active: 5, admit_rate: 0}",
            "",
        ),
        &["waiting_room[0].admit_rate"],
    );
    check_names(
        &yaml(&format!("{{{ok}, active: 5, activate: sometimes}}"), ""),
        &["waiting_room[0].activate"],
    );
    check_names(
        &yaml(&format!("{{{ok}, active: 5, session: 0s}}"), ""),
        &["waiting_room[0].session"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_in_line_sees_its_place_and_the_page_asks_again_by_itself() {
    let upstream = Upstream::start().await;
    let yaml = in_room(
        Config::new(),
        &upstream,
        &[],
        "active: 1, admit_rate: 100, session: 2s, activate: always",
    );
    let fg = Floodgate::start(&yaml);
    // Someone holds the one place for 2 s; Chromium (no API key: its address is its identity)
    // waits, its page asking again every second, until the place is handed on.
    assert_eq!(ask(&fg.url("/ride"), "holder").await.status, StatusCode::OK);
    // The holder keeps its place until Chromium has been told to wait once (however long
    // Chromium takes to start), then goes quiet: its place lapses 2 s later, within which the
    // page asks again at least once (every second).
    let holding = {
        let (url, metrics) = (fg.url("/ride"), fg.admin_url("/metrics"));
        tokio::spawn(async move {
            let waited = r#"floodgate_requests_total{route="rides",decision="waiting"} "#;
            loop {
                let _ = ask(&url, "holder").await;
                let text = client()
                    .get(&metrics)
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                if text
                    .lines()
                    .any(|l| l.starts_with(waited) && !l.ends_with(" 0"))
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // The budget lets the page's timers run: its refresh every second, then the upstream's
    // answer once the holder's admission has lapsed.
    let (dom, stderr) = common::chromium_dom(&fg.url("/ride"), 10_000).await;
    holding.abort();
    assert!(
        dom.contains("hello from upstream"),
        "let in at last: {dom}\n{stderr}"
    );
    let waiting = metric(
        &fg,
        r#"floodgate_requests_total{route="rides",decision="waiting"}"#,
    );
    let asked = waiting.await;
    assert!(
        asked >= 2,
        "the page asked again by itself: {asked} requests in line"
    );
    assert!(upstream.count() >= 2, "the holder, then Chromium");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_clients_polling_two_instances_never_hold_more_than_active_at_once() {
    let redis = common::RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = in_room(
        Config::new().redis(&redis.url(), "allow"),
        &upstream,
        &[],
        "active: 10, admit_rate: 20, session: 3s, activate: always",
    );
    let (a, b) = (Floodgate::start(&yaml), Floodgate::start(&yaml));
    // Each client asks through one instance or the other, honouring Retry-After while it waits;
    // once admitted it asks for 500 ms more, then leaves (its place lapses 3 s later). The session
    // outlasts any gap between one client's asks on a loaded machine: with `session: 1s`, a CI
    // run once counted 41 admissions; the likeliest reading is a client whose admission lapsed
    // between two of its asks (a second apart under load) and was admitted again.
    let started = std::time::Instant::now();
    let clients: Vec<_> = (0..40)
        .map(|i| {
            let url = [a.url("/ride"), b.url("/ride")][i % 2].clone();
            tokio::spawn(async move {
                let key = format!("rider-{i}");
                loop {
                    let reply = ask(&url, &key).await;
                    if reply.status == StatusCode::OK {
                        let admitted = std::time::Instant::now();
                        while admitted.elapsed() < Duration::from_millis(500) {
                            assert_eq!(ask(&url, &key).await.status, StatusCode::OK);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        return admitted;
                    }
                    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
                    let retry: u64 = reply.headers["retry-after"]
                        .to_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    assert!((1..=5).contains(&retry), "{retry}");
                    tokio::time::sleep(Duration::from_secs(retry)).await;
                }
            })
        })
        .collect();
    // Meanwhile the room's own count, as each instance hears it from Redis, never passes 10.
    let mut most = 0;
    while clients.iter().any(|c| !c.is_finished()) {
        for fg in [&a, &b] {
            let active = metric(fg, r#"floodgate_waiting_room_active{room="concert"}"#).await;
            most = most.max(active);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not everyone got in"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(most, 10, "the room filled, and never held more than active");
    // The instance that ran the last admission heard the store's total last.
    let admitted = r#"floodgate_waiting_room_admitted_total{room="concert"}"#;
    let heard = metric(&a, admitted).await.max(metric(&b, admitted).await);
    assert_eq!(heard, 40, "every client got in, once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_room_follows_the_upstream_slowing_and_healing() {
    let upstream = common::DemoUpstream::start(4, "20ms", "250ms");
    let yaml = Config::new()
        .with(
            "waiting_room",
            "[{name: concert, routes: [rides], active: 1, admit_rate: 100, session: 1s}]",
        )
        .route(
            Route::new("rides", "/", upstream.url())
                .with("adaptive_concurrency", "{queue_timeout: 20ms}"),
        )
        .yaml();
    let fg = Floodgate::start(&yaml);
    let url = fg.url("/ride");
    // Healthy and lightly used: the room stays closed, everyone is let in.
    for key in ["a", "b", "c"] {
        assert_eq!(ask(&url, key).await.status, StatusCode::OK);
    }
    // The upstream slows to a tenth and a flood arrives: the gate sheds, and the room opens.
    upstream.set_capacity("service_time=200ms").await;
    common::hammer(
        std::slice::from_ref(&url),
        "flood",
        32,
        Duration::from_secs(2),
    )
    .await;
    let told = ask(&url, "newcomer").await;
    assert_eq!(told.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body(&told)["error"], "waiting_room");
    // It heals and the flood is gone: a session (1 s) without a refusal for capacity closes the
    // room (1.5 s: half a second of slack for a slow machine), and a new client is let in.
    upstream.set_capacity("service_time=20ms").await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(ask(&url, "latecomer").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_spends_no_budget() {
    let upstream = Upstream::start().await;
    // Two requests per identity, then one in 1,000 s; one client admitted at a time.
    let yaml = in_room(
        Config::new(),
        &upstream,
        &[Limit::token_bucket(2, 0.001)],
        "active: 1, admit_rate: 100, session: 500ms, activate: always",
    );
    let fg = Floodgate::start(&yaml);
    let url = fg.url("/ride");
    assert_eq!(ask(&url, "holder").await.status, StatusCode::OK);
    for _ in 0..5 {
        assert_eq!(ask(&url, "k").await.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    // The holder's place lapses (500 ms; 800 allows for a slow machine): k is let in with its
    // whole budget, the five waits having spent none of it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let statuses = [
        ask(&url, "k").await,
        ask(&url, "k").await,
        ask(&url, "k").await,
    ];
    let codes: Vec<_> = statuses.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(codes, [200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_banned_client_takes_no_place_in_line() {
    let upstream = Upstream::start().await;
    let token = common::TempFile::new("t0ken\n");
    let config = Config::new().with(
        "admin",
        &format!("{{token_file: {}}}", token.path().display()),
    );
    let yaml = in_room(
        config,
        &upstream,
        &[Limit::token_bucket(100, 100.0)],
        "active: 1, admit_rate: 100, session: 1m, activate: always",
    );
    let fg = Floodgate::start(&yaml);
    let url = fg.url("/ride");
    let banned = client()
        .put(fg.admin_url("/bans"))
        .bearer_auth("t0ken")
        .body(r#"{"route": "rides", "api_key": "rogue", "duration": "1h"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(banned.status(), StatusCode::OK);
    // Refused as banned, and the one place is still free for the next client.
    let rogue = ask(&url, "rogue").await;
    assert_eq!(rogue.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body(&rogue)["error"], "banned");
    assert_eq!(ask(&url, "rider").await.status, StatusCode::OK);
}
