//! PostgreSQL as a store of budgets across regions (`limiter/slices.rs`): the same operations as
//! the Redis scripts (`redis/slices.rs`), as PL/pgSQL functions on the database's clock
//! (`clock_timestamp()`), a budget's or slice's row locked for each call. Installed
//! (idempotently, under an advisory lock) before the first call, so floodgate starts while the
//! database is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::types::ToSql;

use crate::limiter::slices::{
    Give, GlobalStore, Grant, OwnedCall, SliceRead, SliceStore, Take, Taken,
};
use crate::limiter::{Cause, LimiterError, StoreCall};

/// The global store's tables and functions: a budget's tokens and the instant they were counted
/// at, and each region's slice (units as last reported, its end), as the Redis hash keeps them.
const GLOBAL_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS floodgate_global_budgets (
    key text PRIMARY KEY,
    tokens bigint NOT NULL,
    ts bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS floodgate_global_slices (
    key text NOT NULL,
    region text NOT NULL,
    units bigint NOT NULL,
    ends_us bigint NOT NULL,
    PRIMARY KEY (key, region)
);
CREATE OR REPLACE FUNCTION floodgate_global_refill(p_key text, p_cap bigint, p_interval bigint,
    OUT o_tokens bigint, OUT o_ts bigint, OUT o_now bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_add bigint;
BEGIN
    o_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    INSERT INTO floodgate_global_budgets (key, tokens, ts) VALUES (p_key, p_cap, o_now)
        ON CONFLICT (key) DO NOTHING;
    SELECT b.tokens, b.ts INTO o_tokens, o_ts FROM floodgate_global_budgets b
        WHERE b.key = p_key FOR UPDATE;
    IF o_now > o_ts THEN
        v_add := (o_now - o_ts) / p_interval;
        IF v_add > 0 THEN
            o_tokens := least(p_cap, o_tokens + v_add);
            o_ts := o_ts + v_add * p_interval;
        END IF;
        IF o_tokens >= p_cap THEN
            o_ts := o_now;
        END IF;
    END IF;
END $$;
-- A windowed budget (p_end > 0) is one key per window, decided only while the database's clock
-- is inside [p_start, p_end), and never refilled (its interval is the window's length).
CREATE OR REPLACE FUNCTION floodgate_global_take(p_key text, p_cap bigint, p_interval bigint,
    p_need bigint, p_want bigint, p_region text, p_ttl_ms bigint, p_held bigint,
    p_start bigint, p_end bigint,
    OUT o_granted bigint, OUT o_left bigint, OUT o_lapsed bigint, OUT o_now bigint,
    OUT o_outside bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_ts bigint;
    v_now bigint;
    v_extra bigint;
    v_slice bigint;
BEGIN
    o_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    o_granted := 0;
    o_left := 0;
    o_lapsed := 0;
    o_outside := 0;
    IF p_end > 0 AND (o_now < p_start OR o_now >= p_end) THEN
        o_outside := 1;
        RETURN;
    END IF;
    SELECT r.o_tokens, r.o_ts, r.o_now INTO o_left, v_ts, v_now
        FROM floodgate_global_refill(p_key, p_cap,
            CASE WHEN p_end > 0 THEN p_end - p_start ELSE p_interval END) r;
    WITH gone AS (
        DELETE FROM floodgate_global_slices s WHERE s.key = p_key AND s.ends_us < v_now
        RETURNING s.region, s.units
    )
    SELECT coalesce(sum(g.units) FILTER (WHERE g.region <> p_region), 0) INTO o_lapsed FROM gone g;
    o_granted := 0;
    IF o_left >= p_need THEN
        v_extra := least(p_want, (o_left - p_need) / 2);
        IF p_need = 0 AND v_extra = 0 AND o_left > 0 AND p_want > 0 THEN
            v_extra := 1;
        END IF;
        o_granted := p_need + v_extra;
        o_left := o_left - o_granted;
    END IF;
    v_slice := p_held;
    IF o_granted > 0 THEN
        v_slice := p_held + o_granted - p_need;
    END IF;
    IF v_slice > 0 THEN
        INSERT INTO floodgate_global_slices (key, region, units, ends_us)
            VALUES (p_key, p_region, v_slice, v_now + p_ttl_ms * 1000)
            ON CONFLICT (key, region) DO UPDATE SET units = excluded.units, ends_us = excluded.ends_us;
    ELSE
        DELETE FROM floodgate_global_slices s WHERE s.key = p_key AND s.region = p_region;
    END IF;
    UPDATE floodgate_global_budgets SET tokens = o_left, ts = v_ts WHERE key = p_key;
END $$;
CREATE OR REPLACE FUNCTION floodgate_global_give(p_key text, p_cap bigint, p_interval bigint,
    p_units bigint, p_region text, p_start bigint, p_end bigint, OUT o_left bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    v_ts bigint;
    v_now bigint;
BEGIN
    v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    IF p_end > 0 AND (v_now < p_start OR v_now >= p_end) THEN
        o_left := 0;
        RETURN;
    END IF;
    SELECT r.o_tokens, r.o_ts, r.o_now INTO o_left, v_ts, v_now
        FROM floodgate_global_refill(p_key, p_cap,
            CASE WHEN p_end > 0 THEN p_end - p_start ELSE p_interval END) r;
    o_left := least(p_cap, o_left + p_units);
    DELETE FROM floodgate_global_slices s WHERE s.key = p_key AND s.region = p_region;
    UPDATE floodgate_global_budgets SET tokens = o_left, ts = v_ts WHERE key = p_key;
END $$;
"#;

/// A region's slices and the keepers' claims, and the functions on them (`now` is the database's
/// clock, in µs).
const SLICES_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS floodgate_global_region_slices (
    key text PRIMARY KEY,
    units bigint NOT NULL,
    demand bigint NOT NULL,
    idle bigint NOT NULL,
    ends_us bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS floodgate_global_region_claims (
    key text PRIMARY KEY,
    ends_us bigint NOT NULL
);
CREATE OR REPLACE FUNCTION floodgate_slice_now() RETURNS bigint LANGUAGE sql AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;
CREATE OR REPLACE FUNCTION floodgate_slice_spend(p_key text, p_cost bigint,
    OUT o_paid bigint, OUT o_units bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_units bigint;
    v_ends bigint;
BEGIN
    SELECT s.units, s.ends_us INTO v_units, v_ends FROM floodgate_global_region_slices s
        WHERE s.key = p_key FOR UPDATE;
    IF NOT FOUND OR v_ends <= floodgate_slice_now() THEN
        o_paid := 0;
        o_units := 0;
        RETURN;
    END IF;
    IF v_units >= p_cost THEN
        o_paid := 1;
        o_units := v_units - p_cost;
    ELSE
        o_paid := 0;
        o_units := v_units;
    END IF;
    UPDATE floodgate_global_region_slices SET units = o_units, demand = demand + p_cost
        WHERE key = p_key;
END $$;
CREATE OR REPLACE FUNCTION floodgate_slice_add(p_key text, p_units bigint, p_ttl_ms bigint,
    p_demand bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := floodgate_slice_now();
    v_units bigint;
BEGIN
    -- ttl 0: units given back, only to a slice still there, its end kept.
    IF p_ttl_ms = 0 THEN
        UPDATE floodgate_global_region_slices t SET units = t.units + p_units
            WHERE t.key = p_key AND t.ends_us > v_now RETURNING t.units INTO v_units;
        RETURN coalesce(v_units, 0);
    END IF;
    INSERT INTO floodgate_global_region_slices AS t (key, units, demand, idle, ends_us)
        VALUES (p_key, p_units, p_demand, 0, v_now + p_ttl_ms * 1000)
        ON CONFLICT (key) DO UPDATE SET
            units = CASE WHEN t.ends_us <= v_now THEN excluded.units ELSE t.units + excluded.units END,
            demand = CASE WHEN t.ends_us <= v_now THEN excluded.demand ELSE t.demand + excluded.demand END,
            idle = CASE WHEN t.ends_us <= v_now THEN 0 ELSE t.idle END,
            ends_us = excluded.ends_us
        RETURNING t.units INTO v_units;
    RETURN v_units;
END $$;
CREATE OR REPLACE FUNCTION floodgate_slice_read(p_key text,
    OUT o_units bigint, OUT o_demand bigint, OUT o_idle bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_ends bigint;
BEGIN
    SELECT s.units, s.demand, s.idle, s.ends_us INTO o_units, o_demand, o_idle, v_ends
        FROM floodgate_global_region_slices s WHERE s.key = p_key FOR UPDATE;
    IF NOT FOUND OR v_ends <= floodgate_slice_now() THEN
        o_units := 0;
        o_demand := 0;
        o_idle := 0;
        RETURN;
    END IF;
    IF o_demand = 0 THEN
        o_idle := o_idle + 1;
    ELSE
        o_idle := 0;
    END IF;
    UPDATE floodgate_global_region_slices SET demand = 0, idle = o_idle WHERE key = p_key;
END $$;
CREATE OR REPLACE FUNCTION floodgate_slice_drain(p_key text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_units bigint;
    v_ends bigint;
BEGIN
    SELECT s.units, s.ends_us INTO v_units, v_ends FROM floodgate_global_region_slices s
        WHERE s.key = p_key FOR UPDATE;
    IF NOT FOUND OR v_ends <= floodgate_slice_now() THEN
        RETURN 0;
    END IF;
    UPDATE floodgate_global_region_slices SET units = 0 WHERE key = p_key;
    RETURN v_units;
END $$;
CREATE OR REPLACE FUNCTION floodgate_slice_held(p_key text) RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce((SELECT s.units FROM floodgate_global_region_slices s
        WHERE s.key = p_key AND s.ends_us > floodgate_slice_now()), 0)
$$;
CREATE OR REPLACE FUNCTION floodgate_slice_claim(p_key text, p_ms bigint) RETURNS boolean
    LANGUAGE plpgsql AS $$
DECLARE
    v_now bigint := floodgate_slice_now();
    v_claimed boolean;
BEGIN
    INSERT INTO floodgate_global_region_claims AS c (key, ends_us) VALUES (p_key, v_now + p_ms * 1000)
        ON CONFLICT (key) DO UPDATE SET ends_us = excluded.ends_us WHERE c.ends_us <= v_now
        RETURNING true INTO v_claimed;
    RETURN coalesce(v_claimed, false);
END $$;
"#;

/// A database error as a [`LimiterError`].
fn failed(e: impl std::error::Error + Send + Sync + 'static) -> LimiterError {
    LimiterError::unavailable(Cause::from_error(e))
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Column `i` of `row`, a count (never below 0).
fn count(row: &tokio_postgres::Row, i: usize) -> Result<u64, LimiterError> {
    let v: i64 = row.try_get(i).map_err(failed)?;
    Ok(v.max(0) as u64)
}

/// A schema installed once per process (again after a failed attempt), by one caller at a time.
struct Installed {
    schema: &'static str,
    done: AtomicBool,
    installing: tokio::sync::Mutex<()>,
}

impl Installed {
    fn new(schema: &'static str) -> Installed {
        Installed {
            schema,
            done: AtomicBool::new(false),
            installing: tokio::sync::Mutex::new(()),
        }
    }

    /// Runs the schema in one transaction under an advisory lock (two instances installing at
    /// once would race on `CREATE OR REPLACE`), unless it ran already.
    async fn ensure(&self, pool: &Pool) -> Result<(), LimiterError> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let _one = self.installing.lock().await;
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let client = pool.get().await.map_err(failed)?;
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(7406451); {} COMMIT;",
                self.schema
            ))
            .await
            .map_err(failed)?;
        self.done.store(true, Ordering::Release);
        Ok(())
    }
}

/// How long past twice its `statement_timeout` a sent statement is awaited before the server is
/// taken for gone (it would have cancelled the statement and said so by then).
const STATEMENT_GRACE: Duration = Duration::from_secs(1);

/// A database holding one schema: its pool, the schema's installation, and how long a call may
/// wait (`None`: as long as the server's `statement_timeout` lets it).
struct Db {
    pool: Pool,
    installed: Installed,
    timeout: Option<Duration>,
}

impl Db {
    /// A pool of 8 connections to `url`, named `application` in `pg_stat_activity`, its
    /// statements cancelled by the server after `statement_timeout`. Fails only on a malformed
    /// URL.
    fn connect(
        url: &str,
        timeout: Duration,
        application: &str,
        statement_timeout: Duration,
        schema: &'static str,
        call_timeout: Option<Duration>,
    ) -> Result<Db, LimiterError> {
        let pool = super::pool(
            url,
            application,
            &format!("-c statement_timeout={}", statement_timeout.as_millis()),
            8,
            timeout,
        )
        .map_err(LimiterError::unavailable)?;
        Ok(Db {
            pool,
            installed: Installed::new(schema),
            timeout: call_timeout,
        })
    }

    /// One row from `sql` with `params`, the schema installed first. `timeout` bounds getting
    /// there (the schema, a connection); once the statement is sent, the server's word is
    /// awaited: it answers, or cancels the statement at its `statement_timeout` (the same
    /// length) and says so. Given up client-side, a statement the server then runs would commit
    /// a spend its caller was told failed: a unit of the budget nobody was admitted with (seen
    /// on a loaded machine: 2,998 of 3,000). [`STATEMENT_GRACE`] past it, the server is taken
    /// for gone.
    async fn one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, LimiterError> {
        let ready = async {
            self.installed.ensure(&self.pool).await?;
            self.pool.get().await.map_err(failed)
        };
        let client = match self.timeout {
            None => ready.await?,
            Some(timeout) => tokio::time::timeout(timeout, ready)
                .await
                .map_err(|_| LimiterError::Timeout(timeout))??,
        };
        let call = client.query_one(sql, params);
        match self.timeout {
            None => call.await.map_err(failed),
            Some(timeout) => {
                let wait = timeout * 2 + STATEMENT_GRACE;
                tokio::time::timeout(wait, call)
                    .await
                    .map_err(|_| LimiterError::Timeout(wait))?
                    .map_err(failed)
            }
        }
    }

    async fn prepare(&self) -> Result<(), LimiterError> {
        self.installed.ensure(&self.pool).await
    }
}

/// The global store on PostgreSQL.
pub struct PgGlobal(Db);

impl PgGlobal {
    /// A pool for `url` (connections made on demand). Fails only on a malformed URL.
    pub fn connect(url: &str, timeout: Duration) -> Result<Arc<PgGlobal>, LimiterError> {
        // A call is not cut short: a statement that runs on after its caller gave up has its
        // grant adopted late (the server cancels it after 10 s).
        let db = Db::connect(
            url,
            timeout,
            "floodgate-global",
            Duration::from_secs(10),
            GLOBAL_SCHEMA,
            None,
        )?;
        Ok(Arc::new(PgGlobal(db)))
    }
}

/// A statement's parameter, owned: a call that outlives its caller owns its parameters.
type Param = Box<dyn ToSql + Send + Sync>;

impl GlobalStore for Arc<PgGlobal> {
    fn prepare(&self) -> StoreCall<'_, ()> {
        Box::pin(async move { self.0.prepare().await })
    }

    fn take(&self, a: Take) -> OwnedCall<Taken> {
        let params: Vec<Param> = vec![
            Box::new(a.key),
            Box::new(i64::from(a.capacity)),
            Box::new(as_i64(a.interval_us)),
            Box::new(as_i64(a.need)),
            Box::new(as_i64(a.want)),
            Box::new(a.region),
            Box::new(as_i64(a.ttl_ms)),
            Box::new(as_i64(a.held)),
            Box::new(as_i64(a.window.map_or(0, |w| w.0))),
            Box::new(as_i64(a.window.map_or(0, |w| w.1))),
        ];
        let row = owned_row(
            self.clone(),
            "SELECT o_granted, o_left, o_lapsed, o_now, o_outside \
             FROM floodgate_global_take($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            params,
        );
        Box::pin(async move {
            let row = row.await?;
            Ok(Taken {
                granted: count(&row, 0)?,
                left: count(&row, 1)?,
                lapsed: count(&row, 2)?,
                now_us: count(&row, 3)?,
                outside: count(&row, 4)? == 1,
            })
        })
    }

    fn give(&self, g: Give) -> OwnedCall<u64> {
        let params: Vec<Param> = vec![
            Box::new(g.key),
            Box::new(i64::from(g.capacity)),
            Box::new(as_i64(g.interval_us)),
            Box::new(as_i64(g.units)),
            Box::new(g.region),
            Box::new(as_i64(g.window.map_or(0, |w| w.0))),
            Box::new(as_i64(g.window.map_or(0, |w| w.1))),
        ];
        let row = owned_row(
            self.clone(),
            "SELECT o_left FROM floodgate_global_give($1, $2, $3, $4, $5, $6, $7)",
            params,
        );
        Box::pin(async move { count(&row.await?, 0) })
    }
}

/// One row from `sql` with `params`, in a future that owns all it needs.
async fn owned_row(
    pg: Arc<PgGlobal>,
    sql: &'static str,
    params: Vec<Param>,
) -> Result<tokio_postgres::Row, LimiterError> {
    let refs: Vec<&(dyn ToSql + Sync)> =
        params.iter().map(|p| &**p as &(dyn ToSql + Sync)).collect();
    pg.0.one(sql, &refs).await
}

/// A region's slices on PostgreSQL.
pub struct PgSlices(Db);

impl PgSlices {
    /// A pool for `url`; every call waits at most `timeout`, the connection's checkout included
    /// (a request waits on it: the server's `statement_timeout` alone would not bound a
    /// connection that stopped answering). Fails only on a malformed URL.
    pub fn connect(url: &str, timeout: Duration) -> Result<PgSlices, LimiterError> {
        let db = Db::connect(
            url,
            timeout,
            "floodgate-region",
            timeout,
            SLICES_SCHEMA,
            Some(timeout),
        )?;
        Ok(PgSlices(db))
    }
}

impl SliceStore for PgSlices {
    fn prepare(&self) -> StoreCall<'_, ()> {
        Box::pin(async move { self.0.prepare().await })
    }

    fn spend<'a>(&'a self, key: &'a str, cost: u64) -> StoreCall<'a, (bool, u64)> {
        Box::pin(async move {
            let row = self
                .0
                .one(
                    "SELECT o_paid, o_units FROM floodgate_slice_spend($1, $2)",
                    &[&key, &as_i64(cost)],
                )
                .await?;
            Ok((count(&row, 0)? == 1, count(&row, 1)?))
        })
    }

    fn add<'a>(&'a self, key: &'a str, grant: Grant) -> StoreCall<'a, u64> {
        Box::pin(async move {
            let row = self
                .0
                .one(
                    "SELECT floodgate_slice_add($1, $2, $3, $4)",
                    &[
                        &key,
                        &as_i64(grant.units),
                        &as_i64(grant.ttl_ms),
                        &as_i64(grant.demand),
                    ],
                )
                .await?;
            count(&row, 0)
        })
    }

    fn read<'a>(&'a self, key: &'a str) -> StoreCall<'a, SliceRead> {
        Box::pin(async move {
            let row = self
                .0
                .one(
                    "SELECT o_units, o_demand, o_idle FROM floodgate_slice_read($1)",
                    &[&key],
                )
                .await?;
            Ok(SliceRead {
                units: count(&row, 0)?,
                demand: count(&row, 1)?,
                idle: count(&row, 2)?,
            })
        })
    }

    fn drain<'a>(&'a self, key: &'a str) -> StoreCall<'a, u64> {
        Box::pin(async move {
            let row = self
                .0
                .one("SELECT floodgate_slice_drain($1)", &[&key])
                .await?;
            count(&row, 0)
        })
    }

    fn held<'a>(&'a self, key: &'a str) -> StoreCall<'a, u64> {
        Box::pin(async move {
            let row = self
                .0
                .one("SELECT floodgate_slice_held($1)", &[&key])
                .await?;
            count(&row, 0)
        })
    }

    fn claim<'a>(&'a self, key: &'a str, _holder: &'a str, ms: u64) -> StoreCall<'a, bool> {
        Box::pin(async move {
            let row = self
                .0
                .one("SELECT floodgate_slice_claim($1, $2)", &[&key, &as_i64(ms)])
                .await?;
            row.try_get::<_, bool>(0).map_err(failed)
        })
    }
}
