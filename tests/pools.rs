//! Upstream pools (`upstreams:`, `balance:`, `outlier:`, `retries:`, `resolver:`): real
//! upstreams on 127.0.0.2-4 (one port, as replicas behind one name have), the demo upstream's
//! processes where one is killed with SIGKILL, and a DNS server written here whose answers the
//! test changes.

mod common;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Floodgate, metric};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UdpSocket};

/// Store settings for a test that counts exactly: a decision may wait 5 s (a loaded machine's
/// store never takes that long; the 50 ms default would fail some decisions open and admit
/// more than the budget), and a store that fails refuses (503), never admits unspent.
const EXACT: &str = "  timeout: 5s\n  on_error: deny\n";

/// One client for the whole test binary: building one per request (its TLS configuration) costs
/// milliseconds in a debug build.
fn client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(common::client).clone()
}

/// A port free on 127.0.0.1 (and, in practice, on the other loopback addresses): replicas
/// behind one name share a port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One replica: an HTTP/1.1 server on `ip:port` answering with its own address (after its
/// delay, with its status), counting requests by method.
struct Replica {
    addr: SocketAddr,
    gets: Arc<AtomicU64>,
    posts: Arc<AtomicU64>,
    delay_ms: Arc<AtomicU64>,
    status: Arc<AtomicU16>,
    /// Connections accepted so far.
    accepts: Arc<AtomicU64>,
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Replica {
    async fn start(ip: &str, port: u16) -> Replica {
        let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
        let listener = TcpListener::bind(addr).await.expect("bind the replica");
        let replica = Replica {
            addr,
            gets: Arc::default(),
            posts: Arc::default(),
            delay_ms: Arc::default(),
            status: Arc::new(AtomicU16::new(200)),
            accepts: Arc::default(),
            tasks: Arc::default(),
        };
        let accepts = replica.accepts.clone();
        let (gets, posts, delay, status, tasks) = (
            replica.gets.clone(),
            replica.posts.clone(),
            replica.delay_ms.clone(),
            replica.status.clone(),
            replica.tasks.clone(),
        );
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepts.fetch_add(1, Ordering::SeqCst);
                let (gets, posts, delay, status) =
                    (gets.clone(), posts.clone(), delay.clone(), status.clone());
                let conn = tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (gets, posts, delay, status) =
                            (gets.clone(), posts.clone(), delay.clone(), status.clone());
                        async move {
                            match *req.method() {
                                hyper::Method::POST => posts.fetch_add(1, Ordering::SeqCst),
                                _ => gets.fetch_add(1, Ordering::SeqCst),
                            };
                            let wait = delay.load(Ordering::SeqCst);
                            if wait > 0 {
                                tokio::time::sleep(Duration::from_millis(wait)).await;
                            }
                            let mut response = hyper::Response::new(Full::new(bytes::Bytes::from(
                                addr.ip().to_string(),
                            )));
                            *response.status_mut() =
                                hyper::StatusCode::from_u16(status.load(Ordering::SeqCst)).unwrap();
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                tasks.lock().unwrap().push(conn.abort_handle());
            }
        });
        replica.tasks.lock().unwrap().push(accept.abort_handle());
        replica
    }

    fn served(&self) -> u64 {
        self.gets.load(Ordering::SeqCst) + self.posts.load(Ordering::SeqCst)
    }

    /// Closes the listener and every connection at once.
    fn stop(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn three(port: u16) -> Vec<Replica> {
    let mut replicas = Vec::new();
    for ip in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
        replicas.push(Replica::start(ip, port).await);
    }
    replicas
}

/// A route `/` to `pool` (YAML lines under the route), with an admin listener.
fn config(pool: &str) -> String {
    format!("admin_listen: 127.0.0.1:0\nroutes:\n  - name: pool\n    path_prefix: /\n{pool}")
}

fn origins(port: u16) -> String {
    format!(
        "    upstreams: [http://127.0.0.2:{port}, http://127.0.0.3:{port}, http://127.0.0.4:{port}]\n"
    )
}

