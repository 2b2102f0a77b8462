//! The edge, end to end through the real binary: CORS (a headless Chromium on one origin calling
//! floodgate on another), a route's own refusal bodies, and a route's own timeouts and body
//! size beside the global ones.

mod common;

use std::time::Duration;

use common::config::{Config, Limit, Route};
use common::{Floodgate, RawUpstream, Upstream, check_names, client, get, metric};

/// A page on its own origin (a raw server of its own port) that calls floodgate (its origin
/// in the page's `?fg=`) at `/rides` (POST, JSON, `X-API-Key`: a preflight first) until
/// refused, then `/other` (a route whose `cors` does not allow the page's origin), and writes
/// what it could read into the DOM.
fn page() -> &'static [u8] {
    let html = r#"<!doctype html><html><body><pre id="out">pending</pre><script>
(async () => {
  const floodgate = new URLSearchParams(location.search).get("fg");
  const lines = [];
  for (let i = 0; i < 5; i++) {
    try {
      const r = await fetch(floodgate + "/rides", {method: "POST",
        headers: {"X-API-Key": "rider-1", "Content-Type": "application/json"}, body: "{}"});
      lines.push("status=" + r.status + " retry_after=" + r.headers.get("Retry-After")
        + " remaining=" + r.headers.get("X-RateLimit-Remaining"));
    } catch (e) { lines.push("failed " + e.name); }
  }
  try {
    const r = await fetch(floodgate + "/other", {method: "POST",
      headers: {"X-API-Key": "rider-1", "Content-Type": "application/json"}, body: "{}"});
    lines.push("other=" + r.status);
  } catch (e) { lines.push("other=blocked " + e.name); }
  document.getElementById("out").textContent = lines.join("\n");
})();
</script></body></html>"#;
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
        html.len()
    );
    Box::leak(response.into_bytes().into_boxed_slice())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_on_another_origin_reads_the_429_and_its_preflights_spend_nothing() {
    let upstream = Upstream::start().await;
    // Two origins: the page's server (127.0.0.1, a port of its own) and floodgate (another).
    let page_server = RawUpstream::start(page()).await;
    let page_origin = page_server.url();
    let yaml = Config::new()
        .route(
            // Only POST: the preflight (OPTIONS) is answered all the same.
            Route::new("rides", "/rides", &upstream.url())
                .with("methods", "[POST]")
                .with(
                    "cors",
                    &format!(
                        "{{origins: [\"{page_origin}\"], methods: [GET, POST], headers: [Content-Type, X-API-Key]}}"
                    ),
                )
                .limit(Limit::token_bucket(3, 0.001)),
        )
        .route(
            Route::new("other", "/other", &upstream.url())
                .with("cors", "{origins: [\"https://elsewhere.example\"], headers: [Content-Type, X-API-Key]}"),
        )
        .yaml();
    let fg = Floodgate::start(&yaml);
    let fg_origin = format!("http://{}", fg.addr());
    let (dom, stderr) =
        common::chromium_dom(&format!("{page_origin}/?fg={fg_origin}"), 10_000).await;
    let lines: Vec<&str> = dom
        .split("<pre id=\"out\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or_else(|| panic!("no output in {dom}\n{stderr}"))
        .lines()
        .collect();
    // Three allowed (the bucket holds three), then refused: the page reads the 429's status and
    // headers, which it could not without CORS on the refusal ("failed TypeError").
    assert_eq!(lines.len(), 6, "{lines:?}\n{stderr}");
    for (i, line) in lines[..3].iter().enumerate() {
        assert!(line.starts_with("status=200 "), "{i}: {line}");
        assert!(
            line.ends_with(&format!("remaining={}", 2 - i)),
            "{i}: {line}"
        );
    }
    for line in &lines[3..5] {
        assert!(line.starts_with("status=429 retry_after="), "{line}");
        let retry: u64 = line
            .split("retry_after=")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no Retry-After read: {line}"));
        assert!(retry >= 1, "{line}");
        assert!(line.ends_with("remaining=0"), "{line}");
    }
    // The other route does not allow the page's origin: its preflight gets no CORS headers, and
    // the browser blocks the call before sending it.
    assert_eq!(lines[5], "other=blocked TypeError", "{stderr}");
    // The preflights reached no upstream and spent nothing: the upstream saw three POSTs only.
    let seen = upstream.seen();
    assert!(
        seen.iter().all(|s| s.method == http::Method::POST),
        "{:?}",
        seen.iter().map(|s| &s.method).collect::<Vec<_>>()
    );
    assert_eq!(seen.len(), 3);
    let preflights = metric(
        &fg,
        r#"floodgate_requests_total{route="rides",decision="preflight"}"#,
    )
    .await;
    assert!(preflights >= 1, "Chromium sent no preflight?");
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_requests_total{route="rides",decision="allowed"}"#
        )
        .await,
        3
    );
    assert!(
        metric(
            &fg,
            r#"floodgate_requests_total{route="other",decision="preflight"}"#
        )
        .await
            >= 1
    );
}

