//! The PostgreSQL store: one SQL function call per decision (or per batch of decisions, see
//! `postgres/batch.rs`), covering all the limits asked about a request, in one transaction, with time from the database's clock, so any number of floodgate
//! instances share one budget exactly (seed 003's design, with row locks instead of SERIALIZABLE
//! retries).
//!
//! The SQL is in `sql/`: `schema.sql` (the table), one file per algorithm mirroring the Rust
//! functions of `algorithm.rs` and the Lua of `lua/`, `decide.sql` (the all-or-nothing decision,
//! locking its rows in key order), `batch.sql` (many decisions in one call), `release.sql` and
//! `sweep.sql`. At start floodgate installs
//! them (see `install`): under an advisory lock, the table when the `floodgate_schema` version
//! row says it is missing or older, and the functions with `CREATE OR REPLACE`. The functions'
//! names end in a hash of their text, so two floodgate versions sharing a database (a rolling
//! upgrade) each call their own; they are installed again if they disappear (a restored or
//! recreated database).
//!
//! Rows are the budgets, named as in Redis ([`wire::key_name`]). Rows expired for more than
//! `SWEEP_GRACE` (5 s) are deleted in the background, a batch of keys at a time, walking the
//! primary key (see `sweep.sql`).
//!
//! TLS: with `sslmode=require`, `verify-full` or `verify-ca` in the URL, connections are TLS
//! (rustls), verified against the system's roots or `sslrootcert`, with a client certificate from
//! `sslcert` and `sslkey` if given; otherwise they are plain text. See [`url`].
//!
//! Connections: a [`deadpool_postgres`] pool of tokio-postgres connections, recycled without a
//! query (`RecyclingMethod::Fast`: a checkout costs no round trip, unlike deadpool-redis' PING),
//! each decision one prepared statement on one connection. Each session runs with
//! `synchronous_commit = off`: a commit does not wait for its WAL to reach the disk, so a crash
//! of the database can forget the last fraction of a second of decisions (budgets a little
//! fuller than they were), which is the right trade for rate-limit state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use sha2::{Digest, Sha256};
use tokio_postgres::NoTls;
use tokio_postgres::types::{FromSqlOwned, ToSql};
use tokio_postgres_rustls::MakeRustlsConnect;

use tokio::sync::mpsc;

use super::batch::Pending;
use super::guard::RemoteStore;
use super::wire::{self, Reply};
use super::{AlgorithmKind, Ask, Decision, LeaseId, LimiterError, Verdict};

mod batch;
pub mod url;

/// The table layout's version (`schema.sql`), recorded in `floodgate_schema`. Raise it with a
/// migration when the table changes; the functions need no version (their names carry a hash).
pub const SCHEMA_VERSION: i32 = 1;

const SCHEMA: &str = include_str!("sql/schema.sql");

/// The functions, in the order they must be created (the decision calls the algorithms).
const FUNCTIONS: [&str; 9] = [
    include_str!("sql/gcra.sql"),
    include_str!("sql/fixed_window.sql"),
    include_str!("sql/sliding_window_log.sql"),
    include_str!("sql/sliding_window_counter.sql"),
    include_str!("sql/concurrency.sql"),
    include_str!("sql/decide.sql"),
    include_str!("sql/batch.sql"),
    include_str!("sql/release.sql"),
    include_str!("sql/sweep.sql"),
];

/// The token the SQL files end their function names with, replaced by the hash.
const NAME_SUFFIX: &str = "__V";

/// Serialises installers across floodgate instances (`pg_advisory_xact_lock`): "floodgat".
const INSTALL_LOCK: i64 = 0x666c_6f6f_6467_6174;

