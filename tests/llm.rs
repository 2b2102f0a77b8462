//! Token budgets for an LLM API (`cost: {reserve, actual}`), end to end: the openai Python SDK
//! (`tests/llm/client.py`, in the venv `scripts/test.sh` makes) calls floodgate in front of the
//! demo upstream's OpenAI-compatible `/v1/chat/completions`, plain and streamed; floodgate holds
//! each call's `max_tokens` and settles at the `usage` the response reports.

mod common;

use std::time::{Duration, Instant};

use common::{DemoUpstream, Floodgate, PostgresServer, RedisServer, client, get, metric, python};
use serde_json::Value;

/// One call through the SDK: `mode` plain or stream, `max_tokens` (the reserve), the completion
/// the demo makes before `max_tokens` cuts it, the prompt's words.
fn call(fg: &Floodgate, key: &str, call: (&str, u64, u64, u64), retries: u32) -> Value {
    call_with(fg, key, call, retries, "{}")
}

/// [`call`] with more request headers (`headers`, a JSON object) for the demo.
fn call_with(
    fg: &Floodgate,
    key: &str,
    call: (&str, u64, u64, u64),
    retries: u32,
    headers: &str,
) -> Value {
    let (mode, max_tokens, completion, words) = call;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/llm/client.py");
    let out = std::process::Command::new(python())
        .arg(&script)
        .args(["call", &fg.url("/v1"), key, mode])
        .args([max_tokens, completion, words].map(|n| n.to_string()))
        .arg(retries.to_string())
        .arg(headers)
        .output()
        .expect("run client.py");
    assert!(
        out.status.success(),
        "client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client.py prints JSON")
}

/// A route `/v1/` to `upstream` whose limits are `limits` (YAML list items), on `storage`.
fn config(upstream: &str, storage: &str, limits: &str) -> String {
    format!(
        "admin_listen: 127.0.0.1:0\nidentity:\n  api_key_header: Authorization\n{storage}\nroutes:\n  - name: chat\n    \
         path_prefix: /v1/\n    upstream: {upstream}\n    limits:\n{limits}"
    )
}

/// A token bucket of `capacity` tokens refilled at `rate` a second, per API key, holding each
/// call's `max_tokens` (at most `max`; when absent, `max` or 500 if less) and settling at
/// `usage.total_tokens`.
fn token_budget(capacity: u64, rate: &str, max: u64) -> String {
    let default = max.min(500);
    format!(
        "      - algorithm: token_bucket\n        capacity: {capacity}\n        refill_rate: {rate}\n        \
         cost:\n          reserve: {{json: max_tokens, default: {default}, max: {max}}}\n          \
         actual: {{json: usage.total_tokens}}\n"
    )
}

async fn cost(fg: &Floodgate, outcome: &str) -> u64 {
    metric(
        fg,
        &format!(
            "floodgate_cost_units_total{{route=\"chat\",limit=\"chat-0\",outcome=\"{outcome}\"}}"
        ),
    )
    .await
}

