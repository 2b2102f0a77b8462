//! gRPC through floodgate, end to end with real gRPC software: a grpcio server behind floodgate
//! (`upstream_protocol: http2`) and the grpcio client in front, over h2c and over TLS, for every
//! call type with its metadata and trailers; floodgate's own refusals in gRPC's words (status,
//! message, pushback, `google.rpc.RetryInfo` read by grpcio-status), grpcio's retry policy
//! obeying the pushback, and `grpc-timeout` bounding the upstream wait (a raw h2 client, which
//! sees the frames).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::config::{Config, Limit, Route};
use common::{
    Floodgate, GrpcServer, SelfSigned, grpc_calls, grpc_client, metric, read_calls, unix_now_ms,
    yaml_path,
};
use serde_json::Value;

const ECHO: &str = "/floodgate.test.Echo/";

/// A route to the grpcio server's Echo service over HTTP/2, and one to its health service.
fn grpc_routes(config: Config, upstream: &str, echo: Route) -> Config {
    config.route(echo.with("upstream_protocol", "http2")).route(
        Route::new("health", "/grpc.health.v1.Health/", upstream)
            .with("upstream_protocol", "http2"),
    )
}

fn code(call: &Value) -> &str {
    call["code"].as_str().unwrap_or("?")
}

/// Every call type, its metadata and trailers, and a failing call's status, as the grpcio client
/// sees them through floodgate at `target`.
fn assert_every_call_type_passes(target: &str, options: &[&str]) {
    let calls = grpc_calls(
        target,
        &[
            "unary",
            "fail",
            "server_stream:1000",
            "client_stream:200",
            "bidi:100",
            "health",
            "big:200000",
        ],
        options,
    );
    let [unary, fail, server, client, bidi, health, big] = &calls[..] else {
        panic!("seven calls: {calls:?}");
    };
    assert_eq!(code(unary), "OK", "{unary}");
    assert_eq!(unary["echoed"], true);
    assert_eq!(
        unary["initial"]["x-initial"], "yes",
        "initial metadata: {unary}"
    );
    assert_eq!(unary["trailing"]["x-trailer"], "kept", "trailers: {unary}");
    assert_eq!(
        unary["trailing"]["x-trailer-bin"], "0001ff",
        "binary trailer: {unary}"
    );
    // An error status and its trailing metadata come back in trailers too.
    assert_eq!(code(fail), "NOT_FOUND", "{fail}");
    assert_eq!(fail["details"], "nothing here");
    assert_eq!(fail["trailing"]["x-why"], "because");
    assert_eq!(code(server), "OK", "{server}");
    assert_eq!(server["count"], 1000);
    assert_eq!(server["in_order"], true);
    assert_eq!(server["trailing"]["x-count"], "1000");
    assert_eq!(code(client), "OK", "{client}");
    assert_eq!(client["response"], "200:800");
    assert_eq!(code(bidi), "OK", "{bidi}");
    assert_eq!(bidi["count"], 100);
    assert_eq!(bidi["echoed"], true);
    assert_eq!(code(health), "OK", "{health}");
    assert_eq!(health["status"], "SERVING");
    assert_eq!(code(big), "OK", "{big}");
    assert_eq!(big["echoed"], true);
}

#[test]
fn every_call_type_passes_through_h2c_with_trailers_intact() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    let config = grpc_routes(
        Config::new(),
        &upstream,
        Route::new("echo", ECHO, &upstream),
    );
    let fg = Floodgate::start(&config.yaml());
    assert_every_call_type_passes(&fg.addr().to_string(), &[]);
}

#[test]
fn a_long_stream_outlives_the_body_timeouts_while_messages_flow() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    // 12 messages 250 ms apart: 3 s of stream under 1 s body timeouts (the silence between
    // messages is what they bound), and a concurrency limit of 1 that the stream holds.
    let echo = Route::new("echo", ECHO, &upstream).limit(Limit::concurrency(1));
    let config = grpc_routes(
        Config::new()
            .timeout("upstream_body", "1s")
            .timeout("client_body", "1s"),
        &upstream,
        echo,
    );
    let fg = Floodgate::start(&config.yaml());
    let target = fg.addr().to_string();
    let stream = grpc_client(&target, &["ticks:12:250"], &[]);
    // While it flows, its slot is taken: another call is refused. The other calls start only
    // once the stream holds the slot (its admission counted when its response head went out):
    // a call sent earlier could take the slot first and have the stream refused.
    let admitted = r#"floodgate_requests_total{route="echo",decision="allowed"}"#;
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while rt.block_on(common::metric(&fg, admitted)) < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream was never admitted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let refused = loop {
        let call = grpc_calls(&target, &["unary"], &[]).remove(0);
        if code(&call) != "OK" || std::time::Instant::now() > deadline {
            break call;
        }
    };
    assert_eq!(code(&refused), "RESOURCE_EXHAUSTED", "{refused}");
    let streamed = read_calls(stream.wait_with_output().unwrap());
    assert_eq!(code(&streamed[0]), "OK", "{}", streamed[0]);
    assert_eq!(streamed[0]["count"], 12);
    // Once it ended, the slot is free again.
    assert_eq!(code(&grpc_calls(&target, &["unary"], &[])[0]), "OK");
}

