//! The database as the store and its batch driver share it: the pool, the schema and functions
//! (installed at start, again if they disappear), the sweeper of expired budgets, and one
//! prepared statement at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;
use sha2::{Digest, Sha256};
use tokio_postgres::types::{FromSqlOwned, ToSql};

use super::SCHEMA_VERSION;
use crate::limiter::LimiterError;

pub(super) const SCHEMA: &str = include_str!("../sql/schema.sql");

/// The functions, in the order they must be created (the decision calls the algorithms).
pub(super) const FUNCTIONS: [&str; 12] = [
    include_str!("../sql/gcra.sql"),
    include_str!("../sql/fixed_window.sql"),
    include_str!("../sql/sliding_window_log.sql"),
    include_str!("../sql/sliding_window_counter.sql"),
    include_str!("../sql/concurrency.sql"),
    include_str!("../sql/decide.sql"),
    include_str!("../sql/batch.sql"),
    include_str!("../sql/release.sql"),
    include_str!("../sql/renew.sql"),
    include_str!("../sql/settle.sql"),
    include_str!("../sql/sweep.sql"),
    include_str!("../sql/room.sql"),
];

/// The token the SQL files end their function names with, replaced by the hash.
pub(super) const NAME_SUFFIX: &str = "__V";

/// Serialises installers across floodgate instances (`pg_advisory_xact_lock`): "floodgat".
pub(super) const INSTALL_LOCK: i64 = 0x666c_6f6f_6467_6174;

/// Budgets the sweeper looks at per batch, and the pause between batches and between passes.
pub(super) const SWEEP_BATCH: i32 = 1000;
pub(super) const SWEEP_PAUSE: Duration = Duration::from_millis(100);
pub(super) const SWEEP_PASS_PAUSE: Duration = Duration::from_secs(1);
/// How long past its expiry a budget is kept (see `sweep.sql`): one used more often than this
/// stays a row that is updated, not deleted and inserted again.
pub(super) const SWEEP_GRACE: Duration = Duration::from_secs(5);

/// The SQL floodgate sends, with the functions' hashed names filled in.
pub(super) struct Sql {
    /// Every `CREATE OR REPLACE FUNCTION`.
    pub(super) functions: String,
    pub(super) decide: String,
    pub(super) decide_at: String,
    pub(super) decide_batch: String,
    pub(super) release: String,
    pub(super) renew: String,
    pub(super) settle: String,
    pub(super) sweep: String,
    pub(super) room_enter: String,
}

impl Sql {
    pub(super) fn new() -> Sql {
        let text = FUNCTIONS.concat();
        let hash = super::super::hex(&Sha256::digest(text.as_bytes())[..6]);
        let suffix = format!("_{hash}");
        let name = |f: &str| format!("floodgate_{f}{suffix}");
        Sql {
            functions: text.replace(NAME_SUFFIX, &suffix),
            decide: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                name("decide")
            ),
            decide_at: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                name("decide_at")
            ),
            decide_batch: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                name("decide_batch")
            ),
            release: format!("SELECT {}($1, $2)", name("release")),
            renew: format!("SELECT {}($1, $2, $3)", name("renew")),
            settle: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                name("settle")
            ),
            sweep: format!(
                "SELECT last_key, deleted FROM {}($1, $2, $3)",
                name("sweep")
            ),
            room_enter: format!("SELECT {}($1, $2, $3, $4, $5, $6, $7)", name("room_enter")),
        }
    }
}

