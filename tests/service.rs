//! floodgate as the rate-limit service behind the real Envoy (1.40): Envoy's
//! `envoy.filters.http.ratelimit` filter calls floodgate's `RateLimitService` before each
//! request, with envoyproxy/ratelimit's rules as they are; and the service's own front ends
//! (`ShouldRateLimit` called directly, `/json`, `/check`).
//!
//! Windows here are an hour long and aligned to the epoch: each test keeps clear of an hour's
//! end (`keep_clear_of_window_boundary`, 60 s: every test finishes in seconds).

mod common;

use std::time::Duration;

use common::*;
use floodgate::service::rls;
use prost::Message;

/// The rules every Envoy test here loads: envoyproxy/ratelimit's format, unchanged.
const RULES: &str = r#"
domain: edge
descriptors:
  # A bare key: each client its own budget.
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 3}
  # A wildcard: each matching path its own budget.
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2, name: api}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
  # Nested: the limit applies at the last entry only.
  - key: user
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 4, name: gold}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 2, name: tenant}
  - key: vip
    rate_limit: {unit: hour, requests_per_unit: 5, name: vip, replaces: [{name: tenant}]}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

/// The route's `rate_limits`: each a descriptor built from one request header (Envoy sends
/// none when the header is absent).
const ACTIONS: &str = r#"- actions: [{request_headers: {header_name: x-client, descriptor_key: client}}]
- actions: [{request_headers: {header_name: x-path, descriptor_key: path}}]
- actions: [{request_headers: {header_name: x-user, descriptor_key: user}}, {request_headers: {header_name: x-plan, descriptor_key: plan}}]
- actions: [{request_headers: {header_name: x-shadowed, descriptor_key: shadowed}}]
- actions: [{request_headers: {header_name: x-tenant, descriptor_key: tenant}}]
- actions: [{request_headers: {header_name: x-vip, descriptor_key: vip}}]
- actions: [{request_headers: {header_name: x-tokens, descriptor_key: tokens}}]
  hits_addend: {number: 4}
"#;

/// floodgate with `service:` on port 0, its rules in a directory of their own.
struct Service {
    fg: Floodgate,
    _rules: TempDir,
}

fn service_with(rules: &str, extra: &str) -> Service {
    let dir = TempDir::new("rules");
    std::fs::write(dir.path().join("edge.yaml"), rules).expect("write rules");
    let fg = Floodgate::start(&format!(
        "admin_listen: 127.0.0.1:0\nroutes: []\n{extra}service:\n  listen: 127.0.0.1:0\n  config: [{}]\n",
        dir.path().display()
    ));
    Service { fg, _rules: dir }
}

async fn status_via(envoy: &Envoy, headers: &[(&str, &str)]) -> Reply {
    get(&client(), &envoy.url("/"), headers).await
}

async fn statuses_via(envoy: &Envoy, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(status_via(envoy, headers).await.status.as_u16());
    }
    out
}

#[tokio::test]
async fn envoy_limits_simple_nested_wildcard_and_unlimited_descriptors() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let upstream = Upstream::start().await;
    let svc = service_with(RULES, "");
    let envoy = Envoy::start(
        upstream.addr(),
        svc.fg.service_addr(),
        &RateLimitFilter::new("edge", ACTIONS),
    );

    // A simple limit: 3 an hour per client; the 4th is Envoy's 429, never forwarded.
    assert_eq!(
        statuses_via(&envoy, &[("x-client", "a")], 3).await,
        [200, 200, 200]
    );
    let limited = status_via(&envoy, &[("x-client", "a")]).await;
    assert_eq!(limited.status, 429, "{limited:?}");
    assert_eq!(limited.header("x-envoy-ratelimited"), "true");
    // floodgate's response_headers_to_add, and Envoy's DRAFT_VERSION_03 headers computed from
    // the status floodgate gave the tightest descriptor.
    assert!(limited.header_u64("retry-after") >= 1, "{limited:?}");
    assert_eq!(limited.header("ratelimit-limit"), "3");
    assert_eq!(limited.header("x-ratelimit-limit"), "3, 3;w=3600");
    assert_eq!(limited.header("x-ratelimit-remaining"), "0");
    // Another client has its own budget.
    assert_eq!(status_via(&envoy, &[("x-client", "b")]).await.status, 200);
    assert_eq!(upstream.count(), 4);

    // A wildcard: each matching value its own budget of 2.
    assert_eq!(
        statuses_via(&envoy, &[("x-path", "/api/users")], 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses_via(&envoy, &[("x-path", "/api/orders")], 3).await,
        [200, 200, 429]
    );
    // unlimited: never over, remaining 2^32-1.
    assert!(
        statuses_via(&envoy, &[("x-path", "/free")], 10)
            .await
            .iter()
            .all(|&s| s == 200)
    );

    // Nested: (user, plan=gold) has 4; (user) alone has no limit (the limit is at the last
    // entry), and neither has plan=free.
    let gold = [("x-user", "u1"), ("x-plan", "gold")];
    assert_eq!(
        statuses_via(&envoy, &gold, 5).await,
        [200, 200, 200, 200, 429]
    );
    assert!(
        statuses_via(&envoy, &[("x-user", "u1")], 6)
            .await
            .iter()
            .all(|&s| s == 200)
    );
    assert!(
        statuses_via(&envoy, &[("x-user", "u1"), ("x-plan", "free")], 6)
            .await
            .iter()
            .all(|&s| s == 200)
    );
    assert!(envoy.stat("cluster.upstream.ratelimit.over_limit") >= 4);
}

