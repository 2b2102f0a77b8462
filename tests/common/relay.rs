//! A delaying TCP relay in the test: every chunk read from one side reaches the other `delay`
//! later (so a store on loopback answers as one a region away does: a round trip costs
//! 2 × delay more), and a switch that cuts the link (open connections closed, new ones
//! refused) and heals it: a partition, made without `netem`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct DelayRelay {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut: each connection's pipes end when it changes.
    generation: watch::Sender<u64>,
    connections: Arc<AtomicU64>,
    _accept: tokio::task::JoinHandle<()>,
}

impl DelayRelay {
    /// Relays port-0 connections to `target`, `delay` each way.
    pub async fn start(target: SocketAddr, delay: Duration) -> DelayRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let connections = Arc::new(AtomicU64::new(0));
        let accept = {
            let (cut, generation, connections) =
                (cut.clone(), generation.clone(), connections.clone());
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    if cut.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let Ok(server) = TcpStream::connect(target).await else {
                        continue;
                    };
                    connections.fetch_add(1, Ordering::SeqCst);
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pipe(cr, sw, delay, generation.subscribe()));
                    tokio::spawn(pipe(sr, cw, delay, generation.subscribe()));
                }
            })
        };
        DelayRelay {
            addr,
            cut,
            generation,
            connections,
            _accept: accept,
        }
    }

    /// `redis://ADDR`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts the link: open connections are closed, new ones refused, until [`DelayRelay::heal`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Connections relayed so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read, in order, until either side
/// closes or the relay is cut.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    mut cut: watch::Receiver<u64>,
) {
    let (chunks, mut due) =
        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if chunks
                        .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::select! {
        _ = async { tokio::join!(reader, writer) } => {}
        _ = cut.changed() => {}
    }
}
