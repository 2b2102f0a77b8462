//! The end-to-end harness: the real `floodgate` binary started as a child process on port 0, in
//! front of a real HTTP/1.1 upstream started inside the test on port 0 that records every request.
//!
//! Each integration test file is its own crate and uses only part of this module, hence the
//! `dead_code` allowance.
#![allow(dead_code)]

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The body the upstream answers with on its default path.
pub const UPSTREAM_BODY: &str = "hello from upstream";

/// How long the upstream sits on a `/hang…` request: far longer than any test's
/// `timeouts.upstream_response`, so floodgate must give up first.
pub const HANG: Duration = Duration::from_secs(10);

/// How long the upstream takes on a `/slow…` request: long enough to reload or shut floodgate
/// down while it is in flight, shorter than the default `timeouts.upstream_response`.
pub const SLOW: Duration = Duration::from_millis(1500);

// ---------------------------------------------------------------------------------------------
// Temp files
// ---------------------------------------------------------------------------------------------

/// A file in the system temp dir, removed on drop.
pub struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Writes `contents` to a fresh file named after this process and a counter.
    pub fn new(contents: &str) -> TempFile {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("floodgate-test-{}-{n}.yaml", std::process::id()));
        std::fs::write(&path, contents).expect("write temp config");
        TempFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

// ---------------------------------------------------------------------------------------------
// The floodgate process
// ---------------------------------------------------------------------------------------------

/// A running `floodgate --config FILE` child process, killed on drop.
pub struct Floodgate {
    child: Child,
    addr: SocketAddr,
    admin: Arc<Mutex<Option<SocketAddr>>>,
    stderr: Arc<Mutex<String>>,
    _config: TempFile,
}

impl Floodgate {
    /// Starts floodgate with `yaml` (everything but `listen:`, which is set to 127.0.0.1:0) and
    /// waits for its `floodgate listening on http://IP:PORT` line (`https://` with `tls:`).
    pub fn start(yaml: &str) -> Floodgate {
        Floodgate::start_with_env(yaml, &[])
    }

