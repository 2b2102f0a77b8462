//! The request pipeline in process: floodgate's `Proxy` and `Server` built from a config inside
//! the test (no child process), on port 0, in front of the test upstream, with the memory store on
//! a clock the test moves. Each phase's early exit, and time, without sleeping.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::config::{Config, Limit, Route};
use common::{Upstream, client, get};
use floodgate::limiter::{Limiter, ManualClock, MemoryStore};
use floodgate::metrics::Metrics;
use floodgate::proxy::Proxy;
use floodgate::server::Server;
use http::StatusCode;
use tokio::sync::oneshot;

const T0: u64 = 1_700_000_000_000_000;

/// floodgate serving `yaml` in this process; stops when dropped.
struct InProcess {
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    proxy: Arc<Proxy>,
    clock: Arc<ManualClock>,
    stop: Option<oneshot::Sender<()>>,
}

impl InProcess {
    async fn start(config: &Config) -> InProcess {
        let config = parsed(config);
        let clock = Arc::new(ManualClock::new(T0));
        let limiter = Limiter::Memory(Arc::new(MemoryStore::new(clock.clone(), 1000)));
        let metrics = Arc::new(Metrics::with_limiter(&limiter));
        let proxy = Arc::new(Proxy::new(&config, limiter, metrics));
        let server = Server::bind(&config, proxy.clone(), None)
            .await
            .expect("bind");
        let addr = server.local_addr().expect("addr");
        let admin = server.admin_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        InProcess {
            addr,
            admin,
            proxy,
            clock,
            stop: Some(stop),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin.expect("admin_listen set"))
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// `config` as floodgate reads it, on port 0.
fn parsed(config: &Config) -> floodgate::config::Config {
    floodgate::config::Config::from_yaml(&config.clone().with("listen", "127.0.0.1:0").yaml())
        .expect("config")
}

/// One route, `/api` → `upstream`, with `limits`.
fn one_route(upstream: &Upstream, limits: impl IntoIterator<Item = Limit>) -> Config {
    Config::new().route(Route::new("api", "/api", &upstream.url()).limits(limits))
}

#[tokio::test]
async fn each_phase_answers_its_own_early_exit() {
    let upstream = Upstream::start().await;
    let fg =
        InProcess::start(&one_route(&upstream, [Limit::token_bucket(1, 1.0)]).consumers("reject"))
            .await;
    let client = client();
    // Route: nothing matches.
    let reply = get(&client, &fg.url("/elsewhere"), &[]).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.json()["error"], "no_route");
    // Identify: two different API keys on one request are a conflict.
    let reply = get(
        &client,
        &fg.url("/api"),
        &[("x-api-key", "a"), ("x-api-key", "b")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    // Identify: a key no consumer has.
    let reply = get(&client, &fg.url("/api"), &[("x-api-key", "who")]).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    // Limit: the first passes and is forwarded, the second is denied.
    assert_eq!(
        get(&client, &fg.url("/api"), &[]).await.status,
        StatusCode::OK
    );
    let reply = get(&client, &fg.url("/api"), &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), "1");
    assert_eq!(
        upstream.count(),
        1,
        "only the admitted request was forwarded"
    );
}

#[tokio::test]
async fn a_denied_client_passes_exactly_when_the_clock_reaches_retry_after() {
    let upstream = Upstream::start().await;
    let fg = InProcess::start(&one_route(&upstream, [Limit::token_bucket(2, 0.5)])).await;
    let client = client();
    let url = fg.url("/api");
    assert_eq!(get(&client, &url, &[]).await.status, StatusCode::OK);
    assert_eq!(get(&client, &url, &[]).await.status, StatusCode::OK);
    let denied = get(&client, &url, &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), "2", "one token every 2 s");
    // One microsecond short of the refill: still denied. At it: admitted. No sleeping.
    fg.clock.advance(Duration::from_micros(2_000_000 - 1));
    assert_eq!(
        get(&client, &url, &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    fg.clock.advance(Duration::from_micros(1));
    let reply = get(&client, &url, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("x-ratelimit-remaining"), "0");
}

#[tokio::test]
async fn a_reload_keeps_the_state_of_unchanged_limits_and_resets_changed_ones() {
    let upstream = Upstream::start().await;
    let route_cap = Limit::fixed_window(3, "1h").per("route");
    let fg = InProcess::start(&one_route(
        &upstream,
        [Limit::fixed_window(2, "1h"), route_cap.clone()],
    ))
    .await;
    let client = client();
    let url = fg.url("/api");
    for _ in 0..2 {
        assert_eq!(get(&client, &url, &[]).await.status, StatusCode::OK);
    }
    assert_eq!(
        get(&client, &url, &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The client's limit goes from 2 to 5; the route cap (3, of which 2 are spent) is unchanged.
    let changed = one_route(&upstream, [Limit::fixed_window(5, "1h"), route_cap]);
    fg.proxy.reload(&parsed(&changed));
    assert_eq!(get(&client, &url, &[]).await.status, StatusCode::OK);
    assert_eq!(
        get(&client, &url, &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the route cap kept its count across the reload"
    );
}

#[tokio::test]
async fn budgets_show_a_budget_spent_and_restored_and_never_spend_it() {
    let upstream = Upstream::start().await;
    let fg = InProcess::start(&one_route(
        &upstream,
        [
            Limit::token_bucket(3, 1.0),
            Limit::fixed_window(100, "1h").per("route"),
            Limit::token_bucket(9, 1.0).per("ip"),
        ],
    ))
    .await;
    let client = client();
    let budgets = fg.admin_url("/budgets?route=api&api_key=k1&ip=127.0.0.1");
    let remaining = |v: &serde_json::Value| -> Vec<u64> {
        v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["remaining"].as_u64().unwrap())
            .collect()
    };
    let before = get(&client, &budgets, &[]).await;
    assert_eq!(before.status, StatusCode::OK);
    let v = before.json();
    assert_eq!(v["route"], "api");
    assert_eq!(v["limits"][0]["algorithm"], "token_bucket");
    assert_eq!(v["limits"][0]["per"], "identity");
    assert_eq!(v["limits"][0]["limit"], 3);
    assert_eq!(v["limits"][1]["per"], "route");
    assert_eq!(remaining(&v), vec![3, 100, 9]);
    // Two requests spend two of each.
    for _ in 0..2 {
        let r = get(&client, &fg.url("/api"), &[("x-api-key", "k1")]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    assert_eq!(
        remaining(&get(&client, &budgets, &[]).await.json()),
        vec![1, 98, 7]
    );
    // Asking a thousand times spends nothing: the one token left still admits a request.
    for _ in 0..1000 {
        get(&client, &budgets, &[]).await;
    }
    assert_eq!(
        remaining(&get(&client, &budgets, &[]).await.json()),
        vec![1, 98, 7]
    );
    assert_eq!(
        get(&client, &fg.url("/api"), &[("x-api-key", "k1")])
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        remaining(&get(&client, &budgets, &[]).await.json()),
        vec![0, 97, 6]
    );
    // Three seconds later (the manual clock) the bucket of 3 at 1/s is full again.
    fg.clock.advance(Duration::from_secs(3));
    assert_eq!(
        remaining(&get(&client, &budgets, &[]).await.json()),
        vec![3, 97, 9]
    );
}

#[tokio::test]
async fn budgets_answer_404_for_an_unknown_route_and_400_without_an_identity() {
    let upstream = Upstream::start().await;
    let fg = InProcess::start(&one_route(&upstream, [Limit::token_bucket(3, 1.0)])).await;
    let client = client();
    let r = get(
        &client,
        &fg.admin_url("/budgets?route=nope&ip=127.0.0.1"),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["error"], "no_route");
    let r = get(&client, &fg.admin_url("/budgets?route=api"), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"], "missing_identity");
    let r = get(
        &client,
        &fg.admin_url("/budgets?route=api&ip=not-an-ip"),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn budgets_key_an_ipv6_client_by_its_prefix_as_the_proxy_does() {
    let upstream = Upstream::start().await;
    // The test client is 127.0.0.1, trusted, so its X-Forwarded-For names the client.
    let fg = InProcess::start(
        &one_route(&upstream, [Limit::token_bucket(3, 0.001)]).trusted_proxies("[127.0.0.1]"),
    )
    .await;
    let client = client();
    let spent = get(
        &client,
        &fg.url("/api"),
        &[("x-forwarded-for", "2001:db8::7")],
    )
    .await;
    assert_eq!(spent.status, StatusCode::OK);
    // Another address of the same /64 has the same budget, one token down.
    let v = get(
        &client,
        &fg.admin_url("/budgets?route=api&ip=2001:db8::ffff:1"),
        &[],
    )
    .await
    .json();
    assert_eq!(v["limits"][0]["remaining"], 2, "{v}");
}
