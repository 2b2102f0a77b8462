//! The Redis store: one script call per decision (`FCALL` of a function library on Redis 7,
//! `EVALSHA` before), covering all the limits asked about a request, with time from Redis `TIME`,
//! so any number of floodgate instances share one budget exactly; under load, many decisions per
//! call (`redis/batch.rs`).
//!
//! The script (`redis/script.rs`) is `lua/prelude.lua`, one file per algorithm,
//! `lua/clock_redis.lua`, `lua/decide.lua` and an entry point (`lua/main.lua`, or `lua/batch.lua`
//! for a batch), joined at compile time and loaded as a function library; before Redis 7,
//! [`redis::Script`] sends `EVALSHA` and on `NOSCRIPT` (a restart, `SCRIPT FLUSH`, a failover)
//! loads the script and retries, transparently. Where Redis is, and how it is followed through
//! failovers, is `redis/connection.rs`. The differential tests use the same files with `lua/clock_test.lua`
//! in place of the Redis clock ([`RedisStore::connect_for_test`]); the production script cannot
//! read an injected time.
//!
//! Keys: `{prefix}{budget}:{kind}:{{hash}}:{algorithm}`, one per limit asked. The client value
//! is hashed (SHA-256 of kind and value), so no raw API key ever reaches Redis, and the hash is
//! the Redis Cluster hash tag: the keys of one decision share a slot whenever they are spent by
//! the same client value, which the config guarantees on `redis_cluster` (a route there may not
//! mix `per:` scopes). Every key gets a TTL equal to the time until its budget is full again.
//!
//! Connections: one multiplexed connection ([`ConnectionManager`], which reconnects in the
//! background) shared by every request, so concurrent calls are pipelined on one socket;
//! see the README for the measurement against deadpool-redis. For `redis_cluster`, redis-rs's
//! cluster connection, which follows `MOVED`/`ASK`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::Script;
use redis::aio::ConnectionManager;

use super::wire::{self, Reply};

mod batch;
mod cache;
mod connection;
mod room;
mod script;
mod slices;

pub use connection::RedisTarget;
use connection::{Connection, MasterFollower, manager_config};
pub use script::SCRIPT_SOURCE;
use script::{
    BATCH_SCRIPT_SOURCE, Caller, FUNCTIONS_UNKNOWN, FUNCTIONS_UNSUPPORTED, FunctionLibrary,
    LIBRARY, RELEASE_SOURCE, RENEW_SOURCE, SETTLE_SOURCE, TEST_LIBRARY, TEST_SCRIPT_SOURCE,
    TEST_SETTLE_SOURCE, push_limits, read_reply,
};
pub use slices::{RedisGlobal, RedisSlices};

use super::store::{
    CacheScope, CacheVariant, CacheWrite, ControlChange, ControlList, RoomBounds, RoomEntered,
    Shared, Store, StoreCall,
};
use super::wire::Call;
use super::{AlgorithmKind, Ask, LeaseId, LimiterError};

/// A Redis error as the guard should see it: an error reply about this request's keys (a type
/// error, a script error) is [`LimiterError::Refused`], which leaves the breaker alone; anything
/// about the connection or the server's state is [`LimiterError::Unavailable`].
fn classify(e: redis::RedisError) -> LimiterError {
    if connection::ErrorReply::of(&e) == connection::ErrorReply::AboutTheKeys {
        LimiterError::Refused(crate::limiter::Cause::from_error(e))
    } else {
        LimiterError::Unavailable(crate::limiter::Cause::from_error(e))
    }
}

