//! Why one Lua script per decision: seed 002's comparison, reproduced with floodgate's own Redis
//! client. Three ways to run the same token bucket (burst 10, 10/s) against Redis:
//!
//! - `lua`: floodgate's production path, `RedisStore::decide`: one `EVALSHA`, Redis' clock;
//! - `multi_cmd`: `HMGET`, the refill computed here, then `HSET` and `PEXPIRE`: three round trips,
//!   not atomic;
//! - `watch`: `WATCH`, `HMGET`, then `MULTI`/`HSET`/`PEXPIRE`/`EXEC`, retried whenever another
//!   client touched the key in between (each task on a connection of its own, since `WATCH` is
//!   per connection).
//!
//! For each: 64 tasks for `RUN_SECONDS` on one hot key and on a key each, reporting µs per decision
//! per task and Redis round trips per decision; then the over-grant test: 64 tasks on one key for
//! 3 s, where at most 10 + 10 × 3 = 40 may be allowed.
//!
//! Run: `scripts/bench-lua-vs-watch.sh` (starts its own redis-server), or
//! `cargo run --release --example lua_vs_watch -- redis://127.0.0.1:6379`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use floodgate::limiter::redis::{RedisStore, RedisTarget};
use floodgate::limiter::{Algorithm, Ask, BudgetKey, KeyKind, Limit, Store};
use redis::AsyncCommands;

const TASKS: usize = 64;
const BURST: f64 = 10.0;
const RATE: f64 = 10.0;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Lua,
    MultiCmd,
    Watch,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Lua => "lua (floodgate)",
            Way::MultiCmd => "multi_cmd",
            Way::Watch => "watch",
        }
    }
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The client-side token bucket the seed's multi_cmd and watch compute: refill to now, take one.
fn refill(tokens: Option<f64>, ts: Option<f64>, now: f64) -> (bool, f64) {
    let tokens = tokens.unwrap_or(BURST);
    let ts = ts.unwrap_or(now);
    let tokens = (tokens + (now - ts).max(0.0) * RATE).min(BURST);
    if tokens >= 1.0 {
        (true, tokens - 1.0)
    } else {
        (false, tokens)
    }
}

struct Counters {
    decisions: AtomicU64,
    allowed: AtomicU64,
    calls: AtomicU64,
    errors: AtomicU64,
}

