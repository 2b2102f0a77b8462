//! Measures the limiter's Redis hot path with two clients, side by side in one run:
//!
//! - `connection_manager`: floodgate's own path, [`RedisStore::decide`], one redis-rs multiplexed
//!   `ConnectionManager` shared (cloned) by every task, so concurrent EVALSHAs are pipelined;
//! - `deadpool_redis`: the same script, keys and arguments through a deadpool-redis pool, which
//!   checks a connection out per decision (and PINGs it on every checkout).
//!
//! Usage: `cargo run --release --example redis_clients -- redis://127.0.0.1:6379 [tasks] [seconds] [rounds]`
//! (`scripts/bench-redis-clients.sh` starts a redis-server and runs this).

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_redis::{Config, Runtime};
use floodgate::limiter::redis::{RedisStore, RedisTarget, SCRIPT_SOURCE};
use floodgate::limiter::{Algorithm, AlgorithmKind, Ask, BudgetKey, KeyKind, Limit, Store};

#[derive(Clone, Copy, PartialEq)]
enum Client {
    ConnectionManager,
    Deadpool,
}

struct Run {
    ops: u64,
    latencies_us: Vec<u64>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_string());
    let tasks: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(64);
    let seconds: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(5);
    let rounds: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(3);

    let store = Arc::new(RedisStore::connect(
        &RedisTarget::Single(url.clone()),
        "bench:",
        Duration::from_secs(2),
    )?);
    let mut cfg = Config::from_url(url.as_str());
    cfg.pool = Some(deadpool_redis::PoolConfig::new(tasks.min(64)));
    let pool = cfg.create_pool(Some(Runtime::Tokio1))?;
    let script = Arc::new(redis::Script::new(SCRIPT_SOURCE));
    let limits = Arc::new([Limit::of(Algorithm::from_parts(
        AlgorithmKind::TokenBucket,
        1_000_000,
        1,
    )?)]);

    println!("{tasks} tasks, {seconds} s per run, {rounds} interleaved rounds, 1000 identities");
    println!(
        "{:<20} {:>6} {:>12} {:>9} {:>9}",
        "client", "round", "decisions/s", "p50 µs", "p99 µs"
    );
    let mut totals = [(0u64, Vec::new()), (0u64, Vec::new())];
    for round in 1..=rounds {
        for (i, client) in [Client::ConnectionManager, Client::Deadpool]
            .into_iter()
            .enumerate()
        {
            let run = measure(
                client,
                tasks,
                Duration::from_secs(seconds),
                &store,
                &pool,
                &script,
                &limits,
            )
            .await;
            let rate = run.ops as f64 / seconds as f64;
            let (p50, p99) = percentiles(run.latencies_us.clone());
            let name = if client == Client::ConnectionManager {
                "connection_manager"
            } else {
                "deadpool_redis"
            };
            println!("{name:<20} {round:>6} {rate:>12.0} {p50:>9} {p99:>9}");
            totals[i].0 += run.ops;
            totals[i].1.extend(run.latencies_us);
        }
    }
    for (i, name) in ["connection_manager", "deadpool_redis"].iter().enumerate() {
        let (p50, p99) = percentiles(std::mem::take(&mut totals[i].1));
        let rate = totals[i].0 as f64 / (seconds as f64 * rounds as f64);
        println!("{name:<20} {:>6} {rate:>12.0} {p50:>9} {p99:>9}", "all");
    }
    Ok(())
}

async fn measure(
    client: Client,
    tasks: usize,
    duration: Duration,
    store: &Arc<RedisStore>,
    pool: &deadpool_redis::Pool,
    script: &Arc<redis::Script>,
    limits: &Arc<[Limit; 1]>,
) -> Run {
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let store = store.clone();
            let pool = pool.clone();
            let script = script.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                let mut ops = 0u64;
                let mut latencies = Vec::new();
                let mut n = t as u64;
                while started.elapsed() < duration {
                    n = n.wrapping_add(7919);
                    let identity = (n % 1000).to_be_bytes();
                    let asks = [Ask {
                        limit: &limits[0],
                        key: BudgetKey {
                            budget: "bench",
                            kind: KeyKind::ApiKey,
                            value: &identity,
                        },
                    }];
                    let begin = Instant::now();
                    let ok = match client {
                        Client::ConnectionManager => store.decide(&asks, 0).await.is_ok(),
                        Client::Deadpool => {
                            let mut invocation = script.prepare_invoke();
                            invocation.key(store.key_name(&asks[0]));
                            invocation
                                .arg("-")
                                .arg(0u64)
                                .arg("token_bucket")
                                .arg(1_000_000u64)
                                .arg(1u64)
                                .arg(1u32)
                                .arg(0u32)
                                .arg(0u32)
                                .arg(0u32);
                            match pool.get().await {
                                Ok(mut conn) => invocation
                                    .invoke_async::<Vec<redis::Value>>(&mut conn)
                                    .await
                                    .is_ok(),
                                Err(_) => false,
                            }
                        }
                    };
                    if ok {
                        ops += 1;
                        latencies.push(begin.elapsed().as_micros() as u64);
                    }
                }
                (ops, latencies)
            })
        })
        .collect();
    let mut run = Run {
        ops: 0,
        latencies_us: Vec::new(),
    };
    for h in handles {
        if let Ok((ops, lat)) = h.await {
            run.ops += ops;
            run.latencies_us.extend(lat);
        }
    }
    run
}

fn percentiles(mut v: Vec<u64>) -> (u64, u64) {
    if v.is_empty() {
        return (0, 0);
    }
    v.sort_unstable();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}
