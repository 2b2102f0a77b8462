//! OpenTelemetry over OTLP/HTTP, received by a real decoder (`tests/telemetry/receiver.py`,
//! PyPI's opentelemetry-proto message classes), with the OpenTelemetry Python SDK as a client
//! that sends `traceparent`, and an upstream that records the one it receives; and the
//! dashboard, loaded in headless Chromium.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// The receiver: what it has decoded so far, one JSON object per span or metric.
struct Receiver {
    child: Child,
    port: u16,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/telemetry/receiver.py");
        let mut child = Command::new(python())
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the OTLP receiver");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a first line").expect("utf-8");
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line: {first}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        Receiver { child, port, seen }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits (10 s at most: spans leave in batches every half second) until `pick` finds
    /// something among what was received, and returns every match.
    fn wait_for(&self, what: &str, pick: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found: Vec<Value> = self
                .seen
                .lock()
                .unwrap()
                .iter()
                .filter(|v| pick(v))
                .cloned()
                .collect();
            if !found.is_empty() {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} received; got: {:#?}",
                self.seen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python SDK client's call to `url`: its trace and span ids and the status it got.
fn traced_call(url: &str, sampled: bool) -> Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/telemetry/client.py");
    let out = Command::new(python())
        .arg(script)
        .arg(url)
        .arg(if sampled { "sampled" } else { "unsampled" })
        .output()
        .expect("run the traced client");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

fn attr<'v>(span: &'v Value, name: &str) -> &'v Value {
    &span["attributes"][name]
}

// Multi-threaded: the traced client is a blocking child process while the upstream, on this
// runtime, answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_from_the_client_through_the_decision_to_the_upstream() {
    let receiver = Receiver::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&format!(
        "telemetry:\n  otlp_endpoint: {}\n  service_name: edge-gw\n  metrics_interval: 200ms\nroutes:\n  - name: api\n    path_prefix: /api\n    upstream: {}\n    limits:\n      - {{algorithm: fixed_window, limit: 1, window: 1h, per: ip}}\n  - name: open\n    path_prefix: /open\n    upstream: {}\n",
        receiver.endpoint(),
        upstream.url(),
        upstream.url()
    ));
    // Allowed: the client's trace continues through floodgate to the upstream.
    let call = traced_call(&fg.url("/api/orders"), true);
    assert_eq!(call["status"], 200);
    let trace_id = call["trace_id"].as_str().unwrap().to_string();
    let server = receiver.wait_for("the SERVER span", |v| {
        v["signal"] == "span" && v["kind"] == "SERVER" && v["trace_id"] == trace_id.as_str()
    });
    let server = &server[0];
    assert_eq!(server["service"], "edge-gw");
    assert_eq!(server["name"], "GET api");
    assert_eq!(server["parent_span_id"], call["span_id"]);
    assert_eq!(attr(server, "http.request.method"), "GET");
    assert_eq!(attr(server, "url.path"), "/api/orders");
    assert_eq!(attr(server, "http.route"), "/api");
    assert_eq!(attr(server, "http.response.status_code"), 200);
    assert_eq!(attr(server, "floodgate.route"), "api");
    assert_eq!(attr(server, "floodgate.decision"), "allowed");
    assert_eq!(attr(server, "floodgate.limit"), 0);
    assert_eq!(attr(server, "floodgate.remaining"), 0);
    assert_eq!(attr(server, "floodgate.identity.kind"), "ip");
    assert_eq!(attr(server, "client.address"), "127.0.0.1");
    let server_id = server["span_id"].as_str().unwrap().to_string();
    let client = receiver.wait_for("the forwarded request's CLIENT span", |v| {
        v["kind"] == "CLIENT" && v["parent_span_id"] == server_id.as_str()
    });
    let client_id = client[0]["span_id"].as_str().unwrap();
    // It names the endpoint the request went to: its address and port.
    assert_eq!(attr(&client[0], "server.address"), "127.0.0.1");
    assert_eq!(attr(&client[0], "server.port"), upstream.addr().port());
    // The upstream got a traceparent naming the CLIENT span, sampled.
    let seen = upstream.seen();
    let traceparent = seen[0]
        .header("traceparent")
        .expect("a traceparent upstream");
    assert_eq!(traceparent, format!("00-{trace_id}-{client_id}-01"));

    // Refused: traced like any other request.
    let refused = traced_call(&fg.url("/api/orders"), true);
    assert_eq!(refused["status"], 429);
    let refused_id = refused["trace_id"].as_str().unwrap().to_string();
    let server = receiver.wait_for("the refused request's span", |v| {
        v["kind"] == "SERVER" && v["trace_id"] == refused_id.as_str()
    });
    assert_eq!(attr(&server[0], "floodgate.decision"), "denied");
    assert_eq!(attr(&server[0], "http.response.status_code"), 429);
    assert_eq!(upstream.count(), 1);

    // An unsampled client: floodgate exports nothing of that trace, and the upstream hears
    // flags 00.
    let quiet = traced_call(&fg.url("/open"), false);
    assert_eq!(quiet["status"], 200);
    let quiet_id = quiet["trace_id"].as_str().unwrap().to_string();
    let seen = upstream.seen();
    let traceparent = seen.last().unwrap().header("traceparent").unwrap();
    assert!(
        traceparent.starts_with(&format!("00-{quiet_id}-")) && traceparent.ends_with("-00"),
        "{traceparent}"
    );
    // OTLP metrics carry /metrics' names.
    let metric = receiver.wait_for("floodgate_requests_total over OTLP", |v| {
        v["signal"] == "metric" && v["name"] == "floodgate_requests_total"
    });
    assert_eq!(metric[0]["kind"], "sum");
    assert!(
        !receiver
            .seen
            .lock()
            .unwrap()
            .iter()
            .any(|v| v["trace_id"] == quiet_id.as_str()),
        "an unsampled trace was exported"
    );
}

