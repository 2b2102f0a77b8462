//! `X-RateLimit-Reset` and `Retry-After` on every path that answers 429: the memory store, the
//! Redis store, the deny cache in front of it, and the in-process fallback when Redis is down
//! (`on_error: local`). Reset is a Unix time within the limit's window of now, and Retry-After
//! names the same instant.

mod common;

use common::config::{Config, Limit, Route};
use common::{Floodgate, RedisServer, Reply, Upstream, client, closed_port_addr, get, unix_now};

/// `stored` with its one route: a fixed window of 2 per 30 s, so a denial's earliest retry and
/// the budget's full reset are the same instant: the window's end.
fn config(stored: Config, upstream: &Upstream) -> String {
    stored
        .route(Route::new("api", "/", &upstream.url()).limit(Limit::fixed_window(2, "30s")))
        .yaml()
}

/// Checks one 429: Reset within the window of now, and Retry-After landing on it.
fn assert_reset_is_unix_time(reply: &Reply, path: &str) {
    assert_eq!(reply.status, 429, "{path}: {reply:?}");
    let now = unix_now();
    let reset = reply.header_u64("x-ratelimit-reset");
    // Whole seconds both ways, and the request took a moment: one second of slack either side.
    assert!(
        reset + 1 >= now && reset <= now + 30 + 1,
        "{path}: X-RateLimit-Reset {reset} is not within 30 s of now ({now})"
    );
    let retry_after = reply.header_u64("retry-after");
    let retry_at = reply.received_unix_ms / 1000 + retry_after;
    assert!(
        retry_at.abs_diff(reset) <= 1,
        "{path}: Retry-After {retry_after} lands at {retry_at}, the reset is {reset}"
    );
}

/// Spends the budget (2), then returns the next `denials` replies, all expected to be 429s.
async fn spend_then_deny(fg: &Floodgate, denials: usize) -> Vec<Reply> {
    let http = client();
    for _ in 0..2 {
        assert_eq!(get(&http, &fg.url("/"), &[]).await.status, 200);
    }
    let mut replies = Vec::new();
    for _ in 0..denials {
        replies.push(get(&http, &fg.url("/"), &[]).await);
    }
    replies
}

#[tokio::test]
async fn the_memory_store_answers_429_with_a_unix_reset() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&config(Config::new(), &upstream));
    for reply in spend_then_deny(&fg, 3).await {
        assert_reset_is_unix_time(&reply, "memory");
    }
}

#[tokio::test]
async fn redis_and_its_deny_cache_answer_429_with_a_unix_reset() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let stored = Config::new()
        .storage("backend", "redis")
        .storage("url", &redis.url())
        .storage("timeout", "500ms");
    let fg = Floodgate::start(&config(stored, &upstream));
    let replies = spend_then_deny(&fg, 4).await;
    // The first denial is the store's; the store was asked once for the rest of them at most
    // (each later one is the deny cache's answer).
    assert_reset_is_unix_time(&replies[0], "redis");
    for reply in &replies[1..] {
        assert_reset_is_unix_time(reply, "deny cache");
    }
    let hits = common::metric(&fg, "floodgate_deny_cache_hits_total").await;
    assert!(
        hits >= 3,
        "the later denials came from the deny cache: {hits}"
    );
}

#[tokio::test]
async fn the_local_fallback_answers_429_with_a_unix_reset_while_redis_is_down() {
    let upstream = Upstream::start().await;
    let stored = Config::new()
        .redis(&format!("redis://{}", closed_port_addr()), "local")
        .storage("timeout", "50ms");
    let fg = Floodgate::start(&config(stored, &upstream));
    for reply in spend_then_deny(&fg, 3).await {
        assert_reset_is_unix_time(&reply, "local fallback");
    }
}
