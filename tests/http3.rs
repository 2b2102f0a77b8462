//! HTTP/3 end to end: the real binary's QUIC listener (`http3:`) driven by aioquic
//! (`tests/http3/client.py`, a QUIC and HTTP/3 stack written apart from quinn and h3), beside
//! its TCP listener driven by reqwest over HTTP/1.1 and HTTP/2. The same routes, limits and
//! answers over each; `Alt-Svc` on TCP; what floods of resets and handshakes reach; 0-RTT; the
//! idle timeout; the drain.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::config::{Config, Limit, Route};
use common::{Floodgate, RedisServer, SelfSigned, UPSTREAM_BODY, Upstream, get, metric, python};
use http::{StatusCode, Version};
use serde_json::{Value, json};

/// floodgate serving `cert` on TCP and on QUIC (port 0 both), with `config`'s routes.
fn start(cert: &SelfSigned, config: Config, http3: &[(&str, &str)]) -> Floodgate {
    let mut config = cert.served(config).set("http3", "listen", "127.0.0.1:0");
    for (key, value) in http3 {
        config = config.set("http3", key, value);
    }
    // The access log on: the lines name each request's protocol.
    Floodgate::start_with_env(
        &config.yaml(),
        &[("RUST_LOG", "warn,floodgate::access=info")],
    )
}

/// Runs the aioquic client's `scenario` against `fg`'s QUIC listener and returns what it printed
/// (on a blocking thread: the test's upstream answers on this runtime meanwhile).
async fn h3(fg: &Floodgate, cert: &SelfSigned, scenario: &str, spec: Value) -> Value {
    let mut command = h3_command(fg, cert, scenario, spec);
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("run the HTTP/3 client");
    assert!(
        out.status.success(),
        "HTTP/3 client failed: {}\nfloodgate:\n{}",
        String::from_utf8_lossy(&out.stderr),
        fg.stderr()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("client printed {stdout:?}: {e}"))
}

fn h3_command(fg: &Floodgate, cert: &SelfSigned, scenario: &str, spec: Value) -> Command {
    let addr = fg.http3_addr();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/http3/client.py");
    let mut command = Command::new(python());
    command
        .arg(script)
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(cert.cert_file.path())
        .arg(scenario)
        .arg(spec.to_string());
    command
}

/// [`h3`] for a run that may fail: its JSON, or what it wrote to stderr.
async fn h3_try(
    fg: &Floodgate,
    ca: &SelfSigned,
    scenario: &str,
    spec: Value,
) -> Result<Value, String> {
    let mut command = h3_command(fg, ca, scenario, spec);
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("run the HTTP/3 client");
    match out.status.success() {
        true => Ok(serde_json::from_slice(&out.stdout).expect("client output")),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The answers of a `requests` run.
fn answers(result: &Value) -> &Vec<Value> {
    result["answers"].as_array().expect("answers")
}

/// A header of an aioquic answer (names are lowercase in HTTP/3).
fn header<'a>(answer: &'a Value, name: &str) -> Option<&'a str> {
    answer["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

/// A fresh certificate, an upstream, and floodgate with one route `/` to it, without limits,
/// serving HTTP/3 with `http3`'s settings.
async fn one_route(http3: &[(&str, &str)]) -> (SelfSigned, Upstream, Floodgate) {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let config = Config::new().route(Route::new("api", "/", &upstream.url()));
    let fg = start(&cert, config, http3);
    (cert, upstream, fg)
}

/// `https://localhost:PORT{path}` on the TCP listener.
fn https_url(fg: &Floodgate, path: &str) -> String {
    format!("https://localhost:{}{path}", fg.addr().port())
}

#[tokio::test]
async fn requests_and_streamed_bodies_with_trailers_go_through_the_pipeline_to_the_upstream() {
    let (cert, upstream, fg) = one_route(&[]).await;

    let result = h3(
        &fg,
        &cert,
        "requests",
        json!({"requests": [
            {"path": "/hello?x=1"},
            {"method": "POST", "path": "/echo", "headers": [["content-type", "text/plain"]],
             "chunks": ["one ", "two ", "three"], "trailers": [["x-checksum", "abc"]]},
        ]}),
    )
    .await;
    let answers = answers(&result);
    assert_eq!(answers[0]["status"], 200, "{result}");
    assert_eq!(answers[0]["body"], UPSTREAM_BODY);
    assert_eq!(answers[1]["status"], 200, "{result}");
    assert_eq!(
        answers[1]["body"], "one two three",
        "the body arrived whole"
    );

    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].path, "/hello");
    assert_eq!(seen[0].method, http::Method::GET);
    // Forwarded over HTTP/1.1, with the QUIC peer as the client.
    assert_eq!(seen[0].version, Version::HTTP_11);
    assert_eq!(seen[0].header("x-forwarded-for"), Some("127.0.0.1"));
    // The client's `:authority` and scheme, told as for any client over TLS.
    assert_eq!(
        seen[0].header("x-forwarded-host"),
        Some(&*format!("localhost:{}", fg.http3_addr().port()))
    );
    assert_eq!(seen[0].header("x-forwarded-proto"), Some("https"));
    assert_eq!(seen[1].method, http::Method::POST);
    assert_eq!(seen[1].header("content-type"), Some("text/plain"));
    // The access log names the protocol.
    let log = fg.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("path=\"/hello\""))
        .unwrap_or_else(|| panic!("no access log line in {log}"));
    assert!(line.contains("protocol=\"3\""), "{line}");
    // The requests counted as any other's.
    assert_eq!(
        metric(
            &fg,
            "floodgate_requests_total{route=\"api\",decision=\"unlimited\"}"
        )
        .await,
        2
    );
}

