//! `usage_path` on the proxy listener: a client reads its own budgets on every route, spending
//! nothing and never reaching the upstream, itself limited per identity.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn a_client_reads_its_own_budgets_and_the_endpoint_is_limited_per_identity() {
    // A 1-hour window: keep clear of its end (the test takes about a second).
    keep_clear_of_window_boundary(3600, Duration::from_secs(30)).await;
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&format!(
        "usage_path: /rate_limit\nroutes:\n  - name: orders\n    path_prefix: /orders\n    upstream: {u}\n    limits:\n      - {{algorithm: token_bucket, capacity: 5, refill_rate: 0.001}}\n      - {{algorithm: fixed_window, limit: 100, window: 1h, per: ip}}\n  - name: open\n    path_prefix: /open\n    upstream: {u}\n",
        u = upstream.url()
    ));
    let client = client();
    let key = [("x-api-key", "usage-k1")];
    for _ in 0..2 {
        assert_eq!(get(&client, &fg.url("/orders"), &key).await.status, 200);
    }
    let usage = get(&client, &fg.url("/rate_limit"), &key).await;
    assert_eq!(usage.status, 200, "{usage:?}");
    let body = usage.json();
    assert_eq!(body["identity_kind"], "api_key");
    let routes = body["routes"].as_array().unwrap();
    assert_eq!(routes.len(), 1, "only routes with limits: {body}");
    assert_eq!(routes[0]["route"], "orders");
    let limits = routes[0]["limits"].as_array().unwrap();
    assert_eq!(limits[0]["algorithm"], "token_bucket");
    assert_eq!(limits[0]["limit"], 5);
    assert_eq!(limits[0]["remaining"], 3);
    assert_eq!(limits[1]["per"], "ip");
    assert_eq!(limits[1]["remaining"], 98);
    assert!(limits[1]["reset"].as_u64().unwrap() > unix_now());
    // Reading spent nothing, and the upstream never saw it.
    let again = get(&client, &fg.url("/rate_limit"), &key).await.json();
    assert_eq!(again["routes"][0]["limits"][0]["remaining"], 3);
    assert_eq!(upstream.count(), 2);
    // Another key has its own budget.
    let other = get(
        &client,
        &fg.url("/rate_limit"),
        &[("x-api-key", "usage-k2")],
    )
    .await
    .json();
    assert_eq!(other["routes"][0]["limits"][0]["remaining"], 5);
    // The endpoint is limited per identity: 10 at once (two were read above).
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(
            get(&client, &fg.url("/rate_limit"), &key)
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        8,
        "{statuses:?}"
    );
    let limited = get(&client, &fg.url("/rate_limit"), &key).await;
    assert_eq!(limited.status, 429);
    assert!(limited.header_u64("retry-after") >= 1);
    // A POST to the path is an ordinary request (no route matches it here).
    let post = client.post(fg.url("/rate_limit")).send().await.unwrap();
    assert_eq!(post.status(), 404);
}

/// A limit keyed by identity and a header: the usage endpoint reads the header from its own
/// request, as the proxy does, and shows the budget the client spends (e9faff0 showed the
/// identity's untouched budget: 10 where 7 were left).
#[tokio::test]
async fn a_composite_key_reads_the_usage_requests_own_headers() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&format!(
        "usage_path: /rate_limit\nroutes:\n  - name: orders\n    path_prefix: /orders\n    upstream: {}\n    limits:\n      - {{algorithm: token_bucket, capacity: 10, refill_rate: 0.001, per: [identity, \"header:X-Tenant\"]}}\n",
        upstream.url()
    ));
    let client = client();
    let t1 = [("x-api-key", "alice"), ("x-tenant", "t1")];
    for _ in 0..3 {
        assert_eq!(get(&client, &fg.url("/orders"), &t1).await.status, 200);
    }
    let remaining = |body: serde_json::Value| body["routes"][0]["limits"][0]["remaining"].clone();
    let usage = get(&client, &fg.url("/rate_limit"), &t1).await.json();
    assert_eq!(remaining(usage), 7);
    // Another tenant of the same client has its own budget.
    let t2 = [("x-api-key", "alice"), ("x-tenant", "t2")];
    let usage = get(&client, &fg.url("/rate_limit"), &t2).await.json();
    assert_eq!(remaining(usage), 10);
}
