//! Forward auth (`GET /check` on the service port) behind the real nginx (`auth_request`) and
//! Caddy (`forward_auth`): their clients get 429 with `Retry-After` once over the limit, and
//! the upstream never sees those requests. The configs here are the ones docs/service.md shows.
//!
//! The limit is per client address, 2 an hour in an epoch-aligned window: each test keeps
//! clear of an hour's end (60 s; each finishes in about a second).

mod common;

use std::time::Duration;

use common::*;

const RULES: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

/// floodgate with the service's forward auth: one descriptor, the client's address (found past
/// the proxy in front, a trusted proxy on 127.0.0.1).
fn service(deny_status: u16) -> (Floodgate, TempDir) {
    let dir = TempDir::new("rules");
    std::fs::write(dir.path().join("edge.yaml"), RULES).expect("write rules");
    let fg = Floodgate::start(&format!(
        "routes: []\nidentity:\n  trusted_proxies: [127.0.0.1/32]\nservice:\n  listen: 127.0.0.1:0\n  config: [{}]\n  forward_auth:\n    domain: edge\n    descriptors:\n      - [{{key: remote_address, value: client_ip}}]\n    deny_status: {deny_status}\n",
        dir.path().display()
    ));
    (fg, dir)
}

/// The nginx snippet from docs/service.md: `auth_request` to `/check`; floodgate answers 403 over
/// the limit (nginx turns any other status but 401 into 500), and `error_page` makes it the 429
/// the client gets, with `Retry-After` and the `X-RateLimit-*` fields.
fn nginx_http(service: std::net::SocketAddr, upstream: std::net::SocketAddr) -> String {
    format!(
        r#"
  server {{
    listen 127.0.0.1:{{PORT}};
    location / {{
      auth_request /_floodgate;
      auth_request_set $rl_limit $upstream_http_x_ratelimit_limit;
      auth_request_set $rl_remaining $upstream_http_x_ratelimit_remaining;
      auth_request_set $rl_reset $upstream_http_x_ratelimit_reset;
      auth_request_set $rl_retry $upstream_http_retry_after;
      add_header X-RateLimit-Limit $rl_limit always;
      add_header X-RateLimit-Remaining $rl_remaining always;
      add_header X-RateLimit-Reset $rl_reset always;
      error_page 403 = @rate_limited;
      proxy_pass http://{upstream};
    }}
    location = /_floodgate {{
      internal;
      proxy_pass http://{service}/check;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_set_header X-Forwarded-Uri $request_uri;
    }}
    location @rate_limited {{
      add_header Retry-After $rl_retry always;
      add_header X-RateLimit-Limit $rl_limit always;
      add_header X-RateLimit-Remaining $rl_remaining always;
      add_header X-RateLimit-Reset $rl_reset always;
      default_type application/problem+json;
      return 429 '{{"type":"urn:floodgate:problem:rate_limit_exceeded","status":429,"error":"rate_limit_exceeded"}}';
    }}
  }}"#
    )
}

#[tokio::test]
async fn nginx_auth_request_gives_its_clients_429_with_retry_after() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let upstream = Upstream::start().await;
    let (fg, _rules) = service(403);
    let nginx = FrontProxy::nginx(&nginx_http(fg.service_addr(), upstream.addr()));
    let client = client();
    for remaining in [1, 0] {
        let ok = get(&client, &nginx.url("/orders"), &[]).await;
        assert_eq!(ok.status, 200, "{ok:?}");
        assert_eq!(ok.header_u64("x-ratelimit-limit"), 2);
        assert_eq!(ok.header_u64("x-ratelimit-remaining"), remaining);
    }
    let limited = get(&client, &nginx.url("/orders"), &[]).await;
    assert_eq!(limited.status, 429, "{limited:?}");
    let retry = limited.header_u64("retry-after");
    assert!((1..=3600).contains(&retry), "{limited:?}");
    assert_eq!(limited.header_u64("x-ratelimit-remaining"), 0);
    assert!(limited.header_u64("x-ratelimit-reset") > unix_now());
    assert_eq!(
        upstream.count(),
        2,
        "the limited request never reached the upstream"
    );
}