#[tokio::test]
async fn one_budget_is_spent_over_http1_http2_and_http3_and_refused_alike() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    // Six requests, and a refill far slower than the test.
    let config = Config::new().route(
        Route::new("api", "/", &upstream.url())
            .limit(Limit::token_bucket(6, 0.001).per("identity")),
    );
    let fg = start(&cert, config, &[]);
    let key = [("x-api-key", "k-shared")];
    let http1 = cert.client(fg.addr(), true);
    let http2 = cert.client(fg.addr(), false);

    for client in [&http1, &http2] {
        for _ in 0..2 {
            let reply = get(client, &https_url(&fg, "/"), &key).await;
            assert_eq!(reply.status, StatusCode::OK);
        }
    }
    assert_eq!(
        get(&http2, &https_url(&fg, "/"), &key).await.version,
        Version::HTTP_2
    );
    // That was the fifth: one left, then HTTP/3 is refused as HTTP/2 is.
    let request = json!({"path": "/", "headers": [["x-api-key", "k-shared"]]});
    let result = h3(
        &fg,
        &cert,
        "requests",
        json!({"requests": [request, request]}),
    )
    .await;
    let answers = answers(&result);
    assert_eq!(answers[0]["status"], 200, "{result}");
    assert_eq!(header(&answers[0], "x-ratelimit-remaining"), Some("0"));
    let refused_h3 = &answers[1];
    assert_eq!(refused_h3["status"], 429, "{result}");
    let refused_h2 = get(&http2, &https_url(&fg, "/"), &key).await;
    assert_eq!(refused_h2.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upstream.count(), 6, "the refusals reached no upstream");

    // The same answer: body, and every rate-limit header.
    assert_eq!(refused_h3["body"], refused_h2.body.as_str());
    for name in [
        "content-type",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "retry-after",
    ] {
        assert_eq!(
            header(refused_h3, name),
            Some(refused_h2.header(name)),
            "{name} differs"
        );
    }
    let reset_h3: u64 = header(refused_h3, "x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    let reset_h2 = refused_h2.header_u64("x-ratelimit-reset");
    // The same Unix second, or the next one if a second ended between the two answers.
    assert!(reset_h2.abs_diff(reset_h3) <= 1, "{reset_h3} vs {reset_h2}");
}

#[tokio::test]
async fn tcp_answers_advertise_http3_for_the_certificates_name_unless_told_not_to() {
    let (cert, upstream, fg) = one_route(&[]).await;
    let expected = format!("h3=\":{}\"; ma=86400", fg.http3_addr().port());
    for http1_only in [true, false] {
        let reply = get(
            &cert.client(fg.addr(), http1_only),
            &https_url(&fg, "/"),
            &[],
        )
        .await;
        assert_eq!(reply.header("alt-svc"), expected);
    }
    // A client that dials the address sends no SNI: the certificate's IP address (an IP SAN)
    // is the name it connected to, and it is told too.
    let by_address = format!("https://127.0.0.1:{}/", fg.addr().port());
    for http1_only in [true, false] {
        let reply = get(&cert.client(fg.addr(), http1_only), &by_address, &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("alt-svc"), expected, "by address");
    }
    // A request naming another host than the connection's (SNI) is told nothing.
    let reply = get(
        &cert.client(fg.addr(), true),
        &https_url(&fg, "/"),
        &[("host", "elsewhere.example")],
    )
    .await;
    assert!(reply.headers.get("alt-svc").is_none(), "{reply:?}");
    // HTTP/3 answers do not advertise themselves.
    let result = h3(&fg, &cert, "requests", json!({"requests": [{"path": "/"}]})).await;
    assert_eq!(header(&answers(&result)[0], "alt-svc"), None, "{result}");

    let quiet = start(
        &cert,
        Config::new().route(Route::new("api", "/", &upstream.url())),
        &[("advertise", "false")],
    );
    let reply = get(
        &cert.client(quiet.addr(), true),
        &https_url(&quiet, "/"),
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.headers.get("alt-svc").is_none());
}