#[tokio::test]
async fn envoy_applies_shadow_mode_replaces_and_hits_addend() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let upstream = Upstream::start().await;
    let svc = service_with(RULES, "");
    let envoy = Envoy::start(
        upstream.addr(),
        svc.fg.service_addr(),
        &RateLimitFilter {
            at_filter: true,
            ..RateLimitFilter::new("edge", ACTIONS)
        },
    );

    // shadow_mode: counted, never denying (1 an hour, 5 pass).
    assert!(
        statuses_via(&envoy, &[("x-shadowed", "s")], 5)
            .await
            .iter()
            .all(|&s| s == 200)
    );
    // Without the VIP descriptor, the tenant's 2 an hour apply...
    assert_eq!(
        statuses_via(&envoy, &[("x-tenant", "t1")], 3).await,
        [200, 200, 429]
    );
    // ...with it, the VIP limit replaces the tenant's: 5 an hour (its own budget).
    assert_eq!(
        statuses_via(&envoy, &[("x-tenant", "t2"), ("x-vip", "t2")], 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    // hits_addend 4 on a budget of 10: two requests fit (8), the third would be 12.
    assert_eq!(
        statuses_via(&envoy, &[("x-tokens", "k")], 3).await,
        [200, 200, 429]
    );
    let metrics = get(&client(), &svc.fg.admin_url("/metrics"), &[])
        .await
        .body;
    assert!(
        sample(
            &metrics,
            r#"floodgate_service_decisions_total{domain="edge",code="over_limit"}"#
        ) >= 3.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn envoy_follows_failure_mode_deny_when_floodgate_is_down() {
    let upstream = Upstream::start().await;
    let mut svc = service_with(RULES, "");
    let service = svc.fg.service_addr();
    let open = Envoy::start(
        upstream.addr(),
        service,
        &RateLimitFilter::new("edge", ACTIONS),
    );
    let closed = Envoy::start(
        upstream.addr(),
        service,
        &RateLimitFilter {
            failure_mode_deny: true,
            ..RateLimitFilter::new("edge", ACTIONS)
        },
    );
    // Both pass while floodgate answers.
    assert_eq!(status_via(&open, &[("x-client", "f")]).await.status, 200);
    assert_eq!(status_via(&closed, &[("x-client", "g")]).await.status, 200);
    // floodgate killed: Envoy cannot reach the service; failure_mode_deny decides.
    svc.fg.signal("KILL");
    svc.fg.wait_exit(Duration::from_secs(5));
    assert_eq!(status_via(&open, &[("x-client", "f")]).await.status, 200);
    assert_eq!(status_via(&closed, &[("x-client", "g")]).await.status, 500);
    assert!(open.stat("cluster.upstream.ratelimit.error") >= 1);
}

#[tokio::test]
async fn a_limited_grpc_call_through_envoy_is_resource_exhausted() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let grpc = GrpcServer::start();
    let svc = service_with(
        "domain: grpc\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
        "",
    );
    let envoy = Envoy::start(
        std::net::SocketAddr::from(([127, 0, 0, 1], grpc.port())),
        svc.fg.service_addr(),
        &RateLimitFilter {
            resource_exhausted: true,
            upstream_h2: true,
            ..RateLimitFilter::new(
                "grpc",
                "- actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]\n",
            )
        },
    );
    let calls = grpc_calls(
        &envoy.addr().to_string(),
        &["calm:4"],
        &["--key", "grpc-key"],
    );
    assert_eq!(
        calls[0]["codes"],
        serde_json::json!({"OK": 2, "RESOURCE_EXHAUSTED": 2}),
        "{calls:?}"
    );
}

#[tokio::test]
async fn two_instances_on_one_redis_behind_two_envoys_admit_exactly_the_budget() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let rules = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 50}\n";
    let storage = format!(
        "storage:\n  backend: redis\n  url: {}\n  on_error: deny\n  batch: true\n  lease_ttl: 1s\n",
        redis.url()
    );
    let one = service_with(rules, &storage);
    let two = service_with(rules, &storage);
    let actions =
        "- actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]\n";
    let envoy_one = Envoy::start(
        upstream.addr(),
        one.fg.service_addr(),
        &RateLimitFilter::new("edge", actions),
    );
    let envoy_two = Envoy::start(
        upstream.addr(),
        two.fg.service_addr(),
        &RateLimitFilter::new("edge", actions),
    );
    // 32 clients, half through each Envoy, for 3 s: far more than 50 requests.
    let totals = hammer(
        &[envoy_one.url("/"), envoy_two.url("/")],
        "shared",
        32,
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(totals.get(&200).copied(), Some(50), "{totals:?}");
    assert_eq!(upstream.count(), 50);
    assert!(totals.get(&429).copied().unwrap_or(0) > 50, "{totals:?}");
}

/// A `ShouldRateLimit` call over h2c, as Envoy makes it: the response message, or the
/// trailers-only status.
async fn should_rate_limit(
    service: std::net::SocketAddr,
    request: &rls::RateLimitRequest,
) -> Result<rls::RateLimitResponse, (String, String)> {
    let message = request.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let response = h2c_client()
        .post(format!(
            "http://{service}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(framed)
        .send()
        .await
        .expect("call the service");
    assert_eq!(response.status(), 200);
    if let Some(code) = response.headers().get("grpc-status") {
        let message = response
            .headers()
            .get("grpc-message")
            .map(|m| m.to_str().unwrap().to_string())
            .unwrap_or_default();
        return Err((code.to_str().unwrap().to_string(), message));
    }
    let body = response.bytes().await.expect("read the answer");
    assert_eq!(body[0], 0, "not compressed");
    Ok(rls::RateLimitResponse::decode(&body[5..]).expect("a RateLimitResponse"))
}

fn descriptor(pairs: &[(&str, &str)]) -> rls::RateLimitDescriptor {
    rls::RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| rls::DescriptorEntry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
        is_negative_hits: false,
    }
}

#[tokio::test]
async fn should_rate_limit_answers_each_descriptor_and_refuses_bad_requests_whole() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let svc = service_with(RULES, "");
    let addr = svc.fg.service_addr();
    let request = |descriptors| rls::RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    };
    // Two descriptors decided together: one statuses entry each, in order; the tightest carries
    // the figures.
    let answer = should_rate_limit(
        addr,
        &request(vec![
            descriptor(&[("client", "x")]),
            descriptor(&[("path", "/api/a")]),
            descriptor(&[("nothing", "here")]),
        ]),
    )
    .await
    .expect("answered");
    assert_eq!(answer.overall_code, rls::Code::Ok as i32);
    assert_eq!(answer.statuses.len(), 3);
    // Every descriptor that found a limit reports it (not the tightest alone): the client's 3
    // an hour with 2 left.
    let client_status = &answer.statuses[0];
    assert_eq!(
        client_status
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        3
    );
    assert_eq!(client_status.limit_remaining, 2);
    let reset = client_status
        .duration_until_reset
        .expect("the client's reset")
        .seconds;
    assert!((1..=3600).contains(&reset), "{reset}");
    let tightest = &answer.statuses[1];
    assert_eq!(
        tightest.current_limit.as_ref().unwrap().requests_per_unit,
        2
    );
    assert_eq!(tightest.current_limit.as_ref().unwrap().name, "api");
    assert_eq!(tightest.limit_remaining, 1);
    assert!(tightest.duration_until_reset.unwrap().seconds <= 3600);
    assert_eq!(answer.statuses[2].code, rls::Code::Ok as i32);
    assert!(answer.statuses[2].current_limit.is_none());
    // All or nothing: /api/a's second request passes, its third is over, and then the client's
    // budget is not spent either (it had 3: two spent here, so one is left).
    let both = request(vec![
        descriptor(&[("client", "x")]),
        descriptor(&[("path", "/api/a")]),
    ]);
    assert_eq!(
        should_rate_limit(addr, &both).await.unwrap().overall_code,
        rls::Code::Ok as i32
    );
    let over = should_rate_limit(addr, &both).await.unwrap();
    assert_eq!(over.overall_code, rls::Code::OverLimit as i32);
    assert_eq!(over.statuses[0].code, rls::Code::Ok as i32);
    assert_eq!(over.statuses[1].code, rls::Code::OverLimit as i32);
    // Both carry their figures on a denial too: the client's budget, untouched by the denied
    // request, still has 1 left; /api/a none.
    assert_eq!(
        over.statuses[0].limit_remaining, 1,
        "{:?}",
        over.statuses[0]
    );
    assert!(over.statuses[0].current_limit.is_some());
    assert_eq!(over.statuses[1].limit_remaining, 0);
    assert!(
        over.response_headers_to_add
            .iter()
            .any(|h| h.key == "Retry-After")
    );
    let client_only = request(vec![descriptor(&[("client", "x")])]);
    assert_eq!(
        should_rate_limit(addr, &client_only)
            .await
            .unwrap()
            .overall_code,
        rls::Code::Ok as i32
    );
    assert_eq!(
        should_rate_limit(addr, &client_only)
            .await
            .unwrap()
            .overall_code,
        rls::Code::OverLimit as i32
    );
    // hits_addend 0 checks without spending; is_negative_hits gives back.
    let mut check = descriptor(&[("tokens", "c")]);
    check.hits_addend = Some(rls::UInt64Value { value: 0 });
    for _ in 0..3 {
        let a = should_rate_limit(addr, &request(vec![check.clone()]))
            .await
            .unwrap();
        assert_eq!(a.overall_code, rls::Code::Ok as i32);
        assert_eq!(a.statuses[0].limit_remaining, 10);
    }
    let mut spend = descriptor(&[("tokens", "c")]);
    spend.hits_addend = Some(rls::UInt64Value { value: 10 });
    let spent = should_rate_limit(addr, &request(vec![spend.clone()]))
        .await
        .unwrap();
    assert_eq!(spent.overall_code, rls::Code::Ok as i32);
    let checked = should_rate_limit(addr, &request(vec![check.clone()]))
        .await
        .unwrap();
    assert_eq!(checked.overall_code, rls::Code::OverLimit as i32);
    let mut give_back = spend.clone();
    give_back.hits_addend = Some(rls::UInt64Value { value: 4 });
    give_back.is_negative_hits = true;
    should_rate_limit(addr, &request(vec![give_back]))
        .await
        .unwrap();
    let after = should_rate_limit(addr, &request(vec![check]))
        .await
        .unwrap();
    assert_eq!(after.overall_code, rls::Code::Ok as i32);
    assert_eq!(after.statuses[0].limit_remaining, 4);
    // More hits than the limit holds: over, whatever is left.
    let mut huge = descriptor(&[("client", "fresh")]);
    huge.hits_addend = Some(rls::UInt64Value { value: 1_000 });
    assert_eq!(
        should_rate_limit(addr, &request(vec![huge]))
            .await
            .unwrap()
            .overall_code,
        rls::Code::OverLimit as i32
    );

    // Malformed: INVALID_ARGUMENT (3), and nothing spent.
    for bad in [
        rls::RateLimitRequest {
            domain: String::new(),
            descriptors: vec![descriptor(&[("client", "y")])],
            hits_addend: 0,
        },
        request(vec![]),
        request(vec![descriptor(&[])]),
        request(vec![descriptor(&[("client", "y"), ("", "v")])]),
    ] {
        let (code, message) = should_rate_limit(addr, &bad).await.unwrap_err();
        assert_eq!(code, "3", "{message}");
        assert!(!message.is_empty());
    }
    let fresh = should_rate_limit(addr, &request(vec![descriptor(&[("client", "y")])]))
        .await
        .unwrap();
    assert_eq!(fresh.overall_code, rls::Code::Ok as i32);
    // An unknown domain: OK, no limit (as envoyproxy/ratelimit answers).
    let unknown = should_rate_limit(
        addr,
        &rls::RateLimitRequest {
            domain: "elsewhere".into(),
            descriptors: vec![descriptor(&[("client", "y")])],
            hits_addend: 0,
        },
    )
    .await
    .unwrap();
    assert_eq!(unknown.overall_code, rls::Code::Ok as i32);
    let metrics = get(&client(), &svc.fg.admin_url("/metrics"), &[])
        .await
        .body;
    assert!(
        sample(
            &metrics,
            r#"floodgate_service_decisions_total{domain="edge",code="error"}"#
        ) >= 3.0,
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            r#"floodgate_service_decisions_total{domain="other",code="ok"}"#
        ) >= 1.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn json_and_check_answer_over_http() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let svc = service_with(RULES, "identity:\n  trusted_proxies: [127.0.0.1/32]\n");
    // POST /json: envoyproxy/ratelimit's JSON.
    let body =
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/api/json"}]}]}"#;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client()
            .post(svc.fg.service_url("/json"))
            .body(body)
            .send()
            .await
            .unwrap();
        codes.push(r.status().as_u16());
        let json: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        let expected = if codes.len() < 3 { "OK" } else { "OVER_LIMIT" };
        assert_eq!(json["overallCode"], expected, "{json}");
        assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
        assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "HOUR");
    }
    assert_eq!(codes, [200, 200, 429]);
    let bad = client()
        .post(svc.fg.service_url("/json"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert_eq!(bad.headers()["content-type"], "application/problem+json");
    let health = get(&client(), &svc.fg.service_url("/healthz"), &[]).await;
    assert_eq!(health.status, 200);
}

#[test]
fn check_names_the_rules_file_and_path_of_a_problem() {
    let dir = TempDir::new("rules-check");
    std::fs::write(
        dir.path().join("bad.yaml"),
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: lightyear, requests_per_unit: 1}\n  - key: b\n    bogus: 1\n",
    )
    .unwrap();
    check_names(
        &format!(
            "listen: 127.0.0.1:0\nroutes: []\nservice:\n  listen: 127.0.0.1:0\n  config: [{}]\n",
            dir.path().display()
        ),
        &["bad.yaml: descriptors[", "bogus"],
    );
}

