//! Control at run time on the admin listener: bans by an operator (`PUT /bans`) and by a
//! limit's penalty box, behind `admin.token_file`'s bearer token.

mod common;

use common::*;
use http::StatusCode;

fn config(upstream: &str, token: Option<&TempFile>) -> String {
    let admin = match token {
        Some(file) => format!("admin:\n  token_file: {}\n", yaml_path(file)),
        None => String::new(),
    };
    format!(
        "admin_listen: 127.0.0.1:0\n{admin}routes:\n  - name: orders\n    path_prefix: /orders\n    upstream: {upstream}\n    limits:\n      - {{algorithm: token_bucket, capacity: 100, refill_rate: 10}}\n      - algorithm: token_bucket\n        capacity: 1\n        refill_rate: 0.0001\n        per: header:X-Greedy\n        penalty: {{denials: 3, within: 1m, ban: 1h}}\n  - name: search\n    path_prefix: /search\n    upstream: {upstream}\n"
    )
}

async fn admin(
    fg: &Floodgate,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Reply {
    let mut request = client().request(method, fg.admin_url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.body(body.to_string());
    }
    Reply::read(request.send().await.expect("admin call")).await
}

#[tokio::test]
async fn the_write_endpoints_need_the_token_and_are_off_without_one() {
    let upstream = Upstream::start().await;
    let off = Floodgate::start(&config(&upstream.url(), None));
    let r = admin(&off, reqwest::Method::GET, "/bans", Some("x"), None).await;
    assert_problem(&r, StatusCode::FORBIDDEN, "forbidden");
    let token = TempFile::new("  s3cret-token\n");
    let on = Floodgate::start(&config(&upstream.url(), Some(&token)));
    for given in [None, Some("wrong"), Some("s3cret-token-longer")] {
        let r = admin(&on, reqwest::Method::GET, "/bans", given, None).await;
        assert_problem(&r, StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let r = admin(
        &on,
        reqwest::Method::GET,
        "/bans",
        Some("s3cret-token"),
        None,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["bans"], serde_json::json!([]));
}

#[tokio::test]
async fn an_operators_ban_refuses_the_identity_until_lifted_and_bad_input_changes_nothing() {
    let upstream = Upstream::start().await;
    let token = TempFile::new("t0ken");
    let fg = Floodgate::start(&config(&upstream.url(), Some(&token)));
    let t = Some("t0ken");
    let put = |body: &'static str| admin(&fg, reqwest::Method::PUT, "/bans", t, Some(body));
    // Bad input: 400 naming the field, nothing changed.
    for (body, field) in [
        ("{not json", "JSON"),
        (
            r#"{"route": "nope", "api_key": "k1", "duration": "1h"}"#,
            "route",
        ),
        (
            r#"{"route": "orders", "api_key": "k1", "duration": "soon"}"#,
            "duration",
        ),
        (r#"{"route": "orders", "duration": "1h"}"#, "api_key"),
        (
            r#"{"route": "orders", "api_key": "k1", "ip": "10.0.0.1", "duration": "1h"}"#,
            "exactly one",
        ),
        (
            r#"{"route": "orders", "ip": "ten", "duration": "1h"}"#,
            "ip",
        ),
    ] {
        let r = put(body).await;
        let problem = assert_problem(&r, StatusCode::BAD_REQUEST, "bad_request");
        assert!(
            problem["detail"].as_str().unwrap().contains(field),
            "{problem}"
        );
    }
    assert_eq!(
        admin(&fg, reqwest::Method::GET, "/bans", t, None)
            .await
            .json()["bans"],
        serde_json::json!([])
    );
    let client = client();
    let k1 = [("x-api-key", "k1")];
    assert_eq!(get(&client, &fg.url("/orders"), &k1).await.status, 200);

    let r = put(r#"{"route": "orders", "api_key": "k1", "duration": "1h", "reason": "scraping"}"#)
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_string();
    let banned = get(&client, &fg.url("/orders"), &k1).await;
    let problem = assert_problem(&banned, StatusCode::TOO_MANY_REQUESTS, "banned");
    let retry = banned.header_u64("retry-after");
    assert!((3590..=3600).contains(&retry), "{retry}");
    assert_eq!(problem["retry_after"].as_u64(), Some(retry));
    // Only that identity, only that route; never forwarded.
    assert_eq!(
        get(&client, &fg.url("/orders"), &[("x-api-key", "k2")])
            .await
            .status,
        200
    );
    assert_eq!(get(&client, &fg.url("/search"), &k1).await.status, 200);
    assert_eq!(upstream.count(), 3);
    let listed = admin(&fg, reqwest::Method::GET, "/bans", t, None).await;
    let bans = listed.json()["bans"].clone();
    assert_eq!(bans[0]["id"], id.as_str());
    assert_eq!(bans[0]["route"], "orders");
    assert_eq!(bans[0]["reason"], "scraping");
    assert!(
        !listed.body.contains("\"k1\""),
        "the raw key is listed: {}",
        listed.body
    );
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_requests_total{route="orders",decision="banned"}"#
        )
        .await,
        1
    );
    // Lifted: the identity is decided by the limits again (its one-request header budget,
    // which spends the key's budget without the header, was spent above).
    let r = admin(
        &fg,
        reqwest::Method::DELETE,
        &format!("/bans/{id}"),
        t,
        None,
    )
    .await;
    assert_eq!(r.status, 200);
    let after = get(&client, &fg.url("/orders"), &k1).await;
    assert_problem(&after, StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded");
    let r = admin(
        &fg,
        reqwest::Method::DELETE,
        &format!("/bans/{id}"),
        t,
        None,
    )
    .await;
    assert_eq!(r.status, 404);
    // Every route: an address.
    let r = put(r#"{"route": "*", "ip": "127.0.0.1", "duration": "10m"}"#).await;
    assert_eq!(r.status, 200);
    assert_eq!(get(&client, &fg.url("/search"), &[]).await.status, 429);
}

#[tokio::test]
async fn a_limits_penalty_box_bans_after_that_many_denials() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(&upstream.url(), None));
    let client = client();
    let greedy = [("x-greedy", "g1")];
    // One admitted, then denials 1 and 2 (the limit's 429), then denial 3 bans.
    assert_eq!(get(&client, &fg.url("/orders"), &greedy).await.status, 200);
    for _ in 0..3 {
        let r = get(&client, &fg.url("/orders"), &greedy).await;
        assert_problem(&r, StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded");
    }
    let banned = get(&client, &fg.url("/orders"), &greedy).await;
    assert_problem(&banned, StatusCode::TOO_MANY_REQUESTS, "banned");
    assert!(banned.header_u64("retry-after") > 3500);
    // The ban is the identity's (its address here), on that route.
    assert_eq!(
        get(&client, &fg.url("/orders"), &[("x-greedy", "g2")])
            .await
            .status,
        429
    );
    assert_eq!(get(&client, &fg.url("/search"), &[]).await.status, 200);
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn on_redis_a_ban_reaches_every_instance_within_a_second_and_survives_a_restart() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let token = TempFile::new("t0ken");
    let yaml = format!(
        "storage:\n  backend: redis\n  url: {}\n{}",
        redis.url(),
        config(&upstream.url(), Some(&token))
    );
    let one = Floodgate::start(&yaml);
    let two = Floodgate::start(&yaml);
    let client = client();
    let key = [("x-api-key", "shared-ban")];
    assert_eq!(get(&client, &two.url("/search"), &key).await.status, 200);
    let r = admin(
        &one,
        reqwest::Method::PUT,
        "/bans",
        Some("t0ken"),
        Some(r#"{"route": "search", "api_key": "shared-ban", "duration": "1h"}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_string();
    // The other instance reads the list's version in Redis every 300 ms (FOLLOW_EVERY), so the
    // ban reaches it within a second; 3 s here leaves a loaded machine room (a lost ban would
    // never arrive at all).
    let started = std::time::Instant::now();
    loop {
        let status = get(&client, &two.url("/search"), &key).await.status;
        if status == 429 {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "the ban did not reach the other instance"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // A new instance starts with it.
    let three = Floodgate::start(&yaml);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while get(&client, &three.url("/search"), &key).await.status != 429 {
        assert!(
            std::time::Instant::now() < deadline,
            "a restarted instance lost the ban"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Lifted on one, lifted everywhere.
    let r = admin(
        &two,
        reqwest::Method::DELETE,
        &format!("/bans/{id}"),
        Some("t0ken"),
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while get(&client, &one.url("/search"), &key).await.status != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the lift did not reach the first instance"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
