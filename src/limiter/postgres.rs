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

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::store::{
    CacheScope, CacheVariant, CacheWrite, ControlChange, ControlList, RoomBounds, RoomEntered,
    Shared, Store, StoreCall,
};
use super::wire::Call;
use super::wire::{self, Reply};
use super::{AlgorithmKind, Ask, LeaseId, LimiterError};

mod batch;
mod cache;
mod db;
mod room;
mod slices;
pub mod url;

pub use slices::{PgGlobal, PgSlices};

use db::{Db, Sql};

/// The table layout's version (`schema.sql`), recorded in `floodgate_schema`. Raise it with a
/// migration when the table changes; the functions need no version (their names carry a hash).
pub const SCHEMA_VERSION: i32 = 5;

/// One decision's lease arguments as `decide.sql` takes them, one element per limit (0s where
/// `wants` is shorter).
#[derive(Debug, Default)]
pub(crate) struct Leasing {
    pub wants: Vec<i64>,
    pub backs: Vec<i64>,
    pub back_ats: Vec<i64>,
    pub lease_us: Vec<i64>,
    pub lents: Vec<i64>,
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
            out.back_ats.push(w.back_at.0 as i64);
            out.lease_us.push(w.lease_us as i64);
            out.lents.push(w.lent as i64);
        }
        out
    }
}

/// The PostgreSQL-backed limiter store.
pub struct PostgresStore {
    db: Db,
    /// True when decisions may take the caller's time (tests only).
    test_clock: bool,
    prefix: String,
    /// Where decisions wait to leave in a batch, while batching is on
    /// ([`PostgresStore::batched`]).
    batching: super::batch::Batching<batch::Job>,
    /// The background tasks (installer, sweeper) hold a weak reference and end with the store.
    _alive: Arc<()>,
}

impl PostgresStore {
    /// A store for the database at `url` (`postgres://user:password@host:port/db`). Returns at
    /// once: connections are made on demand and the schema is installed in the background,
    /// retried until the database answers, so floodgate starts (and follows `on_error`) while
    /// PostgreSQL is down. Fails only on a malformed URL. Must be called within a Tokio runtime.
    pub fn connect(url: &str, prefix: &str, timeout: Duration) -> Result<Self, LimiterError> {
        Self::with_clock(url, prefix, timeout, false)
    }

    /// A store whose decisions may take the caller's time ([`Store::decide_leasing_at`]),
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
        // A statement still running long after its caller gave up (a lock queue behind a hot
        // budget) is cancelled by the server rather than left to pile up.
        let statement_timeout = (timeout * 4).max(Duration::from_millis(250));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let pool = pool(
            url,
            "floodgate",
            &format!(
                "-c synchronous_commit=off -c statement_timeout={}",
                statement_timeout.as_millis()
            ),
            (4 * cores).max(8),
            timeout,
        )
        .map_err(LimiterError::unavailable)?;
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
            batching: Default::default(),
            _alive: alive,
        })
    }
}

impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    /// One decision call, doing what `call` says.
    /// `wants`: per ask, what to lease and give back (see `lease.rs`); may be empty.
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
            // A quota's period is worked out from floodgate's clock (a test's, when it sets one).
            let calendar_now = now.unwrap_or_else(crate::limiter::wall_clock_us);
            for ask in asks {
                // Every parameter is below 2^53 (the constructors check it): the casts are exact.
                let (a, b) = ask.limit.algorithm().wire_at(calendar_now);
                pa.push(a as i64);
                pb.push(b as i64);
                costs.push(i64::from(ask.limit.cost()));
            }
            let leases = Leasing::of(wants, asks.len());
            let lease = lease.map(|l| l as i64);
            if let (Some(batcher), true, Some(lease)) =
                (self.batching.queue(), call.batchable(), lease)
            {
                let job = batch::Job {
                    keys,
                    algorithms,
                    pa,
                    pb,
                    costs,
                    lease,
                    leases,
                };
                return super::batch::decide(batcher, job, late).await;
            }
            self.db.count_call();
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 11] = [
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
                &leases.lents,
            ];
            let items: Vec<i64> = match now {
                None => self.db.query(&self.db.sql.decide, &params).await?,
                Some(now) => {
                    // The test entry point: the same arguments after the caller's clock.
                    let now = now as i64;
                    let mut at: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&now];
                    at.extend(params);
                    self.db.query(&self.db.sql.decide_at, &at).await?
                }
            };
            Reply::from_ints(&items, asks.len())
        })
    }

    fn settle_at<'a>(
        &'a self,
        asks: &'a [Ask<'a>],
        settlements: &'a [crate::limiter::Settlement],
        now: Option<u64>,
    ) -> StoreCall<'a, ()> {
        Box::pin(async move {
            // A quota's periods are worked out from floodgate's clock (a test's, when it sets one).
            let calendar_now = now.unwrap_or_else(crate::limiter::wall_clock_us);
            let (mut keys, mut algorithms) = (Vec::new(), Vec::new());
            let (mut pa, mut pb, mut pb_at) = (Vec::new(), Vec::new(), Vec::new());
            let (mut refunds, mut charges, mut ats) = (Vec::new(), Vec::new(), Vec::new());
            for (ask, settle) in asks.iter().zip(settlements) {
                if settle.is_even() {
                    continue;
                }
                let algorithm = ask.limit.algorithm();
                keys.push(wire::key_name(&self.prefix, ask));
                algorithms.push(algorithm.name());
                // Every figure is below 2^53 (the constructors and `Settlement::bounded` see to it).
                let (a, b) = algorithm.wire_at(calendar_now);
                let (refund, charge, at) = settle.bounded(a);
                pa.push(a as i64);
                pb.push(b as i64);
                pb_at.push(algorithm.wire_at(settle.at_us).1 as i64);
                refunds.push(refund as i64);
                charges.push(charge as i64);
                ats.push(at as i64);
            }
            if keys.is_empty() {
                return Ok(());
            }
            let clock = now.map(|n| n as i64);
            self.db
                .query::<i64>(
                    &self.db.sql.settle,
                    &[
                        &clock,
                        &keys,
                        &algorithms,
                        &pa,
                        &pb,
                        &pb_at,
                        &refunds,
                        &charges,
                        &ats,
                    ],
                )
                .await
                .map(|_| ())
        })
    }

    fn reads_callers_clock(&self) -> bool {
        self.test_clock
    }

    /// Turns batching on or off for the decisions that follow (the batcher starts the first
    /// time it is turned on, and stays).
    fn set_batching(&self, on: bool) {
        let in_flight = self.db.pool.status().max_size;
        self.batching
            .set(on, || batch::start(self.db.clone(), in_flight));
    }

    /// Gives back the concurrency leases named `lease` in `asks`' budgets, in one round trip.
    fn release<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()> {
        Box::pin(async move {
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
        })
    }

    /// Extends the concurrency leases named `lease` in `asks`' budgets, in one round trip.
    fn renew<'a>(&'a self, asks: &'a [Ask<'a>], lease: LeaseId) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let (keys, spans): (Vec<String>, Vec<i64>) = asks
                .iter()
                .filter(|a| a.limit.algorithm().kind() == AlgorithmKind::Concurrency)
                .map(|a| {
                    let span = i64::try_from(a.limit.algorithm().span_us()).unwrap_or(i64::MAX);
                    (wire::key_name(&self.prefix, a), span)
                })
                .unzip();
            if keys.is_empty() {
                return Ok(());
            }
            let lease = lease as i64; // the same bits as the decision stored
            self.db
                .query::<i32>(&self.db.sql.renew, &[&keys, &lease, &spans])
                .await
                .map(|_| ())
        })
    }

    /// Asks PostgreSQL whether it answers (and the schema is in place): `/readyz`.
    fn ping(&self) -> StoreCall<'_, ()> {
        Box::pin(async move { self.db.ping().await })
    }

    fn reset<'a>(&'a self, asks: &'a [Ask<'a>]) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let keys: Vec<String> = asks
                .iter()
                .map(|a| wire::key_name(&self.prefix, a))
                .collect();
            self.db
                .query::<i64>(
                    "WITH gone AS (DELETE FROM floodgate_budgets WHERE key = ANY($1) RETURNING 1) \
                     SELECT count(*) FROM gone",
                    &[&keys],
                )
                .await
                .map(|_| ())
        })
    }

    /// Waits for the installer's attempt under way (if any), then pings: the first decision
    /// finds the schema in place rather than spending its timeout waiting for it.
    fn prepare(&self) -> StoreCall<'_, ()> {
        Box::pin(async move { self.db.prepare().await })
    }

    fn count_calls(&self, counter: prometheus_client::metrics::counter::Counter) -> bool {
        let _ = self.db.calls.set(counter);
        true
    }

    fn shared(&self) -> Option<&dyn Shared> {
        Some(self)
    }
}

