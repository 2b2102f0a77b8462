//! Admin `GET /top`: who is being limited right now, per route, from a table of bounded memory
//! (src/top.rs), through the real proxy.

mod common;

use common::config::{Config, Limit, Route};
use common::{Floodgate, Upstream, client, floodgate_command, get};
use sha2::Digest;

#[tokio::test]
async fn top_names_the_heaviest_identities_of_a_route_hashed() {
    let upstream = Upstream::start().await;
    let bucket = || Limit::token_bucket(5, 0.01);
    let fg = Floodgate::start(
        &Config::new()
            .route(Route::new("api", "/api", &upstream.url()).limit(bucket()))
            .route(Route::new("other", "/", &upstream.url()).limit(bucket()))
            .yaml(),
    );
    let client = client();
    // One heavy client among thirty light ones.
    for _ in 0..60 {
        get(&client, &fg.url("/api/x"), &[("x-api-key", "heavy")]).await;
    }
    for i in 0..30 {
        let key = format!("light-{i}");
        for _ in 0..2 {
            get(&client, &fg.url("/api/x"), &[("x-api-key", key.as_str())]).await;
        }
    }
    let top = get(&client, &fg.admin_url("/top?route=api&n=3"), &[]).await;
    assert_eq!(top.status, 200);
    let v = top.json();
    assert_eq!(v["route"], "api");
    let rows = v["identities"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let digest = sha2::Sha256::digest(b"heavy");
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(rows[0]["identity"], format!("api_key:{hex}…"));
    assert_eq!(rows[0]["kind"], "api_key");
    assert_eq!(
        (rows[0]["allowed"].as_u64(), rows[0]["denied"].as_u64()),
        (Some(5), Some(55))
    );
    assert_eq!(rows[1]["allowed"], 2);
    assert!(!top.body.contains("heavy"), "no raw key: {}", top.body);
    // Most denied first: the same one.
    let by_denied = get(
        &client,
        &fg.admin_url("/top?route=api&sort=denied&n=1"),
        &[],
    )
    .await
    .json();
    assert_eq!(by_denied["identities"][0]["identity"], rows[0]["identity"]);
    // Every route, without route=; the other route saw nobody.
    let all = get(&client, &fg.admin_url("/top"), &[]).await.json();
    assert_eq!(all["routes"][1]["route"], "other");
    assert_eq!(all["routes"][1]["identities"].as_array().unwrap().len(), 0);
    // `floodgate top` draws the same (here once: its output is not a terminal).
    let admin = fg.admin_url("");
    let out = floodgate_command(&[
        "top".as_ref(),
        "--admin".as_ref(),
        admin.as_ref(),
        "--route".as_ref(),
        "api".as_ref(),
        "--n".as_ref(),
        "2".as_ref(),
        "--once".as_ref(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("route api"), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(&format!("api_key:{hex}")))
        .unwrap_or_else(|| panic!("the heavy key in {text}"));
    assert!(
        line.trim_end().ends_with("91.7%"),
        "55 of 60 denied: {line}"
    );
    // Bad queries.
    assert_eq!(
        get(&client, &fg.admin_url("/top?route=nope"), &[])
            .await
            .status,
        404
    );
    assert_eq!(
        get(&client, &fg.admin_url("/top?n=zero"), &[]).await.status,
        400
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_shed_by_the_upstreams_gate_are_counted_on_a_route_without_limits() {
    let upstream = Upstream::start().await;
    // No limits, no consumers: only the upstream's learned limit, pinned at one request.
    let fg = Floodgate::start(
        &Config::new()
            .route(Route::new("gated", "/", &upstream.url()).with(
                "adaptive_concurrency",
                "{min_limit: 1, max_limit: 1, queue_timeout: 50ms}",
            ))
            .yaml(),
    );
    let client = client();
    // The holder takes the one slot for SLOW (1.5 s); 200 ms is ample for it to get there
    // first, and the five requests after it take about 50 ms each: all inside the 1.5 s.
    let holder = {
        let (client, url) = (client.clone(), fg.url("/slow"));
        tokio::spawn(async move { get(&client, &url, &[("x-api-key", "holder")]).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    for _ in 0..5 {
        let reply = get(&client, &fg.url("/x"), &[("x-api-key", "shed")]).await;
        assert_eq!(reply.status, 503, "{reply:?}");
    }
    assert_eq!(holder.await.expect("holder").status, 200);
    let v = get(&client, &fg.admin_url("/top?route=gated&sort=denied"), &[])
        .await
        .json();
    let rows = v["identities"].as_array().expect("rows");
    let digest = sha2::Sha256::digest(b"shed");
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(rows[0]["identity"], format!("api_key:{hex}…"), "{v}");
    assert_eq!(rows[0]["denied"], 5, "{v}");
    assert_eq!(rows[1]["allowed"], 1, "the holder: {v}");
}
