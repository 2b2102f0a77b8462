//! The Redis store: one `EVALSHA` per decision, covering all the limits of a route, with time
//! from Redis `TIME`, so any number of floodgate instances share one budget exactly.
//!
//! The script is `lua/prelude.lua`, one file per algorithm and `lua/main.lua`, joined at compile
//! time. [`redis::Script`] computes its SHA1 once, sends `EVALSHA`, and on `NOSCRIPT` (a Redis
//! restart, `SCRIPT FLUSH`, a failover) loads the script and retries, transparently.
//!
//! Keys: `{prefix}{route}#{fingerprint}:{kind}:{{identity hash}}:{limit index}:{algorithm}`. The
//! identity is hashed (SHA-256 of kind and value), so no raw API key ever reaches Redis, and the
//! hash is the Redis Cluster hash tag, so all keys of one decision live in one slot. Every key
//! gets a TTL equal to the time until its budget is full again.
//!
//! Connections: one multiplexed connection ([`ConnectionManager`], which reconnects in the
//! background) shared by every request, so concurrent `EVALSHA`s are pipelined on one socket;
//! see the README for the measurement against deadpool-redis. For `redis_cluster`, redis-rs's
//! cluster connection, which follows `MOVED`/`ASK`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};
use sha2::{Digest, Sha256};

use super::{BudgetKey, Decision, Limit, LimiterError, Verdict};

/// The limiter script, assembled from one file per algorithm.
pub const SCRIPT_SOURCE: &str = concat!(
    include_str!("lua/prelude.lua"),
    include_str!("lua/gcra.lua"),
    include_str!("lua/leaky_bucket.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window_log.lua"),
    include_str!("lua/sliding_window_counter.lua"),
    include_str!("lua/main.lua"),
);

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single(String),
    Cluster(Vec<String>),
}

/// A connection to Redis or Redis Cluster.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The Redis-backed limiter store.
pub struct RedisStore {
    connection: Arc<ArcSwapOption<Connection>>,
    script: Script,
    prefix: String,
}