async fn run(
    way: Way,
    url: &str,
    store: Arc<RedisStore>,
    hot: bool,
    seconds: u64,
    prefix: &str,
) -> (f64, f64, u64, u64) {
    let client = redis::Client::open(url).expect("url");
    let counters = Arc::new(Counters {
        decisions: AtomicU64::new(0),
        allowed: AtomicU64::new(0),
        calls: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let limit = Limit::of(Algorithm::token_bucket(BURST as u32, RATE).expect("valid bucket"));
    let run_for = Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    let started = Instant::now();
    for t in 0..TASKS {
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let counters = counters.clone();
        let store = store.clone();
        let key = if hot {
            format!("{prefix}:hot")
        } else {
            format!("{prefix}:user{t}")
        };
        tasks.push(tokio::spawn(async move {
            while started.elapsed() < run_for {
                let outcome: redis::RedisResult<(bool, u64)> = match way {
                    Way::Lua => {
                        let asks = [Ask {
                            limit: &limit,
                            key: BudgetKey {
                                budget: &key,
                                kind: KeyKind::ApiKey,
                                value: b"",
                            },
                        }];
                        store
                            .decide(&asks, 0)
                            .await
                            .map(|r| (r.verdict.allowed(), 1))
                            .map_err(|e| {
                                redis::RedisError::from(std::io::Error::other(e.to_string()))
                            })
                    }
                    Way::MultiCmd => multi_cmd(&mut conn, &key).await,
                    Way::Watch => watch(&mut conn, &key).await,
                };
                match outcome {
                    Ok((allowed, calls)) => {
                        counters.decisions.fetch_add(1, Ordering::Relaxed);
                        counters
                            .allowed
                            .fetch_add(u64::from(allowed), Ordering::Relaxed);
                        counters.calls.fetch_add(calls, Ordering::Relaxed);
                    }
                    Err(_) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let decisions = counters.decisions.load(Ordering::Relaxed).max(1);
    let us_per_op = elapsed * 1e6 * TASKS as f64 / decisions as f64;
    let calls = counters.calls.load(Ordering::Relaxed) as f64 / decisions as f64;
    (
        us_per_op,
        calls,
        counters.allowed.load(Ordering::Relaxed),
        counters.errors.load(Ordering::Relaxed),
    )
}

async fn multi_cmd(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> redis::RedisResult<(bool, u64)> {
    let (tokens, ts): (Option<f64>, Option<f64>) = redis::cmd("HMGET")
        .arg(key)
        .arg("tokens")
        .arg("ts")
        .query_async(conn)
        .await?;
    let now = now_secs();
    let (allowed, tokens) = refill(tokens, ts, now);
    // Always written back (the seed's lesson: skipping the write on a denial makes it worse).
    let _: () = conn
        .hset_multiple(key, &[("tokens", tokens), ("ts", now)])
        .await?;
    let _: () = conn.pexpire(key, 10_000).await?;
    Ok((allowed, 3))
}

async fn watch(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> redis::RedisResult<(bool, u64)> {
    let mut calls = 0;
    loop {
        let _: () = redis::cmd("WATCH").arg(key).query_async(conn).await?;
        let (tokens, ts): (Option<f64>, Option<f64>) = redis::cmd("HMGET")
            .arg(key)
            .arg("tokens")
            .arg("ts")
            .query_async(conn)
            .await?;
        calls += 2;
        let now = now_secs();
        let (allowed, tokens) = refill(tokens, ts, now);
        let committed: Option<((), ())> = redis::pipe()
            .atomic()
            .hset_multiple(key, &[("tokens", tokens), ("ts", now)])
            .pexpire(key, 10_000)
            .query_async(conn)
            .await?;
        calls += 1;
        if committed.is_some() {
            return Ok((allowed, calls));
        }
        if calls > 3000 {
            return Err(std::io::Error::other("gave up after 1000 WATCH retries").into());
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_string());
    let seconds: u64 = std::env::var("RUN_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let store = Arc::new(
        RedisStore::connect(
            &RedisTarget::Single(url.clone()),
            "lvw:",
            Duration::from_secs(2),
        )
        .expect("store"),
    );
    // Let the lazy connection come up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ways = [Way::Lua, Way::MultiCmd, Way::Watch];
    println!("## Performance ({TASKS} tasks, {seconds} s each; µs per decision per task)\n");
    println!(
        "| approach | hot key: µs/op | hot key: round trips/decision | a key each: µs/op | a key each: round trips/decision |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (i, way) in ways.into_iter().enumerate() {
        let hot = run(way, &url, store.clone(), true, seconds, &format!("perf{i}")).await;
        let each = run(
            way,
            &url,
            store.clone(),
            false,
            seconds,
            &format!("each{i}"),
        )
        .await;
        println!(
            "| {} | {:.1} | {:.2} | {:.1} | {:.2} |",
            way.name(),
            hot.0,
            hot.1,
            each.0,
            each.1
        );
    }
    println!("\n## Over-grant ({TASKS} tasks on one key for 3 s; burst 10, 10/s: at most 40)\n");
    println!("| approach | allowed | over-grant | decisions | errors |");
    println!("|---|---:|---:|---:|---:|");
    for (i, way) in ways.into_iter().enumerate() {
        let (us, _, allowed, errors) =
            run(way, &url, store.clone(), true, 3, &format!("grant{i}")).await;
        let decisions = (3.0 * 1e6 * TASKS as f64 / us) as u64;
        println!(
            "| {} | {allowed} | {:+.1}% | {decisions} | {errors} |",
            way.name(),
            (allowed as f64 - 40.0) / 40.0 * 100.0
        );
    }
}