/// A CA and a client certificate it signed, as PEM.
fn client_ca_and_identity() -> (String, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let client_params = rcgen::CertificateParams::new(vec!["envoy".to_string()]).unwrap();
    let client_key = rcgen::KeyPair::generate().unwrap();
    let client = client_params.signed_by(&client_key, &ca).unwrap();
    (
        ca.pem(),
        format!("{}{}", client.pem(), client_key.serialize_pem()),
    )
}

#[tokio::test]
async fn over_mtls_only_a_client_with_a_certificate_from_client_ca_is_answered() {
    let server = SelfSigned::new();
    let (ca_pem, identity_pem) = client_ca_and_identity();
    let ca = TempFile::new(&ca_pem);
    let dir = TempDir::new("rules");
    std::fs::write(dir.path().join("edge.yaml"), RULES).unwrap();
    let fg = Floodgate::start(&format!(
        "routes: []\nservice:\n  listen: 127.0.0.1:0\n  config: [{}]\n  tls: {{cert: {}, key: {}, client_ca: {}}}\n",
        dir.path().display(),
        yaml_path(&server.cert_file),
        yaml_path(&server.key_file),
        yaml_path(&ca),
    ));
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"client","value":"tls"}]}]}"#;
    let url = format!("https://localhost:{}/json", fg.service_addr().port());
    let trusted = reqwest::Certificate::from_pem(server.cert_pem.as_bytes()).unwrap();
    let with_cert = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([trusted.clone()])
        .identity(reqwest::Identity::from_pem(identity_pem.as_bytes()).unwrap())
        .resolve("localhost", fg.service_addr())
        .build()
        .unwrap();
    let answered = with_cert.post(&url).body(body).send().await.unwrap();
    assert_eq!(answered.status(), 200);
    let without = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([trusted])
        .resolve("localhost", fg.service_addr())
        .build()
        .unwrap();
    assert!(
        without.post(&url).body(body).send().await.is_err(),
        "a client without a certificate must not get an answer"
    );
}

