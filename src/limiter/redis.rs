//! The Redis store: one script call per decision (`FCALL` of a function library on Redis 7,
//! `EVALSHA` before), covering all the limits asked about a request, with time from Redis `TIME`,
//! so any number of floodgate instances share one budget exactly; under load, many decisions per
//! call (`redis/batch.rs`).
//!
//! The script is `lua/prelude.lua`, one file per algorithm, `lua/clock_redis.lua`,
//! `lua/decide.lua` and an entry point (`lua/main.lua`, or `lua/batch.lua` for a batch), joined
//! at compile time. [`redis::Script`] computes its SHA1 once, sends
//! `EVALSHA`, and on `NOSCRIPT` (a Redis restart, `SCRIPT FLUSH`, a failover) loads the script and
//! retries, transparently. The differential tests use the same files with `lua/clock_test.lua`
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
//! background) shared by every request, so concurrent `EVALSHA`s are pipelined on one socket;
//! see the README for the measurement against deadpool-redis. For `redis_cluster`, redis-rs's
//! cluster connection, which follows `MOVED`/`ASK`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};
use sha2::{Digest, Sha256};

use super::wire::{self, Reply};

mod batch;

use super::guard::RemoteStore;
use super::{AlgorithmKind, Ask, Decision, LeaseId, LimiterError, Verdict};

/// Everything before `main.lua`: helpers, the algorithms and a clock.
macro_rules! limiter_library {
    ($clock:literal) => {
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!("lua/gcra.lua"),
            include_str!("lua/leaky_bucket.lua"),
            include_str!("lua/fixed_window.lua"),
            include_str!("lua/sliding_window_log.lua"),
            include_str!("lua/sliding_window_counter.lua"),
            include_str!("lua/concurrency.lua"),
            include_str!($clock),
            include_str!("lua/decide.lua"),
        )
    };
}

const LIBRARY: &str = limiter_library!("lua/clock_redis.lua");
const TEST_LIBRARY: &str = limiter_library!("lua/clock_test.lua");
const MAIN: &str = include_str!("lua/main.lua");
const BATCH: &str = include_str!("lua/batch.lua");

/// The limiter script, assembled from one file per algorithm, on Redis' clock.
pub const SCRIPT_SOURCE: &str = concat!(
    limiter_library!("lua/clock_redis.lua"),
    include_str!("lua/main.lua")
);
/// The same script on a clock the caller passes as `ARGV[1]`: for the differential tests only.
const TEST_SCRIPT_SOURCE: &str = concat!(
    limiter_library!("lua/clock_test.lua"),
    include_str!("lua/main.lua")
);
/// The batch script (many decisions per call) for `EVALSHA`, before Redis 7.
const BATCH_SCRIPT_SOURCE: &str = concat!(
    limiter_library!("lua/clock_redis.lua"),
    include_str!("lua/batch.lua")
);

/// The same Lua as a Redis 7 function library: the helpers and algorithms are built once when
/// the library loads, and each `FCALL` runs only `main.lua`, where an `EVALSHA` rebuilds every
/// table and closure of the script on each call. Its name carries a hash of its text, so two
/// floodgate versions sharing one Redis (a rolling upgrade) each call their own.
struct FunctionLibrary {
    /// `FUNCTION LOAD REPLACE` text.
    code: String,
    /// The decision function's name.
    decide: String,
    /// The batch function's name (`batch.lua`).
    batch: String,
}

