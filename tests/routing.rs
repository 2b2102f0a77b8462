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

/// Sends `request` (whole, as raw bytes) to `fg` and returns the status of its answer.
async fn raw_bytes_status(fg: &Floodgate, request: &[u8]) -> u16 {
    let answer = raw_exchange(fg.addr(), request).await;
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Sends one HTTP/2 request (h2, so that `:authority` and `host` can disagree and a value can
/// keep its white space) and returns its status.
async fn h2_status(fg: &Floodgate, uri: &str, headers: &[(&str, &[u8])]) -> u16 {
    let tcp = tokio::net::TcpStream::connect(fg.addr()).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let mut request = http::Request::get(uri);
    for (name, value) in headers {
        request = request.header(*name, http::HeaderValue::from_bytes(value).unwrap());
    }
    let (response, _) = client
        .send_request(request.body(()).unwrap(), true)
        .unwrap();
    response.await.map(|r| r.status().as_u16()).unwrap_or(0)
}

/// One host per request: the target's (absolute form, `:authority`) over `Host`, valid or 400,
/// and the upstream told the host that was routed on; a client's `X-Forwarded-Host` without a
/// host is not passed on. Each upstream records heads byte for byte.
#[tokio::test]
async fn the_upstream_is_told_the_host_routed_on_and_invalid_hosts_are_refused() {
    let (b, any) = (
        RecordingUpstream::start().await,
        RecordingUpstream::start().await,
    );
    let fg = Floodgate::start(&format!(
        "routes:
  - name: b
    hosts: [b.example]
    path_prefix: /
    upstream: {}
  - name: any
    path_prefix: /
    upstream: {}
",
        b.url(),
        any.url()
    ));
    // The absolute form wins (RFC 9112 §3.2.2), and X-Forwarded-Host says so.
    let status = raw_bytes_status(
        &fg,
        b"GET http://b.example/abs HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(b.values(0, "x-forwarded-host"), ["b.example"]);
    // HTTP/2: `:authority` over a `host` field that disagrees.
    let status = h2_status(&fg, "http://b.example/h2", &[("host", b"a.example")]).await;
    assert_eq!(status, 200);
    assert_eq!(b.values(1, "x-forwarded-host"), ["b.example"]);
    assert_eq!(b.heads().len(), 2);
    // Hosts a parser behind would read as b.example (or as anything) never reach a route.
    for host in [
        &b"b.example@a.example"[..],
        b"a.example, b.example",
        b"other.test, b.example",
        "b\u{fc}cher.example".as_bytes(),
        b"b.example:80:80",
    ] {
        let mut request = b"GET / HTTP/1.1\r\nHost: ".to_vec();
        request.extend_from_slice(host);
        request.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        let status = raw_bytes_status(&fg, &request).await;
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(host));
    }
    let status = raw_bytes_status(
        &fg,
        b"GET http://user@b.example/ HTTP/1.1\r\nHost: b.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 400, "user information in the target");
    assert!(any.heads().is_empty(), "{:?}", any.heads());
    assert_eq!(b.heads().len(), 2);
    // No host at all: the client's own X-Forwarded-Host is not believed.
    let status = raw_bytes_status(
        &fg,
        b"GET /old HTTP/1.0\r\nX-Forwarded-Host: b.example\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(any.values(0, "x-forwarded-host"), Vec::<String>::new());
    let status = h2_status(&fg, "/no-authority", &[("x-forwarded-host", b"b.example")]).await;
    // An HTTP/2 request without `:authority` or `host` (h2 sends an origin-form target so).
    assert_eq!(status, 200);
    assert_eq!(any.values(1, "x-forwarded-host"), Vec::<String>::new());
}

/// A header-matched route reads the field's combined value: two lines are one list, and an
/// HTTP/2 value padded with white space is malformed (400), not a way to another route.
#[tokio::test]
async fn a_header_matched_route_reads_the_fields_combined_value() {
    let (tenant_a, any) = (Upstream::start().await, Upstream::start().await);
    let fg = Floodgate::start(&format!(
        "routes:
  - name: a
    headers: {{X-Tenant: a}}
    path_prefix: /
    upstream: {}
  - name: any
    path_prefix: /
    upstream: {}
",
        tenant_a.url(),
        any.url()
    ));
    let two_lines = raw_bytes_status(
        &fg,
        format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nX-Tenant: a\r\nX-Tenant: b\r\nConnection: close\r\n\r\n",
            fg.addr()
        )
        .as_bytes(),
    )
    .await;
    let one_line = raw_bytes_status(
        &fg,
        format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nX-Tenant: a, b\r\nConnection: close\r\n\r\n",
            fg.addr()
        )
        .as_bytes(),
    )
    .await;
    assert_eq!((two_lines, one_line), (200, 200));
    assert_eq!(
        tenant_a.count(),
        0,
        "\"a, b\" is not \"a\", however it is split"
    );
    assert_eq!(any.count(), 2);
    let url = format!("http://{}/", fg.addr());
    for padded in [&b" a"[..], b"a\t"] {
        assert_eq!(h2_status(&fg, &url, &[("x-tenant", padded)]).await, 400);
    }
    assert_eq!(h2_status(&fg, &url, &[("x-tenant", b"a")]).await, 200);
    assert_eq!((tenant_a.count(), any.count()), (1, 2));
}

/// A rewrite replaces whole segments: no spelling of a path under `/api/v1` (`v1..`, its
/// escapes, the absolute form, HTTP/2) is forwarded outside `/internal/`.
#[tokio::test]
async fn a_rewrite_never_climbs_out_of_its_prefix() {
    let (internal, any) = (
        RecordingUpstream::start().await,
        RecordingUpstream::start().await,
    );
    let fg = Floodgate::start(&format!(
        "routes:
  - name: v1
    path_prefix: /api/v1
    rewrite_prefix: /internal/
    upstream: {}
  - name: any
    path_prefix: /
    upstream: {}
",
        internal.url(),
        any.url()
    ));
    let host = fg.addr().to_string();
    for target in [
        "/api/v1../admin".to_string(),
        "/api/v1%2e%2e/admin".to_string(),
        "/api/v1%2E%2E/admin".to_string(),
        format!("http://{host}/api/v1../admin"),
    ] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        raw_bytes_status(&fg, request.as_bytes()).await;
    }
    h2_status(&fg, &format!("http://{host}/api/v1../admin"), &[]).await;
    for ok in ["/api/v1", "/api/v1/x", "/api/v1/a/../y"] {
        let request = format!("GET {ok} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        assert_eq!(raw_bytes_status(&fg, request.as_bytes()).await, 200, "{ok}");
    }
    let lines = internal.request_lines();
    assert_eq!(
        lines,
        [
            "GET /internal/ HTTP/1.1",
            "GET /internal/x HTTP/1.1",
            "GET /internal/y HTTP/1.1"
        ]
    );
    // The others went to the catch-all, as the paths they are.
    for line in any.request_lines() {
        assert!(line.starts_with("GET /api/v1../admin "), "{line}");
    }
    assert_eq!(any.heads().len(), 5);
}

/// What `request_headers` sets reaches the upstream whatever the client lists in `Connection`,
/// and an underscored spelling of it (`X_Consumer`, which CGI reads as `X-Consumer`) is dropped,
/// unless `underscores_in_headers: true`.
#[tokio::test]
async fn set_headers_survive_connection_and_underscored_spellings() {
    for keep in [false, true] {
        let upstream = RecordingUpstream::start().await;
        let fg = Floodgate::start(&format!(
            "underscores_in_headers: {keep}
routes:
  - name: api
    path_prefix: /
    upstream: {}
    request_headers:
      set: {{X-Consumer: gateway-set}}
",
            upstream.url()
        ));
        let request = format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close, X-Consumer, X-Dropped\r\nX-Dropped: 1\r\nX_Consumer: forged\r\n\r\n",
            fg.addr()
        );
        assert_eq!(raw_bytes_status(&fg, request.as_bytes()).await, 200);
        assert_eq!(upstream.values(0, "x-consumer"), ["gateway-set"]);
        assert!(upstream.values(0, "x-dropped").is_empty());
        let underscored = upstream.values(0, "x_consumer");
        match keep {
            false => assert!(underscored.is_empty(), "{underscored:?}"),
            true => assert_eq!(underscored, ["forged"]),
        }
    }
}

/// `spend_on` settles at the response head: a 200 whose body is still streaming has already
/// given its login unit back, so the next failed login is answered by the upstream, not 429.
/// The upstream holds the 200's body until the test releases it (no timing involved).
#[tokio::test]
async fn a_status_refund_comes_back_at_the_head_while_the_body_still_streams() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let held = release.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let held = held.clone();
            tokio::spawn(async move {
                let Some(head) = read_request_head(&mut stream).await else {
                    return;
                };
                if head.starts_with(b"GET /slow") {
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfirst")
                        .await;
                    held.notified().await;
                    let _ = stream.write_all(b"-last").await;
                } else {
                    let _ = stream
                        .write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .await;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    let fg = Floodgate::start(&format!(
        "routes:
  - name: login
    path_prefix: /
    upstream: http://{addr}
    limits:
      - {{algorithm: fixed_window, limit: 1, window: 1h, spend_on: [401]}}
"
    ));
    let client = client();
    let mut slow = client
        .get(fg.url("/slow"))
        .header("x-api-key", "k")
        .send()
        .await
        .expect("the 200's head");
    assert_eq!(slow.status(), 200);
    let first = slow.chunk().await.expect("read").expect("a first piece");
    assert_eq!(&first[..], b"first");
    // The 200's body is still open: its unit is back all the same.
    let failed = get(&client, &fg.url("/login"), &[("x-api-key", "k")]).await;
    assert_eq!(failed.status, 401);
    let refused = get(&client, &fg.url("/login"), &[("x-api-key", "k")]).await;
    assert_eq!(refused.status, 429, "the 401 spent the window");
    release.notify_one();
    let rest = slow.chunk().await.expect("read").expect("the rest");
    assert_eq!(&rest[..], b"-last");
}