#[tokio::test]
async fn sighup_reads_the_rules_again() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let dir = TempDir::new("rules");
    let rules = dir.path().join("edge.yaml");
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    let fg = Floodgate::start(&format!(
        "admin_listen: 127.0.0.1:0\nroutes: []\nservice:\n  listen: 127.0.0.1:0\n  config: [{}]\n",
        dir.path().display()
    ));
    let ask = |value: &'static str| {
        let addr = fg.service_addr();
        async move {
            should_rate_limit(
                addr,
                &rls::RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![descriptor(&[("k", value)])],
                    hits_addend: 0,
                },
            )
            .await
            .unwrap()
            .overall_code
        }
    };
    assert_eq!(ask("a").await, rls::Code::Ok as i32);
    assert_eq!(ask("a").await, rls::Code::OverLimit as i32);
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .unwrap();
    let reloads = metric(&fg, r#"floodgate_config_reloads_total{result="success"}"#).await;
    fg.signal("HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&fg, r#"floodgate_config_reloads_total{result="success"}"#).await == reloads {
        assert!(std::time::Instant::now() < deadline, "no reload");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A changed limit is a new budget: 3 more.
    for _ in 0..3 {
        assert_eq!(ask("a").await, rls::Code::Ok as i32);
    }
    assert_eq!(ask("a").await, rls::Code::OverLimit as i32);
    // A broken file is refused whole; the rules in force stay.
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: k\n    bogus: 1\n",
    )
    .unwrap();
    let failures = metric(&fg, r#"floodgate_config_reloads_total{result="failure"}"#).await;
    fg.signal("HUP");
    while metric(&fg, r#"floodgate_config_reloads_total{result="failure"}"#).await == failures {
        assert!(std::time::Instant::now() < deadline, "no failed reload");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ask("b").await, rls::Code::Ok as i32);
    assert_eq!(ask("b").await, rls::Code::Ok as i32);
    // A link to /dev/zero and a FIFO among the rules: each reload is refused naming the file
    // (before, the link was read until the process passed 1 GB), and the rules in force serve.
    std::fs::write(
        &rules,
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .unwrap();
    let zero = dir.path().join("zero.yaml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    for _ in 0..2 {
        let failures = metric(&fg, r#"floodgate_config_reloads_total{result="failure"}"#).await;
        fg.signal("HUP");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while metric(&fg, r#"floodgate_config_reloads_total{result="failure"}"#).await == failures {
            assert!(std::time::Instant::now() < deadline, "no failed reload");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            fg.stderr().contains("zero.yaml"),
            "the reload error names the file"
        );
        std::fs::remove_file(&zero).unwrap();
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&zero)
                .status()
                .unwrap()
                .success()
        );
    }
    assert_eq!(ask("c").await, rls::Code::Ok as i32);
    assert_eq!(ask("c").await, rls::Code::Ok as i32);
}

#[tokio::test]
async fn a_store_that_fails_follows_on_error_unavailable_or_ok() {
    let mut redis = RedisServer::start();
    let rules = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let storage = |on_error: &str| {
        format!(
            "storage:\n  backend: redis\n  url: {}\n  on_error: {on_error}\n  timeout: 100ms\n",
            redis.url()
        )
    };
    let deny = service_with(rules, &storage("deny"));
    let allow = service_with(rules, &storage("allow"));
    let request = rls::RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor(&[("k", "v")])],
        hits_addend: 0,
    };
    assert!(
        should_rate_limit(deny.fg.service_addr(), &request)
            .await
            .is_ok()
    );
    redis.kill();
    // deny: gRPC UNAVAILABLE (14), for Envoy's failure_mode_deny to decide; /json 503.
    let (code, _) = should_rate_limit(deny.fg.service_addr(), &request)
        .await
        .unwrap_err();
    assert_eq!(code, "14");
    let json = client()
        .post(deny.fg.service_url("/json"))
        .body(r#"{"domain":"edge","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(json.status(), 503);
    // allow: OK.
    let ok = should_rate_limit(allow.fg.service_addr(), &request)
        .await
        .unwrap();
    assert_eq!(ok.overall_code, rls::Code::Ok as i32);
}