/// An HTTP/3 request (aioquic, `tests/http3/client.py`) is a SERVER span like any other, its
/// protocol version `3`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http3_request_is_a_server_span_with_protocol_version_3() {
    let receiver = Receiver::start();
    let upstream = Upstream::start().await;
    let cert = SelfSigned::new();
    let fg = Floodgate::start(&format!(
        "tls:\n  cert: {}\n  key: {}\nhttp3:\n  listen: 127.0.0.1:0\ntelemetry:\n  otlp_endpoint: {}\nroutes:\n  - name: api\n    path_prefix: /\n    upstream: {}\n",
        yaml_path(&cert.cert_file),
        yaml_path(&cert.key_file),
        receiver.endpoint(),
        upstream.url()
    ));
    let addr = fg.http3_addr();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/http3/client.py");
    let out = Command::new(python())
        .arg(script)
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(cert.cert_file.path())
        .arg("requests")
        .arg(r#"{"requests": [{"path": "/over-quic"}]}"#)
        .output()
        .expect("run the HTTP/3 client");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = receiver.wait_for("the HTTP/3 SERVER span", |v| {
        v["signal"] == "span" && v["kind"] == "SERVER" && attr(v, "url.path") == "/over-quic"
    });
    assert_eq!(attr(&server[0], "network.protocol.version"), "3");
    assert_eq!(attr(&server[0], "http.response.status_code"), 200);
    assert_eq!(attr(&server[0], "client.address"), "127.0.0.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_that_waited_on_redis_has_a_client_span_for_the_call() {
    let receiver = Receiver::start();
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&format!(
        "telemetry:\n  otlp_endpoint: {}\nstorage:\n  backend: redis\n  url: {}\n  leases: disabled\nroutes:\n  - name: api\n    path_prefix: /\n    upstream: {}\n    limits:\n      - {{algorithm: token_bucket, capacity: 100, refill_rate: 10}}\n",
        receiver.endpoint(),
        redis.url(),
        upstream.url()
    ));
    let call = traced_call(&fg.url("/x"), true);
    assert_eq!(call["status"], 200);
    let trace_id = call["trace_id"].as_str().unwrap().to_string();
    let store = receiver.wait_for("the store call's span", |v| {
        v["kind"] == "CLIENT"
            && v["trace_id"] == trace_id.as_str()
            && !v["attributes"]["db.system.name"].is_null()
    });
    assert_eq!(attr(&store[0], "db.system.name"), "redis");
    let server = receiver.wait_for("the SERVER span", |v| {
        v["kind"] == "SERVER" && v["trace_id"] == trace_id.as_str()
    });
    assert_eq!(store[0]["parent_span_id"], server[0]["span_id"]);
    assert!(store[0]["start"].as_u64() >= server[0]["start"].as_u64());
    assert!(store[0]["end"].as_u64() <= server[0]["end"].as_u64());
}