/// The Redis-backed limiter store.
pub struct RedisStore {
    connection: Arc<ArcSwapOption<Connection>>,
    caller: Arc<Caller>,
    /// Where decisions wait to leave in a batch, while batching is on ([`RedisStore::batched`]).
    batching: crate::limiter::batch::Batching<batch::Job>,
    /// For Redis behind Sentinel: how to find the master again.
    sentinel: Option<Arc<MasterFollower>>,
    release: Script,
    renew: Script,
    settle: Script,
    /// True when `script` reads the time from `ARGV[1]` (tests only).
    test_clock: bool,
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
        Self::with_script(target, prefix, timeout, false)
    }

    /// A store whose script reads the time from the caller ([`Store::decide_leasing_at`])
    /// instead of Redis `TIME`: for the differential tests.
    pub fn connect_for_test(
        target: &RedisTarget,
        prefix: &str,
        timeout: Duration,
    ) -> Result<Self, LimiterError> {
        Self::with_script(target, prefix, timeout, true)
    }

    fn with_script(
        target: &RedisTarget,
        prefix: &str,
        timeout: Duration,
        test_clock: bool,
    ) -> Result<Self, LimiterError> {
        let connection = Arc::new(ArcSwapOption::empty());
        let mut sentinel = None;
        match target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| LimiterError::Unavailable(crate::limiter::Cause::from_error(e)))?;
                let manager =
                    ConnectionManager::new_lazy_with_config(client, manager_config(timeout))
                        .map_err(|e| {
                            LimiterError::Unavailable(crate::limiter::Cause::from_error(e))
                        })?;
                connection.store(Some(Arc::new(Connection::Single(manager))));
            }
            RedisTarget::Sentinel {
                sentinels,
                master_name,
            } => {
                let client = redis::sentinel::SentinelClient::build(
                    sentinels.clone(),
                    master_name.as_str(),
                    None,
                    redis::sentinel::SentinelServerType::Master,
                )
                .map_err(|e| LimiterError::Unavailable(crate::limiter::Cause::from_error(e)))?;
                let follower = Arc::new(MasterFollower {
                    client: tokio::sync::Mutex::new(client),
                    timeout,
                    asked: std::sync::Mutex::new(None),
                    running: std::sync::atomic::AtomicBool::new(false),
                });
                follower.clone().ask(connection.clone());
                sentinel = Some(follower);
            }
            RedisTarget::Cluster(urls) => {
                let client =
                    redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str))
                        .connection_timeout(timeout.max(Duration::from_millis(250)))
                        .response_timeout(timeout.max(Duration::from_millis(250)))
                        .build()
                        .map_err(|e| {
                            LimiterError::Unavailable(crate::limiter::Cause::from_error(e))
                        })?;
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
            caller: Arc::new(Caller {
                library: FunctionLibrary::new(if test_clock { TEST_LIBRARY } else { LIBRARY }),
                functions: std::sync::atomic::AtomicU8::new(FUNCTIONS_UNKNOWN),
                script: Script::new(if test_clock {
                    TEST_SCRIPT_SOURCE
                } else {
                    SCRIPT_SOURCE
                }),
                batch_script: Script::new(BATCH_SCRIPT_SOURCE),
                calls: std::sync::OnceLock::new(),
            }),
            batching: Default::default(),
            sentinel,
            release: Script::new(RELEASE_SOURCE),
            renew: Script::new(RENEW_SOURCE),
            settle: Script::new(if test_clock {
                TEST_SETTLE_SOURCE
            } else {
                SETTLE_SOURCE
            }),
            test_clock,
            prefix: prefix.to_string(),
        })
    }

    /// Runs a script that answers a number (the release and settle scripts), for its effect.
    async fn run_for_effect(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<(), LimiterError> {
        let guard = self.connection.load_full();
        let Some(connection) = guard.as_deref() else {
            return Err(LimiterError::unavailable("not connected to Redis yet"));
        };
        let result: redis::RedisResult<i64> = match connection.clone() {
            Connection::Single(mut c) => invocation.invoke_async(&mut c).await,
            Connection::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        };
        result
            .map(|_| ())
            .map_err(|e| LimiterError::Unavailable(crate::limiter::Cause::from_error(e)))
    }

    /// The control list's hash and its version key (one hash tag: one Cluster slot).
    fn control_keys(&self) -> (String, String) {
        // (Named `bans` since bans came first; overrides and resets are entries of it too.)
        let list = format!("{}{{control}}:bans", self.prefix);
        let version = format!("{}{{control}}:version", self.prefix);
        (list, version)
    }

    /// One plain command, on whichever connection there is.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, LimiterError> {
        let guard = self.connection.load_full();
        let Some(connection) = guard.as_deref() else {
            return Err(LimiterError::unavailable("not connected to Redis yet"));
        };
        let result: redis::RedisResult<T> = match connection.clone() {
            Connection::Single(mut c) => cmd.query_async(&mut c).await,
            Connection::Cluster(mut c) => cmd.query_async(&mut c).await,
        };
        result.map_err(|e| LimiterError::Unavailable(crate::limiter::Cause::from_error(e)))
    }

    /// The Redis key of one ask.
    pub fn key_name(&self, ask: &Ask<'_>) -> String {
        wire::key_name(&self.prefix, ask)
    }
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    /// One script call, doing what `call` says. `wants`: per ask, the requests' worth of units
    /// to lease beyond this request (see `lease.rs`); may be empty.
    fn invoke<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        call: Call,
        wants: &'a [super::lease::LeaseAsk],
        late: Option<super::batch::Late>,
    ) -> StoreCall<'a, Reply> {
        Box::pin(async move {
            let (now, lease) = (call.at(), call.lease());
            if asks.is_empty() {
                return Err(LimiterError::protocol("nothing to decide"));
            }
            let keys: Vec<String> = asks.iter().map(|ask| self.key_name(ask)).collect();
            let number = |n: u64| n.to_string().into_bytes();
            // A quota's period is worked out from floodgate's clock (a test's, when it sets one).
            let calendar_now = now.unwrap_or_else(crate::limiter::wall_clock_us);
            if let (Some(batcher), true, Some(lease)) =
                (self.batching.queue(), call.batchable(), lease)
            {
                // ARGV as batch.lua reads one decision's: the lease token, the number of limits,
                // then nine per limit.
                let mut args: Vec<Vec<u8>> = Vec::with_capacity(2 + 9 * asks.len());
                args.push(number(lease));
                args.push(number(asks.len() as u64));
                push_limits(&mut args, asks, wants, calendar_now);
                let job = batch::Job {
                    keys,
                    args,
                    limits: asks.len(),
                };
                return crate::limiter::batch::decide(batcher, job, late).await;
            }
            // ARGV as main.lua reads it: the clock, the lease token, then nine per limit.
            let mut args: Vec<Vec<u8>> = Vec::with_capacity(2 + 9 * asks.len());
            args.push(now.map_or_else(|| b"-".to_vec(), number));
            args.push(lease.map_or_else(|| b"-".to_vec(), number));
            push_limits(&mut args, asks, wants, calendar_now);
            let guard = self.connection.load_full();
            let Some(connection) = guard.as_deref() else {
                return Err(LimiterError::unavailable("not connected to Redis yet"));
            };
            let reply = self
                .caller
                .call(connection, &keys, &args)
                .await
                .map_err(classify)?;
            read_reply(&reply, asks.len())
        })
    }

    fn settle_at<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        settlements: &'a [crate::limiter::Settlement],
        now: Option<u64>,
    ) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let mut invocation = self.settle.prepare_invoke();
            invocation.arg(now.map_or_else(|| "-".to_string(), |n| n.to_string()));
            // A quota's periods are worked out from floodgate's clock (a test's, when it sets one).
            let calendar_now = now.unwrap_or_else(crate::limiter::wall_clock_us);
            let mut any = false;
            for (ask, settle) in asks.iter().zip(settlements) {
                if settle.is_even() {
                    continue;
                }
                let algorithm = ask.limit.algorithm();
                let (a, b) = algorithm.wire_at(calendar_now);
                let (_, b_at) = algorithm.wire_at(settle.at_us);
                let (refund, charge, at) = settle.bounded(a);
                invocation
                    .key(self.key_name(ask))
                    .arg(algorithm.name())
                    .arg(a)
                    .arg(b)
                    .arg(b_at)
                    .arg(refund)
                    .arg(charge)
                    .arg(at);
                any = true;
            }
            if !any {
                return Ok(());
            }
            self.run_for_effect(&invocation).await
        })
    }

    fn reads_callers_clock(&self) -> bool {
        self.test_clock
    }

    /// Turns batching on or off for the decisions that follow (the batcher starts the first
    /// time it is turned on, and stays).
    fn set_batching(&self, on: bool) {
        // A test store decides on the caller's clock, which a batch does not carry.
        self.batching.set(on && !self.test_clock, || {
            batch::start(self.connection.clone(), self.caller.clone())
        });
    }

    fn reset<'a>(&'a self, asks: &'a [Ask<'a>]) -> StoreCall<'a, ()> {
        Box::pin(async move {
            if asks.is_empty() {
                return Ok(());
            }
            // One identity's keys share its hash tag: one command, one Cluster slot.
            let mut del = redis::cmd("DEL");
            for ask in asks {
                del.arg(self.key_name(ask));
            }
            let _: i64 = self.query(&del).await?;
            Ok(())
        })
    }

    /// Gives back the concurrency leases named `lease` in `asks`' budgets, in one round trip.
    fn release<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let mut invocation = self.release.prepare_invoke();
            invocation.arg(lease);
            let mut any = false;
            for ask in asks {
                if ask.limit.algorithm().kind() == AlgorithmKind::Concurrency {
                    invocation.key(self.key_name(ask)).arg(ask.limit.cost());
                    any = true;
                }
            }
            if !any {
                return Ok(());
            }
            self.run_for_effect(&invocation).await
        })
    }

    /// Extends the concurrency leases named `lease` in `asks`' budgets, in one round trip.
    fn renew<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let mut invocation = self.renew.prepare_invoke();
            invocation.arg(lease);
            let mut any = false;
            for ask in asks {
                if ask.limit.algorithm().kind() == AlgorithmKind::Concurrency {
                    invocation
                        .key(self.key_name(ask))
                        .arg(ask.limit.cost())
                        .arg(ask.limit.algorithm().span_us());
                    any = true;
                }
            }
            if !any {
                return Ok(());
            }
            self.run_for_effect(&invocation).await
        })
    }

    fn after_failure(&self) {
        if let Some(sentinel) = &self.sentinel {
            sentinel.after_failure(&self.connection);
        }
    }

    /// Asks Redis whether it answers: `/readyz`.
    fn ping(&self) -> StoreCall<'_, ()> {
        Box::pin(async move {
            let guard = self.connection.load_full();
            let Some(connection) = guard.as_deref() else {
                return Err(LimiterError::unavailable("not connected to Redis yet"));
            };
            let mut cmd = redis::cmd("PING");
            let result: redis::RedisResult<String> = match connection.clone() {
                Connection::Single(mut c) => cmd.query_async(&mut c).await,
                Connection::Cluster(mut c) => cmd.arg("floodgate").query_async(&mut c).await,
            };
            result
                .map(|_| ())
                .map_err(|e| LimiterError::Unavailable(crate::limiter::Cause::from_error(e)))
        })
    }

    /// Connects and loads the function library ahead of the first decision, which would
    /// otherwise pay for both within its `storage.timeout`; before Redis 7, loads the script
    /// (`SCRIPT LOAD`) for the `EVALSHA`s instead. A cluster or Sentinel connection is made in
    /// the background: this waits for it (the caller bounds the wait). On a cluster the script
    /// reaches one node; the first `EVALSHA` on each other node loads it there.
    fn prepare(&self) -> StoreCall<'_, ()> {
        Box::pin(async move {
            let connection = loop {
                if let Some(connection) = self.connection.load_full() {
                    break connection;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let unavailable = |e: redis::RedisError| {
                LimiterError::Unavailable(crate::limiter::Cause::from_error(e))
            };
            let caller = &self.caller;
            caller
                .load_library(&connection)
                .await
                .map_err(unavailable)?;
            if caller.functions.load(Ordering::Relaxed) == FUNCTIONS_UNSUPPORTED {
                for script in [&caller.script, &caller.batch_script] {
                    match connection.as_ref().clone() {
                        Connection::Single(mut c) => script.load_async(&mut c).await,
                        Connection::Cluster(mut c) => script.load_async(&mut c).await,
                    }
                    .map_err(unavailable)?;
                }
            }
            Ok(())
        })
    }

    fn count_calls(&self, counter: prometheus_client::metrics::counter::Counter) -> bool {
        let _ = self.caller.calls.set(counter);
        true
    }

    fn shared(&self) -> Option<&dyn Shared> {
        Some(self)
    }
}