impl FunctionLibrary {
    fn new(body: &str) -> Self {
        let hash: String = Sha256::digest(format!("{body}{MAIN}{BATCH}").as_bytes())[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let decide = format!("floodgate_decide_{hash}");
        let batch = format!("floodgate_batch_{hash}");
        let code = format!(
            "#!lua name=floodgate_{hash}\n{body}\nlocal function decide(KEYS, ARGV)\n{MAIN}\nend\n\
             local function batch(KEYS, ARGV)\n{BATCH}\nend\n\
             redis.register_function('{decide}', decide)\n\
             redis.register_function('{batch}', batch)\n"
        );
        FunctionLibrary {
            code,
            decide,
            batch,
        }
    }
}

/// Whether the server has the function library: not known yet, loaded, or not supported (Redis
/// before 7), when `EVALSHA` is used for good.
const FUNCTIONS_UNKNOWN: u8 = 0;
const FUNCTIONS_LOADED: u8 = 1;
const FUNCTIONS_UNSUPPORTED: u8 = 2;

/// One command on either kind of connection.
async fn query<T: redis::FromRedisValue>(
    connection: &Connection,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    match connection.clone() {
        Connection::Single(mut c) => cmd.query_async(&mut c).await,
        Connection::Cluster(mut c) => cmd.query_async(&mut c).await,
    }
}

fn is_unknown_command(e: &redis::RedisError) -> bool {
    e.to_string()
        .to_ascii_lowercase()
        .contains("unknown command")
}

/// A Redis error as the guard should see it: an error reply about this request's keys (a type
/// error, a script error) is [`LimiterError::Refused`], which leaves the breaker alone; anything
/// about the connection or the server's state is [`LimiterError::Unavailable`].
fn classify(e: redis::RedisError) -> LimiterError {
    let about_the_keys = e.code() == Some("WRONGTYPE")
        || (e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
            && e.detail().is_some_and(|d| d.contains("script")));
    if about_the_keys {
        LimiterError::Refused(e.to_string())
    } else {
        LimiterError::Unavailable(e.to_string())
    }
}

/// Gives back one request's concurrency leases.
const RELEASE_SOURCE: &str = include_str!("lua/release.lua");

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single(String),
    Cluster(Vec<String>),
    /// The master that these sentinels name `master_name`, followed through failovers.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
    },
}

/// A connection to Redis or Redis Cluster.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The one-connection settings: the decision budget bounds a connection attempt and a reply.
fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
        .set_response_timeout(Some(timeout.max(Duration::from_millis(250))))
        .set_max_delay(Duration::from_secs(2))
        .set_number_of_retries(1)
}

/// Finds the master through Sentinel, and again after a failed decision (at most once a
/// second): after a failover the old address is dead, or back as a replica that refuses writes
/// with READONLY, and either failure sends floodgate to ask the sentinels anew. Sentinel's
/// answer is checked with `ROLE` by redis-rs, so a replica is never taken for the master.
struct MasterFollower {
    client: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
    timeout: Duration,
    /// When the sentinels were last asked.
    asked: std::sync::Mutex<Option<std::time::Instant>>,
    /// True while a lookup is retrying: at most one at a time.
    running: std::sync::atomic::AtomicBool,
}

