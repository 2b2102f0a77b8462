//! PostgreSQL as the global store: the same two operations as the Redis scripts (`take`,
//! `give`), as PL/pgSQL functions on the database's clock (`clock_timestamp()`), a budget's row
//! locked for each call. Installed (idempotently) in the background at start and again after a
//! call finds them missing, so floodgate starts while the database is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;

/// The tables and functions: a budget's tokens and the instant they were counted at, and each
/// region's slice (units as last reported, its end), as the Redis hash keeps them.
const SCHEMA: &str = r#"
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
CREATE OR REPLACE FUNCTION floodgate_global_take(p_key text, p_cap bigint, p_interval bigint,
    p_need bigint, p_want bigint, p_region text, p_ttl_ms bigint, p_held bigint,
    OUT o_granted bigint, OUT o_left bigint, OUT o_lapsed bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_ts bigint;
    v_now bigint;
    v_extra bigint;
    v_slice bigint;
BEGIN
    SELECT r.o_tokens, r.o_ts, r.o_now INTO o_left, v_ts, v_now
        FROM floodgate_global_refill(p_key, p_cap, p_interval) r;
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
    p_units bigint, p_region text, OUT o_left bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_ts bigint;
    v_now bigint;
BEGIN
    SELECT r.o_tokens, r.o_ts, r.o_now INTO o_left, v_ts, v_now
        FROM floodgate_global_refill(p_key, p_cap, p_interval) r;
    o_left := least(p_cap, o_left + p_units);
    DELETE FROM floodgate_global_slices s WHERE s.key = p_key AND s.region = p_region;
    UPDATE floodgate_global_budgets SET tokens = o_left, ts = v_ts WHERE key = p_key;
END $$;
"#;

/// The global store on PostgreSQL.
pub(super) struct PgGlobal {
    pool: Pool,
    installed: AtomicBool,
    /// One installation at a time.
    installing: tokio::sync::Mutex<()>,
}

impl PgGlobal {
    /// A pool for `url` (connections made on demand). Fails only on a malformed URL.
    pub(super) fn connect(url: &str, timeout: Duration) -> anyhow::Result<Arc<PgGlobal>> {
        // (A statement runs on after its caller gave up: its grant is adopted late.)
        let pool = pool(url, timeout, "floodgate-global", Duration::from_secs(10))?;
        Ok(Arc::new(PgGlobal {
            pool,
            installed: AtomicBool::new(false),
            installing: tokio::sync::Mutex::new(()),
        }))
    }

    /// Installs the schema, once it has not been (`Err` while the database does not answer).
    pub(super) async fn install(&self) -> Result<(), String> {
        if self.installed.load(Ordering::Acquire) {
            return Ok(());
        }
        let _one = self.installing.lock().await;
        if self.installed.load(Ordering::Acquire) {
            return Ok(());
        }
        install(&self.pool, SCHEMA).await?;
        self.installed.store(true, Ordering::Release);
        Ok(())
    }

    /// `take` (see the Redis script's docs): (granted, left, lapsed).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn take(
        &self,
        key: &str,
        cap: u32,
        interval_us: u64,
        need: u64,
        want: u64,
        region: &str,
        ttl_ms: u64,
        held: u64,
    ) -> Result<(u64, u64, u64), String> {
        self.install().await?;
        let client = self.pool.get().await.map_err(|e| e.to_string())?;
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let row = client
            .query_one(
                "SELECT o_granted, o_left, o_lapsed FROM floodgate_global_take($1, $2, $3, $4, $5, $6, $7, $8)",
                &[
                    &key,
                    &i64::from(cap),
                    &as_i64(interval_us),
                    &as_i64(need),
                    &as_i64(want),
                    &region,
                    &as_i64(ttl_ms),
                    &as_i64(held),
                ],
            )
            .await
            .map_err(|e| e.to_string())?;
        let get = |i: usize| -> Result<u64, String> {
            let v: i64 = row.try_get(i).map_err(|e| e.to_string())?;
            Ok(v.max(0) as u64)
        };
        Ok((get(0)?, get(1)?, get(2)?))
    }

    /// `give`: refunds `units` and clears the region's slice; what is left.
    pub(super) async fn give(
        &self,
        key: &str,
        cap: u32,
        interval_us: u64,
        units: u64,
        region: &str,
    ) -> Result<u64, String> {
        self.install().await?;
        let client = self.pool.get().await.map_err(|e| e.to_string())?;
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let row = client
            .query_one(
                "SELECT o_left FROM floodgate_global_give($1, $2, $3, $4, $5)",
                &[
                    &key,
                    &i64::from(cap),
                    &as_i64(interval_us),
                    &as_i64(units),
                    &region,
                ],
            )
            .await
            .map_err(|e| e.to_string())?;
        let left: i64 = row.try_get(0).map_err(|e| e.to_string())?;
        Ok(left.max(0) as u64)
    }
}

/// A pool for `url` (8 connections, made on demand), named `application` in
/// `pg_stat_activity`, its statements cancelled by the server after `statement_timeout`. Fails
/// only on a malformed URL.
pub(super) fn pool(
    url: &str,
    timeout: Duration,
    application: &str,
    statement_timeout: Duration,
) -> anyhow::Result<Pool> {
    crate::limiter::postgres::pool(
        url,
        application,
        &format!("-c statement_timeout={}", statement_timeout.as_millis()),
        8,
        timeout,
    )
    .map_err(|e| anyhow::anyhow!(e))
}

/// Runs `schema` in one transaction under an advisory lock (two instances installing at once
/// would race on `CREATE OR REPLACE`).
pub(super) async fn install(pool: &Pool, schema: &str) -> Result<(), String> {
    let client = pool.get().await.map_err(|e| e.to_string())?;
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(7406451); {schema} COMMIT;"
        ))
        .await
        .map_err(|e| e.to_string())
}