/// The settlement runs once the response has ended, after the client has read it: wait (a few
/// ms; up to `DRAIN_DEADLINE` on a loaded machine) until the settled units reach `want`.
async fn settled(fg: &Floodgate, want: u64) {
    let deadline = Instant::now() + common::DRAIN_DEADLINE;
    while cost(fg, "settled").await < want {
        assert!(
            Instant::now() < deadline,
            "settled units never reached {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn remaining(fg: &Floodgate, key: &str) -> u64 {
    let url = fg.admin_url(&format!("/budgets?route=chat&api_key={key}"));
    get(&client(), &url, &[]).await.json()["limits"][0]["remaining"]
        .as_u64()
        .expect("remaining")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_holds_max_tokens_and_settles_at_the_usage_plain_and_streamed() {
    let demo = DemoUpstream::start(8, "1ms", "5s");
    // A refill of one token a minute: nothing comes back during the test. The access log on.
    let fg = Floodgate::start_with_env(
        &config(demo.url(), "", &token_budget(1000, "0.016", 1000)),
        &[("RUST_LOG", "warn,floodgate::access=info")],
    );

    // Plain: 200 held, 3 + 40 used: 157 refunded.
    let plain = call(&fg, "alice", ("plain", 200, 40, 3), 0);
    assert_eq!(plain["usage"]["total_tokens"], 43, "{plain}");
    settled(&fg, 43).await;
    assert_eq!(cost(&fg, "reserved").await, 200);
    assert_eq!(cost(&fg, "refunded").await, 157);
    // Streamed, the usage in the last event: 100 held, 3 + 30 used.
    let streamed = call(&fg, "alice", ("stream", 100, 30, 3), 0);
    assert_eq!(streamed["usage"]["total_tokens"], 33, "{streamed}");
    assert_eq!(streamed["words"], 30, "the stream reached the client whole");
    settled(&fg, 76).await;
    // A reserve that lied: max_tokens 10, but the prompt's 50 words count too: 50 charged.
    let lie = call(&fg, "alice", ("plain", 10, 40, 50), 0);
    assert_eq!(lie["usage"]["total_tokens"], 60, "{lie}");
    settled(&fg, 136).await;
    assert_eq!(cost(&fg, "charged").await, 50);
    assert_eq!(cost(&fg, "reserved").await, 310);
    assert_eq!(cost(&fg, "refunded").await, 157 + 67);
    assert_eq!(remaining(&fg, "alice").await, 1000 - 136);

    // A reserve that cannot be held (1000 > 864 left) is refused, and the SDK says so as a
    // RateLimitError with the server's Retry-After.
    let refused = call(&fg, "alice", ("plain", 1000, 10, 1), 0);
    assert_eq!(refused["ok"], false, "{refused}");
    assert_eq!(refused["status"], 429);
    assert!(refused["retry_after"].as_str().is_some(), "{refused}");
    assert_eq!(cost(&fg, "reserved").await, 310, "a refusal holds nothing");
    // bob's budget is his own; his prompt costs more than all of it: charged as the capacity
    // (`actual.max`'s default), he is in debt, and refused until he has refilled past it.
    let heavy = call(&fg, "bob", ("plain", 10, 10, 995), 0);
    assert_eq!(heavy["usage"]["total_tokens"], 1005);
    settled(&fg, 136 + 1000).await;
    assert_eq!(remaining(&fg, "bob").await, 0);
    let in_debt = call(&fg, "bob", ("plain", 1, 1, 1), 0);
    assert_eq!(in_debt["status"], 429, "{in_debt}");
    assert_eq!(remaining(&fg, "alice").await, 864, "alice is not bob");
    // Each call's line, written once it was settled, says what it reserved and settled.
    let log = fg.stderr();
    for figures in ["0=200/43", "0=100/33", "0=10/60", "0=10/1000"] {
        assert!(
            log.contains(figures),
            "{figures} not in the access log:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_answers_settle_at_their_usage_in_every_coding() {
    let demo = DemoUpstream::start(8, "1ms", "5s");
    let fg = Floodgate::start(&config(
        demo.url(),
        "",
        &token_budget(10_000, "0.016", 1000),
    ));
    // The SDK accepts gzip, deflate, br and zstd; the demo answers in the coding asked for,
    // plain and streamed (each event flushed). Each call holds 1000 and uses 3 + 40.
    let mut want = 0;
    for coding in ["gzip", "deflate", "br", "zstd"] {
        for mode in ["plain", "stream"] {
            let headers = format!(r#"{{"x-demo-content-encoding": "{coding}"}}"#);
            let answer = call_with(&fg, "dora", (mode, 1000, 40, 3), 0, &headers);
            assert_eq!(
                answer["usage"]["total_tokens"], 43,
                "{coding} {mode}: {answer}"
            );
            want += 43;
            settled(&fg, want).await;
        }
    }
    assert_eq!(
        cost(&fg, "settled").await,
        8 * 43,
        "each settled at its usage"
    );
    assert_eq!(cost(&fg, "refunded").await, 8 * (1000 - 43));
    assert_eq!(remaining(&fg, "dora").await, 10_000 - 8 * 43);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_short_settles_at_its_reserve_whatever_an_early_event_said() {
    let demo = DemoUpstream::start(8, "1ms", "5s");
    let fg = Floodgate::start(&config(
        demo.url(),
        "",
        &token_budget(10_000, "0.016", 1000),
    ));
    // The first event says 1 token was used (as Anthropic's message_start does); the upstream
    // breaks off after three events: the call costs its reserve of 300, not 1.
    for coding in ["identity", "gzip"] {
        let headers =
            format!(r#"{{"x-demo-cut-after": "3", "x-demo-content-encoding": "{coding}"}}"#);
        let broken = call_with(&fg, "erin", ("stream", 300, 40, 3), 0, &headers);
        assert_eq!(broken["ok"], false, "{coding}: {broken}");
    }
    settled(&fg, 600).await;
    assert_eq!(cost(&fg, "settled").await, 600, "settled at the reserves");
    assert_eq!(cost(&fg, "refunded").await, 0);
    assert_eq!(remaining(&fg, "erin").await, 10_000 - 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_retries_a_429_after_its_retry_after_and_gets_through() {
    let demo = DemoUpstream::start(8, "1ms", "5s");
    // 100 tokens, 25 a second back.
    let fg = Floodgate::start(&config(demo.url(), "", &token_budget(100, "25", 100)));
    // 150 used of 100, charged as 100 (`actual.max`'s default, the capacity): the next call
    // must wait for its own reserve's refill, 4 s, longer than the second SDK process takes to
    // start (about 1 s; a debt that only needed 1 s let a slow start pass without a 429). The
    // SDK reads Retry-After and tries again (at most 3 times).
    let first = call(&fg, "carol", ("plain", 100, 100, 50), 0);
    assert_eq!(first["usage"]["total_tokens"], 150);
    settled(&fg, 100).await;
    let again = call(&fg, "carol", ("stream", 100, 20, 5), 3);
    assert_eq!(again["ok"], true, "{again}");
    assert_eq!(again["usage"]["total_tokens"], 25);
    let denied = metric(
        &fg,
        "floodgate_requests_total{route=\"chat\",decision=\"denied\"}",
    )
    .await;
    assert!(
        denied >= 1,
        "the SDK met at least one 429 before it got through"
    );
}

/// Two instances on one store share a token budget per key; 32 clients of one key call them
/// at once until it is spent. What the budget admitted may exceed it only by what calls used
/// beyond their reserves (the reserves' error), never by the number in flight; what the store
/// keeps is exactly the budget less what the responses said they used.
///
/// `storage` says `on_error: deny`, so that a decision the store did not take shows as a 503
/// (and fails the test) instead of passing unlimited, and a `timeout` of 2 s: on two cores
/// shared by two instances, the store, the upstream and 32 clients, a decision on one hot row
/// can take longer than the default 50 ms, and this test is about exactness, not latency.
async fn two_instances_share_a_token_budget_exactly(storage: &str) {
    const BUDGET: u64 = 20_000;
    let demo = DemoUpstream::start(64, "5ms", "10s");
    // A refill of one token a minute: under one token in the test.
    let yaml = config(demo.url(), storage, &token_budget(BUDGET, "0.016", 400));
    let a = Floodgate::start(&yaml);
    let b = Floodgate::start(&yaml);
    // Both ready (connected, schema installed) before the clients come.
    for fg in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(20);
        while get(&client(), &fg.admin_url("/readyz"), &[]).await.status != 200 {
            assert!(Instant::now() < deadline, "never ready: {}", fg.stderr());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/llm/client.py");
    let out = tokio::process::Command::new(python())
        .arg(&script)
        .args([
            "load",
            "shared-key",
            "32",
            "12",
            &a.url("/v1"),
            &b.url("/v1"),
        ])
        .output()
        .await
        .expect("run client.py");
    assert!(
        out.status.success(),
        "client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    eprintln!("{seen}");
    assert_eq!(seen["other"], serde_json::json!({}), "only 200s and 429s");
    let n = |k: &str| seen[k].as_u64().unwrap();
    let (used, error) = (n("settled"), n("reserve_error"));
    assert!(n("refused") > 0, "the budget ran out: {seen}");
    assert!(
        used <= BUDGET + error,
        "{used} tokens used of a budget of {BUDGET} with reserves {error} short"
    );
    // Both instances settled what the clients saw used, and the store holds the rest.
    let deadline = Instant::now() + common::DRAIN_DEADLINE;
    loop {
        let settled_units = cost(&a, "settled").await + cost(&b, "settled").await;
        if settled_units == used {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "settled {settled_units}, the clients saw {used}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = remaining(&a, "shared-key").await;
    assert_eq!(left, BUDGET.saturating_sub(used), "{seen}");
    assert_eq!(remaining(&b, "shared-key").await, left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_share_a_token_budget_exactly() {
    let redis = RedisServer::start();
    let storage = format!(
        "storage:\n  backend: redis\n  url: {}\n  on_error: deny\n  timeout: 2s",
        redis.url()
    );
    two_instances_share_a_token_budget_exactly(&storage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_postgres_share_a_token_budget_exactly() {
    let postgres = PostgresServer::start();
    let storage = format!(
        "storage:\n  backend: postgres\n  url: {}\n  on_error: deny\n  timeout: 2s",
        postgres.url()
    );
    two_instances_share_a_token_budget_exactly(&storage).await;
}