#[test]
fn every_call_type_passes_over_tls_on_both_hops() {
    // The client speaks TLS to floodgate (ALPN h2), floodgate speaks TLS to the grpcio server:
    // once with `http2` (ALPN h2 only), once with `auto` (ALPN picks h2).
    let upstream_cert = SelfSigned::new();
    let server = GrpcServer::start_tls(
        upstream_cert.cert_file.path(),
        upstream_cert.key_file.path(),
    );
    let upstream = format!("https://localhost:{}", server.port());
    let front = SelfSigned::new();
    for protocol in ["http2", "auto"] {
        let config = Config::new()
            .with("upstream_ca", &yaml_path(&upstream_cert.cert_file))
            .route(Route::new("echo", ECHO, &upstream).with("upstream_protocol", protocol))
            .route(
                Route::new("health", "/grpc.health.v1.Health/", &upstream)
                    .with("upstream_protocol", protocol),
            );
        let fg = Floodgate::start(&front.served(config).yaml());
        let target = format!("localhost:{}", fg.addr().port());
        let ca = front.cert_file.path().to_str().expect("a UTF-8 temp path");
        assert_every_call_type_passes(&target, &["--tls-ca", ca]);
    }
}

#[tokio::test]
async fn a_limited_call_is_resource_exhausted_with_its_retry_delay_in_both_forms() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    // Two calls, then one more every 2 s: the third call waits up to 2 s.
    let echo = Route::new("echo", ECHO, &upstream).limit(Limit::token_bucket(2, 0.5));
    let config = grpc_routes(Config::new(), &upstream, echo);
    let fg = Floodgate::start(&config.yaml());
    let calls = grpc_calls(&fg.addr().to_string(), &["unary", "unary", "unary"], &[]);
    assert_eq!(code(&calls[0]), "OK");
    assert_eq!(
        calls[0]["initial"]["x-ratelimit-limit"], "2",
        "{}",
        calls[0]
    );
    let limited = &calls[2];
    assert_eq!(code(limited), "RESOURCE_EXHAUSTED", "{limited}");
    assert_eq!(limited["details"], "rate limit exceeded");
    // The rich status (grpc-status-details-bin, read by grpcio-status) says the same.
    assert_eq!(limited["status_code"], 8, "{limited}");
    assert_eq!(limited["status_message"], "rate limit exceeded");
    let delay = limited["retry_delay_ms"].as_u64().expect("a RetryInfo");
    let pushback: u64 = limited["trailing"]["grpc-retry-pushback-ms"]
        .as_str()
        .expect("grpc-retry-pushback-ms")
        .parse()
        .unwrap();
    assert!(delay > 0 && delay <= 2000, "{limited}");
    // Both from the same instant: the RetryInfo is exact, the pushback rounded up to the ms.
    assert!(pushback == delay || pushback == delay + 1, "{limited}");
    assert_eq!(limited["trailing"]["x-ratelimit-limit"], "2");
    assert_eq!(limited["trailing"]["x-ratelimit-remaining"], "0");
    assert_eq!(
        metric(
            &fg,
            "floodgate_requests_total{route=\"echo\",decision=\"denied\"}"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn grpc_retry_policy_waits_for_the_pushback_and_then_passes() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    // One call, then one more every 500 ms.
    let echo = Route::new("echo", ECHO, &upstream).limit(Limit::token_bucket(1, 2.0));
    let fg = Floodgate::start(&grpc_routes(Config::new(), &upstream, echo).yaml());
    let calls = grpc_calls(&fg.addr().to_string(), &["unary", "retry"], &[]);
    assert_eq!(code(&calls[0]), "OK");
    // The retry policy retries RESOURCE_EXHAUSTED after a 10 s backoff, unless the server's
    // pushback says when: the call passes on its second attempt (before the change, it failed
    // UNAVAILABLE, which the policy does not retry).
    let retried = &calls[1];
    assert_eq!(code(retried), "OK", "{retried}");
    assert_eq!(
        metric(
            &fg,
            "floodgate_requests_total{route=\"echo\",decision=\"denied\"}"
        )
        .await,
        1,
        "one attempt refused, then one admitted"
    );
    // A lower bound only: the retry cannot have come before the pushback (up to 500 ms; the
    // first call's own time came off it, so allow the half of it).
    assert!(retried["elapsed_ms"].as_u64().unwrap() >= 250, "{retried}");
}

#[test]
fn unavailable_is_the_rate_limited_status_when_the_route_says_so() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    let echo = Route::new("echo", ECHO, &upstream)
        .limit(Limit::token_bucket(1, 0.5))
        .with("grpc_rate_limited_status", "unavailable");
    let fg = Floodgate::start(&grpc_routes(Config::new(), &upstream, echo).yaml());
    let calls = grpc_calls(&fg.addr().to_string(), &["unary", "unary"], &[]);
    assert_eq!(code(&calls[1]), "UNAVAILABLE", "{}", calls[1]);
    assert!(
        calls[1]["retry_delay_ms"].as_u64().is_some(),
        "{}",
        calls[1]
    );
}

