//! A region's store of slices: Redis (the scripts in `scripts.rs`) or PostgreSQL (the same
//! operations as PL/pgSQL functions on the database's clock). A slice is a row or hash with
//! `units`, `demand` (units asked since the keeper's last read), `idle` (the keeper's passes in
//! a row without demand) and an end, after which it is as if it were not there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use super::scripts;

pub(super) enum RegionStore {
    Redis {
        connection: ConnectionManager,
        spend: Script,
        add: Script,
        read: Script,
        drain: Script,
    },
    Postgres(PgRegion),
}

impl RegionStore {
    /// Connects lazily to the region's store at `url`: `redis://`/`rediss://`, or
    /// `postgres://`/`postgresql://`.
    pub(super) fn connect(url: &str, timeout: Duration) -> anyhow::Result<RegionStore> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(RegionStore::Postgres(PgRegion::connect(url, timeout)?));
        }
        Ok(RegionStore::Redis {
            connection: super::redis_connection(url, timeout, timeout)?,
            spend: Script::new(scripts::SPEND),
            add: Script::new(scripts::ADD),
            read: Script::new(scripts::READ),
            drain: Script::new(scripts::DRAIN),
        })
    }

    /// Loads the scripts or installs the functions.
    pub(super) async fn prepare(&self) -> Result<(), String> {
        match self {
            RegionStore::Redis {
                connection,
                spend,
                add,
                read,
                drain,
            } => super::load_scripts(connection, &[spend, add, read, drain]).await,
            RegionStore::Postgres(pg) => pg.install().await,
        }
    }

    /// Pays `cost` from the slice if it holds that much, counting the demand either way:
    /// (paid, units left).
    pub(super) async fn spend(&self, key: &str, cost: u64) -> Result<(bool, u64), String> {
        match self {
            RegionStore::Redis {
                connection, spend, ..
            } => {
                let (paid, units): (i64, i64) = spend
                    .key(key)
                    .arg(cost)
                    .invoke_async(&mut connection.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((paid == 1, units.max(0) as u64))
            }
            RegionStore::Postgres(pg) => {
                let row = pg
                    .one(
                        "SELECT o_paid, o_units FROM floodgate_slice_spend($1, $2)",
                        &[&key, &as_i64(cost)],
                    )
                    .await?;
                Ok((get(&row, 0)? == 1, get(&row, 1)?))
            }
        }
    }

    /// Adds granted `units` and `demand` to the slice and renews it for `ttl_ms`: what it holds.
    pub(super) async fn add(
        &self,
        key: &str,
        units: u64,
        ttl_ms: u64,
        demand: u64,
    ) -> Result<u64, String> {
        match self {
            RegionStore::Redis {
                connection, add, ..
            } => add
                .key(key)
                .arg(units)
                .arg(ttl_ms)
                .arg(demand)
                .invoke_async(&mut connection.clone())
                .await
                .map_err(|e| e.to_string()),
            RegionStore::Postgres(pg) => {
                let row = pg
                    .one(
                        "SELECT floodgate_slice_add($1, $2, $3, $4)",
                        &[&key, &as_i64(units), &as_i64(ttl_ms), &as_i64(demand)],
                    )
                    .await?;
                get(&row, 0)
            }
        }
    }

    /// The slice's (units, demand since the last read, passes without demand); the demand
    /// starts again from 0.
    pub(super) async fn read(&self, key: &str) -> Result<(u64, u64, u64), String> {
        match self {
            RegionStore::Redis {
                connection, read, ..
            } => read
                .key(key)
                .invoke_async(&mut connection.clone())
                .await
                .map_err(|e| e.to_string()),
            RegionStore::Postgres(pg) => {
                let row = pg
                    .one(
                        "SELECT o_units, o_demand, o_idle FROM floodgate_slice_read($1)",
                        &[&key],
                    )
                    .await?;
                Ok((get(&row, 0)?, get(&row, 1)?, get(&row, 2)?))
            }
        }
    }

    /// Takes every unit out of the slice (to give them back): how many.
    pub(super) async fn drain(&self, key: &str) -> Result<u64, String> {
        match self {
            RegionStore::Redis {
                connection, drain, ..
            } => drain
                .key(key)
                .invoke_async(&mut connection.clone())
                .await
                .map_err(|e| e.to_string()),
            RegionStore::Postgres(pg) => {
                let row = pg.one("SELECT floodgate_slice_drain($1)", &[&key]).await?;
                get(&row, 0)
            }
        }
    }

    /// What the slice holds, changing nothing.
    pub(super) async fn held(&self, key: &str) -> Result<u64, String> {
        match self {
            RegionStore::Redis { connection, .. } => {
                let held: Option<u64> = connection
                    .clone()
                    .hget(key, "units")
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(held.unwrap_or(0))
            }
            RegionStore::Postgres(pg) => {
                let row = pg.one("SELECT floodgate_slice_held($1)", &[&key]).await?;
                get(&row, 0)
            }
        }
    }

    /// Claims `key` for `ms` (one instance of the region renews a slice each pass): true when
    /// this instance has it.
    pub(super) async fn claim(&self, key: &str, holder: &str, ms: u64) -> Result<bool, String> {
        match self {
            RegionStore::Redis { connection, .. } => redis::cmd("SET")
                .arg(key)
                .arg(holder)
                .arg("NX")
                .arg("PX")
                .arg(ms.max(1))
                .query_async::<Option<String>>(&mut connection.clone())
                .await
                .map(|set| set.is_some())
                .map_err(|e| e.to_string()),
            RegionStore::Postgres(pg) => {
                let row = pg
                    .one("SELECT floodgate_slice_claim($1, $2)", &[&key, &as_i64(ms)])
                    .await?;
                row.try_get::<_, bool>(0).map_err(|e| e.to_string())
            }
        }
    }
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn get(row: &tokio_postgres::Row, i: usize) -> Result<u64, String> {
    let v: i64 = row.try_get(i).map_err(|e| e.to_string())?;
    Ok(v.max(0) as u64)
}

/// The slices and the keepers' claims, and the functions on them (`now` is the database's
/// clock, in µs).
const SCHEMA: &str = r#"
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

/// The region's store on PostgreSQL.
pub(super) struct PgRegion {
    pool: deadpool_postgres::Pool,
    /// One call, the connection's checkout included (a request waits on it: the server's
    /// `statement_timeout` alone would not bound a connection that stopped answering).
    timeout: Duration,
    installed: AtomicBool,
    installing: tokio::sync::Mutex<()>,
}

impl PgRegion {
    fn connect(url: &str, timeout: Duration) -> anyhow::Result<PgRegion> {
        Ok(PgRegion {
            pool: super::postgres::pool(url, timeout, "floodgate-region", timeout)?,
            timeout,
            installed: AtomicBool::new(false),
            installing: tokio::sync::Mutex::new(()),
        })
    }

    async fn install(&self) -> Result<(), String> {
        if self.installed.load(Ordering::Acquire) {
            return Ok(());
        }
        let _one = self.installing.lock().await;
        if self.installed.load(Ordering::Acquire) {
            return Ok(());
        }
        super::postgres::install(&self.pool, SCHEMA).await?;
        self.installed.store(true, Ordering::Release);
        Ok(())
    }

    async fn one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, String> {
        let call = async {
            self.install().await?;
            let client = self.pool.get().await.map_err(|e| e.to_string())?;
            client
                .query_one(sql, params)
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
    }
}