/// The control list and claims, kept in PostgreSQL for every instance that shares it.
impl Shared for PostgresStore {
    fn control_read(&self, known: Option<String>) -> StoreCall<'_, Option<ControlList>> {
        Box::pin(async move {
            let version: i64 = self
                .db
                // (A fresh sequence's `last_value` is already 1: until the first write, 0.)
                .query(
                    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END \
                     FROM floodgate_control_version",
                    &[],
                )
                .await?;
            let prefix: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.prefix];
            let entries = self.db.query::<Vec<String>>(
                "SELECT coalesce(array_agg(entry ORDER BY id), '{}') FROM floodgate_control \
                 WHERE starts_with(id, $1)",
                &prefix,
            );
            ControlList::read(version.to_string(), known, entries).await
        })
    }

    fn control_write<'a>(&'a self, changes: &'a [ControlChange<'a>]) -> StoreCall<'a, ()> {
        Box::pin(async move {
            // Rows are named with the key prefix: instances with different prefixes keep apart
            // lists in one database. One statement: the changes and the version's bump together.
            let mut gone: Vec<String> = Vec::new();
            let (mut ids, mut entries): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
            for (id, entry) in changes {
                let id = format!("{}{id}", self.prefix);
                match entry {
                    Some(entry) => {
                        ids.push(id);
                        entries.push((*entry).to_string());
                    }
                    None => gone.push(id),
                }
            }
            let _: i64 = self
                .db
                .query(
                    "WITH d AS (DELETE FROM floodgate_control WHERE id = ANY($1::text[]) RETURNING 1), \
                     w AS (INSERT INTO floodgate_control (id, entry) \
                           SELECT * FROM unnest($2::text[], $3::text[]) \
                           ON CONFLICT (id) DO UPDATE SET entry = excluded.entry RETURNING 1) \
                     SELECT nextval('floodgate_control_version') \
                     FROM (SELECT (SELECT count(*) FROM d) + (SELECT count(*) FROM w)) c",
                    &[&gone, &ids, &entries],
                )
                .await?;
            Ok(())
        })
    }

    fn claim<'a>(&'a self, key: &'a str, ttl_us: u64) -> StoreCall<'a, bool> {
        Box::pin(async move {
            // On the database's clock; ended claims go as a new one is made (claims are rare).
            let key = format!("{}{key}", self.prefix);
            let ttl = i64::try_from(ttl_us).unwrap_or(i64::MAX);
            let claimed: i64 = self
                .db
                .query(
                    "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint AS us), \
                     gone AS (DELETE FROM floodgate_claims WHERE until_us < (SELECT us FROM now) \
                       AND key <> $1), \
                     c AS (INSERT INTO floodgate_claims (key, until_us) \
                       VALUES ($1, (SELECT us FROM now) + $2) \
                       ON CONFLICT (key) DO UPDATE SET until_us = excluded.until_us \
                       WHERE floodgate_claims.until_us < (SELECT us FROM now) RETURNING 1) \
                     SELECT count(*) FROM c",
                    &[&key, &ttl],
                )
                .await?;
            Ok(claimed == 1)
        })
    }

    fn unclaim<'a>(&'a self, key: &'a str) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            self.db
                .query::<i64>(
                    "WITH gone AS (DELETE FROM floodgate_claims WHERE key = $1 RETURNING 1) \
                     SELECT count(*) FROM gone",
                    &[&key],
                )
                .await
                .map(|_| ())
        })
    }

    fn blob_read<'a>(&'a self, key: &'a str) -> StoreCall<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            self.db
                .query(
                    "SELECT (SELECT value FROM floodgate_blobs WHERE key = $1)",
                    &[&key],
                )
                .await
        })
    }

    fn blob_write<'a>(&'a self, key: &'a str, bytes: &'a [u8]) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            self.db
                .query::<i64>(
                    "WITH w AS (INSERT INTO floodgate_blobs (key, value) VALUES ($1, $2) \
                       ON CONFLICT (key) DO UPDATE SET value = excluded.value RETURNING 1) \
                     SELECT count(*) FROM w",
                    &[&key, &bytes],
                )
                .await
                .map(|_| ())
        })
    }

    fn blob_remove<'a>(&'a self, key: &'a str) -> StoreCall<'a, ()> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            self.db
                .query::<i64>(
                    "WITH gone AS (DELETE FROM floodgate_blobs WHERE key = $1 RETURNING 1) \
                     SELECT count(*) FROM gone",
                    &[&key],
                )
                .await
                .map(|_| ())
        })
    }

    fn cache_read<'a>(&'a self, route: &'a str, key: &'a str) -> StoreCall<'a, Vec<CacheVariant>> {
        let _ = route;
        Box::pin(self.read_cached(key))
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

/// A pool of connections to `url`, made on demand, named `application` in
/// `pg_stat_activity`, each session started with `session` (`-c name=value` options), at most
/// `max_size` of them, waited for at most `timeout` (at least 250 ms; a new connection at
/// least 1 s). `Err` only for a URL that cannot be used at all.
pub fn pool(
    url: &str,
    application: &str,
    session: &str,
    max_size: usize,
    timeout: Duration,
) -> Result<Pool, String> {
    let url::Options { mut config, tls } =
        url::options(url).map_err(|e| format!("invalid PostgreSQL URL: {e}"))?;
    config
        .application_name(application)
        .connect_timeout(timeout.max(Duration::from_secs(1)))
        .options(session);
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
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(timeout.max(Duration::from_millis(250))))
        .create_timeout(Some(timeout.max(Duration::from_secs(1))))
        .recycle_timeout(Some(timeout.max(Duration::from_millis(250))))
        .build()
        .map_err(|e| e.to_string())
}
