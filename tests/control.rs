//! Control at run time on the admin listener: bans by an operator (`PUT /bans`) and by a
//! limit's penalty box, overrides (`PUT /overrides`) and resets (`POST /reset`), behind
//! `admin.token_file`'s bearer token; on the memory store, and shared by instances on Redis and
//! on PostgreSQL.

mod common;

use common::*;
use http::StatusCode;

fn config(upstream: &str, token: Option<&TempFile>) -> String {
    let admin = match token {
        Some(file) => format!("admin:\n  token_file: {}\n", yaml_path(file)),
        None => String::new(),
    };
    format!(
        "admin_listen: 127.0.0.1:0\n{admin}routes:\n  - name: orders\n    path_prefix: /orders\n    upstream: {upstream}\n    limits:\n      - {{algorithm: token_bucket, capacity: 100, refill_rate: 10}}\n      - algorithm: token_bucket\n        capacity: 1\n        refill_rate: 0.0001\n        per: header:X-Greedy\n        penalty: {{denials: 3, within: 1m, ban: 1h}}\n  - name: search\n    path_prefix: /search\n    upstream: {upstream}\n  - name: quota\n    path_prefix: /quota\n    upstream: {upstream}\n    limits:\n      - {{algorithm: fixed_window, limit: 3, window: 1h}}\n"
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

/// Polls `check` every 20 ms until it holds, for at most `within` (`what` names it when it
/// never does).
async fn eventually<F: std::future::Future<Output = bool>>(
    within: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let deadline = std::time::Instant::now() + within;
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_override_changes_one_identitys_limits_a_reset_fills_its_budgets_and_bad_input_changes_nothing()
 {
    let upstream = Upstream::start().await;
    let token = TempFile::new("t0ken");
    // At info: every write is logged, and so is every request (the access log).
    let fg = Floodgate::start_with_env(
        &config(&upstream.url(), Some(&token)),
        &[("RUST_LOG", "info")],
    );
    let t = Some("t0ken");
    let client = client();
    let k1 = [("x-api-key", "override-key-1")];
    // Bad input: 400 naming the field, nothing changed.
    for (body, field) in [
        ("[1, 2]", "JSON object"),
        (
            r#"{"route": "nope", "api_key": "k", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]}"#,
            "route",
        ),
        (
            r#"{"route": "search", "api_key": "k", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]}"#,
            "no limits",
        ),
        (r#"{"route": "quota", "api_key": "k"}"#, "limits"),
        (
            r#"{"route": "quota", "api_key": "k", "limits": [{"algorithm": "fixed_window", "limit": -5, "window": "1h"}]}"#,
            "limits[0].limit",
        ),
        (
            r#"{"route": "quota", "api_key": "k", "limits": [{"algorithm": "token_bucket", "capacity": 5, "refill_rate": 1, "window": "1h"}]}"#,
            "limits[0].window",
        ),
        (
            r#"{"route": "quota", "api_key": "k", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h", "shadow": true}]}"#,
            "limits[0].shadow",
        ),
        (
            r#"{"route": "quota", "api_key": "k", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h", "bogus": 1}]}"#,
            "bogus",
        ),
        (
            r#"{"route": "quota", "api_key": "k", "expires_in": "later", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]}"#,
            "expires_in",
        ),
        (
            r#"{"route": "quota", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]}"#,
            "api_key",
        ),
    ] {
        let r = admin(&fg, reqwest::Method::PUT, "/overrides", t, Some(body)).await;
        let problem = assert_problem(&r, StatusCode::BAD_REQUEST, "bad_request");
        assert!(
            problem["detail"].as_str().unwrap().contains(field),
            "{body}: {problem}"
        );
    }
    for (body, field) in [
        ("{", "JSON"),
        (r#"{"route": "nope", "api_key": "k"}"#, "route"),
        (r#"{"route": "quota"}"#, "api_key"),
    ] {
        let r = admin(&fg, reqwest::Method::POST, "/reset", t, Some(body)).await;
        let problem = assert_problem(&r, StatusCode::BAD_REQUEST, "bad_request");
        assert!(
            problem["detail"].as_str().unwrap().contains(field),
            "{problem}"
        );
    }
    let r = admin(&fg, reqwest::Method::GET, "/overrides", t, None).await;
    assert_eq!(r.json()["overrides"], serde_json::json!([]));
    assert_eq!(
        admin(&fg, reqwest::Method::GET, "/reset", t, None)
            .await
            .status,
        405
    );

    // The route's limit: 3 an hour.
    let first = get(&client, &fg.url("/quota"), &k1).await;
    assert_eq!(first.header_u64("x-ratelimit-limit"), 3);
    // An override: 5 an hour for this key, its own budget (full).
    let r = admin(
        &fg,
        reqwest::Method::PUT,
        "/overrides",
        t,
        Some(r#"{"route": "quota", "api_key": "override-key-1", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_string();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = get(&client, &fg.url("/quota"), &k1).await;
        assert_eq!(r.header_u64("x-ratelimit-limit"), 5);
        statuses.push(r.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    // Other keys keep the route's limit.
    let other = get(&client, &fg.url("/quota"), &[("x-api-key", "k2")]).await;
    assert_eq!(other.header_u64("x-ratelimit-limit"), 3);
    // /budgets sees the override; the listing hides the raw key.
    let budgets = admin(
        &fg,
        reqwest::Method::GET,
        "/budgets?route=quota&api_key=override-key-1",
        None,
        None,
    )
    .await
    .json();
    assert_eq!(budgets["limits"][0]["limit"], 5, "{budgets}");
    let listed = admin(&fg, reqwest::Method::GET, "/overrides", t, None).await;
    assert_eq!(listed.json()["overrides"][0]["id"], id.as_str());
    assert_eq!(listed.json()["overrides"][0]["limits"][0]["limit"], 5);
    assert!(!listed.body.contains("override-key-1"), "{}", listed.body);
    // A reset fills the override's budget again.
    let r = admin(
        &fg,
        reqwest::Method::POST,
        "/reset",
        t,
        Some(r#"{"route": "quota", "api_key": "override-key-1"}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let after = get(&client, &fg.url("/quota"), &k1).await;
    assert_eq!(after.status, 200);
    assert_eq!(after.header_u64("x-ratelimit-remaining"), 4);
    // Deleted: the route's limit again; its budget was reset too (every budget of the
    // identity on the route is), so only this request is spent.
    let r = admin(
        &fg,
        reqwest::Method::DELETE,
        &format!("/overrides/{id}"),
        t,
        None,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let back = get(&client, &fg.url("/quota"), &k1).await;
    assert_eq!(
        (
            back.header_u64("x-ratelimit-limit"),
            back.header_u64("x-ratelimit-remaining")
        ),
        (3, 2)
    );
    // An override that expires.
    let r = admin(
        &fg,
        reqwest::Method::PUT,
        "/overrides",
        t,
        Some(r#"{"route": "quota", "api_key": "override-key-1", "expires_in": "1s", "limits": [{"algorithm": "fixed_window", "limit": 50, "window": "1h"}]}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        get(&client, &fg.url("/quota"), &k1)
            .await
            .header_u64("x-ratelimit-limit"),
        50
    );
    // Ends after 1 s; 5 s allows a loaded machine (an override that never ends fails).
    eventually(
        std::time::Duration::from_secs(5),
        "the override did not end",
        || async {
            get(&client, &fg.url("/quota"), &k1)
                .await
                .header_u64("x-ratelimit-limit")
                == 3
        },
    )
    .await;
    // The raw key is in no log line.
    assert!(
        !fg.stderr().contains("override-key-1"),
        "a raw key was logged"
    );
    assert!(fg.stderr().contains("override set"));
}

/// Bans, overrides and resets on a shared store: made on one instance, applied by the other
/// within a second; a new instance starts with them.
/// (`storage` sets a 2 s timeout: at the default 50 ms a decision slowed by a loaded machine,
/// a new instance's first on PostgreSQL above all, follows `on_error: allow`, answered without
/// rate-limit headers: seen once in CI.)
async fn shared_by_every_instance(storage: &str) {
    let upstream = Upstream::start().await;
    let token = TempFile::new("t0ken");
    let yaml = format!("{storage}{}", config(&upstream.url(), Some(&token)));
    let one = Floodgate::start(&yaml);
    let two = Floodgate::start(&yaml);
    let client = client();
    let t = Some("t0ken");
    // The other instance reads the list's version every 300 ms (FOLLOW_EVERY), so a change
    // reaches it within a second; 3 s leaves a loaded machine room (a lost change would never
    // arrive at all).
    let within = std::time::Duration::from_secs(3);

    // A ban.
    let key = [("x-api-key", "shared-ban")];
    assert_eq!(get(&client, &two.url("/search"), &key).await.status, 200);
    let r = admin(
        &one,
        reqwest::Method::PUT,
        "/bans",
        t,
        Some(r#"{"route": "search", "api_key": "shared-ban", "duration": "1h"}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let ban = r.json()["id"].as_str().unwrap().to_string();
    eventually(
        within,
        "the ban did not reach the other instance",
        || async { get(&client, &two.url("/search"), &key).await.status == 429 },
    )
    .await;

    // An override, made on one, applied on two; its budget is shared.
    let k = [("x-api-key", "shared-override")];
    let r = admin(
        &one,
        reqwest::Method::PUT,
        "/overrides",
        t,
        Some(r#"{"route": "quota", "api_key": "shared-override", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let over = r.json()["id"].as_str().unwrap().to_string();
    eventually(
        within,
        "the override did not reach the other instance",
        || async {
            get(&client, &two.url("/quota"), &k)
                .await
                .header_u64("x-ratelimit-limit")
                == 5
        },
    )
    .await;
    // (The request that saw the override spent one of its 5.)
    let mut admitted = 1;
    for n in 0..8 {
        let fg = if n % 2 == 0 { &one } else { &two };
        admitted += u32::from(get(&client, &fg.url("/quota"), &k).await.status == 200);
    }
    assert_eq!(admitted, 5, "one budget of 5 across both instances");
    // A reset on two fills it on one (whose cached denial goes too).
    let r = admin(
        &two,
        reqwest::Method::POST,
        "/reset",
        t,
        Some(r#"{"route": "quota", "api_key": "shared-override"}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    eventually(
        within,
        "the reset did not reach the other instance",
        || async {
            let r = get(&client, &one.url("/quota"), &k).await;
            r.status == 200
        },
    )
    .await;

    // A new instance starts with the ban and the override.
    let three = Floodgate::start(&yaml);
    eventually(
        std::time::Duration::from_secs(5),
        "a restarted instance lost the ban",
        || async { get(&client, &three.url("/search"), &key).await.status == 429 },
    )
    .await;
    assert_eq!(
        get(&client, &three.url("/quota"), &k)
            .await
            .header_u64("x-ratelimit-limit"),
        5
    );
    // Removed on one, removed everywhere.
    for path in [format!("/bans/{ban}"), format!("/overrides/{over}")] {
        let r = admin(&two, reqwest::Method::DELETE, &path, t, None).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    eventually(
        within,
        "the lift did not reach the first instance",
        || async { get(&client, &one.url("/search"), &key).await.status == 200 },
    )
    .await;
    eventually(
        within,
        "the deletion did not reach the third instance",
        || async {
            get(&client, &three.url("/quota"), &k)
                .await
                .header_u64("x-ratelimit-limit")
                == 3
        },
    )
    .await;
}

#[tokio::test]
async fn on_redis_changes_reach_every_instance_within_a_second_and_survive_a_restart() {
    let redis = RedisServer::start();
    shared_by_every_instance(&format!(
        "storage:\n  backend: redis\n  url: {}\n  timeout: 2s\n",
        redis.url()
    ))
    .await;
}

#[tokio::test]
async fn on_postgres_changes_reach_every_instance_within_a_second_and_survive_a_restart() {
    let postgres = PostgresServer::start();
    shared_by_every_instance(&format!(
        "storage:\n  backend: postgres\n  url: {}\n  timeout: 2s\n",
        postgres.url()
    ))
    .await;
}

/// Redis stopped (SIGSTOP) while an operator writes: each write is 503 and changes nothing on
/// this instance; once Redis is continued (and whatever it then applies of the stopped writes),
/// both instances agree, with nothing of the refused writes in force anywhere. Before, each
/// write was 200 after the store's timeout and held on the instance that took it alone.
#[tokio::test]
async fn a_write_the_shared_store_did_not_take_is_503_and_changes_nothing_anywhere() {
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
    let t = Some("t0ken");
    let key = [("x-api-key", "stopped")];
    // An override made while Redis answers, to be deleted while it does not.
    let r = admin(
        &one,
        reqwest::Method::PUT,
        "/overrides",
        t,
        Some(r#"{"route": "quota", "api_key": "kept", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}]}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let kept = r.json()["id"].as_str().unwrap().to_string();
    let within = std::time::Duration::from_secs(3);
    let kept_key = [("x-api-key", "kept")];
    eventually(within, "the override did not reach two", || async {
        get(&client, &two.url("/quota"), &kept_key)
            .await
            .header_u64("x-ratelimit-limit")
            == 5
    })
    .await;

    redis.signal("STOP");
    let ban = admin(
        &one,
        reqwest::Method::PUT,
        "/bans",
        t,
        Some(r#"{"route": "search", "api_key": "stopped", "duration": "1h"}"#),
    )
    .await;
    assert_eq!(ban.status, 503, "{ban:?}");
    assert_eq!(ban.json()["error"], "store_unavailable");
    let over = admin(
        &one,
        reqwest::Method::PUT,
        "/overrides",
        t,
        Some(r#"{"route": "quota", "api_key": "stopped", "limits": [{"algorithm": "fixed_window", "limit": 7, "window": "1h"}]}"#),
    )
    .await;
    assert_eq!(over.status, 503, "{over:?}");
    let deleted = admin(
        &one,
        reqwest::Method::DELETE,
        &format!("/overrides/{kept}"),
        t,
        None,
    )
    .await;
    assert_eq!(deleted.status, 503, "{deleted:?}");
    // Nothing changed here (the memory of the instance that took the writes).
    let listed = admin(&one, reqwest::Method::GET, "/bans", t, None).await;
    assert_eq!(
        listed.json()["bans"].as_array().unwrap().len(),
        0,
        "{listed:?}"
    );
    let listed = admin(&one, reqwest::Method::GET, "/overrides", t, None).await;
    let ids: Vec<String> = listed.json()["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, std::slice::from_ref(&kept));

    redis.signal("CONT");
    // Redis now runs the stopped writes and their undoing, in order. Give both instances
    // time to read the list (they follow it every 300 ms; 2 s leaves a loaded machine room),
    // then both must agree: no ban, the kept override only.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    for fg in [&one, &two] {
        let listed = admin(fg, reqwest::Method::GET, "/bans", t, None).await;
        assert_eq!(
            listed.json()["bans"].as_array().unwrap().len(),
            0,
            "{listed:?}"
        );
        let listed = admin(fg, reqwest::Method::GET, "/overrides", t, None).await;
        let ids: Vec<String> = listed.json()["overrides"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, std::slice::from_ref(&kept), "{listed:?}");
        assert_eq!(get(&client, &fg.url("/search"), &key).await.status, 200);
    }
    // And a write once Redis answers again is taken.
    let ban = admin(
        &two,
        reqwest::Method::PUT,
        "/bans",
        t,
        Some(r#"{"route": "search", "api_key": "stopped", "duration": "1h"}"#),
    )
    .await;
    assert_eq!(ban.status, 200, "{ban:?}");
}

#[tokio::test]
async fn a_write_body_with_a_field_the_endpoint_does_not_know_is_400_and_changes_nothing() {
    let upstream = Upstream::start().await;
    let token = TempFile::new("t0ken");
    let fg = Floodgate::start(&config(&upstream.url(), Some(&token)));
    let t = Some("t0ken");
    for (method, path, body, field) in [
        (
            reqwest::Method::PUT,
            "/overrides",
            r#"{"route": "quota", "api_key": "k", "limits": [{"algorithm": "fixed_window", "limit": 5, "window": "1h"}], "expire_in": "2s"}"#,
            "expire_in",
        ),
        (
            reqwest::Method::PUT,
            "/bans",
            r#"{"route": "search", "api_key": "k", "duration": "1h", "bogus": 1}"#,
            "bogus",
        ),
        (
            reqwest::Method::POST,
            "/reset",
            r#"{"route": "quota", "api_key": "k", "everything": true}"#,
            "everything",
        ),
    ] {
        let r = admin(&fg, method, path, t, Some(body)).await;
        assert_eq!(r.status, 400, "{path}: {r:?}");
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_string();
        assert!(detail.contains(field), "{path}: {detail}");
    }
    for list in ["/bans", "/overrides"] {
        let r = admin(&fg, reqwest::Method::GET, list, t, None).await;
        let name = &list[1..];
        assert_eq!(r.json()[name].as_array().unwrap().len(), 0, "{r:?}");
    }
}

/// A ban's reason and an API key holding line breaks and terminal escapes: floodgate's log has
/// no line that begins with the attacker's text, and no raw ESC (e9faff0 wrote them raw).
#[tokio::test]
async fn values_from_an_admin_body_cannot_forge_log_lines() {
    let upstream = Upstream::start().await;
    let token = TempFile::new("t0ken");
    let fg = Floodgate::start_with_env(
        &config(&upstream.url(), Some(&token)),
        &[("RUST_LOG", "info")],
    );
    let body = serde_json::json!({
        "route": "search",
        "user_id": "u\nFORGED INFO floodgate: admin login ok\r\u{1b}[2J",
        "duration": "1h",
        "reason": "spam\nFORGED INFO floodgate: ban removed\u{1b}]0;owned\u{7}",
    });
    let r = admin(
        &fg,
        reqwest::Method::PUT,
        "/bans",
        Some("t0ken"),
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    // The log is read from the process's stderr as it comes.
    eventually(
        std::time::Duration::from_secs(3),
        "the ban was not logged",
        || async { fg.stderr().contains("ban added") },
    )
    .await;
    let log = fg.stderr();
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED")),
        "a forged line: {log}"
    );
    assert!(!log.contains('\u{1b}') && !log.contains('\r'), "{log:?}");
}