    /// [`Floodgate::start`] with extra environment variables (`FLOODGATE_REDIS_URL`, say).
    pub fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Floodgate {
        let config = TempFile::new(&format!("listen: 127.0.0.1:0\n{yaml}"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate"));
        command.env_remove("FLOODGATE_REDIS_URL");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command
            .arg("--config")
            .arg(config.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn floodgate");

        // Keep stderr drained (so the child never blocks on a full pipe) and at hand for failures.
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut child_stderr = child.stderr.take().expect("stderr piped");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = child_stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });

        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        // floodgate prints its admin address (if any) before the proxy's.
        let admin = Arc::new(Mutex::new(None));
        let admin_sink = admin.clone();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                if let Some(addr) = line.strip_prefix("floodgate admin listening on http://") {
                    if let Ok(addr) = addr.trim().parse::<SocketAddr>() {
                        *admin_sink.lock().unwrap() = Some(addr);
                    }
                } else if let Some(addr) = line
                    .strip_prefix("floodgate listening on http://")
                    .or_else(|| line.strip_prefix("floodgate listening on https://"))
                {
                    let _ = tx.send(addr.trim().parse::<SocketAddr>());
                }
            }
        });

        let mut floodgate = Floodgate {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin,
            stderr,
            _config: config,
        };
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(addr)) => floodgate.addr = addr,
            other => panic!(
                "floodgate did not report its address ({other:?}); exit: {:?}; stderr:\n{}",
                floodgate.child.try_wait(),
                floodgate.stderr()
            ),
        }
        floodgate
    }

    /// The proxy listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT{path}` on the proxy listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The admin listener's address (the config must set `admin_listen: 127.0.0.1:0`).
    pub fn admin_url(&self, path: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(addr) = *self.admin.lock().unwrap() {
                return format!("http://{addr}{path}");
            }
            assert!(
                Instant::now() < deadline,
                "floodgate reported no admin address"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The config file floodgate was started with (rewrite it, then [`Floodgate::signal`] HUP).
    pub fn config_path(&self) -> &Path {
        self._config.path()
    }

    /// Sends a signal (`HUP`, `TERM`, `INT`) to the process.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for the process to exit on its own, for at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// What floodgate has logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Floodgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the floodgate binary to completion with `args`.
pub fn floodgate_command(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("FLOODGATE_REDIS_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run floodgate")
}

// ---------------------------------------------------------------------------------------------
// The upstream
// ---------------------------------------------------------------------------------------------

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub version: Version,
    pub headers: HeaderMap,
    /// When the upstream's handler was called.
    pub at: Instant,
}

impl Seen {
    /// A header's value as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A real HTTP/1.1 server on 127.0.0.1:0 that records every request. Behaviour by path:
/// - `/hang…`: answers only after [`HANG`] (so floodgate's upstream timeout fires first);
/// - `/ws…`: a WebSocket-style upgrade: 101, then echoes bytes over the upgraded connection;
/// - `/hop-response…`: 200 carrying hop-by-hop headers (`Connection: x-foo`, `X-Foo`,
///   `Keep-Alive`) that a proxy must not relay;
/// - anything else: 200 with [`UPSTREAM_BODY`].
pub struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, log.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Upstream { addr, seen, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for a route's `upstream:`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests arrived so far.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    mut req: Request<Incoming>,
    log: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    log.lock().unwrap().push(Seen {
        method: req.method().clone(),
        path: req.uri().path().to_string(),
        version: req.version(),
        headers: req.headers().clone(),
        at: Instant::now(),
    });
    let path = req.uri().path().to_string();
    let response = if path.starts_with("/slow") {
        tokio::time::sleep(SLOW).await;
        Response::new(Full::new(Bytes::from_static(b"slow but done")))
    } else if path.starts_with("/hang") {
        tokio::time::sleep(HANG).await;
        Response::new(Full::new(Bytes::from_static(b"too late")))
    } else if path.starts_with("/ws") {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("upgrade", "websocket")
            .header("connection", "upgrade")
            .body(Full::new(Bytes::new()))
            .unwrap()
    } else if path.starts_with("/hop-response") {
        Response::builder()
            .header("connection", "x-foo")
            .header("x-foo", "1")
            .header("keep-alive", "timeout=5")
            .header("x-end-to-end", "kept")
            .body(Full::new(Bytes::from_static(UPSTREAM_BODY.as_bytes())))
            .unwrap()
    } else {
        Response::new(Full::new(Bytes::from_static(UPSTREAM_BODY.as_bytes())))
    };
    Ok(response)
}

/// An address on which nothing listens: bind port 0, note the port, close the listener.
pub fn closed_port_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr
}

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

/// An HTTP/1.1 client that never goes through a proxy from the environment.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("build client")
}

/// A cleartext HTTP/2 client (prior knowledge, no upgrade dance).
pub fn h2c_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("build h2c client")
}

/// A response read whole: status, headers and body text.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: String,
    /// When the response head arrived, in milliseconds since the Unix epoch.
    pub received_unix_ms: u64,
}

impl Reply {
    pub async fn read(response: reqwest::Response) -> Reply {
        let received_unix_ms = unix_now_ms();
        let status = response.status();
        let version = response.version();
        let headers = response.headers().clone();
        let body = response.text().await.expect("read body");
        Reply {
            status,
            version,
            headers,
            body,
            received_unix_ms,
        }
    }

    /// A header's value as text; panics if it is missing.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("missing {name} in {self:?}"))
            .to_str()
            .expect("header is text")
    }

    /// A header's value as an integer; panics if it is missing or not one.
    pub fn header_u64(&self, name: &str) -> u64 {
        let text = self.header(name);
        text.parse()
            .unwrap_or_else(|_| panic!("{name}: {text:?} is not an integer"))
    }

    /// Whole seconds, rounded up, from when this reply arrived until the Unix second `unix_secs`.
    pub fn secs_until(&self, unix_secs: u64) -> u64 {
        (unix_secs * 1000)
            .saturating_sub(self.received_unix_ms)
            .div_ceil(1000)
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
}

