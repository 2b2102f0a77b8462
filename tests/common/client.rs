//! Clients for the proxy, and the assertions the tests share.

use super::*;

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

/// A series' value on floodgate's admin `/metrics` (the whole series name, labels included, as
/// the text format writes it); panics if it is missing.
pub async fn metric(fg: &Floodgate, series: &str) -> u64 {
    let body = get(&client(), &fg.admin_url("/metrics"), &[]).await.body;
    sample(&body, series) as u64
}

/// The value of exactly `series` (its name and labels, as `/metrics` writes them) in a
/// Prometheus text exposition; panics, with the text, when there is no such series.
pub fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
}

/// The status of one GET of `url` with `X-API-Key: key`.
pub async fn keyed_status(url: &str, key: &str) -> u16 {
    get(&client(), url, &[("x-api-key", key)])
        .await
        .status
        .as_u16()
}

/// The statuses of `n` GETs of `url` with `X-API-Key: key`, one after the other on one client.
pub async fn keyed_statuses(url: &str, key: &str, n: usize) -> Vec<u16> {
    let client = client();
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        got.push(
            get(&client, url, &[("x-api-key", key)])
                .await
                .status
                .as_u16(),
        );
    }
    got
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

/// The seeds' over-grant load: `clients` clients POST to `urls` (client i to url i mod n) with
/// one API key, as fast as they can, for `run_for`; the statuses they got, counted (0: no
/// response). Clients are built before the clock starts: building one loads TLS roots, which
/// takes a while in a debug build and would otherwise eat into the measured time.
pub async fn hammer(
    urls: &[String],
    key: &str,
    clients: usize,
    run_for: Duration,
) -> std::collections::HashMap<u16, u32> {
    let urls: std::sync::Arc<Vec<String>> = std::sync::Arc::new(urls.to_vec());
    let built: Vec<reqwest::Client> = (0..clients).map(|_| client()).collect();
    let started = std::time::Instant::now();
    let tasks: Vec<_> = built
        .into_iter()
        .enumerate()
        .map(|(i, client)| {
            let urls = urls.clone();
            let key = key.to_string();
            tokio::spawn(async move {
                let mut statuses = std::collections::HashMap::<u16, u32>::new();
                while started.elapsed() < run_for {
                    let status = post_status(&client, &urls[i % urls.len()], &key).await;
                    *statuses.entry(status).or_default() += 1;
                }
                statuses
            })
        })
        .collect();
    let mut totals = std::collections::HashMap::<u16, u32>::new();
    for task in tasks {
        for (status, n) in task.await.expect("client task") {
            *totals.entry(status).or_default() += n;
        }
    }
    totals
}

/// How long a drain may take at most: far beyond what spending any test's budget takes on this
/// project's 2-core machine even with the whole suite beside it (seconds), so reaching it means
/// the budget did not run out, and the test says so.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(120);

/// Like [`hammer`], but each client stops once it has been refused (429) `in_a_row` times
/// running: the budget behind its URL is spent, however slowly a loaded machine got there. A
/// client still admitted after [`DRAIN_DEADLINE`] fails the test, naming what was answered.
/// Returns the answers by status, all clients together.
pub async fn hammer_until_refused(
    urls: &[String],
    key: &str,
    clients: usize,
    in_a_row: u32,
) -> std::collections::HashMap<u16, u32> {
    let urls: std::sync::Arc<Vec<String>> = std::sync::Arc::new(urls.to_vec());
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let urls = urls.clone();
            let key = key.to_string();
            tokio::spawn(async move {
                let client = client();
                let mut statuses = std::collections::HashMap::<u16, u32>::new();
                let mut refused = 0;
                while refused < in_a_row {
                    if started.elapsed() > DRAIN_DEADLINE {
                        return Err(statuses);
                    }
                    let status = post_status(&client, &urls[i % urls.len()], &key).await;
                    refused = if status == 429 { refused + 1 } else { 0 };
                    *statuses.entry(status).or_default() += 1;
                }
                Ok(statuses)
            })
        })
        .collect();
    let mut totals = std::collections::HashMap::<u16, u32>::new();
    let mut undrained = 0;
    for task in tasks {
        let (Ok(statuses) | Err(statuses)) = match task.await.expect("client task") {
            Ok(s) => Ok(s),
            Err(s) => {
                undrained += 1;
                Err(s)
            }
        };
        for (status, n) in statuses {
            *totals.entry(status).or_default() += n;
        }
    }
    assert_eq!(
        undrained, 0,
        "{undrained} of {clients} clients were not refused {in_a_row} times running within \
         {DRAIN_DEADLINE:?}: the budget did not run out ({totals:?})"
    );
    totals
}

/// A POST to `url` as `key`: its status, or 0 when it failed (said on stderr).
async fn post_status(client: &reqwest::Client, url: &str, key: &str) -> u16 {
    match client.post(url).header("x-api-key", key).send().await {
        Ok(r) => r.status().as_u16(),
        Err(e) => {
            eprintln!("hammer: request failed: {e:?}");
            0
        }
    }
}