/// Budgets the sweeper looks at per batch, and the pause between batches and between passes.
const SWEEP_BATCH: i32 = 1000;
const SWEEP_PAUSE: Duration = Duration::from_millis(100);
const SWEEP_PASS_PAUSE: Duration = Duration::from_secs(1);
/// How long past its expiry a budget is kept (see `sweep.sql`): one used more often than this
/// stays a row that is updated, not deleted and inserted again.
const SWEEP_GRACE: Duration = Duration::from_secs(5);

/// One decision's lease arguments as `decide.sql` takes them, one element per limit (0s where
/// `wants` is shorter).
#[derive(Debug, Default)]
pub(crate) struct Leasing {
    pub wants: Vec<i64>,
    pub backs: Vec<i64>,
    pub back_ats: Vec<i64>,
    pub lease_us: Vec<i64>,
}

impl Leasing {
    fn of(wants: &[super::lease::LeaseAsk], limits: usize) -> Leasing {
        let mut out = Leasing::default();
        if wants.is_empty() {
            // NULL-free but all zeros: nothing leased, nothing given back.
            return out;
        }
        for i in 0..limits {
            let w = wants.get(i).copied().unwrap_or_default();
            // Every figure is a count or a time in µs, far below 2^63.
            out.wants.push(i64::from(w.want));
            out.backs.push(w.back as i64);
            out.back_ats.push(w.back_at as i64);
            out.lease_us.push(w.lease_us as i64);
        }
        out
    }
}

/// The SQL floodgate sends, with the functions' hashed names filled in.
struct Sql {
    /// Every `CREATE OR REPLACE FUNCTION`.
    functions: String,
    decide: String,
    decide_at: String,
    decide_batch: String,
    release: String,
    sweep: String,
}

impl Sql {
    fn new() -> Sql {
        let text = FUNCTIONS.concat();
        let hash: String = Sha256::digest(text.as_bytes())[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let suffix = format!("_{hash}");
        let name = |f: &str| format!("floodgate_{f}{suffix}");
        Sql {
            functions: text.replace(NAME_SUFFIX, &suffix),
            decide: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                name("decide")
            ),
            decide_at: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                name("decide_at")
            ),
            decide_batch: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                name("decide_batch")
            ),
            release: format!("SELECT {}($1, $2)", name("release")),
            sweep: format!(
                "SELECT last_key, deleted FROM {}($1, $2, $3)",
                name("sweep")
            ),
        }
    }
}

/// Installs the schema on `client`, idempotently: the table if `floodgate_schema` records an
/// older version (or none), and every function. One transaction, under an advisory lock, so
/// instances starting together do not race.
async fn install(client: &mut deadpool_postgres::Object, sql: &Sql) -> Result<(), LimiterError> {
    let tx = client.transaction().await.map_err(unavailable)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&INSTALL_LOCK])
        .await
        .map_err(unavailable)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS floodgate_schema (
           version integer PRIMARY KEY,
           installed_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(unavailable)?;
    let installed: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM floodgate_schema",
            &[],
        )
        .await
        .map_err(unavailable)?
        .get(0);
    if installed < SCHEMA_VERSION {
        tx.batch_execute(SCHEMA).await.map_err(unavailable)?;
        tx.execute(
            "INSERT INTO floodgate_schema (version) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(unavailable)?;
        tracing::info!(
            version = SCHEMA_VERSION,
            "installed floodgate's PostgreSQL schema"
        );
    } else if installed > SCHEMA_VERSION {
        tracing::warn!(
            installed,
            ours = SCHEMA_VERSION,
            "the database has a newer floodgate schema; using it as version {SCHEMA_VERSION}"
        );
    }
    tx.batch_execute(&sql.functions)
        .await
        .map_err(unavailable)?;
    tx.commit().await.map_err(unavailable)
}

fn unavailable(e: impl std::fmt::Display) -> LimiterError {
    LimiterError::Unavailable(e.to_string())
}

