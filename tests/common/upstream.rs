//! The upstream: a real HTTP/1.1 server on port 0 that records every request, plain or TLS.

use super::*;

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
/// - `/upload…`: reads the whole request body, then answers `received N bytes`;
/// - `/hang…`: answers only after [`HANG`] (so floodgate's upstream timeout fires first);
/// - `/ws…`: a WebSocket-style upgrade: 101, then echoes bytes over the upgraded connection;
/// - `/hop-response…`: 200 carrying hop-by-hop headers (`Connection: x-foo`, `X-Foo`,
///   `Keep-Alive`) that a proxy must not relay;
/// - `/cost…`: 200 with `X-Cost` set to the request's `x-report-cost` (a cost it reports),
///   after `x-delay-ms`;
/// - `/redirect…`: 302 with `Location` and `Content-Location` on the upstream's own origin (the
///   `Host` it was sent), as a framework's absolute redirect is;
/// - anything else: 200 with [`UPSTREAM_BODY`].
pub struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
    counter: Arc<InFlight>,
}

/// How many requests the upstream's handler is running now, and the most there ever were.
#[derive(Debug, Default)]
struct InFlight {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

/// Counts one request in flight until dropped.
struct Running(Arc<InFlight>);

impl Running {
    fn start(counter: Arc<InFlight>) -> Running {
        let now = counter.now.fetch_add(1, Ordering::SeqCst) + 1;
        counter.max.fetch_max(now, Ordering::SeqCst);
        Running(counter)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let counter = Arc::new(InFlight::default());
        let counting = counter.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let log = log.clone();
                let counter = counting.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let running = Running::start(counter.clone());
                        let log = log.clone();
                        async move {
                            let response = handle(req, log).await;
                            drop(running);
                            response
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Upstream {
            addr,
            seen,
            task,
            counter,
        }
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

    /// The most requests this upstream's handler ran at once (a plain HTTP upstream only).
    pub fn max_in_flight(&self) -> usize {
        self.counter.max.load(Ordering::SeqCst)
    }

    /// How many requests its handler runs now.
    pub fn in_flight_now(&self) -> usize {
        self.counter.now.load(Ordering::SeqCst)
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
    let response = if path.starts_with("/upload") {
        // Reads the whole body first, as an upload endpoint does, and says how much it got.
        use http_body_util::BodyExt;
        match req.into_body().collect().await {
            Ok(body) => Response::new(Full::new(Bytes::from(format!(
                "received {} bytes",
                body.to_bytes().len()
            )))),
            Err(_) => Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .body(Full::new(Bytes::from_static(b"body failed")))
                .unwrap(),
        }
    } else if path.starts_with("/echo") {
        // The request body back, whole.
        use http_body_util::BodyExt;
        match req.into_body().collect().await {
            Ok(body) => Response::new(Full::new(body.to_bytes())),
            Err(_) => Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .body(Full::new(Bytes::from_static(b"body failed")))
                .unwrap(),
        }
    } else if path.starts_with("/cost") {
        // Reports the cost the client asked it to (`x-report-cost`) in `X-Cost`, as an API
        // that says what a call used does, after `x-delay-ms` if given.
        let delay = req
            .headers()
            .get("x-delay-ms")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        if let Some(ms) = delay {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let mut response = Response::new(Full::new(Bytes::from_static(b"costed")));
        if let Some(cost) = req.headers().get("x-report-cost") {
            response.headers_mut().insert("x-cost", cost.clone());
        }
        response
    } else if let Some(code) = path
        .strip_prefix("/status/")
        .and_then(|c| c.parse::<u16>().ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
    {
        // Answers with the status the path names (`/status/404`).
        let mut response = Response::new(Full::new(Bytes::from_static(b"as asked")));
        *response.status_mut() = code;
        response
    } else if path.starts_with("/slow") {
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
    } else if path.starts_with("/redirect") {
        let host = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("missing-host")
            .to_string();
        Response::builder()
            .status(StatusCode::FOUND)
            .header("location", format!("http://{host}/landing?from=redirect"))
            .header("content-location", format!("http://{host}/content"))
            .body(Full::new(Bytes::from_static(b"moved")))
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

/// A raw TCP upstream that reads each request's head, then writes `response` as it is and closes
/// the connection: for answers no HTTP library would send (a body shorter than its
/// `Content-Length`, an HTTP/1.0 status line).
pub struct RawUpstream {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl RawUpstream {
    pub async fn start(response: &'static [u8]) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind raw upstream");
        let addr = listener.local_addr().expect("raw upstream addr");
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if read_request_head(&mut stream).await.is_none() {
                        return;
                    }
                    let _ = stream.write_all(response).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        RawUpstream { addr, task }
    }

    /// `http://127.0.0.1:PORT`, for a route's `upstream:`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads from `stream` up to and including the blank line that ends a request head; `None`
/// when the connection ends first.
pub async fn read_request_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(head)
}

/// A raw TCP upstream that records each request's head byte for byte (the request line and
/// every header line as they came over the wire), answers `200 ok` and closes the connection:
/// for what a client library or an HTTP parser would tidy up before a test could see it.
pub struct RecordingUpstream {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl RecordingUpstream {
    pub async fn start() -> RecordingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind recording upstream");
        let addr = listener.local_addr().expect("recording upstream addr");
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = heads.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let Some(head) = read_request_head(&mut stream).await else {
                        return;
                    };
                    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
                    let text = String::from_utf8_lossy(&head[..end]).into_owned();
                    kept.lock().unwrap().push(text);
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                        )
                        .await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        RecordingUpstream { addr, heads, task }
    }

    /// `http://127.0.0.1:PORT`, for a route's `upstream:`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request head received so far, in order, without the blank line that ends it.
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }

    /// The request line of every head.
    pub fn request_lines(&self) -> Vec<String> {
        let heads = self.heads();
        heads
            .iter()
            .map(|h| h.lines().next().unwrap_or("").to_string())
            .collect()
    }

    /// The values of header `name` (any case) in head `i`, in order, as they were sent.
    pub fn values(&self, i: usize, name: &str) -> Vec<String> {
        let heads = self.heads();
        heads[i]
            .lines()
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .collect()
    }
}

impl Drop for RecordingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An address on which nothing listens: bind port 0, note the port, close the listener.
pub fn closed_port_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr
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
        Upstream {
            addr,
            seen,
            task,
            counter: Arc::default(),
        }
    }
}