#[tokio::test]
async fn caddy_forward_auth_passes_floodgates_429_through() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let upstream = Upstream::start().await;
    let (fg, _rules) = service(429);
    let caddy = FrontProxy::caddy(&format!(
        "  forward_auth {service} {{\n    uri /check\n    copy_headers X-RateLimit-Limit X-RateLimit-Remaining X-RateLimit-Reset\n  }}\n  reverse_proxy {upstream}",
        service = fg.service_addr(),
        upstream = upstream.addr(),
    ));
    let client = client();
    for _ in 0..2 {
        let ok = get(&client, &caddy.url("/orders"), &[]).await;
        assert_eq!(ok.status, 200, "{ok:?}");
    }
    // copy_headers hands the allowed request's figures to the upstream.
    assert_eq!(
        upstream.seen()[1].header("x-ratelimit-remaining"),
        Some("0")
    );
    let limited = get(&client, &caddy.url("/orders"), &[]).await;
    assert_eq!(limited.status, 429, "{limited:?}");
    assert!(limited.header_u64("retry-after") >= 1, "{limited:?}");
    assert_eq!(limited.header("content-type"), "application/problem+json");
    assert_eq!(limited.json()["error"], "rate_limit_exceeded");
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn check_answers_with_the_proxys_headers_and_skips_a_descriptor_it_cannot_build() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let dir = TempDir::new("rules");
    std::fs::write(
        dir.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    let fg = Floodgate::start(&format!(
        "routes: []\nservice:\n  listen: 127.0.0.1:0\n  config: [{}]\n  forward_auth:\n    domain: edge\n    descriptors:\n      - [{{key: api_key, value: \"header:X-API-Key\"}}]\n",
        dir.path().display()
    ));
    let client = client();
    // No key: the descriptor is not sent (as Envoy does), and the request is allowed.
    for _ in 0..3 {
        assert_eq!(
            get(&client, &fg.service_url("/check"), &[]).await.status,
            200
        );
    }
    let key = [("x-api-key", "k1")];
    let ok = get(&client, &fg.service_url("/check"), &key).await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.header_u64("x-ratelimit-limit"), 1);
    let limited = get(&client, &fg.service_url("/check"), &key).await;
    let body = assert_problem(
        &limited,
        http::StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_exceeded",
    );
    assert_eq!(
        body["retry_after"].as_u64(),
        Some(limited.header_u64("retry-after"))
    );
    // Reset in Unix seconds, as the proxy writes it.
    assert!(limited.header_u64("x-ratelimit-reset") > unix_now());
}

/// `/check` writes the config's `rate_limit_headers` profile, as the proxy does (e9faff0 wrote
/// `X-RateLimit-*` whatever the profile).
#[tokio::test]
async fn check_follows_the_rate_limit_headers_profile() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let dir = TempDir::new("rules");
    std::fs::write(
        dir.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .unwrap();
    let config = |profile: &str| {
        format!(
            "rate_limit_headers: {profile}\nroutes: []\nservice:\n  listen: 127.0.0.1:0\n  config: [{}]\n  forward_auth:\n    domain: edge\n    descriptors:\n      - [{{key: api_key, value: \"header:X-API-Key\"}}]\n",
            dir.path().display()
        )
    };
    let client = client();
    let fg = Floodgate::start(&config("ietf"));
    let key = [("x-api-key", "ietf-k")];
    let ok = get(&client, &fg.service_url("/check"), &key).await;
    assert_eq!(ok.status, 200);
    assert!(
        !ok.headers.contains_key("x-ratelimit-limit"),
        "{:?}",
        ok.headers
    );
    let field = ok.header("ratelimit");
    assert!(field.starts_with("\"default\";r=1;t="), "{field}");
    get(&client, &fg.service_url("/check"), &key).await;
    let limited = get(&client, &fg.service_url("/check"), &key).await;
    assert_eq!(limited.status, 429);
    // On a refusal, t is the Retry-After.
    let retry = limited.header_u64("retry-after");
    assert_eq!(
        limited.header("ratelimit"),
        format!("\"default\";r=0;t={retry}")
    );
    drop(fg);
    let fg = Floodgate::start(&config("none"));
    let ok = get(&client, &fg.service_url("/check"), &key).await;
    assert_eq!(ok.status, 200);
    assert!(!ok.headers.contains_key("x-ratelimit-limit") && !ok.headers.contains_key("ratelimit"));
}