/// Installs the schema on `client`, idempotently: the table if `floodgate_schema` records an
/// older version (or none), and every function. One transaction, under an advisory lock, so
/// instances starting together do not race.
pub(super) async fn install(
    client: &mut deadpool_postgres::Object,
    sql: &Sql,
) -> Result<(), LimiterError> {
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

pub(super) fn unavailable(e: impl std::error::Error + Send + Sync + 'static) -> LimiterError {
    LimiterError::Unavailable(crate::limiter::Cause::from_error(e))
}

/// A database error as the guard should see it: an error about this request's data (an
/// exception the function raised, a number out of range, a deadlock or serialization failure,
/// which retrying a later request clears) is [`LimiterError::Refused`], which leaves the breaker
/// alone; anything about the connection or the server is [`LimiterError::Unavailable`].
pub(super) fn classify(e: tokio_postgres::Error) -> LimiterError {
    let about_the_request = e
        .code()
        .is_some_and(|code| matches!(code.code().get(..2), Some("22" | "23" | "40" | "P0")));
    if about_the_request {
        LimiterError::Refused(crate::limiter::Cause::from_error(e))
    } else {
        LimiterError::Unavailable(crate::limiter::Cause::from_error(e))
    }
}

/// How many times one call is made again after a serialization failure or deadlock (the
/// caller's timeout ends it sooner on a store that keeps conflicting).
const MAX_CONFLICT_RETRIES: u32 = 16;

/// True for SQLSTATE `40001` (serialization failure) and `40P01` (deadlock detected): the
/// transaction was rolled back and the database says to try it again.
pub(super) fn must_retry(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// The pause before the `n`th retry of a conflicting call: up to 1 ms, 2 ms, 4 ms… (at most
/// 16 ms), a random part of it, so the calls that conflicted do not meet again in step.
fn conflict_pause(n: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let ceiling_us = 1000u64 << n.saturating_sub(1).min(4);
    // A fresh `RandomState` is seeded anew: enough randomness for jitter, with no dependency.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(n);
    Duration::from_micros(ceiling_us / 2 + hasher.finish() % (ceiling_us / 2 + 1))
}

/// True when the error says floodgate's table or functions are missing (a database recreated or
/// restored under a running floodgate): install them and try again.
pub(super) fn schema_missing(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code()
        .is_some_and(|c| *c == SqlState::UNDEFINED_FUNCTION || *c == SqlState::UNDEFINED_TABLE)
}

/// The database as the store and its batch driver share it: the pool, the SQL, and whether the
/// schema is installed. Cheap to clone.
#[derive(Clone)]
pub(super) struct Db {
    pub(super) pool: Pool,
    pub(super) sql: Arc<Sql>,
    /// True once the schema is installed; decisions are refused (as unavailable) until then.
    pub(super) installed: Arc<AtomicBool>,
    /// True while an installer task is running: at most one at a time.
    pub(super) installing: Arc<AtomicBool>,
    /// Woken after each of the installer's attempts, failed or not.
    pub(super) attempted: Arc<tokio::sync::Notify>,
    /// The store's: background tasks run while it is alive.
    pub(super) alive: Weak<()>,
    /// Round trips made to decide (`floodgate_store_calls_total`), once the guard hands its
    /// counter over: a batch is one.
    pub(super) calls: Arc<std::sync::OnceLock<prometheus_client::metrics::counter::Counter>>,
}

impl Db {
    /// Counts one round trip made to decide.
    pub(super) fn count_call(&self) {
        if let Some(calls) = self.calls.get() {
            calls.inc();
        }
    }

    /// Installs the schema in a background task, retrying with backoff until it succeeds.
    pub(super) fn start_install(&self) {
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
    pub(super) fn spawn_sweeper(&self) {
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
                        .map_err(|e| LimiterError::Protocol(crate::limiter::Cause::from_error(e)))
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
    pub(super) async fn query<T: FromSqlOwned>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<T, LimiterError> {
        if !self.installed.load(Ordering::Acquire) {
            self.start_install();
            return Err(LimiterError::unavailable(
                "floodgate's PostgreSQL schema is not installed yet",
            ));
        }
        let mut client = self.pool.get().await.map_err(unavailable)?;
        let mut reinstalled = false;
        let mut conflicts = 0;
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
                        .map_err(|e| LimiterError::Protocol(crate::limiter::Cause::from_error(e)));
                }
                Err(e) if schema_missing(&e) && !reinstalled => {
                    tracing::warn!(error = %e, "floodgate's PostgreSQL schema is gone; installing it again");
                    client.statement_cache.clear();
                    install(&mut client, &self.sql).await?;
                    reinstalled = true;
                }
                // Under `serializable` or `repeatable read` (a database's default isolation,
                // or a distributed SQL database's only one), concurrent calls on one key fail
                // with a serialization failure or a deadlock that the database asks the
                // application to retry: nothing was spent, so the call is made again, after a
                // short jittered pause. The caller's timeout (`storage.timeout`) bounds the
                // whole.
                Err(e) if must_retry(&e) && conflicts < MAX_CONFLICT_RETRIES => {
                    conflicts += 1;
                    tokio::time::sleep(conflict_pause(conflicts)).await;
                }
                Err(e) => return Err(classify(e)),
            }
        }
    }

    /// Waits for the installer's attempt under way (if any), then pings: the first decision
    /// finds the schema in place rather than spending its timeout waiting for it.
    pub(super) async fn prepare(&self) -> Result<(), LimiterError> {
        let attempt = self.attempted.notified();
        if !self.installed.load(Ordering::Acquire) && self.installing.load(Ordering::Acquire) {
            attempt.await;
        }
        self.ping().await
    }

    /// Asks PostgreSQL whether it answers (and the schema is in place): `/readyz`.
    pub(super) async fn ping(&self) -> Result<(), LimiterError> {
        if !self.installed.load(Ordering::Acquire) {
            self.start_install();
            return Err(LimiterError::unavailable(
                "floodgate's PostgreSQL schema is not installed yet",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn every_function_name_gets_the_hash() {
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
