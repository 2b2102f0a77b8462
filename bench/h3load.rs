//! A small load generator for HTTP/3 (quinn + h3) and, for comparison with the same client code
//! around it, HTTP/2 over TLS (hyper + rustls): closed-loop workers, each a stream in flight, on a
//! few connections, for `scripts/bench-h3.sh`.
//!
//!     cargo run --profile dist --example h3load -- PROTO ADDR CA_PEM CONNECTIONS STREAMS SECONDS PATH [KEYS]
//!
//! `PROTO` is `h3` or `h2`; `ADDR` is 127.0.0.1:PORT (loopback only); the server is named
//! `localhost` and trusted through `CA_PEM`. With `KEYS`, request *n* sends `X-API-Key: kN mod
//! KEYS`. Prints one line:
//! `RESULT proto=h3 requests=N seconds=S rps=R ok=A refused=B other=C errors=E p50_us=.. p99_us=.. client_cpu_us=..`
//! (`client_cpu_us`: this process' own CPU time, for the script to take out of the machine's).

#[path = "../tests/common/h3client.rs"]
mod h3client;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::CertificateDer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one worker saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    refused: u64,
    other: u64,
    errors: u64,
    latencies_us: Vec<u32>,
}

/// One connection of either protocol.
#[derive(Clone)]
enum Conn {
    H3(h3client::H3Client),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Conn {
    async fn open(
        proto: &str,
        addr: SocketAddr,
        ca: CertificateDer<'static>,
    ) -> Result<Conn, BoxError> {
        match proto {
            "h3" => Ok(Conn::H3(
                h3client::H3Client::connect(addr, "localhost", ca).await?,
            )),
            "h2" => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca)?;
                let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
                let mut tls = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                tls.alpn_protocols = vec![b"h2".to_vec()];
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let name = rustls::pki_types::ServerName::try_from("localhost")?;
                let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
                    .connect(name, tcp)
                    .await?;
                let (send, conn) = hyper::client::conn::http2::handshake(
                    TokioExecutor::new(),
                    TokioIo::new(stream),
                )
                .await?;
                tokio::spawn(conn);
                Ok(Conn::H2(send))
            }
            other => Err(format!("unknown protocol {other}").into()),
        }
    }

    /// One GET: its status.
    async fn get(
        &mut self,
        addr: SocketAddr,
        path: &str,
        key: Option<&str>,
    ) -> Result<u16, BoxError> {
        match self {
            Conn::H3(client) => {
                let headers: Vec<(&str, &str)> =
                    key.map(|k| ("x-api-key", k)).into_iter().collect();
                client.get(path, &headers).await
            }
            Conn::H2(send) => {
                let mut request =
                    http::Request::get(format!("https://localhost:{}{path}", addr.port()));
                if let Some(key) = key {
                    request = request.header("x-api-key", key);
                }
                send.ready().await?;
                let response = send.send_request(request.body(Empty::new())?).await?;
                let status = response.status().as_u16();
                response.into_body().collect().await?;
                Ok(status)
            }
        }
    }
}

/// This process' CPU time so far (user + system), in µs.
fn own_cpu_us() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let ticks = fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0);
    // Linux reports these in USER_HZ, 100 a second on every platform Rust targets here.
    ticks * 10_000
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 8 {
        return Err(
            "usage: h3load PROTO ADDR CA_PEM CONNECTIONS STREAMS SECONDS PATH [KEYS]".into(),
        );
    }
    let proto = args[1].clone();
    let addr: SocketAddr = args[2].parse()?;
    if !addr.ip().is_loopback() {
        return Err("load goes to loopback only".into());
    }
    let pem = std::fs::read(&args[3])?;
    let ca = rustls::pki_types::pem::PemObject::from_pem_slice(&pem)
        .map_err(|e| format!("{}: {e:?}", args[3]))?;
    let (connections, streams): (usize, usize) = (args[4].parse()?, args[5].parse()?);
    let seconds: u64 = args[6].parse::<u64>()?.min(120);
    let path = args[7].clone();
    let keys: Option<u64> = args.get(8).map(|k| k.parse()).transpose()?;

    let mut conns = Vec::new();
    for _ in 0..connections {
        conns.push(Conn::open(&proto, addr, CertificateDer::clone(&ca)).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = own_cpu_us();
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for (c, conn) in conns.iter().enumerate() {
        for s in 0..streams {
            let (mut conn, stop, path) = (conn.clone(), stop.clone(), path.clone());
            let mut n = (c * streams + s) as u64;
            workers.spawn(async move {
                let mut tally = Tally::default();
                while !stop.load(Ordering::Relaxed) {
                    let key = keys.map(|k| format!("k{}", n % k));
                    n += (connections * streams) as u64;
                    let sent = Instant::now();
                    match conn.get(addr, &path, key.as_deref()).await {
                        Ok(200..=299) => tally.ok += 1,
                        Ok(429) => tally.refused += 1,
                        Ok(_) => tally.other += 1,
                        Err(_) => {
                            tally.errors += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    let us = sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                    tally.latencies_us.push(us);
                }
                tally
            });
        }
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Tally::default();
    while let Some(done) = workers.join_next().await {
        let t = done?;
        all.ok += t.ok;
        all.refused += t.refused;
        all.other += t.other;
        all.errors += t.errors;
        all.latencies_us.extend(t.latencies_us);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = own_cpu_us() - cpu_before;
    all.latencies_us.sort_unstable();
    let pct = |p: f64| -> u32 {
        let n = all.latencies_us.len();
        if n == 0 {
            return 0;
        }
        all.latencies_us[((n as f64 * p) as usize).min(n - 1)]
    };
    let requests = all.ok + all.refused + all.other;
    println!(
        "RESULT proto={proto} requests={requests} seconds={elapsed:.3} rps={:.0} ok={} refused={} other={} errors={} p50_us={} p99_us={} client_cpu_us={cpu}",
        requests as f64 / elapsed,
        all.ok,
        all.refused,
        all.other,
        all.errors,
        pct(0.5),
        pct(0.99),
    );
    Ok(())
}