/// A database error as the guard should see it: an error about this request's data (an
/// exception the function raised, a number out of range, a deadlock or serialization failure,
/// which retrying a later request clears) is [`LimiterError::Refused`], which leaves the breaker
/// alone; anything about the connection or the server is [`LimiterError::Unavailable`].
fn classify(e: tokio_postgres::Error) -> LimiterError {
    let about_the_request = e
        .code()
        .is_some_and(|code| matches!(code.code().get(..2), Some("22" | "23" | "40" | "P0")));
    if about_the_request {
        LimiterError::Refused(e.to_string())
    } else {
        LimiterError::Unavailable(e.to_string())
    }
}

/// True when the error says floodgate's table or functions are missing (a database recreated or
/// restored under a running floodgate): install them and try again.
fn schema_missing(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code()
        .is_some_and(|c| *c == SqlState::UNDEFINED_FUNCTION || *c == SqlState::UNDEFINED_TABLE)
}

/// The PostgreSQL-backed limiter store.
pub struct PostgresStore {
    db: Db,
    /// True when decisions may take the caller's time (tests only).
    test_clock: bool,
    prefix: String,
    /// Where decisions wait to leave in a batch, when batching is on ([`PostgresStore::batched`]).
    batcher: Option<mpsc::UnboundedSender<Pending<batch::Job>>>,
    /// The background tasks (installer, sweeper) hold a weak reference and end with the store.
    _alive: Arc<()>,
}

/// The database as the store and its batch driver share it: the pool, the SQL, and whether the
/// schema is installed. Cheap to clone.
#[derive(Clone)]
struct Db {
    pool: Pool,
    sql: Arc<Sql>,
    /// True once the schema is installed; decisions are refused (as unavailable) until then.
    installed: Arc<AtomicBool>,
    /// True while an installer task is running: at most one at a time.
    installing: Arc<AtomicBool>,
    /// Woken after each of the installer's attempts, failed or not.
    attempted: Arc<tokio::sync::Notify>,
    /// The store's: background tasks run while it is alive.
    alive: Weak<()>,
    /// Round trips made to decide (`floodgate_store_calls_total`), once the guard hands its
    /// counter over: a batch is one.
    calls: Arc<std::sync::OnceLock<prometheus_client::metrics::counter::Counter>>,
}

impl PostgresStore {
    /// A store for the database at `url` (`postgres://user:password@host:port/db`). Returns at
    /// once: connections are made on demand and the schema is installed in the background,
    /// retried until the database answers, so floodgate starts (and follows `on_error`) while
    /// PostgreSQL is down. Fails only on a malformed URL. Must be called within a Tokio runtime.
    pub fn connect(url: &str, prefix: &str, timeout: Duration) -> Result<Self, LimiterError> {
        Self::with_clock(url, prefix, timeout, false)
    }

    /// A store whose decisions may take the caller's time ([`PostgresStore::decide_at_for_test`]),
    /// and which sweeps nothing: for the differential tests.
    pub fn connect_for_test(
        url: &str,
        prefix: &str,
        timeout: Duration,
    ) -> Result<Self, LimiterError> {
        Self::with_clock(url, prefix, timeout, true)
    }

