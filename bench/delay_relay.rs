//! A delaying TCP relay for benchmarks: every chunk read from one side is written to the other
//! `DELAY` later, in order, both ways, so that a Redis on loopback answers as one a network away
//! does (a round trip costs 2 × DELAY more). This machine's kernel has no `netem`, hence this.
//!
//!     cargo run --release --example delay_relay -- LISTEN_ADDR TARGET_ADDR [DELAY_US]
//!
//! It prints `relay listening on ADDR` once bound (port 0 picks one). Each direction of each
//! connection is two OS threads, a reader stamping chunks and a writer sleeping until each is
//! due: tokio's timer has a 1 ms granularity, far coarser than the 250 µs a hop between hosts in
//! one zone costs, where `std::thread::sleep` keeps to tens of µs. Meant for loopback only.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: delay_relay LISTEN_ADDR TARGET_ADDR [DELAY_US, default 250]");
        std::process::exit(2);
    }
    let target = args[2].clone();
    let delay = Duration::from_micros(args.get(3).and_then(|d| d.parse().ok()).unwrap_or(250));
    let listener = TcpListener::bind(&args[1])?;
    println!("relay listening on {}", listener.local_addr()?);
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(&target) else {
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (from, to) = (from.try_clone()?, to.try_clone()?);
            pipe(from, to, delay);
        }
    }
    Ok(())
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0
                || chunks
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (at, chunk) in due {
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