impl MasterFollower {
    /// Asks the sentinels for the master (retrying with backoff until one answers) and swaps
    /// in a connection to it.
    fn ask(self: Arc<Self>, slot: Arc<ArcSwapOption<Connection>>) {
        if self.running.swap(true, Ordering::AcqRel) {
            return; // a lookup is already retrying
        }
        if let Ok(mut asked) = self.asked.lock() {
            *asked = Some(std::time::Instant::now());
        }
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                let found = self.client.lock().await.async_get_client().await;
                let manager = found.and_then(|client| {
                    ConnectionManager::new_lazy_with_config(client, manager_config(self.timeout))
                });
                match manager {
                    Ok(manager) => {
                        slot.store(Some(Arc::new(Connection::Single(manager))));
                        tracing::info!("connected to the master Sentinel names");
                        self.running.store(false, Ordering::Release);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "no master from Sentinel yet; asking again");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }

    /// A decision failed: ask again, unless the sentinels were asked less than a second ago.
    fn after_failure(self: &Arc<Self>, slot: &Arc<ArcSwapOption<Connection>>) {
        let recent = self
            .asked
            .lock()
            .map(|asked| asked.is_some_and(|at| at.elapsed() < Duration::from_secs(1)))
            .unwrap_or(true);
        if !recent {
            self.clone().ask(slot.clone());
        }
    }
}

/// The two scripts' entry points.
#[derive(Clone, Copy)]
enum Entry {
    Decide,
    Batch,
}

/// What sends the scripts: the function library (or, before Redis 7, the scripts for `EVALSHA`),
/// shared by the store and its batch driver.
struct Caller {
    library: FunctionLibrary,
    /// `FUNCTIONS_*`: whether to `FCALL` or `EVALSHA`.
    functions: std::sync::atomic::AtomicU8,
    script: Script,
    batch_script: Script,
    /// Round trips (`floodgate_store_calls_total`), once the guard hands its counter over.
    calls: std::sync::OnceLock<prometheus_client::metrics::counter::Counter>,
}

impl Caller {
    /// `FUNCTION LOAD REPLACE`s the library; a server without functions (before Redis 7) sends
    /// this store to `EVALSHA` for good.
    async fn load_library(&self, connection: &Connection) -> redis::RedisResult<()> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&self.library.code);
        match query::<String>(connection, &load).await {
            Ok(_) => {
                self.functions.store(FUNCTIONS_LOADED, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if is_unknown_command(&e) => {
                tracing::info!("Redis has no functions (before 7): using EVALSHA");
                self.functions
                    .store(FUNCTIONS_UNSUPPORTED, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// One decision's script call: `FCALL` of the function library when the server has it (it
    /// is loaded on first use, and again after `FUNCTION FLUSH` or a failover to a server
    /// without it), else `EVALSHA` (Redis 6).
    async fn call(
        &self,
        connection: &Connection,
        keys: &[String],
        args: &[Vec<u8>],
    ) -> redis::RedisResult<Vec<Value>> {
        self.call_entry(connection, Entry::Decide, keys, args).await
    }

    /// [`Caller::call`] of either entry point: one decision (`main.lua`) or a batch (`batch.lua`).
    async fn call_entry(
        &self,
        connection: &Connection,
        entry: Entry,
        keys: &[String],
        args: &[Vec<u8>],
    ) -> redis::RedisResult<Vec<Value>> {
        if let Some(calls) = self.calls.get() {
            calls.inc();
        }
        let (function, script) = match entry {
            Entry::Decide => (&self.library.decide, &self.script),
            Entry::Batch => (&self.library.batch, &self.batch_script),
        };
        if self.functions.load(Ordering::Relaxed) != FUNCTIONS_UNSUPPORTED {
            let fcall = || {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(function).arg(keys.len()).arg(keys).arg(args);
                cmd
            };
            match query(connection, &fcall()).await {
                Err(e) if e.to_string().contains("Function not found") => {
                    self.load_library(connection).await?;
                    if self.functions.load(Ordering::Relaxed) == FUNCTIONS_LOADED {
                        return query(connection, &fcall()).await;
                    }
                }
                Err(e) if is_unknown_command(&e) => {
                    tracing::info!("Redis has no FCALL (before 7): using EVALSHA");
                    self.functions
                        .store(FUNCTIONS_UNSUPPORTED, Ordering::Relaxed);
                }
                other => return other,
            }
        }
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for a in args {
            invocation.arg(a.as_slice());
        }
        match connection.clone() {
            Connection::Single(mut c) => invocation.invoke_async(&mut c).await,
            Connection::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        }
    }
}

/// The Redis-backed limiter store.
pub struct RedisStore {
    connection: Arc<ArcSwapOption<Connection>>,
    caller: Arc<Caller>,
    /// Where decisions wait to leave in a batch, when batching is on ([`RedisStore::batched`]).
    batcher: Option<tokio::sync::mpsc::UnboundedSender<crate::limiter::batch::Pending<batch::Job>>>,
    /// For Redis behind Sentinel: how to find the master again.
    sentinel: Option<Arc<MasterFollower>>,
    release: Script,
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

    /// A store whose script reads the time from the caller ([`RedisStore::decide_at_for_test`])
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
                    .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
                let manager =
                    ConnectionManager::new_lazy_with_config(client, manager_config(timeout))
                        .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
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
                .map_err(|e| LimiterError::Unavailable(e.to_string()))?;
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
            batcher: None,
            sentinel,
            release: Script::new(RELEASE_SOURCE),
            test_clock,
            prefix: prefix.to_string(),
        })
    }

    /// This store with batched decisions (`storage.batch`, see `redis/batch.rs`): decisions waiting
    /// while one call is in flight leave together in the next (on Redis Cluster, one call per
    /// hash tag).
    pub fn batched(mut self) -> Self {
        if !self.test_clock {
            self.batcher = Some(batch::start(self.connection.clone(), self.caller.clone()));
        }
        self
    }

    /// Decides one request against all `asks` in one round trip, all-or-nothing, by Redis time;
    /// its concurrency leases (if any) are named `lease`.
    pub async fn decide(&self, asks: &[Ask<'_>], lease: LeaseId) -> Result<Verdict, LimiterError> {
        self.run(asks, None, lease).await
    }

    /// [`RedisStore::decide`] at `now_us` instead of Redis time, on a store made by
    /// [`RedisStore::connect_for_test`].
    pub async fn decide_at_for_test(
        &self,
        asks: &[Ask<'_>],
        now_us: u64,
        lease: LeaseId,
    ) -> Result<Verdict, LimiterError> {
        if !self.test_clock {
            return Err(LimiterError::Protocol(
                "this store's script reads Redis TIME; use RedisStore::connect_for_test".into(),
            ));
        }
        self.run(asks, Some(now_us), lease).await
    }

    /// Gives back the concurrency leases named `lease` in `asks`' budgets, in one round trip.
    pub async fn release(&self, asks: &[Ask<'_>], lease: LeaseId) -> Result<(), LimiterError> {
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
        let guard = self.connection.load_full();
        let Some(connection) = guard.as_deref() else {
            return Err(LimiterError::Unavailable(
                "not connected to Redis yet".to_string(),
            ));
        };
        let result: redis::RedisResult<i64> = match connection.clone() {
            Connection::Single(mut c) => invocation.invoke_async(&mut c).await,
            Connection::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        };
        result
            .map(|_| ())
            .map_err(|e| LimiterError::Unavailable(e.to_string()))
    }

    /// What `asks` would decide now, per limit, spending nothing: for `/budgets`.
    pub async fn peek(&self, asks: &[Ask<'_>]) -> Result<Vec<Decision>, LimiterError> {
        Ok(self.invoke(asks, None, None, &[]).await?.decisions)
    }

    async fn run(
        &self,
        asks: &[Ask<'_>],
        now: Option<u64>,
        lease: LeaseId,
    ) -> Result<Verdict, LimiterError> {
        Ok(self.invoke(asks, now, Some(lease), &[]).await?.verdict)
    }

    /// One script call; `lease: None` peeks. `wants`: per ask, the requests' worth of units to
    /// lease beyond this request (see `lease.rs`); may be empty.
    async fn invoke(
        &self,
        asks: &[Ask<'_>],
        now: Option<u64>,
        lease: Option<LeaseId>,
        wants: &[super::lease::LeaseAsk],
    ) -> Result<Reply, LimiterError> {
        if asks.is_empty() {
            return Err(LimiterError::Protocol("nothing to decide".into()));
        }
        let keys: Vec<String> = asks.iter().map(|ask| self.key_name(ask)).collect();
        let number = |n: u64| n.to_string().into_bytes();
        if let (Some(batcher), None, Some(lease)) = (&self.batcher, now, lease) {
            // ARGV as batch.lua reads one decision's: the lease token, the number of limits,
            // then eight per limit.
            let mut args: Vec<Vec<u8>> = Vec::with_capacity(2 + 8 * asks.len());
            args.push(number(lease));
            args.push(number(asks.len() as u64));
            push_limits(&mut args, asks, wants);
            let job = batch::Job {
                keys,
                args,
                limits: asks.len(),
            };
            return crate::limiter::batch::decide(batcher, job).await;
        }
        // ARGV as main.lua reads it: the clock, the lease token, then eight per limit.
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(2 + 8 * asks.len());
        args.push(now.map_or_else(|| b"-".to_vec(), number));
        args.push(lease.map_or_else(|| b"-".to_vec(), number));
        push_limits(&mut args, asks, wants);
        let guard = self.connection.load_full();
        let Some(connection) = guard.as_deref() else {
            return Err(LimiterError::Unavailable(
                "not connected to Redis yet".to_string(),
            ));
        };
        let reply = self
            .caller
            .call(connection, &keys, &args)
            .await
            .map_err(classify)?;
        read_reply(&reply, asks.len())
    }

    /// Connects and loads the function library ahead of the first decision, which would
    /// otherwise pay for both within its `storage.timeout`; before Redis 7, loads the script
    /// (`SCRIPT LOAD`) for the `EVALSHA`s instead. A cluster or Sentinel connection is made in
    /// the background: this waits for it (the caller bounds the wait). On a cluster the script
    /// reaches one node; the first `EVALSHA` on each other node loads it there.
    pub async fn prepare(&self) -> Result<(), LimiterError> {
        let connection = loop {
            if let Some(connection) = self.connection.load_full() {
                break connection;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let unavailable = |e: redis::RedisError| LimiterError::Unavailable(e.to_string());
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
    }

    /// The Redis key of one ask.
    pub fn key_name(&self, ask: &Ask<'_>) -> String {
        wire::key_name(&self.prefix, ask)
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

impl RemoteStore for RedisStore {
    async fn decide(&self, asks: &[Ask<'_>], lease: LeaseId) -> Result<Reply, LimiterError> {
        self.invoke(asks, None, Some(lease), &[]).await
    }

    async fn decide_leasing(
        &self,
        asks: &[Ask<'_>],
        lease: LeaseId,
        wants: &[super::lease::LeaseAsk],
    ) -> Result<Reply, LimiterError> {
        self.invoke(asks, None, Some(lease), wants).await
    }

    async fn release(&self, asks: &[Ask<'_>], lease: LeaseId) -> Result<(), LimiterError> {
        RedisStore::release(self, asks, lease).await
    }

    async fn peek(&self, asks: &[Ask<'_>]) -> Result<Vec<Decision>, LimiterError> {
        RedisStore::peek(self, asks).await
    }

    fn after_failure(&self) {
        if let Some(sentinel) = &self.sentinel {
            sentinel.after_failure(&self.connection);
        }
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        RedisStore::ping(self).await
    }

    async fn prepare(&self) -> Result<(), LimiterError> {
        RedisStore::prepare(self).await
    }

    fn count_calls(&self, counter: prometheus_client::metrics::counter::Counter) -> bool {
        let _ = self.caller.calls.set(counter);
        true
    }
}

/// Appends each limit's eight arguments (algorithm name, parameter a, parameter b, cost, and
/// from `wants`, 0s when it is shorter: the requests' worth to lease beyond this request, those
/// of an ended lease given back with the store time it was granted at, and how long a lease
/// lasts), as `decide.lua` reads them.
fn push_limits(args: &mut Vec<Vec<u8>>, asks: &[Ask<'_>], wants: &[super::lease::LeaseAsk]) {
    let number = |n: u64| n.to_string().into_bytes();
    for (i, ask) in asks.iter().enumerate() {
        let (a, b) = ask.limit.algorithm().parameters();
        let lease = wants.get(i).copied().unwrap_or_default();
        args.push(ask.limit.algorithm().name().as_bytes().to_vec());
        args.push(number(a));
        args.push(number(b));
        args.push(number(u64::from(ask.limit.cost())));
        args.push(number(u64::from(lease.want)));
        args.push(number(lease.back));
        args.push(number(lease.back_at));
        args.push(number(lease.lease_us));
    }
}

/// Reads the script's reply (the layout of [`wire::Reply`], then one leased count per limit) for
/// a request of `limits` limits.
fn read_reply(reply: &[Value], limits: usize) -> Result<Reply, LimiterError> {
    let number = |at: usize| match &reply[at] {
        Value::Int(n) if *n >= 0 => Ok(*n as u64),
        other => Err(LimiterError::Protocol(format!(
            "reply item {at} is {other:?}, expected a number"
        ))),
    };
    Reply::read_with_leases(reply.len(), limits, number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_with_a_value_that_is_not_a_number_is_a_protocol_error() {
        let mut reply: Vec<Value> = [1, 7, 1, 10, 9, 100, 0, 0, 3].map(Value::Int).to_vec();
        assert!(read_reply(&reply, 1).is_ok());
        reply[4] = Value::Nil;
        assert!(matches!(
            read_reply(&reply, 1),
            Err(LimiterError::Protocol(_))
        ));
    }
}
