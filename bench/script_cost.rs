//! What one limiter decision costs Redis: `usec_per_call` of the script command from
//! `INFO commandstats`, for a one-limit and a three-limit request, through floodgate's own store
//! (`RedisStore::decide`), 64 tasks over 1000 identities; and, as the floor under those figures,
//! a function that makes the one-limit token bucket's three Redis calls (`TIME`, `GET`, `SET PX`)
//! and nothing else. Run: `scripts/bench-script-cost.sh`.

use std::sync::Arc;
use std::time::Duration;

use floodgate::limiter::redis::{RedisStore, RedisTarget};
use floodgate::limiter::{Algorithm, Ask, BudgetKey, KeyKind, Limit, Store};

const TASKS: usize = 64;
const DECISIONS: usize = 200_000;

fn limits(n: usize) -> Vec<Limit> {
    let all = [
        Limit::of(Algorithm::token_bucket(1_000_000, 1_000.0).expect("bucket")),
        Limit::of(
            Algorithm::sliding_window_counter(1_000_000, Duration::from_secs(1)).expect("counter"),
        ),
        Limit::of(Algorithm::fixed_window(1_000_000, Duration::from_secs(60)).expect("window")),
    ];
    all[..n].to_vec()
}

async fn usec_per_call(url: &str) -> Vec<(String, f64, u64)> {
    let client = redis::Client::open(url).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .expect("info");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha") || l.starts_with("cmdstat_fcall"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            Some((
                name.trim_start_matches("cmdstat_").to_string(),
                field("usec_per_call")?,
                field("calls")? as u64,
            ))
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let store = Arc::new(
        RedisStore::connect(
            &RedisTarget::Single(url.clone()),
            "cost:",
            Duration::from_secs(2),
        )
        .expect("store"),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    println!("| request | script command | Redis µs per call | calls |");
    println!("|---|---|---:|---:|");
    for n in [1usize, 3] {
        let limits = Arc::new(limits(n));
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut admin)
            .await
            .expect("resetstat");
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let store = store.clone();
                let limits = limits.clone();
                tokio::spawn(async move {
                    for i in 0..DECISIONS / TASKS {
                        let id = ((t * 7919 + i) % 1000).to_be_bytes();
                        let budgets = ["cost#0", "cost#1", "cost#2"];
                        let asks: Vec<Ask<'_>> = limits
                            .iter()
                            .enumerate()
                            .map(|(j, limit)| Ask {
                                limit,
                                key: BudgetKey {
                                    budget: budgets[j],
                                    kind: KeyKind::ApiKey,
                                    value: &id,
                                },
                            })
                            .collect();
                        let _ = store.decide(&asks, 0).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        for (command, usec, calls) in usec_per_call(&url).await {
            println!(
                "| {n} limit{} | {command} | {usec:.2} | {calls} |",
                if n > 1 { "s" } else { "" }
            );
        }
    }
    floor(&url, &mut admin).await;
}

/// The token bucket's Redis calls with no Lua around them: what a one-limit decision cannot go
/// below while the clock comes from `TIME` and the state is read, then written.
const FLOOR_LIBRARY: &str = "#!lua name=floodgate_cost_floor
redis.register_function('floodgate_cost_floor', function(keys, args)
  local t = redis.call('TIME')
  local tat = redis.call('GET', keys[1])
  redis.call('SET', keys[1], t[1] .. t[2], 'PX', 1000)
  return { 1, 0, 1, 2, 3, 4, 5, 6 }
end)";

async fn floor(url: &str, admin: &mut redis::aio::MultiplexedConnection) {
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(FLOOR_LIBRARY)
        .query_async(admin)
        .await
        .expect("function load");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(admin)
        .await
        .expect("resetstat");
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let mut c = admin.clone();
            tokio::spawn(async move {
                for i in 0..DECISIONS / TASKS {
                    let key = format!("cost:floor:{{{}}}", (t * 7919 + i) % 1000);
                    let _: redis::Value = redis::cmd("FCALL")
                        .arg("floodgate_cost_floor")
                        .arg(1)
                        .arg(key)
                        .query_async(&mut c)
                        .await
                        .expect("the floor function runs");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a floor task");
    }
    for (command, usec, calls) in usec_per_call(url).await {
        println!("| floor: TIME, GET, SET PX only | {command} | {usec:.2} | {calls} |");
    }
}
