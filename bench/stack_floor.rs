//! What floodgate's stack (tokio + hyper, mimalloc) costs before floodgate does anything: the
//! floor under floodgate's own figures, measured by `scripts/bench.sh` beside nginx.
//!
//! - `stack_floor serve ADDR`: hyper's HTTP/1.1 server answering every request `200 ok\n` (what
//!   floodgate's 429 path would cost with no routing, identity, limiter, headers or metrics);
//! - `stack_floor proxy ADDR UPSTREAM`: the smallest hyper reverse proxy, the one hyper's own
//!   client example builds: each client connection gets one upstream connection
//!   (`client::conn::http1`, its driver on a task of its own), requests passed through untouched
//!   (what floodgate's allow path would cost with no pool, header rewriting, timeouts, limiter or
//!   metrics).
//!
//! Both print `listening on http://ADDR` once bound (ADDR may be `127.0.0.1:0`) and run a
//! multi-threaded runtime with one worker per CPU, as floodgate does; `serve-tpc` and
//! `proxy-tpc` run thread per core instead (one current-thread runtime per CPU, each with its
//! own `SO_REUSEPORT` listener), the experiment #30 asked for.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Body = BoxBody<Bytes, hyper::Error>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: stack_floor serve|serve-tpc ADDR | stack_floor proxy|proxy-tpc ADDR \
                 UPSTREAM(host:port)";
    let (mode, addr) = match (args.get(1), args.get(2)) {
        (Some(mode), Some(addr)) => (mode.as_str(), addr.parse::<SocketAddr>()?),
        _ => return Err(usage.into()),
    };
    let (mode, per_core) = match mode.strip_suffix("-tpc") {
        Some(mode) => (mode, true),
        None => (mode, false),
    };
    let upstream = match mode {
        "serve" => None,
        "proxy" => Some(args.get(3).ok_or(usage)?.clone()),
        _ => return Err(usage.into()),
    };
    if !per_core {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        return runtime.block_on(async {
            let listener = TcpListener::bind(addr).await?;
            println!("listening on http://{}", listener.local_addr()?);
            accept(listener, upstream).await
        });
    }
    // Thread per core: one current-thread runtime per CPU, each accepting on its own
    // SO_REUSEPORT listener (the kernel spreads connections over them); nothing moves between
    // threads.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let first = reuseport(addr)?;
    let bound = first.local_addr()?;
    let mut sockets = vec![first];
    for _ in 1..cores {
        sockets.push(reuseport(bound)?);
    }
    println!("listening on http://{bound}");
    let threads: Vec<_> = sockets
        .into_iter()
        .map(|socket| {
            let upstream = upstream.clone();
            std::thread::spawn(move || -> Result<(), String> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                runtime
                    .block_on(async {
                        let listener = TcpListener::from_std(socket)?;
                        accept(listener, upstream).await
                    })
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a thread panicked")??;
    }
    Ok(())
}

/// A non-blocking listener on `addr` with SO_REUSEPORT, so that several can share the port.
fn reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    // tokio's listener registers with a reactor: a throwaway one, left at `into_std`.
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let _entered = setup.enter();
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseport(true)?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(1024)?;
    listener.into_std()
}

async fn accept(
    listener: TcpListener,
    upstream: Option<String>,
) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let result = match upstream {
                None => serve(stream).await,
                Some(upstream) => proxy(stream, &upstream).await,
            };
            // wrk closing its connections at the end of a run is not worth a line.
            if let Err(e) = result
                && !e
                    .downcast_ref::<hyper::Error>()
                    .is_some_and(|e| e.is_incomplete_message())
            {
                eprintln!("connection: {e}");
            }
        });
    }
}

async fn serve(stream: TcpStream) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let service = service_fn(|_req: Request<Incoming>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await?;
    Ok(())
}

async fn proxy(
    stream: TcpStream,
    upstream: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let backend = TcpStream::connect(upstream).await?;
    backend.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(backend)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("upstream connection: {e}");
        }
    });
    let sender = std::sync::Arc::new(tokio::sync::Mutex::new(sender));
    let service = service_fn(move |req: Request<Incoming>| {
        let sender = sender.clone();
        async move {
            // HTTP/1.1 without pipelining: one request at a time per client connection, so the
            // lock is never contended; it only lets the service be called more than once.
            let mut sender = sender.lock().await;
            sender.ready().await?;
            let response = sender.send_request(req).await?;
            Ok::<_, hyper::Error>(response.map(Body::new))
        }
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await?;
    Ok(())
}