    fn with_clock(
        url: &str,
        prefix: &str,
        timeout: Duration,
        test_clock: bool,
    ) -> Result<Self, LimiterError> {
        let url::Options { mut config, tls } = url::options(url)
            .map_err(|e| LimiterError::Unavailable(format!("invalid PostgreSQL URL: {e}")))?;
        // A statement still running long after its caller gave up (a lock queue behind a hot
        // budget) is cancelled by the server rather than left to pile up.
        let statement_timeout = (timeout * 4).max(Duration::from_millis(250));
        config
            .application_name("floodgate")
            .connect_timeout(timeout.max(Duration::from_secs(1)))
            .options(format!(
                "-c synchronous_commit=off -c statement_timeout={}",
                statement_timeout.as_millis()
            ));
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        // TLS only when the URL demands it: `sslmode=prefer` (the default) would try TLS first,
        // and a server with a certificate nobody here trusts (Debian's own snakeoil one, say)
        // would then refuse every connection instead of falling back.
        let manager = match tls {
            Some(tls) => Manager::from_config(config, MakeRustlsConnect::new(tls), manager_config),
            None => Manager::from_config(config, NoTls, manager_config),
        };
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let pool = Pool::builder(manager)
            .max_size((4 * cores).max(8))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout.max(Duration::from_millis(250))))
            .create_timeout(Some(timeout.max(Duration::from_secs(1))))
            .recycle_timeout(Some(timeout.max(Duration::from_millis(250))))
            .build()
            .map_err(unavailable)?;
        let alive = Arc::new(());
        let db = Db {
            pool,
            sql: Arc::new(Sql::new()),
            installed: Arc::new(AtomicBool::new(false)),
            installing: Arc::new(AtomicBool::new(false)),
            attempted: Arc::new(tokio::sync::Notify::new()),
            alive: Arc::downgrade(&alive),
            calls: Arc::default(),
        };
        db.start_install();
        // The sweeper deletes by the database's clock, which would find every budget a test
        // clock wrote long expired.
        if !test_clock {
            db.spawn_sweeper();
        }
        Ok(PostgresStore {
            db,
            test_clock,
            prefix: prefix.to_string(),
            batcher: None,
            _alive: alive,
        })
    }

    /// This store with batched decisions (`storage.batch`, see `postgres/batch.rs`): decisions
    /// that would wait for a connection leave together, as many batches at once as the pool has
    /// connections.
    pub fn batched(mut self) -> Self {
        let in_flight = self.db.pool.status().max_size;
        self.batcher = Some(batch::start(self.db.clone(), in_flight));
        self
    }
}

impl Db {
    /// Counts one round trip made to decide.
    fn count_call(&self) {
        if let Some(calls) = self.calls.get() {
            calls.inc();
        }
    }

    /// Installs the schema in a background task, retrying with backoff until it succeeds.
    fn start_install(&self) {
        if self.installing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (pool, sql, installed, installing, attempted) = (
            self.pool.clone(),
            self.sql.clone(),
            self.installed.clone(),
            self.installing.clone(),
            self.attempted.clone(),
        );
        let alive = self.alive.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            while alive.strong_count() > 0 {
                let result = match pool.get().await {
                    Ok(mut client) => install(&mut client, &sql).await,
                    Err(e) => Err(unavailable(e)),
                };
                if result.is_ok() {
                    installed.store(true, Ordering::Release);
                }
                attempted.notify_waiters();
                match result {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot install the PostgreSQL schema yet; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
            installing.store(false, Ordering::Release);
        });
    }

