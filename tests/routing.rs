//! Several APIs behind one front door (`hosts:`, `headers:` on a route): real upstreams, one per
//! API, and a real floodgate; requests told apart by their `Host`, an absolute-form target's
//! host, or a header.

mod common;

use common::*;

/// Store settings for a test that counts exactly: a decision may wait 5 s (a loaded machine's
/// store never takes that long; the 50 ms default would fail some decisions open and admit
/// more than the budget), and a store that fails refuses (503), never admits unspent.
const EXACT: &str = "  timeout: 5s\n  on_error: deny\n";

/// Sends a raw HTTP/1.1 request `head` (its lines, CRLF added) to `fg` and returns the status.
async fn raw_status(fg: &Floodgate, head: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = fg
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{}\r\nConnection: close\r\n\r\n",
        head.replace('\n', "\r\n")
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn routes_are_told_apart_by_host_and_header_first_match_wins() {
    let (billing, rides, canary, fallback) = (
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    );
    let fg = Floodgate::start(&format!(
        "routes:
  - name: billing
    hosts: [billing.example.com]
    path_prefix: /
    upstream: {}
  - name: canary
    hosts: [\"*.example.com\"]
    headers: {{X-Canary: \"1\"}}
    path_prefix: /
    upstream: {}
  - name: rides
    hosts: [\"*.example.com\"]
    path_prefix: /
    upstream: {}
  - name: any
    path_prefix: /
    upstream: {}
",
        billing.url(),
        canary.url(),
        rides.url(),
        fallback.url()
    ));
    let client = client();
    let url = fg.url("/v1/x");
    let send = async |headers: &[(&str, &str)]| get(&client, &url, headers).await.status;
    // Exact name, case and port ignored.
    assert_eq!(send(&[("host", "Billing.Example.com:8080")]).await, 200);
    // A subdomain, with and without the header that narrows the canary route.
    assert_eq!(send(&[("host", "rides.example.com")]).await, 200);
    assert_eq!(
        send(&[("host", "eu.rides.example.com"), ("x-canary", "1")]).await,
        200
    );
    assert_eq!(
        send(&[("host", "eu.rides.example.com"), ("x-canary", "0")]).await,
        200
    );
    // The bare domain is not "*.example.com"; another host falls through to `any`.
    assert_eq!(send(&[("host", "example.com")]).await, 200);
    assert_eq!(send(&[("host", "other.test")]).await, 200);
    assert_eq!(billing.count(), 1);
    assert_eq!(canary.count(), 1);
    assert_eq!(rides.count(), 2);
    assert_eq!(fallback.count(), 2);
    // An absolute-form target's host counts over the Host header, as nginx counts it.
    let status = raw_status(
        &fg,
        "GET http://billing.example.com/v1/abs HTTP/1.1\nHost: other.test",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(billing.count(), 2);
}

#[tokio::test]
async fn a_request_no_route_matches_by_host_is_404_no_route() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&format!(
        "routes:\n  - name: billing\n    hosts: [billing.example.com]\n    path_prefix: /\n    upstream: {}\n",
        upstream.url()
    ));
    let client = client();
    let reply = get(&client, &fg.url("/"), &[("host", "rides.example.com")]).await;
    assert_problem(&reply, http::StatusCode::NOT_FOUND, "no_route");
    // An HTTP/1.0 request without Host names no host: no route with hosts matches it.
    assert_eq!(raw_status(&fg, "GET / HTTP/1.0").await, 404);
    assert_eq!(upstream.count(), 0);
}

/// `rewrite_prefix`: the API mounted under `/api/rides/` sees `/request`; no spelling of the
/// path gets past the prefix (it is replaced after normalisation); a redirect it answers under
/// its own root comes back under `/api/rides/`.
#[tokio::test]
async fn a_rewritten_prefix_reaches_the_api_at_its_root_and_its_redirects_come_back() {
    let api = Upstream::start().await;
    let redirecting = RawUpstream::start(
        b"HTTP/1.1 302 Found\r\nLocation: /login?next=%2F\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    let fg = Floodgate::start(&format!(
        "routes:
  - name: rides
    path_prefix: /api/rides/
    rewrite_prefix: /
    upstream: {}
  - name: auth
    path_prefix: /auth/
    rewrite_prefix: /
    upstream: {}
",
        api.url(),
        redirecting.url()
    ));
    let client = client();
    for path in [
        "/api/rides/request?x=1",
        "/api/rides//request?x=1",
        "/api/rides/a/../request?x=1",
    ] {
        assert_eq!(get(&client, &fg.url(path), &[]).await.status, 200, "{path}");
    }
    let seen: Vec<String> = api.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(seen, ["/request"; 3], "{seen:?}");
    // `..` that would climb out of the prefix leaves the route: nothing reaches the API.
    let escaped = get(&client, &fg.url("/api/rides/../admin"), &[]).await;
    assert_eq!(escaped.status, 404);
    assert_eq!(api.count(), 3);
    // A redirect from the API's root comes back under the route's prefix.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let redirect = no_redirects
        .get(fg.url("/auth/start"))
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), 302);
    assert_eq!(redirect.headers()["location"], "/auth/login?next=%2F");
}

/// `request_headers` and `response_headers`: the upstream learns who the client is from headers
/// floodgate sets (a client-sent value of that name is replaced, never forwarded), a header is
/// removed both ways, and floodgate's own 429 carries the route's response headers too.
#[tokio::test]
async fn headers_set_and_removed_tell_the_upstream_the_identity_and_cannot_be_forged() {
    let upstream = Upstream::start().await;
    // acme has the key `test` (its SHA-256 below), tier pro.
    let fg = Floodgate::start(&format!(
        "consumers:
  unknown_key: reject
  entries:
    - name: acme
      tier: pro
      keys_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]
routes:
  - name: api
    path_prefix: /
    upstream: {}
    request_headers:
      set: {{X-Consumer: \"{{consumer}}\", X-Tier: \"{{tier}}\", X-Via-Route: \"{{route}}/{{identity_kind}}\", X-Gateway: floodgate}}
      remove: [X-Debug]
    response_headers:
      set: {{Strict-Transport-Security: max-age=63072000}}
      remove: [X-Powered-By]
    limits:
      - {{algorithm: fixed_window, limit: 1, window: 1h}}
",
        upstream.url()
    ));
    let client = client();
    let reply = get(
        &client,
        &fg.url("/x"),
        &[
            ("x-api-key", "test"),
            ("x-consumer", "forged"),
            ("x-debug", "1"),
        ],
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("strict-transport-security"),
        "max-age=63072000"
    );
    let seen = &upstream.seen()[0];
    assert_eq!(seen.headers.get_all("x-consumer").iter().count(), 1);
    assert_eq!(seen.headers["x-consumer"], "acme");
    assert_eq!(seen.headers["x-tier"], "pro");
    assert_eq!(seen.headers["x-via-route"], "api/consumer");
    assert_eq!(seen.headers["x-gateway"], "floodgate");
    assert!(!seen.headers.contains_key("x-debug"));
    // The raw key is never a variable, and floodgate's own 429 has the route's headers.
    let refused = get(&client, &fg.url("/x"), &[("x-api-key", "test")]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("strict-transport-security"),
        "max-age=63072000"
    );
    assert_eq!(upstream.count(), 1);
}

/// `refund_on` and `spend_on`: a login limit that counts only failed attempts, and a budget
/// whose 404s and 5xx cost nothing; the units come back at the response head, on the store that
/// holds the budget, through two instances when it is shared.
async fn only_the_answers_that_matter_are_counted(storage: &str, instances: usize) {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "admin_listen: 127.0.0.1:0\n{storage}routes:
  - name: login
    path_prefix: /status/
    upstream: {u}
    limits:
      - {{algorithm: fixed_window, limit: 5, window: 1h, spend_on: [401]}}
      - {{algorithm: token_bucket, capacity: 10, refill_rate: 0.001, refund_on: [404, \"5xx\"]}}
",
        u = upstream.url()
    );
    let fgs: Vec<Floodgate> = (0..instances).map(|_| Floodgate::start(&yaml)).collect();
    let client = client();
    let key = [("x-api-key", "k")];
    let mut n = 0;
    let mut status = async |path: &str| {
        n += 1;
        get(&client, &fgs[n % fgs.len()].url(path), &key)
            .await
            .status
            .as_u16()
    };
    // Not found and server errors, more than the bucket holds: neither limit keeps a unit.
    for i in 0..12 {
        let (path, code) = [("/status/404", 404), ("/status/503", 503)][i % 2];
        assert_eq!(status(path).await, code, "{path}");
    }
    // Two successes spend the bucket (10) but not the login window.
    assert_eq!(status("/status/200").await, 200);
    assert_eq!(status("/status/200").await, 200);
    // Five failed logins spend the window (and the bucket: 7 of 10); the sixth is stopped by
    // the window.
    for _ in 0..5 {
        assert_eq!(status("/status/401").await, 401);
    }
    assert_eq!(status("/status/401").await, 429);
    assert_eq!(upstream.count(), 19);
    let refunded = metric(
        &fgs[0],
        r#"floodgate_cost_units_total{route="login",limit="login-1",outcome="refunded"}"#,
    )
    .await;
    assert!(refunded >= 1, "refunds of the bucket counted: {refunded}");
    // `/budgets` shows what was kept, on every instance: the window spent by the five failed
    // logins, the bucket by those and the two successes (3 of 10), nothing for the 404s and
    // 503s.
    for fg in &fgs {
        let budgets = get(
            &client,
            &fg.admin_url("/budgets?route=login&api_key=k"),
            &[],
        )
        .await
        .json();
        let remaining: Vec<u64> = budgets["limits"]
            .as_array()
            .expect("limits")
            .iter()
            .map(|l| l["remaining"].as_u64().unwrap())
            .collect();
        assert_eq!(remaining, [0, 3], "{budgets}");
    }
}

#[tokio::test]
async fn only_the_answers_that_matter_are_counted_in_memory() {
    only_the_answers_that_matter_are_counted("", 1).await;
}

/// `storage:` for `backend` at `url`, counting exactly.
fn shared(backend: &str, url: &str) -> String {
    format!("storage:\n  backend: {backend}\n  url: {url}\n{EXACT}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_answers_that_matter_are_counted_on_redis_by_two_instances() {
    let redis = RedisServer::start();
    only_the_answers_that_matter_are_counted(&shared("redis", &redis.url()), 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_answers_that_matter_are_counted_on_postgres_by_two_instances() {
    let postgres = PostgresServer::start();
    only_the_answers_that_matter_are_counted(&shared("postgres", &postgres.url()), 2).await;
}

/// Over HTTP/2 the host is the `:authority` (here a name resolved by the client to floodgate),
/// and the route's response headers go on floodgate's own 502 too.
#[tokio::test]
async fn http2_routes_by_authority_and_a_502_carries_the_routes_headers() {
    let upstream = Upstream::start().await;
    let dead = closed_port_addr();
    let fg = Floodgate::start(&format!(
        "routes:
  - name: billing
    hosts: [billing.example.com]
    path_prefix: /
    upstream: {}
    response_headers: {{set: {{X-Api: billing}}}}
  - name: broken
    hosts: [broken.example.com]
    path_prefix: /
    upstream: http://{dead}
    response_headers: {{set: {{X-Api: broken}}}}
",
        upstream.url()
    ));
    let addr: std::net::SocketAddr = fg
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .resolve("billing.example.com", addr)
        .resolve("broken.example.com", addr)
        .build()
        .unwrap();
    let port = addr.port();
    let ok = h2
        .get(format!("http://billing.example.com:{port}/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.version(), reqwest::Version::HTTP_2);
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["x-api"], "billing");
    assert_eq!(upstream.count(), 1);
    let broken = h2
        .get(format!("http://broken.example.com:{port}/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(broken.status(), 502);
    assert_eq!(broken.headers()["x-api"], "broken");
}
