//! floodgate-demo-upstream: a small HTTP/1.1 + h2c API with finite capacity, for floodgate's
//! quick start and surge load test.
//!
//! It stands in for the ride-matching service of the surge scenario: a fixed worker pool
//! (`--workers`), each request holding a worker for `--service-time`, and a 503 for any request
//! that waits longer than `--queue-timeout` for one. `GET /__stats` reports what it served.
//! `POST /v1/chat/completions` answers as OpenAI's API does, plain or streamed, with a `usage`
//! floodgate's token budgets can settle on (`chat.rs`).
//! On start it prints `floodgate-demo-upstream listening on http://IP:PORT` (the bound port,
//! also with `--listen 127.0.0.1:0`); SIGTERM or SIGINT drains connections and exits 0.

#![forbid(unsafe_code)]

mod body;
mod chat;
mod duration;
mod service;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::duration::parse_duration;
use crate::service::{Capacity, DemoApi};

/// How long in-flight requests get to finish after SIGTERM/SIGINT, on top of the worst case of
/// one queue timeout plus one service time.
const DRAIN_SLACK: Duration = Duration::from_secs(1);

/// A demo API with finite capacity: a fixed worker pool, a queue, and 503s when the queue is too slow.
#[derive(Debug, Parser)]
#[command(name = "floodgate-demo-upstream", version, about)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the bound one is printed).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,

    /// Size of the worker pool: how many requests are served at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,

    /// How long one request holds a worker (e.g. 20ms, 1s).
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    service_time: Duration,

    /// How long a request may wait for a worker before it is answered 503 (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    queue_timeout: Duration,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(error) = run(args).await {
        eprintln!("floodgate-demo-upstream: {error}");
        std::process::exit(1);
    }
}

/// Binds, announces the address, serves until a shutdown signal, then drains.
async fn run(args: Args) -> std::io::Result<()> {
    let capacity = Capacity {
        workers: args.workers as usize,
        service_time: args.service_time,
        queue_timeout: args.queue_timeout,
    };
    let api = DemoApi::new(capacity);
    let listener = TcpListener::bind(args.listen).await?;
    let local = listener.local_addr()?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "floodgate-demo-upstream listening on http://{local}"
        )?;
        stdout.flush()?;
    }
    eprintln!(
        "floodgate-demo-upstream: {} workers, service time {:?}, queue timeout {:?} (capacity about {:.0} req/s)",
        capacity.workers,
        capacity.service_time,
        capacity.queue_timeout,
        capacity.workers as f64 / capacity.service_time.as_secs_f64().max(1e-6),
    );

    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);

    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        // Usually EMFILE under a flood of connections: back off briefly, keep serving.
                        eprintln!("floodgate-demo-upstream: accept failed: {error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Best effort: a socket that refuses NODELAY is still served.
                let _ = stream.set_nodelay(true);
                let api = Arc::clone(&api);
                let service = service_fn(move |req| Arc::clone(&api).handle(req));
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection.into_owned());
                tokio::spawn(async move {
                    // Connection errors (client resets, malformed requests) concern only that client.
                    let _ = connection.await;
                });
            }
            () = &mut shutdown => break,
        }
    }

    drop(listener);
    let grace = capacity.queue_timeout + capacity.service_time + DRAIN_SLACK;
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!("floodgate-demo-upstream: gave up waiting for connections after {grace:?}");
    }
    Ok(())
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let ctrl_c = async {
        // If the handler cannot be installed, never resolve from here; SIGTERM still works.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