impl RedisStore {
    /// A store for `target`. Returns at once: the connection is made in the background and
    /// re-made after failures, so floodgate starts (and follows `on_error`) while Redis is down.
    /// Fails only on a malformed URL.
    pub fn connect(
        target: &RedisTarget,
        prefix: &str,
        timeout: Duration,
    ) -> Result<Self, LimiterError> {
        let connection = Arc::new(ArcSwapOption::empty());
        match target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
                    .set_response_timeout(Some(timeout.max(Duration::from_millis(250))))
                    .set_max_delay(Duration::from_secs(2))
                    .set_number_of_retries(1);
                let manager = ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
                connection.store(Some(Arc::new(Connection::Single(manager))));
            }
            RedisTarget::Cluster(urls) => {
                let client =
                    redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str))
                        .connection_timeout(timeout.max(Duration::from_millis(250)))
                        .response_timeout(timeout.max(Duration::from_millis(250)))
                        .build()
                        .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
                let slot = connection.clone();
                tokio::spawn(async move {
                    let mut backoff = Duration::from_millis(100);
                    loop {
                        match client.get_async_connection().await {
                            Ok(c) => {
                                slot.store(Some(Arc::new(Connection::Cluster(c))));
                                return;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot connect to Redis Cluster yet; retrying");
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_secs(5));
                            }
                        }
                    }
                });
            }
        }
        Ok(RedisStore {
            connection,
            script: Script::new(SCRIPT_SOURCE),
            prefix: prefix.to_string(),
        })
    }

    /// Decides one request against all `limits` in one round trip, all-or-nothing, by Redis time.
    pub async fn decide(
        &self,
        key: &BudgetKey<'_>,
        limits: &[Limit],
    ) -> Result<Option<Verdict>, LimiterError> {
        self.run(key, limits, None).await
    }

    /// [`RedisStore::decide`] with the time given instead of read from Redis: for the
    /// differential tests that drive the script and the Rust algorithms on one fake clock.
    pub async fn decide_at_for_test(
        &self,
        key: &BudgetKey<'_>,
        limits: &[Limit],
        now_us: u64,
    ) -> Result<Option<Verdict>, LimiterError> {
        self.run(key, limits, Some(now_us)).await
    }

    async fn run(
        &self,
        key: &BudgetKey<'_>,
        limits: &[Limit],
        now: Option<u64>,
    ) -> Result<Option<Verdict>, LimiterError> {
        if limits.is_empty() {
            return Ok(None);
        }
        let mut invocation = self.script.prepare_invoke();
        for name in self.key_names(key, limits) {
            invocation.key(name);
        }
        match now {
            Some(now) => invocation.arg(now),
            None => invocation.arg("-"),
        };
        for limit in limits {
            let (a, b) = limit.algorithm.parameters();
            invocation
                .arg(limit.algorithm.name())
                .arg(a)
                .arg(b)
                .arg(limit.cost);
        }
        let guard = self.connection.load_full();
        let Some(connection) = guard.as_deref() else {
            return Err(LimiterError::Unavailable(
                "not connected to Redis yet".to_string(),
            ));
        };
        let reply: Vec<Value> = match connection.clone() {
            Connection::Single(mut c) => invocation.invoke_async(&mut c).await,
            Connection::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        }
        .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
        parse_reply(&reply, limits.len()).map(Some)
    }

    /// The Redis keys of one decision, one per limit.
    pub fn key_names(&self, key: &BudgetKey<'_>, limits: &[Limit]) -> Vec<String> {
        let mut digest = Sha256::new();
        digest.update(key.kind.as_bytes());
        digest.update([0]);
        digest.update(key.value);
        let hash = digest.finalize();
        let mut tag = String::with_capacity(32);
        for b in &hash[..16] {
            let _ = write!(tag, "{b:02x}");
        }
        limits
            .iter()
            .enumerate()
            .map(|(i, l)| {
                format!(
                    "{}{}:{}:{{{tag}}}:{i}:{}",
                    self.prefix,
                    key.route,
                    key.kind,
                    l.algorithm.name()
                )
            })
            .collect()
    }

    /// Asks Redis whether it answers: `/readyz`.
    pub async fn ping(&self) -> Result<(), LimiterError> {
        let guard = self.connection.load_full();
        let Some(connection) = guard.as_deref() else {
            return Err(LimiterError::Unavailable(
                "not connected to Redis yet".to_string(),
            ));
        };
        let mut cmd = redis::cmd("PING");
        let result: redis::RedisResult<String> = match connection.clone() {
            Connection::Single(mut c) => cmd.query_async(&mut c).await,
            Connection::Cluster(mut c) => cmd.arg("floodgate").query_async(&mut c).await,
        };
        result
            .map(|_| ())
            .map_err(|e| LimiterError::Unavailable(e.to_string()))
    }
}

/// Reads `{ allowed, now, then six numbers per limit }`.
fn parse_reply(reply: &[Value], limits: usize) -> Result<Verdict, LimiterError> {
    let number = |i: usize| -> Result<u64, LimiterError> {
        match reply.get(i) {
            Some(Value::Int(n)) if *n >= 0 => Ok(*n as u64),
            other => Err(LimiterError::Protocol(format!(
                "reply item {i} is {other:?}, expected a number"
            ))),
        }
    };
    if reply.len() != 2 + 6 * limits {
        return Err(LimiterError::Protocol(format!(
            "reply has {} items, expected {}",
            reply.len(),
            2 + 6 * limits
        )));
    }
    let now_us = number(1)?;
    let mut decisions = Vec::with_capacity(limits);
    for i in 0..limits {
        let at = 2 + 6 * i;
        decisions.push(Decision {
            allowed: number(at)? == 1,
            limit: number(at + 1)?,
            remaining: number(at + 2)?,
            reset_after_us: number(at + 3)?,
            retry_after_us: number(at + 4)?,
            delay_us: number(at + 5)?,
        });
    }
    let verdict = Verdict::from_decisions(now_us, &decisions)
        .ok_or_else(|| LimiterError::Protocol("empty reply".to_string()))?;
    if verdict.allowed != (number(0)? == 1) {
        return Err(LimiterError::Protocol(
            "the script's verdict disagrees with its decisions".to_string(),
        ));
    }
    Ok(verdict)
}