/// A collector that accepts connections and never answers.
async fn silent_collector() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (addr, task)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn a_collector_that_never_answers_costs_requests_nothing_and_memory_a_bounded_queue() {
    let (collector, _task) = silent_collector().await;
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&format!(
        "admin_listen: 127.0.0.1:0\ntelemetry:\n  otlp_endpoint: http://{collector}\n  metrics_interval: 0s\nroutes:\n  - name: api\n    path_prefix: /\n    upstream: {}\n",
        upstream.url()
    ));
    let client = client();
    // Warm up, then measure memory across 3 rounds of 4,000 requests: far more spans than the
    // queue holds (4,096), so a queue that grew would show.
    for _ in 0..500 {
        assert_eq!(get(&client, &fg.url("/"), &[]).await.status, 200);
    }
    let before = rss_kib(fg.pid());
    for _ in 0..12_000 {
        assert_eq!(get(&client, &fg.url("/"), &[]).await.status, 200);
    }
    let after = rss_kib(fg.pid());
    // 4,096 queued spans of about 1 KiB each and one batch in flight: a few MiB. 64 MiB is
    // the bound asserted (12,000 unbounded spans would be tens of MiB on top of the queue's).
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    let dropped = metric(&fg, "floodgate_telemetry_dropped_total").await;
    assert!(dropped >= 12_500 - 4_096 - 512, "dropped {dropped}");
}

/// The spans of the last requests before SIGTERM reach the collector: floodgate exports what
/// is queued as it shuts down, instead of at the exporter's next turn (every half second), which
/// the process would not live to see. (Without the flush this fails unless a turn happens to
/// fall between the last answer and the signal, a few milliseconds apart: rarely.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_still_queued_at_sigterm_are_exported_as_floodgate_stops() {
    let receiver = Receiver::start();
    let upstream = Upstream::start().await;
    let mut fg = Floodgate::start(&format!(
        "telemetry:\n  otlp_endpoint: {}\n  metrics_interval: 0s\nroutes:\n  - name: api\n    path_prefix: /\n    upstream: {}\n",
        receiver.endpoint(),
        upstream.url()
    ));
    let client = client();
    for i in 0..3 {
        let status = get(&client, &fg.url(&format!("/last/{i}")), &[])
            .await
            .status;
        assert_eq!(status, 200);
    }
    fg.signal("TERM");
    let status = fg
        .wait_exit(Duration::from_secs(10))
        .expect("floodgate exits");
    assert!(status.success(), "{status}");
    for i in 0..3 {
        let path = format!("/last/{i}");
        receiver.wait_for(&format!("the SERVER span of {path}"), |v| {
            v["kind"] == "SERVER" && attr(v, "url.path") == path.as_str()
        });
    }
}