/// The control list and claims, kept in Redis for every instance that shares it.
impl Shared for RedisStore {
    fn control_read(&self, known: Option<String>) -> StoreCall<'_, Option<ControlList>> {
        Box::pin(async move {
            let (list, version) = self.control_keys();
            let version: Option<String> = self.query(redis::cmd("GET").arg(&version)).await?;
            let hvals = redis::cmd("HVALS").arg(&list).clone();
            let entries = self.query::<Vec<String>>(&hvals);
            ControlList::read(version.unwrap_or_default(), known, entries).await
        })
    }

    fn control_write<'a>(&'a self, changes: &'a [ControlChange<'a>]) -> StoreCall<'a, ()> {
        Box::pin(async move {
            // One script: the changes and the version's bump are applied together or not at all
            // (a reader that sees the new version sees every change; none is seen without it).
            const WRITE: &str = "for i = 1, #ARGV, 3 do \
                 if ARGV[i + 1] == '1' then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2]) \
                 else redis.call('HDEL', KEYS[1], ARGV[i]) end \
               end \
               return redis.call('INCR', KEYS[2])";
            let (list, version) = self.control_keys();
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(WRITE).arg(2).arg(&list).arg(&version);
            for (id, entry) in changes {
                cmd.arg(*id)
                    .arg(if entry.is_some() { "1" } else { "0" })
                    .arg(entry.unwrap_or(""));
            }
            let _: i64 = self.query(&cmd).await?;
            Ok(())
        })
    }

    fn claim<'a>(&'a self, key: &'a str, ttl_us: u64) -> StoreCall<'a, bool> {
        Box::pin(async move {
            let name = format!("{}{{control}}:claim:{key}", self.prefix);
            let ttl_ms = ttl_us.div_ceil(1000).max(1);
            let set: Option<String> = self
                .query(
                    redis::cmd("SET")
                        .arg(&name)
                        .arg(1)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms),
                )
                .await?;
            Ok(set.is_some())
        })
    }

    fn unclaim<'a>(&'a self, key: &'a str) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let name = format!("{}{{control}}:claim:{key}", self.prefix);
            let _: i64 = self.query(redis::cmd("DEL").arg(&name)).await?;
            Ok(())
        })
    }

    fn blob_read<'a>(&'a self, key: &'a str) -> StoreCall<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            let name = format!("{}{{control}}:blob:{key}", self.prefix);
            self.query(redis::cmd("GET").arg(&name)).await
        })
    }

    fn blob_write<'a>(&'a self, key: &'a str, bytes: &'a [u8]) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let name = format!("{}{{control}}:blob:{key}", self.prefix);
            let _: () = self.query(redis::cmd("SET").arg(&name).arg(bytes)).await?;
            Ok(())
        })
    }

    fn blob_remove<'a>(&'a self, key: &'a str) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let name = format!("{}{{control}}:blob:{key}", self.prefix);
            let _: i64 = self.query(redis::cmd("DEL").arg(&name)).await?;
            Ok(())
        })
    }

    fn cache_read<'a>(&'a self, route: &'a str, key: &'a str) -> StoreCall<'a, Vec<CacheVariant>> {
        Box::pin(self.read_cached(route, key))
    }

    fn cache_write<'a>(&'a self, write: CacheWrite<'a>) -> StoreCall<'a, ()> {
        Box::pin(self.write_cached(write))
    }

    fn cache_remove<'a>(&'a self, route: &'a str, scope: CacheScope<'a>) -> StoreCall<'a, ()> {
        Box::pin(self.remove_cached(route, scope))
    }

    fn room_enter<'a>(
        &'a self,
        room: &'a str,
        client: &'a str,
        bounds: RoomBounds,
    ) -> StoreCall<'a, RoomEntered> {
        Box::pin(self.enter_room(room, client, bounds))
    }
}