#[test]
fn floodgates_own_refusals_are_grpc_statuses() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let config = Config::new()
        .consumers("reject")
        .with("max_body_size", "1k")
        .timeout("upstream_response", "500ms")
        .route(
            Route::new("gone", "/gone.Service/", &format!("http://{closed}"))
                .with("upstream_protocol", "http2"),
        )
        .route(Route::new("echo", ECHO, &upstream).with("upstream_protocol", "http2"));
    let fg = Floodgate::start(&config.yaml());
    let target = fg.addr().to_string();
    // gRPC clients map HTTP statuses to codes too (404 to UNIMPLEMENTED, 502 to UNAVAILABLE),
    // so each refusal is also told by floodgate's own message, which only a gRPC status carries
    // (from an HTTP status, grpcio says "Received http2 header with status: …").
    let expect = |scenario: &str, options: &[&str], want: &str, message: &str| {
        let calls = grpc_calls(&target, &[scenario], options);
        assert_eq!(code(&calls[0]), want, "{scenario}: {}", calls[0]);
        let details = calls[0]["details"].as_str().unwrap_or("");
        assert!(details.contains(message), "{scenario}: {}", calls[0]);
    };
    expect("path:/other.Service/Call", &[], "UNIMPLEMENTED", "no route");
    expect(
        "unary",
        &["--key", "not-a-known-key"],
        "UNAUTHENTICATED",
        "API key is not known",
    );
    expect(
        "path:/gone.Service/Call",
        &[],
        "UNAVAILABLE",
        "cannot connect",
    );
    expect("big:5000", &[], "RESOURCE_EXHAUSTED", "max_body_size");
    // The upstream answers after 3 s, floodgate waits 500 ms (the client 10 s).
    expect(
        "slow:3000:10000",
        &[],
        "DEADLINE_EXCEEDED",
        "did not answer in time",
    );
    // And a call that passes still passes.
    let calls = grpc_calls(&target, &["unary"], &[]);
    assert_eq!(code(&calls[0]), "OK", "{}", calls[0]);
}

#[test]
fn an_unavailable_store_under_on_error_deny_is_unavailable() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let echo = Route::new("echo", ECHO, &upstream).limit(Limit::token_bucket(10, 1.0));
    let config = grpc_routes(
        Config::new()
            .redis(&format!("redis://{closed}"), "deny")
            .storage("timeout", "50ms"),
        &upstream,
        echo,
    );
    let fg = Floodgate::start(&config.yaml());
    let calls = grpc_calls(&fg.addr().to_string(), &["unary"], &[]);
    assert_eq!(code(&calls[0]), "UNAVAILABLE", "{}", calls[0]);
    assert!(
        calls[0]["details"]
            .as_str()
            .is_some_and(|d| d.contains("rate limiter")),
        "{}",
        calls[0]
    );
}

