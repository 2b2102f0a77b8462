//! End to end through the real binary: whose budget a request spends. Every request here comes
//! from 127.0.0.1, so whether that peer is a trusted proxy decides which headers are believed.

mod common;

use common::config::{Config, Limit, Route};
use common::{Floodgate, Reply, Upstream, assert_problem, client, get};
use http::StatusCode;

/// One route, `/` → `upstream`, with a token bucket of `capacity` that does not refill during a
/// test (one token per 1000 s), behind `trusted_proxies`, with the identity headers spelled out.
fn config(upstream: &Upstream, capacity: u64, trusted_proxies: &str) -> String {
    Config::new()
        .set("identity", "api_key_header", "X-API-Key")
        .set("identity", "user_id_header", "X-User-Id")
        .trusted_proxies(trusted_proxies)
        .route(
            Route::new("limited", "/", &upstream.url()).limit(Limit::token_bucket(capacity, 0.001)),
        )
        .yaml()
}

/// A floodgate that trusts the test client's own address as a proxy, one request per identity.
async fn behind_trusted_proxy() -> (Upstream, Floodgate) {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(&upstream, 1, "[127.0.0.1/32]"));
    (upstream, fg)
}

/// Sends one request with `headers` and returns its status.
async fn status(fg: &Floodgate, headers: &[(&str, &str)]) -> StatusCode {
    let reply: Reply = get(&client(), &fg.url("/who"), headers).await;
    reply.status
}

const OK: StatusCode = StatusCode::OK;
const LIMITED: StatusCode = StatusCode::TOO_MANY_REQUESTS;

#[tokio::test]
async fn rotating_forwarded_for_or_user_id_from_an_untrusted_peer_buys_no_new_budget() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(&upstream, 2, "[]"));
    let mut statuses = Vec::new();
    for n in 0..6 {
        let xff = format!("198.51.100.{n}");
        let user = format!("user-{n}");
        let headers = [
            ("X-Forwarded-For", xff.as_str()),
            ("X-User-Id", user.as_str()),
        ];
        statuses.push(status(&fg, &headers).await);
    }
    assert_eq!(statuses, [OK, OK, LIMITED, LIMITED, LIMITED, LIMITED]);
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_gets_its_own_budget() {
    let (upstream, fg) = behind_trusted_proxy().await;
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "198.51.100.1")]).await,
        OK
    );
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "198.51.100.2")]).await,
        OK
    );
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "198.51.100.1")]).await,
        LIMITED
    );
    // Only the rightmost untrusted entry counts: a client can prepend whatever it likes.
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "203.0.113.66, 198.51.100.2")]).await,
        LIMITED
    );
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn trusted_hops_are_skipped_on_the_forwarded_for_walk() {
    let (upstream, fg) = behind_trusted_proxy().await;
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "9.9.9.9, 127.0.0.1")]).await,
        OK
    );
    // That request counted as 9.9.9.9, whose single token is now spent.
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "9.9.9.9")]).await,
        LIMITED
    );
    // And not as the peer, whose budget is untouched.
    assert_eq!(status(&fg, &[]).await, OK);
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn user_id_from_a_trusted_peer_is_the_identity() {
    let (upstream, fg) = behind_trusted_proxy().await;
    let alice_at_3 = [("X-User-Id", "alice"), ("X-Forwarded-For", "3.3.3.3")];
    assert_eq!(status(&fg, &alice_at_3).await, OK);
    // Alice's budget is spent wherever she comes from ...
    let alice_at_4 = [("X-User-Id", "alice"), ("X-Forwarded-For", "4.4.4.4")];
    assert_eq!(status(&fg, &alice_at_4).await, LIMITED);
    // ... while her address's budget and other users' are untouched.
    assert_eq!(status(&fg, &[("X-Forwarded-For", "3.3.3.3")]).await, OK);
    assert_eq!(status(&fg, &[("X-User-Id", "bob")]).await, OK);
    assert_eq!(upstream.count(), 3);
}

#[tokio::test]
async fn a_malformed_forwarded_for_entry_falls_back_to_the_peer() {
    let (upstream, fg) = behind_trusted_proxy().await;
    assert_eq!(status(&fg, &[("X-Forwarded-For", "garbage")]).await, OK);
    // That spent the peer's (127.0.0.1's) budget: so does every other unbelievable header.
    assert_eq!(status(&fg, &[]).await, LIMITED);
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "1.2.3.4, unknown")]).await,
        LIMITED
    );
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "1.2.3.4:5678")]).await,
        LIMITED
    );
    // The walk stops at the first untrusted entry from the right, before reaching a bad one.
    assert_eq!(
        status(&fg, &[("X-Forwarded-For", "unknown, 5.5.5.5")]).await,
        OK
    );
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn the_api_key_wins_over_user_id_and_forwarded_for() {
    let (upstream, fg) = behind_trusted_proxy().await;
    let key_carol = [
        ("X-API-Key", "key-1"),
        ("X-User-Id", "carol"),
        ("X-Forwarded-For", "7.7.7.7"),
    ];
    assert_eq!(status(&fg, &key_carol).await, OK);
    let key_dave = [
        ("X-API-Key", "key-1"),
        ("X-User-Id", "dave"),
        ("X-Forwarded-For", "8.8.8.8"),
    ];
    assert_eq!(
        status(&fg, &key_dave).await,
        LIMITED,
        "same key, same budget"
    );
    // Neither the user id nor the address behind the keyed request was charged.
    assert_eq!(status(&fg, &[("X-User-Id", "carol")]).await, OK);
    assert_eq!(status(&fg, &[("X-Forwarded-For", "7.7.7.7")]).await, OK);
    assert_eq!(status(&fg, &[("X-API-Key", "key-2")]).await, OK);
    // A blank key is no key: the user id decides, and carol has spent hers.
    let blank_key = [("X-API-Key", " "), ("X-User-Id", "carol")];
    assert_eq!(status(&fg, &blank_key).await, LIMITED);
    assert_eq!(upstream.count(), 4);
}

#[tokio::test]
async fn conflicting_duplicate_api_keys_are_rejected_with_400() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(&upstream, 5, "[]"));
    let client = client();

    let conflicting = client
        .get(fg.url("/who"))
        .header("X-API-Key", "key-a")
        .header("X-API-Key", "key-b")
        .send()
        .await
        .expect("send");
    let reply = Reply::read(conflicting).await;
    assert_problem(&reply, StatusCode::BAD_REQUEST, "bad_request");
    assert_eq!(
        upstream.count(),
        0,
        "a rejected request never reaches the upstream"
    );

    // The same key twice is not ambiguous.
    let repeated = client
        .get(fg.url("/who"))
        .header("X-API-Key", "key-a")
        .header("X-API-Key", "key-a")
        .send()
        .await
        .expect("send");
    assert_eq!(repeated.status(), StatusCode::OK);
    assert_eq!(upstream.count(), 1);
}