#[tokio::test]
async fn streams_reset_as_they_open_spend_nothing_and_reach_no_upstream() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    // Three requests' budget: a reset stream that spent would leave less for the three after.
    let config = Config::new()
        .route(Route::new("api", "/", &upstream.url()).limit(Limit::token_bucket(3, 0.001)));
    let fg = start(&cert, config, &[]);
    let after = json!({"path": "/after"});
    let result = h3(
        &fg,
        &cert,
        "reset",
        json!({"streams": 50, "path": "/reset", "then": [after, after, after]}),
    )
    .await;
    let answers = answers(&result);
    for answer in answers {
        assert_eq!(answer["status"], 200, "{result}");
    }
    let paths: Vec<String> = upstream.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/after", "/after", "/after"]);
}

#[tokio::test]
async fn zero_rtt_is_never_accepted_and_a_resumed_client_is_served_after_its_handshake() {
    let (cert, _upstream, fg) = one_route(&[]).await;
    let result = h3(&fg, &cert, "zero_rtt", json!({"path": "/"})).await;
    assert_eq!(result["first"]["status"], 200, "{result}");
    // Tickets (if any) allow no early data, so aioquic sends none and waits for the handshake.
    let early = result["ticket_max_early_data"].as_u64().unwrap_or(0);
    assert_eq!(early, 0, "{result}");
    if result["tickets"].as_u64().unwrap() > 0 {
        assert_eq!(result["second"]["status"], 200, "{result}");
        assert_eq!(result["early_data_accepted"], false, "{result}");
    }
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_idle_timeout_and_counted_while_open() {
    let (cert, _upstream, fg) = one_route(&[("idle_timeout", "1s")]).await;
    let child = h3_command(&fg, &cert, "idle", json!({"wait": 5}))
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the HTTP/3 client");
    // Counted while the connection is open: read after its request (the answer comes in well
    // under half a second on loopback) and before its idle second is over.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut open = 0;
    while Instant::now() < deadline && open == 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        open = metric(&fg, "floodgate_http3_connections").await;
    }
    assert_eq!(open, 1);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let result: Value = serde_json::from_slice(&out.stdout).expect("client output");
    assert_eq!(answers(&result)[0]["status"], 200, "{result}");
    // Closed by the server's 1 s of silence: QUIC closes silently at the idle timeout, so
    // aioquic sees it by its own reckoning of the advertised timeout; between 1 s and 3 times it
    // (QUIC lets a peer wait up to three probe timeouts more).
    let after = result["closed_after"]
        .as_f64()
        .expect("the server closed it");
    assert!((0.9..4.0).contains(&after), "{result}");
    assert_eq!(metric(&fg, "floodgate_http3_connections").await, 0);
}