#[tokio::test]
async fn a_call_the_upstreams_gate_sheds_is_unavailable_with_pushback() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    let echo = Route::new("echo", ECHO, &upstream).with(
        "adaptive_concurrency",
        "{min_limit: 1, max_limit: 1, queue_timeout: 10ms}",
    );
    let fg = Floodgate::start(&grpc_routes(Config::new(), &upstream, echo).yaml());
    let target = fg.addr().to_string();
    // One slow call holds the only slot (6 s); a call made while it does is shed. (Each probe
    // below is a Python process: on a loaded machine one took over a second to start, and a
    // 3 s hold was once over before any probe landed in it.)
    let mut holder = grpc_client(&target, &["slow:6000:20000"], &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let shed = loop {
        let call = grpc_calls(&target, &["unary"], &[]).remove(0);
        if code(&call) != "OK" || std::time::Instant::now() > deadline {
            break call;
        }
        // The holder's process had not started its call yet; or its call came while a probe
        // held the slot, and was shed itself (seen on a loaded machine): then it goes again.
        if holder.try_wait().expect("the holder's status").is_some() {
            holder = grpc_client(&target, &["slow:6000:20000"], &[]);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(code(&shed), "UNAVAILABLE", "{shed}");
    assert_eq!(shed["retry_delay_ms"], 1000, "{shed}");
    let held = read_calls(holder.wait_with_output().unwrap());
    assert_eq!(code(&held[0]), "OK", "{}", held[0]);
    assert!(
        metric(
            &fg,
            "floodgate_requests_total{route=\"echo\",decision=\"overloaded\"}"
        )
        .await
            >= 1
    );
}

/// One gRPC call over a raw h2 connection: the response head, whether it ended the stream
/// (a trailers-only response), and the trailers if any.
async fn raw_grpc_call(
    addr: SocketAddr,
    path: &str,
    extra: &[(&str, &str)],
    message: &[u8],
) -> (http::response::Parts, bool, Option<http::HeaderMap>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let (response, mut send) = client
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    // A gRPC message: uncompressed flag, 4-byte length, the bytes.
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    send.send_data(Bytes::from(frame), true).unwrap();
    let response = response.await.unwrap();
    let (parts, mut body) = response.into_parts();
    let trailers_only = body.is_end_stream();
    while let Some(chunk) = body.data().await {
        let _ = chunk.unwrap();
    }
    let trailers = body.trailers().await.unwrap();
    (parts, trailers_only, trailers)
}

#[tokio::test]
async fn grpc_timeout_bounds_the_wait_for_the_upstream() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    let echo = Route::new("echo", ECHO, &upstream);
    let config = grpc_routes(
        Config::new().timeout("upstream_response", "30s"),
        &upstream,
        echo,
    );
    let fg = Floodgate::start(&config.yaml());
    let path = "/floodgate.test.Echo/Unary";
    // The upstream answers after 2 s; the client gives the call 300 ms and has no timer of its
    // own here: floodgate answers DEADLINE_EXCEEDED itself (before, it waited the 2 s and
    // relayed OK).
    let (head, trailers_only, _) =
        raw_grpc_call(fg.addr(), path, &[("grpc-timeout", "300m")], b"slow:2000").await;
    assert_eq!(head.status, 200);
    assert!(trailers_only, "a trailers-only response: {head:?}");
    assert_eq!(head.headers["content-type"], "application/grpc");
    assert_eq!(head.headers["grpc-status"], "4", "{head:?}");
    // Without grpc-timeout the same call waits for the upstream, and its status comes in the
    // trailers.
    let (head, trailers_only, trailers) = raw_grpc_call(fg.addr(), path, &[], b"slow:200").await;
    assert_eq!(head.status, 200);
    assert!(!trailers_only);
    let trailers = trailers.expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["x-trailer"], "kept");
}

#[tokio::test]
async fn a_rate_limited_call_is_one_headers_frame_with_the_contracts_fields() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    let echo = Route::new("echo", ECHO, &upstream).limit(Limit::fixed_window(1, "1h"));
    let fg = Floodgate::start(&grpc_routes(Config::new(), &upstream, echo).yaml());
    let path = "/floodgate.test.Echo/Unary";
    let (first, _, _) = raw_grpc_call(fg.addr(), path, &[], b"hi").await;
    assert_eq!(first.headers["x-ratelimit-remaining"], "0");
    let before = unix_now_ms();
    let (head, trailers_only, _) = raw_grpc_call(fg.addr(), path, &[], b"hi").await;
    assert_eq!(head.status, 200);
    assert!(trailers_only, "HEADERS with END_STREAM: {head:?}");
    let h = &head.headers;
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "8");
    assert_eq!(h["grpc-message"], "rate limit exceeded");
    assert_eq!(h["x-ratelimit-limit"], "1");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    // The pushback points at the window's end, as X-RateLimit-Reset does (whole seconds).
    let pushback: u64 = h["grpc-retry-pushback-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let reset: u64 = h["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
    let retry_at_ms = before + pushback;
    assert!(
        retry_at_ms.abs_diff(reset * 1000) <= 2000,
        "{pushback} ms vs reset {reset}"
    );
    assert!(h.contains_key("grpc-status-details-bin"));
}