/// Rules where a key holding a separator sits beside the key and value it spells when joined
/// (envoyproxy/ratelimit's `key_value` map would find `a_b` for `[a=b, c=Z]`).
const SEPARATORS: &str = r#"
domain: edge
descriptors:
  - key: a
    value: b
    descriptors:
      - key: c
        rate_limit: {unit: hour, requests_per_unit: 1, name: nested}
  - key: a_b
    rate_limit: {unit: hour, requests_per_unit: 100, name: joined}
  - key: "a:b"
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: "a|b"
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: "a\u001fb"
    rate_limit: {unit: hour, requests_per_unit: 100}
"#;

#[tokio::test]
async fn a_key_holding_a_separator_does_not_unlimit_a_nested_descriptor() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let svc = service_with(SEPARATORS, "");
    let nested = rls::RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor(&[("a", "b"), ("c", "Z")])],
        hits_addend: 0,
    };
    // Over gRPC: the nested limit of 1 applies.
    let first = should_rate_limit(svc.fg.service_addr(), &nested)
        .await
        .unwrap();
    assert_eq!(first.overall_code, rls::Code::Ok as i32);
    assert_eq!(
        first.statuses[0].current_limit.as_ref().unwrap().name,
        "nested"
    );
    let second = should_rate_limit(svc.fg.service_addr(), &nested)
        .await
        .unwrap();
    assert_eq!(second.overall_code, rls::Code::OverLimit as i32);
    // Over /json: the same rule, the same budget.
    let post = |body: &'static str| {
        let url = svc.fg.service_url("/json");
        async move { client().post(url).body(body).send().await.unwrap() }
    };
    let r = post(r#"{"domain":"edge","descriptors":[{"entries":[{"key":"a","value":"b"},{"key":"c","value":"Z"}]}]}"#).await;
    assert_eq!(r.status(), 429);
    // The joined key is a rule of its own.
    let r =
        post(r#"{"domain":"edge","descriptors":[{"entries":[{"key":"a_b","value":"Z"}]}]}"#).await;
    assert_eq!(r.status(), 200);
    let json: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(
        json["statuses"][0]["currentLimit"]["name"], "joined",
        "{json}"
    );
}

#[tokio::test]
async fn a_mistyped_json_field_is_400_and_spends_nothing() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let svc = service_with(RULES, "");
    let post = |body: &'static str| {
        let url = svc.fg.service_url("/json");
        async move { client().post(url).body(body).send().await.unwrap() }
    };
    for body in [
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/api/t"}],"isNegativeHits":"yes"}]}"#,
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/api/t"}],"hitsAddend":"1x"}]}"#,
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/api/t"}]}],"bogus":true}"#,
    ] {
        let r = post(body).await;
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
    // /api/t's 2 an hour are whole.
    let ok = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/api/t"}]}]}"#;
    assert_eq!(post(ok).await.status(), 200);
    assert_eq!(post(ok).await.status(), 200);
    assert_eq!(post(ok).await.status(), 429);
}