#[tokio::test]
async fn a_handshake_flood_makes_clients_prove_their_address_and_a_legitimate_one_is_served() {
    let (cert, upstream, fg) = one_route(&[]).await;
    let rss_before = rss_kib(fg.pid());
    // More half-open handshakes than floodgate carries before it asks for address validation
    // (256), none ever completed.
    let result = h3(
        &fg,
        &cert,
        "flood",
        json!({"handshakes": 400, "then": [{"path": "/legit"}]}),
    )
    .await;
    assert_eq!(answers(&result)[0]["status"], 200, "{result}");
    assert_eq!(result["retried"], true, "a Retry was asked for: {result}");
    let paths: Vec<String> = upstream.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/legit"]);
    // Bounded: 400 half-open handshakes hold a few megabytes at most (each keeps its first
    // flight and crypto state), nothing like their count times a connection's buffers.
    let grown = rss_kib(fg.pid()).saturating_sub(rss_before);
    assert!(grown < 48 * 1024, "grew {grown} KiB");
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

#[tokio::test]
async fn sigterm_lets_a_request_in_flight_finish_refuses_later_ones_and_closes_cleanly() {
    let (cert, upstream, fg) = one_route(&[]).await;
    let child = h3_command(&fg, &cert, "shutdown", json!({"path": "/slow"}))
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the HTTP/3 client");
    // The client says when its request is sent; the upstream holds `/slow` for 1.5 s, so the
    // signal lands while it is in flight once the upstream has it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.count() == 0 {
        assert!(Instant::now() < deadline, "the request never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fg.signal("TERM");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result: Value =
        serde_json::from_str(stdout.lines().last().unwrap()).expect("client output");
    assert_eq!(answers(&result)[0]["status"], 200, "{result}");
    assert_eq!(answers(&result)[0]["body"], "slow but done");
    assert!(
        result["late"]["status"].is_null(),
        "a request after the drain began: {result}"
    );
    assert_eq!(upstream.count(), 1);
    // Closed with H3_NO_ERROR.
    assert_eq!(result["closed"]["error_code"], 0x100, "{result}");
}

#[tokio::test]
async fn check_names_http3_without_tls_and_bad_fields() {
    let config = "listen: 127.0.0.1:0\nhttp3:\n  listen: nowhere\n  max_streams: 0\n  idle_timeout: 0s\nroutes: []\n";
    let file = common::TempFile::new(config);
    let out = common::floodgate_command(&[
        "check".as_ref(),
        "--config".as_ref(),
        file.path().as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for field in [
        "http3:",
        "http3.listen",
        "http3.max_streams",
        "http3.idle_timeout",
    ] {
        assert!(stderr.contains(field), "{field} not named in {stderr}");
    }
}

/// A gRPC message as the wire frames it: uncompressed, its length, its bytes.
fn grpc_frame(message: &str) -> String {
    let mut framed = String::from('\0');
    for byte in (message.len() as u32).to_be_bytes() {
        framed.push(char::from(byte));
    }
    framed + message
}

#[tokio::test]
async fn a_grpc_call_over_http3_reaches_an_http2_upstream_and_its_refusal_is_a_grpc_status() {
    let cert = SelfSigned::new();
    let grpc = common::GrpcServer::start();
    let upstream = format!("http://127.0.0.1:{}", grpc.port());
    let config = Config::new().route(
        Route::new("echo", "/floodgate.test.Echo/", &upstream)
            .with("upstream_protocol", "http2")
            .limit(Limit::fixed_window(1, "1h")),
    );
    let fg = start(&cert, config, &[]);
    let call = json!({
        "method": "POST",
        "path": "/floodgate.test.Echo/Unary",
        "headers": [["content-type", "application/grpc"], ["te", "trailers"]],
        "chunks": [grpc_frame("over quic")],
    });
    let result = h3(&fg, &cert, "requests", json!({"requests": [call, call]})).await;
    let answers = answers(&result);
    // The call: the message back, the server's initial metadata, and its trailers.
    let ok = &answers[0];
    assert_eq!(ok["status"], 200, "{result}");
    assert_eq!(header(ok, "content-type"), Some("application/grpc"));
    assert_eq!(header(ok, "x-initial"), Some("yes"));
    assert_eq!(ok["body"], grpc_frame("over quic"));
    let trailers = ok["trailers"].as_array().expect("trailers");
    assert!(trailers.contains(&json!(["grpc-status", "0"])), "{result}");
    assert!(trailers.contains(&json!(["x-trailer", "kept"])), "{result}");
    // Refused: RESOURCE_EXHAUSTED, trailers-only, as over HTTP/2.
    let refused = &answers[1];
    assert_eq!(refused["status"], 200, "{result}");
    assert_eq!(header(refused, "grpc-status"), Some("8"), "{result}");
}

#[tokio::test]
async fn a_body_past_max_body_size_is_refused_over_http3_too() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let config =
        Config::new()
            .with("max_body_size", "16")
            .route(Route::new("api", "/", &upstream.url()));
    let fg = start(&cert, config, &[]);
    let result = h3(
        &fg,
        &cert,
        "requests",
        json!({"requests": [
            {"method": "POST", "path": "/upload", "chunks": ["0123456789", "0123456789"]},
            {"method": "POST", "path": "/upload", "chunks": ["0123456789"]},
        ]}),
    )
    .await;
    let answers = answers(&result);
    assert_eq!(answers[0]["status"], 413, "{result}");
    assert_eq!(answers[1]["status"], 200, "{result}");
    assert_eq!(answers[1]["body"], "received 10 bytes");
}

#[tokio::test]
async fn sighup_certificates_serve_new_quic_connections() {
    let (old, new) = (SelfSigned::new(), SelfSigned::new());
    let upstream = Upstream::start().await;
    let routes = Config::new().route(Route::new("api", "/", &upstream.url()));
    let fg = start(&old, routes.clone(), &[]);
    let get_root = json!({"requests": [{"path": "/"}]});
    let before = h3(&fg, &old, "requests", get_root.clone()).await;
    assert_eq!(answers(&before)[0]["status"], 200);

    let config = new.served(routes).set("http3", "listen", "127.0.0.1:0");
    let reloads = r#"floodgate_config_reloads_total{result="success"}"#;
    let counted = metric(&fg, reloads).await;
    std::fs::write(
        fg.config_path(),
        format!("listen: 127.0.0.1:0\n{}", config.yaml()),
    )
    .unwrap();
    fg.signal("HUP");
    // The reload runs on its own task: a few ms; 10 s for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&fg, reloads).await == counted {
        assert!(Instant::now() < deadline, "not reloaded: {}", fg.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A client that trusts only the new certificate is served; one that trusts only the old
    // one no longer is.
    let after = h3(&fg, &new, "requests", get_root.clone()).await;
    assert_eq!(answers(&after)[0]["status"], 200);
    let refused = h3_try(&fg, &old, "requests", get_root).await;
    assert!(
        refused.is_err(),
        "the old certificate still served: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_over_quic_a_budget_admits_exactly_its_size() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let config = Config::new()
        .route(Route::new("api", "/", &upstream.url()).limit(Limit::fixed_window(300, "1h")));
    let fg = start(&cert, config, &[]);
    // 1,000 requests from 4 connections with 25 streams in flight each (quinn and h3 as the
    // client: the other stack's view of the same listener).
    let mut clients = Vec::new();
    for _ in 0..4 {
        let client = common::H3Client::connect(fg.http3_addr(), "localhost", cert.cert_der.clone())
            .await
            .expect("connect over QUIC");
        clients.push(client);
    }
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for client in &clients {
        for _ in 0..25 {
            let (client, next) = (client.clone(), next.clone());
            workers.spawn(async move {
                let mut statuses = Vec::new();
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 1000 {
                    statuses.push(client.get("/load", &[]).await.expect("an answer"));
                }
                statuses
            });
        }
    }
    let mut statuses = Vec::new();
    while let Some(done) = workers.join_next().await {
        statuses.extend(done.unwrap());
    }
    assert_eq!(statuses.len(), 1000);
    let allowed = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((allowed, refused), (300, 700));
    assert_eq!(upstream.count(), 300);
}

#[tokio::test]
async fn a_header_section_past_64_kib_is_refused_before_the_pipeline() {
    let (cert, upstream, fg) = one_route(&[]).await;
    // 40 fields of 2 KiB: 80 KiB in all (aioquic's encoder takes no single value that long).
    let fields: Vec<Value> = (0..40)
        .map(|i| json!([format!("x-big-{i}"), "x".repeat(2048)]))
        .collect();
    let result = h3(
        &fg,
        &cert,
        "requests",
        json!({"requests": [
            {"path": "/big", "headers": fields},
            {"path": "/small"},
        ]}),
    )
    .await;
    let answers = answers(&result);
    // h3 answers 431 itself (QPACK is decoded statelessly, so nothing of it was kept), and the
    // connection goes on serving.
    assert_eq!(answers[0]["status"], 431, "{}", answers[0]);
    assert_eq!(answers[1]["status"], 200, "{result}");
    let paths: Vec<String> = upstream.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/small"]);
}

#[tokio::test]
async fn malformed_frames_close_their_connection_and_nothing_else() {
    let (cert, upstream, fg) = one_route(&[]).await;
    let result = h3(
        &fg,
        &cert,
        "garbage",
        json!({
            "streams": [
                // A DATA frame before any HEADERS.
                "00046a756e6b",
                // HEADERS whose QPACK block is nonsense.
                "0105ffffffffff",
                // A frame type that is reserved for HTTP/2 (SETTINGS on a request stream).
                "0400",
            ],
            "then": [{"path": "/after"}],
        }),
    )
    .await;
    for closed in result["closed"].as_array().unwrap() {
        // A connection error (H3_FRAME_UNEXPECTED, QPACK_DECOMPRESSION_FAILED…), never a
        // silence: the server read the frame, refused it and closed.
        let code = closed["error_code"].as_u64().expect("closed by the server");
        assert!(code >= 0x100, "{result}");
    }
    assert_eq!(answers(&result)[0]["status"], 200, "{result}");
    assert_eq!(upstream.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_streams_bounds_the_requests_a_connection_has_at_once() {
    let (cert, upstream, fg) = one_route(&[("max_streams", "4")]).await;
    let client = common::H3Client::connect(fg.http3_addr(), "localhost", cert.cert_der.clone())
        .await
        .expect("connect over QUIC");
    // Twelve requests at once, each held 200 ms by the upstream: QUIC's stream credit lets the
    // client open four, and the others as those end; all are answered.
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let client = client.clone();
        calls.spawn(async move { client.get("/cost", &[("x-delay-ms", "200")]).await });
    }
    while let Some(done) = calls.join_next().await {
        assert_eq!(done.unwrap().expect("an answer"), 200);
    }
    assert_eq!(upstream.count(), 12);
    assert!(
        upstream.max_in_flight() <= 4,
        "{} at once",
        upstream.max_in_flight()
    );
}

#[tokio::test]
async fn streams_that_never_send_their_head_are_given_up_after_header_read() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let config =
        Config::new()
            .timeout("header_read", "1s")
            .route(Route::new("api", "/", &upstream.url()));
    let fg = start(&cert, config, &[("max_streams", "4")]);
    // Four silent streams take every place the connection has; the request after them gets
    // one only when floodgate gives them up (header_read: 1 s), and is then served.
    let result = h3(
        &fg,
        &cert,
        "silent",
        json!({"streams": 4, "then": [{"path": "/after"}]}),
    )
    .await;
    assert_eq!(answers(&result)[0]["status"], 200, "{result}");
    let seconds = result["seconds"].as_f64().unwrap();
    // At least the 1 s floodgate waited; well under the client's 10 s wait for an answer.
    assert!((0.9..8.0).contains(&seconds), "{result}");
    assert_eq!(upstream.count(), 1);
}

/// Frames h3 would hold whole, or that RFC 9114 forbids a client, close the connection as their
/// header arrives (`src/server/http3/frames.rs`), before anything of them is held: a HEADERS or
/// reserved-type frame declaring 2^62 − 1 bytes (`H3_EXCESSIVE_LOAD`, 0x107); on the control
/// stream, the same, a frame left incomplete past `header_read` (1 s here; the client waits 5),
/// a lowered `MAX_PUSH_ID` and a `CANCEL_PUSH` never allowed (`H3_ID_ERROR`, 0x108); a push
/// stream from the client (`H3_STREAM_CREATION_ERROR`, 0x103). Fresh connections are served.
#[tokio::test]
async fn frames_h3_would_hold_whole_or_a_client_may_not_send_close_the_connection() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let config =
        Config::new()
            .timeout("header_read", "1s")
            .route(Route::new("api", "/", &upstream.url()));
    let fg = start(&cert, config, &[]);
    let huge = "ffffffffffffffff";
    let payload = "00".repeat(4096);
    // Request streams: HEADERS (0x01) and a reserved type (0x21), each declaring 2^62 - 1.
    let result = h3(
        &fg,
        &cert,
        "garbage",
        json!({
            "streams": [format!("01{huge}{payload}"), format!("21{huge}{payload}")],
            "open": true,
            "then": [{"path": "/after"}],
        }),
    )
    .await;
    let closed = closed_codes(&result);
    assert_eq!(closed, [Some(0x107), Some(0x107)], "{result}");
    assert_eq!(answers(&result)[0]["status"], 200, "{result}");
    // Unidirectional streams: a control stream (type 0x00, SETTINGS 0x04 empty) then the frame.
    let control = "000400";
    let result = h3(
        &fg,
        &cert,
        "uni",
        json!({
            "connections": [
                [format!("{control}21{huge}{payload}")],
                [format!("{control}210501")],
                [format!("{control}0d010a0d0105")],
                [format!("{control}030103")],
                ["0100"],
            ],
            "wait": 5,
            "then": [{"path": "/after"}],
        }),
    )
    .await;
    let closed = closed_codes(&result);
    assert_eq!(
        closed,
        [
            Some(0x107),
            Some(0x107),
            Some(0x108),
            Some(0x108),
            Some(0x103)
        ],
        "{result}"
    );
    assert_eq!(answers(&result)[0]["status"], 200, "{result}");
    assert_eq!(upstream.count(), 2);
}

/// What h3 0.0.8 lets through and RFC 9114 §4.1.2 and §4.2 call malformed is refused by the
/// listener: connection-specific fields and `te` other than `trailers` reset the stream with
/// `H3_MESSAGE_ERROR` (0x10e) before any decision, and so do `content-length` values that
/// differ or are no number; DATA frames that do not add up to `content-length` never reach the
/// upstream as a whole body (the piece that completes it waits for the stream's end). The
/// upstream's `/upload` reads the whole body and says how long it was.
#[tokio::test]
async fn malformed_http3_requests_are_refused_and_never_forwarded_whole() {
    let (cert, upstream, fg) = one_route(&[]).await;
    let post = |headers: Value, chunks: Value| json!({"method": "POST", "path": "/upload", "headers": headers, "chunks": chunks});
    let result = h3(
        &fg,
        &cert,
        "requests",
        json!({"requests": [
            post(json!([["content-length", "4"]]), json!(["abcdefghij"])),
            post(json!([["content-length", "4"]]), json!(["abcd", "efghij"])),
            post(json!([["content-length", "10"]]), json!(["abcd"])),
            post(json!([["content-length", "4"], ["content-length", "5"]]), json!(["abcd"])),
            post(json!([["content-length", "four"]]), json!(["abcd"])),
            post(json!([["connection", "keep-alive"]]), json!(["abcd"])),
            post(json!([["transfer-encoding", "chunked"]]), json!(["abcd"])),
            post(json!([["upgrade", "websocket"]]), json!(["abcd"])),
            post(json!([["te", "gzip"]]), json!(["abcd"])),
            post(json!([["content-length", "4"], ["content-length", "4"]]), json!(["ab", "cd"])),
        ]}),
    )
    .await;
    let answers = answers(&result);
    // Lengths that disagree with the DATA: floodgate's 400, never the upstream's 200.
    for (i, answer) in answers[..3].iter().enumerate() {
        assert_eq!(answer["status"], 400, "request {i}: {answer}");
    }
    for (i, answer) in answers[3..9].iter().enumerate() {
        assert_eq!(answer["reset"], 0x10e, "request {}: {answer}", i + 3);
    }
    // The same length twice is one length (RFC 9110 §8.6).
    assert_eq!(answers[9]["status"], 200, "{}", answers[9]);
    assert_eq!(answers[9]["body"], "received 4 bytes");
    // The resets were never decided or forwarded: the upstream saw at most the three length
    // mismatches' heads (their bodies cut) and the last request.
    assert!(upstream.count() <= 4, "{}", upstream.count());
}

/// A stream reset while its request is being decided reaches no upstream and spends nothing:
/// the decision waits on a Redis 300 ms away (a delaying relay, 150 ms each way), the client
/// resets each of 10 streams 100 ms after its head, and floodgate's look before forwarding finds
/// the reset: each admitted one gives back its units (a token bucket's, and a settled limit's
/// reserve). The budget is 3: with the units kept, the three requests sent after would be
/// refused. Tolerance: the give-backs are sent when the decisions come back (~300 ms) and are
/// answered within three round trips (900 ms: the first settlement loads its script); the
/// client sends its next requests `pause` (2.5 s) after the resets: 1.3 s of slack on a loaded
/// machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_while_it_is_decided_reaches_no_upstream_and_spends_nothing() {
    let settled = Limit::fixed_window(3, "1h").with("refund_on", "[500]");
    reset_while_decided(&[Limit::token_bucket(3, 0.001), settled], false).await;
}

/// The same for a `scope: global` budget of 3: each admitted stream's unit goes back to the
/// region's slice (here the global store is behind the relay and the region's is near: the
/// region's commands have their own short timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_while_it_is_decided_gives_back_a_global_budget_s_unit() {
    let limit = Limit::token_bucket(3, 0.001)
        .with("scope", "global")
        .per("route");
    reset_while_decided(&[limit], true).await;
}

/// Ten streams reset 100 ms into a decision 300 ms long on `limits` (a budget of 3), then four
/// requests on the same connection: three admitted, one refused, only those three forwarded.
/// The store that decides is a Redis behind a relay that delays 150 ms each way: the region's
/// own, or with `global` the global store (the region's near).
async fn reset_while_decided(limits: &[Limit], global: bool) {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let far = RedisServer::start();
    let relay = common::DelayRelay::start(
        format!("127.0.0.1:{}", far.port).parse().unwrap(),
        Duration::from_millis(150),
    )
    .await;
    let near = global.then(RedisServer::start);
    let region_url = match &near {
        Some(near) => format!("redis://127.0.0.1:{}", near.port),
        None => relay.url(),
    };
    let mut config = Config::new()
        .storage("backend", "redis")
        .storage("url", &region_url)
        .storage("timeout", "5s")
        .storage("on_error", "deny");
    if global {
        let spec = format!(
            "{{url: \"{}\", region: eu, lease_ttl: 5s, timeout: 5s}}",
            relay.url()
        );
        config = config.storage("global", &spec);
    }
    let config = config.route(Route::new("api", "/", &upstream.url()).limits(limits.to_vec()));
    let fg = start(&cert, config, &[]);
    let after = json!({"path": "/after"});
    let result = h3(
        &fg,
        &cert,
        "reset",
        json!({
            "streams": 10,
            "after": 0.1,
            "pause": 2.5,
            // A declared length: the upstream's HTTP/1.1 client writes such a head before it
            // reads any of the body, so a forwarded request would reach the upstream.
            "headers": [["content-length", "100"]],
            "then": [after, after, after, after],
        }),
    )
    .await;
    let statuses: Vec<&Value> = answers(&result).iter().map(|a| &a["status"]).collect();
    assert_eq!(statuses, [200, 200, 200, 429], "{result}");
    let paths: Vec<String> = upstream.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/after"; 3], "the reset streams were not forwarded");
}

/// A connection that abandons streams faster than `http2_max_resets_per_second` (here 2 a
/// second, a burst of 4) is closed, as an HTTP/2 one is (`H3_EXCESSIVE_LOAD`): HTTP/3's
/// rapid reset. A fresh connection is served.
#[tokio::test]
async fn a_connection_that_resets_streams_past_its_budget_is_closed() {
    let cert = SelfSigned::new();
    let upstream = Upstream::start().await;
    let config = Config::new()
        .with("http2_max_resets_per_second", "2")
        .route(Route::new("api", "/", &upstream.url()));
    let fg = start(&cert, config, &[]);
    let result = h3(&fg, &cert, "reset", json!({"streams": 30, "then": []})).await;
    assert_eq!(result["closed"]["error_code"], 0x107, "{result}");
    let fresh = h3(
        &fg,
        &cert,
        "requests",
        json!({"requests": [{"path": "/fresh"}]}),
    )
    .await;
    assert_eq!(answers(&fresh)[0]["status"], 200, "{fresh}");
    assert_eq!(upstream.count(), 1);
}

/// Pseudo-header rules h3 0.0.8 folds away (RFC 9114 §4.1.2, §4.3) are checked on the QPACK
/// field section as it arrives: a duplicated `:method` (h3 would keep the last: a GET forwarded
/// as POST), a pseudo-header after a regular field, `:status` in a request, a pseudo-header in
/// trailers. Each closes its connection with `H3_MESSAGE_ERROR` (0x10e) before any decision;
/// nothing reaches the upstream, and a fresh connection is served.
#[tokio::test]
async fn pseudo_headers_out_of_place_are_malformed_and_never_forwarded() {
    let (cert, upstream, fg) = one_route(&[]).await;
    for request in [
        json!({"path": "/dup", "headers": [[":method", "POST"]]}),
        json!({"path": "/late", "headers": [["x-a", "1"], [":path", "/other"]]}),
        json!({"path": "/status", "headers": [[":status", "200"]]}),
        json!({"method": "POST", "path": "/trailers", "chunks": ["x"], "trailers": [[":path", "/x"]]}),
    ] {
        let result = h3(&fg, &cert, "requests", json!({"requests": [request]})).await;
        let answer = &answers(&result)[0];
        assert_eq!(answer["closed"]["error_code"], 0x10e, "{request}: {result}");
    }
    let result = h3(
        &fg,
        &cert,
        "requests",
        json!({"requests": [{"path": "/fine"}]}),
    )
    .await;
    assert_eq!(answers(&result)[0]["status"], 200, "{result}");
    let paths: Vec<String> = upstream.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/fine"]);
}

/// The error codes the server closed each of a scenario's connections with (`None`: not closed).
fn closed_codes(result: &Value) -> Vec<Option<u64>> {
    result["closed"]
        .as_array()
        .expect("closed")
        .iter()
        .map(|closed| closed["error_code"].as_u64())
        .collect()
}