/// The learned limit of the route to `upstream` (`floodgate_adaptive_limit`).
async fn adaptive_limit(fg: &Floodgate, upstream: &str) -> u64 {
    metric(
        fg,
        &format!("floodgate_adaptive_limit{{upstream=\"{upstream}\"}}"),
    )
    .await
}

/// The adaptive gate hears a gRPC upstream's overload: `UNAVAILABLE` in a trailers-only answer
/// and `RESOURCE_EXHAUSTED` in the trailers of a stream are overload signals, as 503 is, so
/// the learned limit never grows on them, while healthy calls of the same latency under the
/// same load make it grow (the control). Before, such a failure was a success, and the limit
/// grew on it as on the healthy calls.
///
/// Timing: every call takes 50 ms in the server, so a window's latency is steady (the
/// controller backs off when it exceeds 1.3 × the baseline); 8 clients of 20 calls each keep
/// more calls in flight than a limit of 2 for about 4 s, many 100 ms windows; the gate's queue
/// timeout (5 s) refuses none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_overload_statuses_are_overload_signals_for_the_adaptive_gate() {
    let server = GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", server.port());
    let gate = "{min_limit: 2, max_limit: 100, queue_timeout: 5s}";
    let start = || {
        let route = Route::new("echo", ECHO, &upstream).with("adaptive_concurrency", gate);
        Floodgate::start(&grpc_routes(Config::new(), &upstream, route).yaml())
    };
    let load = |fg: &Floodgate, scenario: &str| {
        let clients: Vec<_> = (0..8)
            .map(|_| grpc_client(&fg.addr().to_string(), &[scenario], &[]))
            .collect();
        clients
            .into_iter()
            .flat_map(|c| read_calls(c.wait_with_output().expect("client")))
            .collect::<Vec<Value>>()
    };

    // The control: healthy calls grow the limit.
    let fg = start();
    let calls = load(&fg, "calm:20");
    let ok: u64 = calls
        .iter()
        .map(|c| c["codes"]["OK"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(ok, 160, "{calls:?}");
    assert!(
        adaptive_limit(&fg, &upstream).await > 2,
        "healthy calls under load grow the limit"
    );
    for scenario in ["shed:20", "exhausted:20"] {
        let fg = start();
        let calls = load(&fg, scenario);
        let want = if scenario.starts_with("shed") {
            "UNAVAILABLE"
        } else {
            "RESOURCE_EXHAUSTED"
        };
        let answered: u64 = calls
            .iter()
            .map(|c| c["codes"][want].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(
            answered, 160,
            "the upstream's own answers came through: {calls:?}"
        );
        assert_eq!(adaptive_limit(&fg, &upstream).await, 2, "{scenario}");
    }
}

/// A pool of two grpcio servers (127.0.0.2 and 127.0.0.3, one port) behind one HTTP/2 route,
/// connections per endpoint: calls are spread over both, and once one is killed the calls go on
/// on the other (its connection's failure and the connect failures that follow are retried
/// there, and the dead one is ejected).
#[test]
fn grpc_calls_go_on_through_a_pool_when_one_server_is_killed() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let first = GrpcServer::start_on(&format!("127.0.0.2:{port}"));
    let _second = GrpcServer::start_on(&format!("127.0.0.3:{port}"));
    let fg = Floodgate::start(&format!(
        "admin_listen: 127.0.0.1:0\nroutes:\n  - name: echo\n    path_prefix: {ECHO}\n    upstream_protocol: http2\n    upstreams: [http://127.0.0.2:{port}, http://127.0.0.3:{port}]\n    balance: round_robin\n"
    ));
    let target = fg.addr().to_string();
    let calls = grpc_calls(&target, &["unary"; 6], &[]);
    assert!(calls.iter().all(|c| code(c) == "OK"), "{calls:?}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    for ip in ["127.0.0.2", "127.0.0.3"] {
        let series =
            format!(r#"floodgate_upstream_requests_total{{route="echo",endpoint="{ip}:{port}"}}"#);
        assert_eq!(
            rt.block_on(metric(&fg, &series)),
            3,
            "round robin over both"
        );
    }
    drop(first); // SIGKILL
    let calls = grpc_calls(&target, &["unary"; 8], &[]);
    assert!(calls.iter().all(|c| code(c) == "OK"), "{calls:?}");
}