async fn get(fg: &Floodgate, headers: &[(&str, &str)]) -> (u16, String) {
    let mut request = client().get(fg.url("/work"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.expect("a response");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// The text of `path` on the admin listener.
async fn admin_text(fg: &Floodgate, path: &str) -> String {
    client()
        .get(fg.admin_url(path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn upstreams(fg: &Floodgate) -> serde_json::Value {
    serde_json::from_str(&admin_text(fg, "/upstreams").await).unwrap()
}

/// Rewrites `fg`'s config with `yaml` (its `listen: 127.0.0.1:0` kept), sends SIGHUP and
/// waits until the reload is counted.
async fn reload(fg: &Floodgate, yaml: &str) {
    std::fs::write(fg.config_path(), format!("listen: 127.0.0.1:0\n{yaml}")).unwrap();
    let before = metric(fg, r#"floodgate_config_reloads_total{result="success"}"#).await;
    fg.signal("HUP");
    until("the reload", || async {
        metric(fg, r#"floodgate_config_reloads_total{result="success"}"#).await > before
    })
    .await;
}

/// Waits (10 s at most: a loaded machine) until `check` holds.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn round_robin_spreads_evenly_and_weights_are_honoured() {
    let port = free_port();
    let replicas = three(port).await;
    let fg = Floodgate::start(&config(&format!(
        "{}    balance: round_robin\n",
        origins(port)
    )));
    for _ in 0..300 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
    // Within 5% of a third each (one client, one instance: exactly a third).
    for r in &replicas {
        let served = r.served();
        assert!((95..=105).contains(&served), "{}: {served}", r.addr);
    }
    drop(fg);
    let before: Vec<u64> = replicas.iter().map(Replica::served).collect();
    let fg = Floodgate::start(&config(&format!(
        "    upstreams:\n      - {{url: http://127.0.0.2:{port}, weight: 3}}\n      - http://127.0.0.3:{port}\n      - http://127.0.0.4:{port}\n    balance: round_robin\n"
    )));
    for _ in 0..500 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
    let served: Vec<u64> = replicas
        .iter()
        .zip(&before)
        .map(|(r, b)| r.served() - b)
        .collect();
    // 3:1:1 of 500.
    assert!((285..=315).contains(&served[0]), "{served:?}");
    assert!((95..=105).contains(&served[1]), "{served:?}");
    assert!((95..=105).contains(&served[2]), "{served:?}");
}

#[tokio::test]
async fn least_request_sends_fewer_requests_to_a_slower_endpoint() {
    let port = free_port();
    let replicas = three(port).await;
    replicas[0].delay_ms.store(20, Ordering::SeqCst);
    let fg = Arc::new(Floodgate::start(&config(&origins(port))));
    let mut clients = Vec::new();
    for _ in 0..16 {
        let fg = fg.clone();
        clients.push(tokio::spawn(async move {
            for _ in 0..40 {
                assert_eq!(get(&fg, &[]).await.0, 200);
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let served: Vec<u64> = replicas.iter().map(Replica::served).collect();
    // The slow one holds its requests 20 ms longer, so it has more in flight whenever it is
    // compared: it must get clearly fewer than either fast one (an even spread is 213 each).
    let fast = served[1].min(served[2]);
    assert!(served[0] * 10 < fast * 8, "{served:?}");
}

#[tokio::test]
async fn hash_keeps_an_identity_on_one_endpoint_and_moves_only_the_removed_ones() {
    let port = free_port();
    let _replicas = three(port).await;
    let fg = Floodgate::start(&config(&format!("{}    balance: hash\n", origins(port))));
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    let mut home: HashMap<String, String> = HashMap::new();
    for key in &keys {
        for _ in 0..3 {
            let (status, body) = get(&fg, &[("x-api-key", key)]).await;
            assert_eq!(status, 200);
            let first = home.entry(key.clone()).or_insert(body.clone());
            assert_eq!(*first, body, "{key} moved");
        }
    }
    let spread: std::collections::HashSet<&String> = home.values().collect();
    assert_eq!(spread.len(), 3, "every endpoint has keys: {home:?}");
    // 127.0.0.3 leaves (a reload): its keys move, no other key does.
    reload(
        &fg,
        &config(&format!(
            "    upstreams: [http://127.0.0.2:{port}, http://127.0.0.4:{port}]\n    balance: hash\n"
        )),
    )
    .await;
    for key in &keys {
        let (_, now) = get(&fg, &[("x-api-key", key)]).await;
        if home[key] != "127.0.0.3" {
            assert_eq!(now, home[key], "{key} moved though its endpoint stayed");
        } else {
            assert_ne!(now, "127.0.0.3");
        }
    }
}

/// The demo upstream's process on `ip:port`.
struct Process(std::process::Child);

impl Process {
    fn start(ip: &str, port: u16) -> Process {
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_floodgate"))
            .with_file_name("floodgate-demo-upstream");
        let mut child = std::process::Command::new(binary)
            .args(["--listen", &format!("{ip}:{port}"), "--workers", "64"])
            .args(["--service-time", "5ms", "--queue-timeout", "5s"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the demo upstream (cargo build -p floodgate-demo-upstream)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        Process(child)
    }

    fn kill(&mut self) {
        let _ = self.0.kill(); // SIGKILL
        let _ = self.0.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn served_by(ip: &str, port: u16) -> Option<u64> {
    let body = client()
        .get(format!("http://{ip}:{port}/__stats"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    serde_json::from_str::<serde_json::Value>(&body).ok()?["served"].as_u64()
}

/// SIGKILL of one of three replicas under 16 clients: every GET succeeds (a request in flight
/// on it is retried on another, `retries.on: reset`), no POST is sent twice, the dead endpoint
/// is ejected and gets no request while it is out, and once restarted it is used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_load_costs_no_get_and_comes_back_when_restarted() {
    killed_mid_load(
        "    retries: {attempts: 3, on: [connect_failure, refused_stream, reset]}\n",
        0,
    )
    .await;
}

/// The same with the default retries (connect failures and refused streams only): only the
/// GETs in flight on the killed replica may fail (16 clients: at most 16); every one that found
/// no connection, or a connection the replica had closed, goes on elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_retries_only_requests_in_flight_on_a_killed_replica_fail() {
    killed_mid_load("", 16).await;
}

async fn killed_mid_load(retries: &str, max_failed: u64) {
    let port = free_port();
    let mut replicas: Vec<Process> = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        .iter()
        .map(|ip| Process::start(ip, port))
        .collect();
    let fg = Arc::new(Floodgate::start(&config(&format!(
        "{}{retries}    outlier: {{consecutive_failures: 2, ejection: 2s}}\n",
        origins(port)
    ))));
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..16 {
        let (fg, stop, failed, done) = (fg.clone(), stop.clone(), failed.clone(), done.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let (status, body) = get(&fg, &[]).await;
                if status != 200 {
                    eprintln!("failed: {status} {body}");
                    failed.fetch_add(1, Ordering::SeqCst);
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    replicas[0].kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    assert!(
        done.load(Ordering::SeqCst) > 200,
        "the load ran: {} done, {} failed",
        done.load(Ordering::SeqCst),
        failed.load(Ordering::SeqCst)
    );
    assert!(
        failed.load(Ordering::SeqCst) <= max_failed,
        "{} failed: {}",
        failed.load(Ordering::SeqCst),
        fg.stderr()
    );
    // The dead endpoint was ejected.
    let state = upstreams(&fg).await;
    let dead = format!("127.0.0.2:{port}");
    let row = state["routes"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["endpoint"] == dead.as_str())
        .cloned()
        .expect("the dead endpoint is listed");
    assert!(row["ejections"].as_u64().unwrap() >= 1, "{state}");
    assert!(
        metric(
            &fg,
            &format!(r#"floodgate_upstream_ejections_total{{route="pool",endpoint="{dead}"}}"#)
        )
        .await
            >= 1
    );
    // POSTs now: each reaches exactly one replica (a connect failure is retried, as the request
    // never left; nothing that reached a replica is sent again).
    let before: u64 =
        served_by("127.0.0.3", port).await.unwrap() + served_by("127.0.0.4", port).await.unwrap();
    for _ in 0..30 {
        let r = client()
            .post(fg.url("/work"))
            .body("ride")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let after: u64 =
        served_by("127.0.0.3", port).await.unwrap() + served_by("127.0.0.4", port).await.unwrap();
    assert_eq!(after - before, 30, "every POST reached one replica, once");
    // Restarted, it is used again once its ejection ends (2 s, or 4 s for a second one).
    replicas[0] = Process::start("127.0.0.2", port);
    until("the restarted replica is used again", || async {
        for _ in 0..6 {
            get(&fg, &[]).await;
        }
        served_by("127.0.0.2", port).await.unwrap_or(0) > 0
    })
    .await;
}

/// A DNS server on 127.0.0.1:0 (UDP, and TCP on the same port for answers too large for a
/// datagram) answering A queries for any name with `addresses`, AAAA with none; silent while
/// `silent` is set.
struct Dns {
    addr: SocketAddr,
    addresses: Arc<Mutex<Vec<Ipv4Addr>>>,
    silent: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Dns {
    async fn start(addresses: &[&str]) -> Dns {
        // The same port on UDP and TCP: a free UDP port may be taken on TCP by another test's
        // connection, so another is tried (a handful of tries at most).
        let mut tries = 0;
        let (udp, tcp, addr) = loop {
            let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let addr = udp.local_addr().unwrap();
            match TcpListener::bind(addr).await {
                Ok(tcp) => break (udp, tcp, addr),
                Err(e) if tries < 20 => {
                    tries += 1;
                    eprintln!("port {} is taken on TCP ({e}); another", addr.port());
                }
                Err(e) => panic!("no port free on both UDP and TCP: {e}"),
            }
        };
        let list = Arc::new(Mutex::new(
            addresses
                .iter()
                .map(|a| a.parse().unwrap())
                .collect::<Vec<Ipv4Addr>>(),
        ));
        let silent = Arc::new(AtomicBool::new(false));
        let (l, s) = (list.clone(), silent.clone());
        let udp_task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, from)) = udp.recv_from(&mut buf).await else {
                    continue;
                };
                if s.load(Ordering::SeqCst) {
                    continue;
                }
                let answer = answer(&buf[..n], &l.lock().unwrap(), true);
                let _ = udp.send_to(&answer, from).await;
            }
        });
        let (l, s) = (list.clone(), silent.clone());
        let tcp_task = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let Ok((mut stream, _)) = tcp.accept().await else {
                    continue;
                };
                let (l, s) = (l.clone(), s.clone());
                tokio::spawn(async move {
                    let mut len = [0u8; 2];
                    while stream.read_exact(&mut len).await.is_ok() {
                        let mut query = vec![0u8; u16::from_be_bytes(len) as usize];
                        if stream.read_exact(&mut query).await.is_err() || s.load(Ordering::SeqCst)
                        {
                            return;
                        }
                        let answer = answer(&query, &l.lock().unwrap(), false);
                        let mut framed = (answer.len() as u16).to_be_bytes().to_vec();
                        framed.extend_from_slice(&answer);
                        if stream.write_all(&framed).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Dns {
            addr,
            addresses: list,
            silent,
            tasks: vec![udp_task, tcp_task],
        }
    }

    fn set(&self, addresses: Vec<Ipv4Addr>) {
        *self.addresses.lock().unwrap() = addresses;
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The answer to DNS `query`: its question echoed, and for type A one record per address (TTL
/// 600, as Docker's). Over UDP an answer over 512 bytes is cut to its header and question with
/// the TC bit, so the client asks again over TCP.
fn answer(query: &[u8], addresses: &[Ipv4Addr], udp: bool) -> Vec<u8> {
    // The question: the name's labels, then type and class.
    let mut at = 12;
    while at < query.len() && query[at] != 0 {
        at += 1 + query[at] as usize;
    }
    let question_end = (at + 5).min(query.len());
    let qtype = u16::from_be_bytes([query[at + 1], query[at + 2]]);
    let records: &[Ipv4Addr] = if qtype == 1 { addresses } else { &[] };
    let mut out = Vec::new();
    out.extend_from_slice(&query[0..2]); // id
    out.extend_from_slice(&[0x81, 0x80]); // response, recursion desired and available
    out.extend_from_slice(&[0, 1]); // one question
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&query[12..question_end]);
    for ip in records {
        out.extend_from_slice(&[0xc0, 0x0c]); // the question's name
        out.extend_from_slice(&[0, 1, 0, 1]); // A, IN
        out.extend_from_slice(&600u32.to_be_bytes());
        out.extend_from_slice(&[0, 4]);
        out.extend_from_slice(&ip.octets());
    }
    if udp && out.len() > 512 {
        out.truncate(12 + (question_end - 12));
        out[2] |= 0x02; // TC
        out[6] = 0;
        out[7] = 0;
    }
    out
}

/// True when the pool lists `endpoint` in `state`.
async fn has(fg: &Floodgate, endpoint: &str, state: &str) -> bool {
    endpoints(fg)
        .await
        .iter()
        .any(|(e, s)| e == endpoint && s == state)
}

async fn endpoints(fg: &Floodgate) -> Vec<(String, String)> {
    upstreams(fg).await["routes"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["endpoint"].as_str().unwrap().to_string(),
                e["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Discovery follows the name: an address that arrives is used within `refresh` + 1 s, one
/// that leaves drains with no failed request, a silent resolver keeps the last addresses, and
/// an answer of 3,000 addresses is cut to the pool's 512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_the_names_answers_and_keeps_them_when_it_goes_silent() {
    let port = free_port();
    let replicas = three(port).await;
    let dns = Dns::start(&["127.0.0.2", "127.0.0.3"]).await;
    let fg = Floodgate::start(&format!(
        "resolver: {{servers: [\"{}\"], refresh: 1s}}\n{}",
        dns.addr,
        config(&format!(
            "    upstream: http://pool.test:{port}\n    balance: round_robin\n"
        ))
    ));
    for _ in 0..20 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
    assert!(replicas[0].served() >= 9 && replicas[1].served() >= 9);
    assert_eq!(replicas[2].served(), 0);
    // A new replica: used within refresh + 1 s (2 s; 10 s for a loaded machine).
    dns.set(vec![
        "127.0.0.2".parse().unwrap(),
        "127.0.0.3".parse().unwrap(),
        "127.0.0.4".parse().unwrap(),
    ]);
    let added = Instant::now();
    until("the new address is used", || async {
        get(&fg, &[]).await;
        replicas[2].served() > 0
    })
    .await;
    println!(
        "a new address was used {:?} after it was answered",
        added.elapsed()
    );
    // One leaves: no request fails while it drains, and none reaches it afterwards.
    dns.set(vec![
        "127.0.0.3".parse().unwrap(),
        "127.0.0.4".parse().unwrap(),
    ]);
    until("the address left the pool", || async {
        let (status, _) = get(&fg, &[]).await;
        assert_eq!(status, 200);
        !endpoints(&fg)
            .await
            .iter()
            .any(|(e, _)| *e == format!("127.0.0.2:{port}"))
    })
    .await;
    let gone = replicas[0].served();
    for _ in 0..30 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
    assert_eq!(replicas[0].served(), gone);
    // The resolver goes silent: the last addresses are kept.
    dns.silent.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for _ in 0..10 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
    assert_eq!(endpoints(&fg).await.len(), 2);
    assert!(
        metric(
            &fg,
            r#"floodgate_upstream_resolutions_total{route="pool",outcome="error"}"#
        )
        .await
            >= 1
    );
    // 3,000 addresses: capped at 512.
    dns.silent.store(false, Ordering::SeqCst);
    dns.set(
        (0..3000u32)
            .map(|i| Ipv4Addr::from(0x7f01_0000 + i))
            .collect(),
    );
    until("the large answer is read", || async {
        endpoints(&fg).await.len() > 2
    })
    .await;
    assert_eq!(
        endpoints(&fg).await.len(),
        floodgate::upstream::MAX_ADDRESSES_PER_NAME
    );
}

/// Every endpoint answering 503, retried on 503: the retries stay within the budget (20% of
/// the requests over 10 s plus 10 a second), the rest are counted as over budget.
#[tokio::test]
async fn retries_stay_within_the_budget_when_every_endpoint_fails() {
    let port = free_port();
    let replicas = three(port).await;
    for r in &replicas {
        r.status.store(503, Ordering::SeqCst);
    }
    let fg = Floodgate::start(&config(&format!(
        "{}    retries: {{attempts: 3, on: [503], budget: 20%}}\n",
        origins(port)
    )));
    let requests = 400u64;
    let started = Instant::now();
    for _ in 0..requests {
        assert_eq!(get(&fg, &[]).await.0, 503);
    }
    let elapsed = started.elapsed().as_secs();
    let sent = metric(
        &fg,
        r#"floodgate_upstream_retries_total{route="pool",outcome="sent"}"#,
    )
    .await;
    let over = metric(
        &fg,
        r#"floodgate_upstream_retries_total{route="pool",outcome="over_budget"}"#,
    )
    .await;
    let reached: u64 = replicas.iter().map(Replica::served).sum();
    // Over any 10 s the budget allows 20% of that window's requests plus 100 (10 a second), so
    // over a run of `elapsed` seconds at most 20% of all of them plus 10 a second of the run and
    // one more window's floor (the windows a run straddles). Without a budget every request
    // would be retried twice: 800.
    assert!(
        sent <= requests / 5 + 10 * elapsed + 100,
        "sent {sent} in {elapsed} s"
    );
    assert!(over > 0, "some retries were refused");
    assert_eq!(
        reached,
        requests + sent,
        "each retry is one more request upstream"
    );
}

/// SIGHUP keeps what the pool knows of an endpoint that stays (its ejection, its counters) and
/// applies the rest (here its retries); an endpoint the new config drops leaves the pool.
#[tokio::test]
async fn a_reload_keeps_the_state_of_endpoints_that_stay() {
    let port = free_port();
    let replicas = three(port).await;
    replicas[0].stop();
    let pool = |extra: &str| {
        config(&format!(
            "{}    outlier: {{consecutive_failures: 2, ejection: 1m}}\n{extra}",
            origins(port)
        ))
    };
    let fg = Floodgate::start(&pool(""));
    let dead = format!("127.0.0.2:{port}");
    until("the stopped replica is ejected", || async {
        get(&fg, &[]).await;
        has(&fg, &dead, "ejected").await
    })
    .await;
    let requests_before = upstreams(&fg).await["routes"][0]["endpoints"][1]["requests"]
        .as_u64()
        .unwrap();
    reload(&fg, &pool("    retries: {attempts: 3}\n")).await;
    let after = upstreams(&fg).await;
    let rows = after["routes"][0]["endpoints"].as_array().unwrap();
    let row = rows
        .iter()
        .find(|e| e["endpoint"] == dead.as_str())
        .unwrap();
    assert_eq!(row["state"], "ejected", "{after}");
    assert_eq!(row["ejections"], 1);
    assert!(
        rows[1]["requests"].as_u64().unwrap() >= requests_before,
        "counters kept"
    );
    // Dropped from the config: gone from the pool.
    reload(
        &fg,
        &config(&format!(
            "    upstreams: [http://127.0.0.3:{port}, http://127.0.0.4:{port}]\n"
        )),
    )
    .await;
    until("the endpoint left", || async {
        endpoints(&fg).await.len() == 2
    })
    .await;
    for _ in 0..10 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
}

/// Active checks (`health_check:`): an endpoint whose check path answers 503 is taken out after
/// `unhealthy_after` failures and gets no request (though it would answer them), and comes back
/// after `healthy_after` passes.
#[tokio::test]
async fn active_health_checks_take_an_endpoint_out_and_bring_it_back() {
    let port = free_port();
    let replicas = three(port).await;
    let fg = Floodgate::start(&config(&format!(
        "{}    balance: round_robin\n    health_check: {{path: /healthz, interval: 100ms, timeout: 500ms, healthy_after: 2, unhealthy_after: 2}}\n",
        origins(port)
    )));
    let sick = format!("127.0.0.2:{port}");
    // Every answer of the replica is 503 from now on: the checks too. (Its requests would be
    // answered 503, not refused, so nothing but the checks takes it out: passive ejection needs
    // five in a row.)
    replicas[0].status.store(503, Ordering::SeqCst);
    until("the failing endpoint is taken out", || async {
        has(&fg, &sick, "unhealthy").await
    })
    .await;
    let before = replicas[0].gets.load(Ordering::SeqCst);
    for _ in 0..30 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
    // Only the checks reach it (one every 100 ms at most while these 30 requests ran).
    let during = replicas[0].gets.load(Ordering::SeqCst) - before;
    assert!(during < 30 / 3, "it was still sent requests: {during}");
    // The gauge follows within its publishing period (a second).
    until("the gauge shows it", || async {
        admin_text(&fg, "/metrics")
            .await
            .contains(r#"floodgate_upstream_endpoints{route="pool",state="unhealthy"} 1"#)
    })
    .await;
    replicas[0].status.store(200, Ordering::SeqCst);
    until("the endpoint is back", || async {
        has(&fg, &sick, "healthy").await
    })
    .await;
}

/// An upstream that leads back to floodgate itself (a name resolving to its own listener)
/// does not loop: the request comes back carrying floodgate's own `Via`, and is answered 508.
#[tokio::test]
async fn a_route_whose_upstream_is_floodgate_itself_answers_508_instead_of_looping() {
    let port = free_port();
    let _replicas = three(port).await;
    let fg = Floodgate::start(&config(&origins(port)));
    let own = fg.addr();
    reload(&fg, &config(&format!("    upstream: http://{own}\n"))).await;
    let response = client().get(fg.url("/work")).send().await.unwrap();
    // The first pass forwards to itself; the second sees its Via and answers 508, which the
    // first relays.
    assert_eq!(response.status().as_u16(), 508);
    let body = response.text().await.unwrap();
    assert!(body.contains("loop_detected"), "{body}");
}

/// A reload that keeps the pool keeps its connections too: the endpoints that stay are not
/// dialled again (the connection pools pass to the new config when they were made the same way).
#[tokio::test]
async fn a_reload_keeps_the_upstream_connections_of_endpoints_that_stay() {
    let port = free_port();
    let replicas = three(port).await;
    let pool = |extra: &str| {
        config(&format!(
            "{}    balance: round_robin\n{extra}",
            origins(port)
        ))
    };
    let fg = Floodgate::start(&pool(""));
    for _ in 0..30 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
    let dialled: Vec<u64> = replicas
        .iter()
        .map(|r| r.accepts.load(Ordering::SeqCst))
        .collect();
    reload(&fg, &pool("    retries: {attempts: 3}\n")).await;
    for _ in 0..30 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
    let after: Vec<u64> = replicas
        .iter()
        .map(|r| r.accepts.load(Ordering::SeqCst))
        .collect();
    assert_eq!(after, dialled, "no endpoint was dialled again");
    assert!(
        replicas.iter().all(|r| r.served() >= 15),
        "every endpoint served"
    );
}

/// `per: endpoint` with a budget of `limit` an hour (nothing refills within the test), on a pool
/// of the three replicas, with `storage` (YAML at the top level, may be empty).
fn per_endpoint(port: u16, limit: u32, storage: &str, extra: &str) -> String {
    format!(
        "{storage}{}{}    limits:\n      - {{algorithm: fixed_window, limit: {limit}, window: 1h, per: endpoint}}\n{extra}",
        config(""),
        origins(port)
    )
}

/// How many of `n` POSTs through `fgs` (in turn) were answered 200 (POSTs: the replicas
/// count them apart from health checks' GETs); every refusal must carry `Retry-After`.
async fn admitted_of(fgs: &[&Floodgate], n: usize) -> u64 {
    let mut admitted = 0;
    for i in 0..n {
        let response = client()
            .post(fgs[i % fgs.len()].url("/work"))
            .send()
            .await
            .expect("a response");
        match response.status().as_u16() {
            200 => admitted += 1,
            429 => assert!(
                response.headers().contains_key("retry-after"),
                "a refusal says when to come back"
            ),
            other => panic!("answered {other}"),
        }
    }
    admitted
}

#[tokio::test]
async fn per_endpoint_budgets_add_up_to_the_pools_capacity_and_each_replica_gets_its_own() {
    let port = free_port();
    let replicas = three(port).await;
    // least_request (the default) would favour whichever replica is idle: the budget, not the
    // balance, must decide where the 10th to 30th requests go.
    let fg = Floodgate::start(&per_endpoint(port, 10, "", ""));
    assert_eq!(admitted_of(&[&fg], 45).await, 30, "3 replicas × 10");
    for r in &replicas {
        assert_eq!(r.served(), 10, "{} serves its own budget exactly", r.addr);
    }
    // The 15 passed over every replica and were refused, counted as any denial.
    let refused = metric(
        &fg,
        r#"floodgate_requests_total{route="pool",decision="denied"}"#,
    )
    .await;
    assert_eq!(refused, 15);
}

#[tokio::test]
async fn per_endpoint_capacity_falls_with_an_endpoint_taken_out_by_its_health_check() {
    let port = free_port();
    let replicas = three(port).await;
    let fg = Floodgate::start(&per_endpoint(
        port,
        10,
        "",
        "    health_check: {path: /healthz, interval: 100ms, timeout: 500ms, healthy_after: 2, unhealthy_after: 2}\n",
    ));
    replicas[0].status.store(503, Ordering::SeqCst);
    let sick = format!("127.0.0.2:{port}");
    until("the failing endpoint is taken out", || async {
        has(&fg, &sick, "unhealthy").await
    })
    .await;
    // Two healthy replicas: 20 admitted, and the unhealthy one's budget is never offered.
    assert_eq!(admitted_of(&[&fg], 30).await, 20, "2 healthy replicas × 10");
    let posts = |r: &Replica| r.posts.load(Ordering::SeqCst);
    assert_eq!((posts(&replicas[1]), posts(&replicas[2])), (10, 10));
    // Only health checks (GETs) reached the sick one meanwhile: its budget is whole.
    assert_eq!(posts(&replicas[0]), 0);
    // Back in health, its 10 are there to spend.
    replicas[0].status.store(200, Ordering::SeqCst);
    until("the endpoint is back", || async {
        has(&fg, &sick, "healthy").await
    })
    .await;
    assert_eq!(
        admitted_of(&[&fg], 15).await,
        10,
        "its own budget, untouched"
    );
    assert_eq!(posts(&replicas[0]), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_admit_exactly_each_endpoints_budget() {
    let redis = common::RedisServer::start();
    let port = free_port();
    let replicas = three(port).await;
    let storage = format!(
        "storage:\n  backend: redis\n  url: {}\n{EXACT}",
        redis.url()
    );
    let yaml = per_endpoint(port, 20, &storage, "");
    let (a, b) = (Floodgate::start(&yaml), Floodgate::start(&yaml));
    // 16 clients over both instances, far more requests than the 60 units there are.
    let urls = [a.url("/work"), b.url("/work")];
    let totals = common::hammer(&urls, "anyone", 16, Duration::from_secs(2)).await;
    assert!(
        totals.keys().all(|s| *s == 200 || *s == 429),
        "only 200 and 429: {totals:?}"
    );
    assert_eq!(totals.get(&200).copied().unwrap_or(0), 60, "{totals:?}");
    for r in &replicas {
        assert_eq!(
            r.served(),
            20,
            "{}: its budget, across both instances",
            r.addr
        );
    }
}

/// `floodgate_adaptive_limit` of the endpoint `addr`; 0 before its gate exists (its first
/// request makes it).
async fn learned(fg: &Floodgate, addr: SocketAddr) -> u64 {
    let series = format!("floodgate_adaptive_limit{{upstream=\"http://{addr}\"}} ");
    admin_text(fg, "/metrics")
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_concurrency_learns_one_limit_per_endpoint() {
    let port = free_port();
    let replicas = three(port).await;
    // Every replica takes 20 ms; the first answers 503 (an overload signal) to everything. No
    // ejection and no retries, so it keeps its third of the requests and its signals.
    for r in &replicas {
        r.delay_ms.store(20, Ordering::SeqCst);
    }
    replicas[0].status.store(503, Ordering::SeqCst);
    let fg = Floodgate::start(&config(&format!(
        "{}    balance: round_robin\n    outlier: {{consecutive_failures: 1000000}}\n    retries: {{attempts: 1}}\n    adaptive_concurrency: {{min_limit: 2, max_limit: 100, queue_timeout: 200ms}}\n",
        origins(port)
    )));
    // 24 clients: 8 per replica at once, more than the limits start at (2), so the healthy
    // replicas' limits bind and grow (here they reach 5-6, and move around there with latency).
    // The gauges are read every 100 ms during the load and their highest kept: a limit that
    // ever rose above the floor learned on its own (a window is 100 ms and 5 samples; a healthy
    // replica gives some 10 a window, so even a loaded machine leaves many windows in 3 s).
    let url = fg.url("/work");
    let load =
        tokio::spawn(async move { common::hammer(&[url], "k", 24, Duration::from_secs(3)).await });
    let (mut sick, mut healthy) = (0, [0u64; 2]);
    while !load.is_finished() {
        sick = sick.max(learned(&fg, replicas[0].addr).await);
        for (h, r) in healthy.iter_mut().zip(&replicas[1..]) {
            *h = (*h).max(learned(&fg, r.addr).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    load.await.unwrap();
    eprintln!("highest learned limits: sick {sick}, healthy {healthy:?}");
    // The sick replica's limit never rose (it starts at min_limit and only falls); the others
    // learned their own, larger ones. One limit for the upstream would have held all three at
    // the floor, every window having the sick one's 503s in it.
    assert_eq!(sick, 2);
    assert!(healthy.iter().all(|&l| l > 2), "{healthy:?}");
}

/// A name that does not resolve yet when floodgate starts (under compose, the upstream's
/// containers still starting): 503 `no_upstream` meanwhile, and its first addresses used within
/// a second of their first answer, not a whole `refresh` later (30 s here; the until's 10 s
/// would not see it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_resolves_late_is_used_as_soon_as_it_does() {
    let port = free_port();
    let replicas = three(port).await;
    let dns = Dns::start(&[]).await;
    let fg = Floodgate::start(&format!(
        "resolver: {{servers: [\"{}\"], refresh: 30s}}\n{}",
        dns.addr,
        config(&format!("    upstream: http://late.test:{port}\n"))
    ));
    let (status, body) = get(&fg, &[]).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("no_upstream"), "{body}");
    dns.set(vec!["127.0.0.2".parse().unwrap()]);
    let answered = Instant::now();
    until("the first address is used", || async {
        get(&fg, &[]).await.0 == 200
    })
    .await;
    println!(
        "used {:?} after the name first resolved",
        answered.elapsed()
    );
    assert!(replicas[0].served() > 0);
}

/// An endpoint that accepts and never answers is a gateway failure each time its request runs
/// out of `timeouts.upstream_response` (as Envoy's outlier detection counts timeouts): after
/// `consecutive_failures` of them it is ejected, and the requests after go to the live replicas.
/// The hanging endpoint's replica sleeps an hour; no time is asserted, only counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_never_answers_is_ejected_by_its_timeouts() {
    let port = free_port();
    let replicas = three(port).await;
    replicas[2].delay_ms.store(3_600_000, Ordering::SeqCst);
    let fg = Floodgate::start(&format!(
        "timeouts:\n  upstream_response: 200ms\n{}",
        config(&format!(
            "{}    balance: round_robin\n    outlier: {{consecutive_failures: 3, ejection: 5m}}\n    retries: {{attempts: 1}}\n",
            origins(port)
        ))
    ));
    let hanging = format!("127.0.0.4:{port}");
    let mut timeouts = 0;
    // Round robin sends every third request to the hanging endpoint: three timeouts in a row
    // there take 9 requests; 30 is ample, and the test stops at the ejection.
    for _ in 0..30 {
        let (status, _) = get(&fg, &[]).await;
        if status == 504 {
            timeouts += 1;
        }
        if has(&fg, &hanging, "ejected").await {
            break;
        }
    }
    assert!(
        has(&fg, &hanging, "ejected").await,
        "ejected after {timeouts} timeouts: {:?}",
        endpoints(&fg).await
    );
    assert_eq!(timeouts, 3);
    // From now on nothing waits on it.
    for _ in 0..20 {
        assert_eq!(get(&fg, &[]).await.0, 200);
    }
}