/// A route with `cors` allowing `https://app.example`, a bucket of one, API keys required.
fn cors_routes(upstream: &str) -> String {
    Config::new()
        .consumers("reject")
        .route(
            Route::new("api", "/api", upstream)
                .with(
                    "cors",
                    "{origins: [\"https://app.example\"], credentials: true}",
                )
                .limit(Limit::token_bucket(1, 0.001)),
        )
        .yaml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_of_a_cors_route_carries_the_origin_and_a_disallowed_origin_gets_nothing() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&cors_routes(&upstream.url()));
    let c = client();
    let from = |origin: &'static str, key: &'static str| [("origin", origin), ("x-api-key", key)];
    let allowed = get(&c, &fg.url("/api/a"), &from("https://app.example", "test")).await;
    let refused = get(&c, &fg.url("/api/a"), &from("https://app.example", "test")).await;
    let unknown = get(
        &c,
        &fg.url("/api/a"),
        &from("https://app.example", "nobody"),
    )
    .await;
    for (reply, status) in [(&allowed, 200), (&refused, 429), (&unknown, 401)] {
        assert_eq!(reply.status.as_u16(), status);
        assert_eq!(
            reply.header("access-control-allow-origin"),
            "https://app.example"
        );
        assert_eq!(reply.header("access-control-allow-credentials"), "true");
        assert!(reply.header("vary").contains("Origin"), "{status}");
        assert!(
            reply
                .header("access-control-expose-headers")
                .contains("X-RateLimit-Remaining"),
            "{status}"
        );
    }
    let evil = get(&c, &fg.url("/api/a"), &from("https://evil.example", "test")).await;
    assert_eq!(evil.status.as_u16(), 429);
    assert!(
        evil.headers
            .keys()
            .all(|name| !name.as_str().starts_with("access-control-")),
        "{:?}",
        evil.headers
    );
    // A preflight is answered 204, whoever asks, never forwarded, and counted.
    let preflight = c
        .request(http::Method::OPTIONS, fg.url("/api/a"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "PUT")
        .header("access-control-request-headers", "x-api-key")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status().as_u16(), 204);
    assert_eq!(
        preflight.headers()["access-control-allow-methods"],
        "GET, HEAD, POST, PUT, PATCH, DELETE"
    );
    assert_eq!(preflight.headers()["access-control-max-age"], "600");
    // An OPTIONS that is not a preflight is the route's like any request (here: refused).
    let plain = c
        .request(http::Method::OPTIONS, fg.url("/api/a"))
        .header("x-api-key", "test")
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status().as_u16(), 429);
    assert_eq!(upstream.count(), 1);
    assert_eq!(
        metric(
            &fg,
            r#"floodgate_requests_total{route="api",decision="preflight"}"#
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_refusal_template_replaces_the_body_and_keeps_the_headers() {
    let upstream = Upstream::start().await;
    let yaml = Config::new()
        .route(
            Route::new("api", "/api", &upstream.url())
                .with(
                    "refusals",
                    r#"{rate_limited: {status: 420, content_type: application/json, body: '{"code": 42901, "retry_in": {retry_after}, "of": {limit}, "left": {remaining}, "route": "{route}"}'}}"#,
                )
                .limit(Limit::token_bucket(2, 0.001)),
        )
        .yaml();
    let fg = Floodgate::start(&yaml);
    let c = client();
    for _ in 0..2 {
        assert_eq!(
            get(&c, &fg.url("/api"), &[("x-api-key", "a")]).await.status,
            200
        );
    }
    let refused = get(&c, &fg.url("/api"), &[("x-api-key", "a")]).await;
    assert_eq!(refused.status.as_u16(), 420);
    assert_eq!(refused.header("content-type"), "application/json");
    let retry = refused.header_u64("retry-after");
    assert!(retry > 0);
    assert_eq!(refused.header("x-ratelimit-limit"), "2");
    assert_eq!(refused.header("x-ratelimit-remaining"), "0");
    let body = refused.json();
    assert_eq!(
        body,
        serde_json::json!({"code": 42901, "retry_in": retry, "of": 2, "left": 0, "route": "api"})
    );
    // A gRPC call keeps its gRPC status: the template is HTTP's.
    let grpc = c
        .post(fg.url("/api"))
        .header("x-api-key", "a")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .send()
        .await
        .unwrap();
    assert_eq!(grpc.status().as_u16(), 200);
    assert_eq!(grpc.headers()["grpc-status"], "8");
}

#[test]
fn bad_edge_keys_are_named_by_floodgate_check() {
    let route = |extra: &str| {
        format!(
            "listen: 127.0.0.1:0\nroutes:\n  - name: api\n    path_prefix: /\n    upstream: http://127.0.0.1:9\n{extra}"
        )
    };
    check_names(
        &route("    refusals:\n      slow_down: {body: x}\n"),
        &["routes[0].refusals.slow_down"],
    );
    check_names(
        &route("    refusals:\n      rate_limited: {body: 'wait {retry_in}'}\n"),
        &["routes[0].refusals.rate_limited.body"],
    );
    check_names(
        &route("    cors: {origins: [\"https://app.example/\"]}\n"),
        &["routes[0].cors.origins[0]"],
    );
    check_names(
        &route("    cors: {origins: [\"*\"], credentials: true}\n"),
        &["routes[0].cors.credentials"],
    );
    check_names(
        &route("    cors: {origins: [\"*\"], methods: [\"GE T\"], expose: [\"a b\"]}\n"),
        &["routes[0].cors.methods[0]", "routes[0].cors.expose[0]"],
    );
    check_names(
        &route("    timeouts: {header_read: 1s, upstream_response: soon}\n"),
        &[
            "routes[0].timeouts.header_read",
            "routes[0].timeouts.upstream_response",
        ],
    );
    check_names(
        &route("    max_body_size: 12 parsecs\n"),
        &["routes[0].max_body_size"],
    );
    check_names(
        &route(
            "    websocket: {max_connections: 0, messages: {capacity: 0, refill_rate: -1}, max_message: big, idle_timeout: soon}\n",
        ),
        &[
            "routes[0].websocket.max_connections",
            "routes[0].websocket.messages.capacity",
            "routes[0].websocket.messages.refill_rate",
            "routes[0].websocket.max_message",
            "routes[0].websocket.idle_timeout",
        ],
    );
    check_names(
        &format!("proxy_protocol: {{from: [10.0.0.0/33]}}\n{}", route("")),
        &["proxy_protocol.from[0]"],
    );
    check_names(
        &format!(
            "identity: {{client_ip_header: \"bad header\"}}\n{}",
            route("")
        ),
        &["identity.client_ip_header"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_own_timeout_and_body_size_stand_beside_the_global_ones() {
    let upstream = Upstream::start().await;
    // The global response timeout (5 s) lets `/slow` (1.5 s) answer; the report route's own
    // (300 ms) does not. The global body size is 1 KiB; the upload route's own is 64 KiB.
    let yaml = Config::new()
        .timeout("upstream_response", "5s")
        .with("max_body_size", "1k")
        .route(
            Route::new("report", "/report", &upstream.url())
                .with("rewrite_prefix", "/")
                .with("timeouts", "{upstream_response: 300ms}"),
        )
        .route(Route::new("upload", "/upload", &upstream.url()).with("max_body_size", "64k"))
        .route(Route::new("rest", "/", &upstream.url()))
        .yaml();
    let fg = Floodgate::start(&yaml);
    let c = client();
    let timed_out = get(&c, &fg.url("/report/slow"), &[]).await;
    assert_eq!(timed_out.status.as_u16(), 504, "{}", timed_out.body);
    assert_eq!(timed_out.json()["error"], "upstream_timeout");
    let slow = get(&c, &fg.url("/slow"), &[]).await;
    assert_eq!(slow.status.as_u16(), 200, "{}", slow.body);

    let body = vec![b'x'; 8 << 10];
    let upload = c
        .post(fg.url("/upload"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status().as_u16(), 200);
    assert_eq!(upload.text().await.unwrap(), "received 8192 bytes");
    let elsewhere = c.post(fg.url("/echo")).body(body).send().await.unwrap();
    assert_eq!(elsewhere.status().as_u16(), 413);

    // Reloaded on SIGHUP: the report route's own timeout lifted, the upload route's size cut.
    let reloaded = Config::new()
        .timeout("upstream_response", "5s")
        .with("max_body_size", "1k")
        .route(Route::new("report", "/report", &upstream.url()).with("rewrite_prefix", "/"))
        .route(Route::new("upload", "/upload", &upstream.url()).with("max_body_size", "4k"))
        .route(Route::new("rest", "/", &upstream.url()))
        .yaml();
    std::fs::write(fg.config_path(), format!("listen: 127.0.0.1:0\n{reloaded}")).unwrap();
    fg.signal("HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .post(fg.url("/upload"))
            .body(vec![b'x'; 8 << 10])
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 413 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reload never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        get(&c, &fg.url("/report/slow"), &[]).await.status.as_u16(),
        200
    );
}