/// A message whose prefix announces 4 GiB, the stream then left open: refused as the prefix
/// arrives (`RESOURCE_EXHAUSTED`), not after the body timeout. 3 s is far above an answer that
/// needs no more bytes (milliseconds), and far below the 10 s the body timeout would take.
#[tokio::test]
async fn a_grpc_prefix_larger_than_the_limit_is_refused_when_it_arrives() {
    let svc = service_with(RULES, "");
    let (response, mut stream) = open_should_rate_limit(&svc).await;
    stream
        .send_data(
            bytes::Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]),
            false,
        )
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(3), response)
        .await
        .expect("answered before the rest of the message")
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["grpc-status"], "8");
    drop(stream);
}

/// Sends one gRPC `ShouldRateLimit` message, `message` as its bytes (not encoded by any
/// protobuf library: a test's own, malformed on purpose), over a raw HTTP/2 stream, and returns
/// the `grpc-status` and, for an answer, its `overall_code` (1 OK, 2 OVER_LIMIT).
async fn raw_should_rate_limit(svc: &Service, message: &[u8]) -> (String, Option<u8>) {
    let (response, mut stream) = open_should_rate_limit(svc).await;
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    stream.send_data(bytes::Bytes::from(frame), true).unwrap();
    let response = response.await.unwrap();
    let (head, mut body) = response.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        data.extend_from_slice(&chunk.unwrap());
    }
    let status = match head.headers.get("grpc-status") {
        Some(status) => status.to_str().unwrap().to_string(),
        None => body
            .trailers()
            .await
            .unwrap()
            .and_then(|t| {
                t.get("grpc-status")
                    .map(|v| v.to_str().unwrap().to_string())
            })
            .unwrap_or_default(),
    };
    // RateLimitResponse.overall_code is field 1, a varint: the message's first two bytes.
    let code = (data.len() >= 7 && data[5] == 1 << 3).then(|| data[6]);
    (status, code)
}