    /// Deletes expired budgets in the background, one batch of keys at a time.
    fn spawn_sweeper(&self) {
        let (pool, sql, installed) = (self.pool.clone(), self.sql.clone(), self.installed.clone());
        let alive = self.alive.clone();
        let grace_us = SWEEP_GRACE.as_micros() as i64;
        tokio::spawn(async move {
            let mut after = String::new();
            while alive.strong_count() > 0 {
                if !installed.load(Ordering::Acquire) {
                    tokio::time::sleep(SWEEP_PASS_PAUSE).await;
                    continue;
                }
                let batch = async {
                    let client = pool.get().await.map_err(unavailable)?;
                    let row = client
                        .query_one(&sql.sweep, &[&after, &SWEEP_BATCH, &grace_us])
                        .await
                        .map_err(classify)?;
                    row.try_get::<_, Option<String>>(0)
                        .map_err(|e| LimiterError::Protocol(e.to_string()))
                };
                match batch.await {
                    Ok(Some(last)) => {
                        after = last;
                        tokio::time::sleep(SWEEP_PAUSE).await;
                    }
                    Ok(None) => {
                        after.clear();
                        tokio::time::sleep(SWEEP_PASS_PAUSE).await;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "sweeping expired budgets failed");
                        tokio::time::sleep(SWEEP_PASS_PAUSE).await;
                    }
                }
            }
        });
    }

    /// Runs one prepared statement returning one value; installs the schema and tries once more
    /// if it has gone missing.
    async fn query<T: FromSqlOwned>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<T, LimiterError> {
        if !self.installed.load(Ordering::Acquire) {
            self.start_install();
            return Err(LimiterError::Unavailable(
                "floodgate's PostgreSQL schema is not installed yet".into(),
            ));
        }
        let mut client = self.pool.get().await.map_err(unavailable)?;
        let mut reinstalled = false;
        loop {
            let result = async {
                let statement = client.prepare_cached(sql).await?;
                client.query_one(&statement, params).await
            }
            .await;
            match result {
                Ok(row) => {
                    return row
                        .try_get(0)
                        .map_err(|e| LimiterError::Protocol(e.to_string()));
                }
                Err(e) if schema_missing(&e) && !reinstalled => {
                    tracing::warn!(error = %e, "floodgate's PostgreSQL schema is gone; installing it again");
                    client.statement_cache.clear();
                    install(&mut client, &self.sql).await?;
                    reinstalled = true;
                }
                Err(e) => return Err(classify(e)),
            }
        }
    }

    /// Waits for the installer's attempt under way (if any), then pings: the first decision
    /// finds the schema in place rather than spending its timeout waiting for it.
    async fn prepare(&self) -> Result<(), LimiterError> {
        let attempt = self.attempted.notified();
        if !self.installed.load(Ordering::Acquire) && self.installing.load(Ordering::Acquire) {
            attempt.await;
        }
        self.ping().await
    }

    /// Asks PostgreSQL whether it answers (and the schema is in place): `/readyz`.
    async fn ping(&self) -> Result<(), LimiterError> {
        if !self.installed.load(Ordering::Acquire) {
            self.start_install();
            return Err(LimiterError::Unavailable(
                "floodgate's PostgreSQL schema is not installed yet".into(),
            ));
        }
        let client = self.pool.get().await.map_err(unavailable)?;
        client
            .simple_query("SELECT 1")
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

impl PostgresStore {
    /// Decides one request against all `asks` in one round trip, all-or-nothing, by the
    /// database's clock; its concurrency leases (if any) are named `lease`.
    pub async fn decide(&self, asks: &[Ask<'_>], lease: LeaseId) -> Result<Verdict, LimiterError> {
        Ok(self.invoke(asks, None, Some(lease), &[]).await?.verdict)
    }

    /// [`PostgresStore::decide`] at `now_us` instead of the database's clock, on a store made by
    /// [`PostgresStore::connect_for_test`].
    pub async fn decide_at_for_test(
        &self,
        asks: &[Ask<'_>],
        now_us: u64,
        lease: LeaseId,
    ) -> Result<Verdict, LimiterError> {
        if !self.test_clock {
            return Err(LimiterError::Protocol(
                "this store reads the database's clock; use PostgresStore::connect_for_test".into(),
            ));
        }
        Ok(self
            .invoke(asks, Some(now_us), Some(lease), &[])
            .await?
            .verdict)
    }

    /// What `asks` would decide now, per limit, spending nothing: for `/budgets`.
    pub async fn peek(&self, asks: &[Ask<'_>]) -> Result<Vec<Decision>, LimiterError> {
        Ok(self.invoke(asks, None, None, &[]).await?.decisions)
    }

    /// Gives back the concurrency leases named `lease` in `asks`' budgets, in one round trip.
    pub async fn release(&self, asks: &[Ask<'_>], lease: LeaseId) -> Result<(), LimiterError> {
        let keys: Vec<String> = asks
            .iter()
            .filter(|a| a.limit.algorithm().kind() == AlgorithmKind::Concurrency)
            .map(|a| wire::key_name(&self.prefix, a))
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let lease = lease as i64; // the same bits as the decision stored
        self.db
            .query::<i32>(&self.db.sql.release, &[&keys, &lease])
            .await
            .map(|_| ())
    }

    /// One decision call; `lease: None` peeks.
    /// `wants`: per ask, what to lease and give back (see `lease.rs`); may be empty.
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
        let keys: Vec<String> = asks
            .iter()
            .map(|a| wire::key_name(&self.prefix, a))
            .collect();
        let algorithms: Vec<&str> = asks.iter().map(|a| a.limit.algorithm().name()).collect();
        let (mut pa, mut pb, mut costs) = (
            Vec::with_capacity(asks.len()),
            Vec::with_capacity(asks.len()),
            Vec::with_capacity(asks.len()),
        );
        for ask in asks {
            // Every parameter is below 2^53 (the constructors check it): the casts are exact.
            let (a, b) = ask.limit.algorithm().parameters();
            pa.push(a as i64);
            pb.push(b as i64);
            costs.push(i64::from(ask.limit.cost()));
        }
        let leases = Leasing::of(wants, asks.len());
        let lease = lease.map(|l| l as i64);
        if let (Some(batcher), None, Some(lease)) = (&self.batcher, now, lease) {
            let job = batch::Job {
                keys,
                algorithms,
                pa,
                pb,
                costs,
                lease,
                leases,
            };
            return super::batch::decide(batcher, job).await;
        }
        self.db.count_call();
        let items: Vec<i64> = match now {
            None => {
                self.db
                    .query(
                        &self.db.sql.decide,
                        &[
                            &keys,
                            &algorithms,
                            &pa,
                            &pb,
                            &costs,
                            &lease,
                            &leases.wants,
                            &leases.backs,
                            &leases.back_ats,
                            &leases.lease_us,
                        ],
                    )
                    .await?
            }
            Some(now) => {
                let now = now as i64;
                self.db
                    .query(
                        &self.db.sql.decide_at,
                        &[
                            &now,
                            &keys,
                            &algorithms,
                            &pa,
                            &pb,
                            &costs,
                            &lease,
                            &leases.wants,
                            &leases.backs,
                            &leases.back_ats,
                            &leases.lease_us,
                        ],
                    )
                    .await?
            }
        };
        Reply::from_ints(&items, asks.len())
    }

    /// Waits for the installer's attempt under way (if any), then pings: the first decision
    /// finds the schema in place rather than spending its timeout waiting for it.
    pub async fn prepare(&self) -> Result<(), LimiterError> {
        self.db.prepare().await
    }

    /// Asks PostgreSQL whether it answers (and the schema is in place): `/readyz`.
    pub async fn ping(&self) -> Result<(), LimiterError> {
        self.db.ping().await
    }
}

impl RemoteStore for PostgresStore {
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
        PostgresStore::release(self, asks, lease).await
    }

    async fn peek(&self, asks: &[Ask<'_>]) -> Result<Vec<Decision>, LimiterError> {
        PostgresStore::peek(self, asks).await
    }

    async fn ping(&self) -> Result<(), LimiterError> {
        PostgresStore::ping(self).await
    }

    async fn prepare(&self) -> Result<(), LimiterError> {
        PostgresStore::prepare(self).await
    }

    fn count_calls(&self, counter: prometheus_client::metrics::counter::Counter) -> bool {
        let _ = self.db.calls.set(counter);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_name_gets_the_hash() {
        let sql = Sql::new();
        assert!(!sql.functions.contains(NAME_SUFFIX));
        for call in [
            &sql.decide,
            &sql.decide_at,
            &sql.decide_batch,
            &sql.release,
            &sql.sweep,
        ] {
            let name = call
                .split(['(', ' '])
                .find(|w| w.starts_with("floodgate_"))
                .expect("a function name");
            assert!(
                sql.functions
                    .contains(&format!("CREATE OR REPLACE FUNCTION {name}(")),
                "{name} is not created"
            );
        }
    }
}