#[tokio::test]
async fn the_dashboard_renders_routes_and_live_figures_in_chromium() {
    let upstream = Upstream::start().await;
    let fg = Floodgate::start(&format!(
        "admin_listen: 127.0.0.1:0\nwaiting_room: [{{name: concert, routes: [orders], active: 1000, admit_rate: 1000, activate: always}}]\nroutes:\n  - name: orders\n    path_prefix: /orders\n    upstream: {u}\n    limits:\n      - {{algorithm: token_bucket, capacity: 5, refill_rate: 1}}\n  - name: search\n    path_prefix: /search\n    upstream: {u}\n    cache: {{ttl: 30s}}\n",
        u = upstream.url()
    ));
    // Traffic while the page is open, back to back (the page samples /metrics on its own
    // clock, which headless Chromium runs faster than real time): allowed and denied on /orders.
    let (url, cached) = (fg.url("/orders"), fg.url("/search"));
    let traffic = tokio::spawn(async move {
        let client = client();
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            let _ = client.get(&url).header("x-api-key", "dash").send().await;
            let _ = client.get(&cached).send().await;
        }
    });
    // Some requests first, so the first samples already differ.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Let the page's timers run: about five one-second samples of /metrics.
    let (dom, stderr) = chromium_dom(&fg.admin_url("/"), 6_000).await;
    traffic.abort();
    assert!(dom.contains("<b>orders</b>"), "{dom}\n{stderr}");
    assert!(dom.contains("<b>search</b>"));
    // The waiting room's row: one client (the traffic's one key) admitted, nobody waiting.
    let room = dom
        .split("<tr data-room=\"concert\">")
        .nth(1)
        .expect("a row for the room");
    assert!(
        room.starts_with("<td><b>concert</b></td><td class=\"num\">1</td><td class=\"num\">0</td>"),
        "{room}"
    );
    assert!(dom.contains("token_bucket 5"), "{dom}");
    // A live figure: the page computed a rate from two /metrics samples.
    let allowed = dom
        .split("data-route=\"orders\" data-decision=\"allowed\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .and_then(|n| n.parse::<f64>().ok())
        .expect("an allowed/s cell");
    let denied = dom
        .split("data-route=\"orders\" data-decision=\"denied\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .and_then(|n| n.parse::<f64>().ok())
        .expect("a denied/s cell");
    assert!(allowed + denied > 0.0, "no live figure: {dom}");
    assert!(dom.contains("closed"), "breaker state shown");
    // The cached route's hit ratio and stale answers; the other route has no cache.
    let ratio = dom
        .split("data-route=\"search\" data-cache=\"ratio\">")
        .nth(1)
        .and_then(|rest| rest.split('%').next())
        .and_then(|n| n.parse::<f64>().ok())
        .expect("a hit ratio cell");
    assert!(
        ratio > 50.0,
        "{ratio}% hits on one path cached for 30 s: {dom}"
    );
    assert!(dom.contains("stale/s"));
    assert!(dom.contains("data-route=\"orders\" data-cache=\"none\""));
    // Each route's upstream endpoints, with their state (from /upstreams).
    let endpoint = upstream.addr().to_string();
    assert!(
        dom.contains(&format!("data-endpoint=\"{endpoint}\">healthy<")),
        "no endpoints table: {dom}"
    );
}

#[tokio::test]
async fn a_should_rate_limit_call_is_a_server_span() {
    use prost::Message;
    let receiver = Receiver::start();
    let rules = TempDir::new("rules");
    std::fs::write(
        rules.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    let fg = Floodgate::start(&format!(
        "telemetry:\n  otlp_endpoint: {}\n  metrics_interval: 0s\nroutes: []\nservice:\n  listen: 127.0.0.1:0\n  config: [{}]\n",
        receiver.endpoint(),
        rules.path().display()
    ));
    let request = floodgate::service::rls::RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![floodgate::service::rls::RateLimitDescriptor {
            entries: vec![floodgate::service::rls::DescriptorEntry {
                key: "k".into(),
                value: "v".into(),
            }],
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        }],
        hits_addend: 0,
    };
    let message = request.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    // Envoy continues its own trace: its traceparent, as Envoy sends it when tracing is on.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    for _ in 0..2 {
        let answer = h2c_client()
            .post(format!(
                "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                fg.service_addr()
            ))
            .header("content-type", "application/grpc")
            .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
            .body(framed.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
    let spans = receiver.wait_for("ShouldRateLimit spans", |v| {
        v["kind"] == "SERVER" && v["trace_id"] == trace_id
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut spans = spans;
    while spans.len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        spans = receiver.wait_for("both spans", |v| {
            v["kind"] == "SERVER" && v["trace_id"] == trace_id
        });
    }
    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert_eq!(
        spans[0]["name"],
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    assert_eq!(spans[0]["parent_span_id"], "00f067aa0ba902b7");
    assert_eq!(attr(&spans[0], "rpc.system"), "grpc");
    assert_eq!(attr(&spans[0], "rpc.grpc.status_code"), 0);
    let decisions: Vec<&Value> = spans
        .iter()
        .map(|s| attr(s, "floodgate.decision"))
        .collect();
    assert!(decisions.contains(&&Value::from("ok")), "{decisions:?}");
    assert!(
        decisions.contains(&&Value::from("over_limit")),
        "{decisions:?}"
    );
}

/// W3C Trace Context: a `traceparent` sent twice, or two values joined with a comma, is
/// invalid, and floodgate starts a new trace (e9faff0 continued the first). The upstream hears
/// a trace id that is neither of the client's.
#[tokio::test]
async fn a_duplicated_traceparent_starts_a_new_trace() {
    let upstream = Upstream::start().await;
    // No collector: nothing is read from it here (exports fail and are counted).
    let fg = Floodgate::start(&format!(
        "telemetry:\n  otlp_endpoint: http://127.0.0.1:9\n  metrics_interval: 0s\nroutes:\n  - name: open\n    path_prefix: /open\n    upstream: {}\n",
        upstream.url()
    ));
    let one = "00-11111111111111111111111111111111-1111111111111111-01";
    let two = "00-22222222222222222222222222222222-2222222222222222-01";
    let mut twice = reqwest::header::HeaderMap::new();
    twice.append("traceparent", one.parse().unwrap());
    twice.append("traceparent", two.parse().unwrap());
    let mut joined = reqwest::header::HeaderMap::new();
    joined.insert("traceparent", format!("{one},{two}").parse().unwrap());
    let mut single = reqwest::header::HeaderMap::new();
    single.insert("traceparent", one.parse().unwrap());
    for (headers, continued) in [(twice, false), (joined, false), (single, true)] {
        let r = client()
            .get(fg.url("/open"))
            .headers(headers)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let seen = upstream.seen();
        let heard = seen.last().unwrap().header("traceparent").unwrap();
        let trace_id = heard.split('-').nth(1).unwrap().to_string();
        assert_eq!(
            trace_id == "11111111111111111111111111111111",
            continued,
            "{heard}"
        );
        assert_ne!(trace_id, "22222222222222222222222222222222");
    }
}