/// Protobuf by hand: a varint, and a length-delimited field holding `inner`.
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn nested(tag: u32, inner: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(&mut out, u64::from(tag << 3 | 2));
    varint(&mut out, inner.len() as u64);
    out.extend_from_slice(inner);
    out
}

/// `RateLimitRequest { domain: "edge", descriptors: [{entries: [path=/api/p], limit}] }` with
/// the descriptor's `limit` (a `RateLimitOverride`) as `limit` bytes, and `after` following the
/// descriptor's fields.
fn request_with_limit(limit: &[u8], after: &[u8]) -> Vec<u8> {
    let mut entry = nested(1, b"path");
    entry.extend(nested(2, b"/api/p"));
    let mut descriptor = nested(1, &entry);
    descriptor.extend(nested(2, limit));
    descriptor.extend_from_slice(after);
    let mut request = nested(1, b"edge");
    request.extend(nested(2, &descriptor));
    request
}

/// A malformed protobuf at any depth (here a descriptor's `limit.unit`, a varint cut short
/// where its message ends, with and without fields after it) is `INVALID_ARGUMENT` and spends
/// nothing: `/api/p`'s 2 an hour are whole afterwards.
#[tokio::test]
async fn a_malformed_protobuf_in_a_nested_field_is_invalid_argument_and_spends_nothing() {
    keep_clear_of_window_boundary(3600, Duration::from_secs(60)).await;
    let svc = service_with(RULES, "");
    // unit (field 2, a varint): 0x80 says another byte follows, and none does in `limit`.
    let truncated = [1 << 3, 5, 2 << 3, 0x80];
    for after in [&[][..], &[4 << 3, 0][..], &[3 << 3 | 2, 2, 1 << 3, 1][..]] {
        let (status, _) = raw_should_rate_limit(&svc, &request_with_limit(&truncated, after)).await;
        assert_eq!(status, "3", "INVALID_ARGUMENT, with {after:?} after it");
    }
    // A limit's varint running past the end of the whole message, and an overlong one.
    let mut cut = request_with_limit(&[1 << 3, 5], &[]);
    cut.extend_from_slice(&[3 << 3, 0x80]);
    assert_eq!(raw_should_rate_limit(&svc, &cut).await.0, "3");
    let overlong = [
        1 << 3,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0x01,
    ];
    let (status, _) = raw_should_rate_limit(&svc, &request_with_limit(&overlong, &[])).await;
    assert_eq!(status, "3", "a varint of eleven bytes");
    // The same request well formed: 2 allowed, then over the limit.
    let whole = request_with_limit(&[1 << 3, 5, 2 << 3, 3], &[]);
    for expected in [1, 1, 2] {
        assert_eq!(
            raw_should_rate_limit(&svc, &whole).await,
            ("0".to_string(), Some(expected))
        );
    }
}

/// A `ShouldRateLimit` call opened over a raw HTTP/2 connection (h2, no gRPC library): its
/// response to come and the stream to send the message on.
async fn open_should_rate_limit(
    svc: &Service,
) -> (h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>) {
    let tcp = tokio::net::TcpStream::connect(svc.fg.service_addr())
        .await
        .unwrap();
    let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut h2 = h2.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        svc.fg.service_addr()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    h2.send_request(request, false).unwrap()
}