/// Sends a GET with extra headers and reads the reply.
pub async fn get(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = client.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    Reply::read(request.send().await.expect("send request")).await
}

/// Sends raw bytes over a fresh TCP connection and reads until the server closes it.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write request");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
        .await
        .expect("server closed the connection in time")
        .expect("read response");
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads from `stream` up to and including the blank line that ends a response head.
pub async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte))
            .await
            .expect("response head in time")
            .expect("read head");
        assert!(n > 0, "connection closed mid-head: {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------------------------

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Checks that `X-RateLimit-Reset` lies after the moment the reply arrived.
fn assert_reset_in_future(reply: &Reply) {
    let reset = reply.header_u64("x-ratelimit-reset");
    assert!(
        reset * 1000 > reply.received_unix_ms,
        "X-RateLimit-Reset is not in the future: {reply:?}"
    );
}

/// Unix seconds in the future at which the next `window`-long window aligned to the epoch
/// starts.
pub fn next_window_start(window_secs: u64) -> u64 {
    let now = unix_now();
    now - now % window_secs + window_secs
}

/// Windows are aligned to the Unix epoch, so a test that expects one window must not straddle
/// a boundary: if one is less than `margin` away, wait until it has passed. The tests that call
/// this finish in well under a second, so a 10 s margin leaves room for a slow, loaded machine.
pub async fn keep_clear_of_window_boundary(window_secs: u64, margin: Duration) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let window = Duration::from_secs(window_secs);
    let into_window = since_epoch.as_micros() % window.as_micros();
    let left = window - Duration::from_micros(into_window as u64);
    if left < margin {
        tokio::time::sleep(left + Duration::from_millis(200)).await;
    }
}

/// Checks a problem+json reply and returns its body.
pub fn assert_problem(reply: &Reply, status: StatusCode, error: &str) -> serde_json::Value {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        "application/problem+json",
        "{reply:?}"
    );
    let body = reply.json();
    assert_eq!(body["error"], error, "{reply:?}");
    assert_eq!(body["status"], status.as_u16(), "{reply:?}");
    body
}

/// Checks an admitted reply: 200, the upstream's body, and the rate-limit headers.
pub fn assert_admitted(reply: &Reply, limit: u64, remaining: u64) {
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body, UPSTREAM_BODY);
    assert_eq!(reply.header_u64("x-ratelimit-limit"), limit, "{reply:?}");
    assert_eq!(
        reply.header_u64("x-ratelimit-remaining"),
        remaining,
        "{reply:?}"
    );
    assert_reset_in_future(reply);
}

/// Checks everything the contract promises about a 429 and returns its `Retry-After`.
pub fn assert_rate_limited(reply: &Reply, limit: u64) -> u64 {
    let body = assert_problem(reply, StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded");
    let retry_after = reply.header_u64("retry-after");
    assert!(retry_after >= 1, "Retry-After below 1: {reply:?}");
    assert_eq!(body["retry_after"], retry_after, "{reply:?}");
    assert_eq!(reply.header_u64("x-ratelimit-limit"), limit, "{reply:?}");
    assert_eq!(reply.header_u64("x-ratelimit-remaining"), 0, "{reply:?}");
    assert_reset_in_future(reply);
    retry_after
}

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

impl Upstream {
    /// Like [`Upstream::start`], but speaking HTTP/1.1 over TLS with `tls` (for `https://`
    /// upstreams). A failed handshake is simply dropped, as a real server would.
    pub async fn start_tls(tls: Arc<rustls::ServerConfig>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let log = log.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = service_fn(move |req| handle(req, log.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Upstream { addr, seen, task }
    }
}
