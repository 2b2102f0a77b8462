//! `cache.shared` on PostgreSQL: one row of `floodgate_cache` per entry and variant (see
//! `schema.sql`), stamped and kept on the database's clock. Every write deletes a few rows past
//! their time, so the table holds about what is live.

use super::PostgresStore;
use crate::limiter::LimiterError;
use crate::limiter::store::{CacheScope, CacheVariant, CacheWrite};

/// Each live variant as the 8 bytes of how long ago it was written (µs) and its bytes.
const READ: &str = "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint AS us) \
  SELECT coalesce(array_agg(int8send(greatest((SELECT us FROM now) - stored_us, 0)) || value), '{}') \
  FROM floodgate_cache WHERE key = $1 AND until_us > (SELECT us FROM now)";

const WRITE: &str = "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint AS us), \
  gone AS (DELETE FROM floodgate_cache WHERE ctid = ANY(ARRAY( \
    SELECT ctid FROM floodgate_cache WHERE until_us < (SELECT us FROM now) LIMIT 16))), \
  w AS (INSERT INTO floodgate_cache (key, variant, route, host, path, query, stored_us, until_us, value) \
    VALUES ($1, $2, $3, $4, $5, $6, (SELECT us FROM now), (SELECT us FROM now) + $7, $8) \
    ON CONFLICT (key, variant) DO UPDATE SET route = excluded.route, host = excluded.host, \
      path = excluded.path, query = excluded.query, stored_us = excluded.stored_us, \
      until_us = excluded.until_us, value = excluded.value RETURNING 1) \
  SELECT count(*) FROM w";

/// `$2`: route, path, prefix or uri.
const REMOVE: &str = "WITH gone AS (DELETE FROM floodgate_cache WHERE route = $1 AND CASE $2 \
    WHEN 'route' THEN true \
    WHEN 'path' THEN path = $3 \
    WHEN 'prefix' THEN starts_with(path, $3) \
    ELSE host = $4 AND path = $3 AND query IS NOT DISTINCT FROM $5 END RETURNING 1) \
  SELECT count(*) FROM gone";

impl PostgresStore {
    pub(super) async fn read_cached(&self, key: &str) -> Result<Vec<CacheVariant>, LimiterError> {
        let key = format!("{}{key}", self.prefix);
        let rows: Vec<Vec<u8>> = self.db.query(READ, &[&key]).await?;
        Ok(rows
            .into_iter()
            .filter(|row| row.len() >= 8)
            .map(|mut row| {
                let bytes = row.split_off(8);
                let elapsed = i64::from_be_bytes(row.try_into().unwrap_or([0; 8]));
                CacheVariant {
                    elapsed_us: u64::try_from(elapsed).unwrap_or(0),
                    bytes,
                }
            })
            .collect())
    }

    pub(super) async fn write_cached(&self, write: CacheWrite<'_>) -> Result<(), LimiterError> {
        let key = format!("{}{}", self.prefix, write.key);
        let route = format!("{}{}", self.prefix, write.route);
        let keep = i64::try_from(write.keep_us).unwrap_or(i64::MAX);
        let _: i64 = self
            .db
            .query(
                WRITE,
                &[
                    &key,
                    &write.variant,
                    &route,
                    &write.host,
                    &write.path,
                    &write.query,
                    &keep,
                    &write.bytes,
                ],
            )
            .await?;
        Ok(())
    }

    pub(super) async fn remove_cached(
        &self,
        route: &str,
        scope: CacheScope<'_>,
    ) -> Result<(), LimiterError> {
        let route = format!("{}{route}", self.prefix);
        let (mode, path, host, query) = match scope {
            CacheScope::Route => ("route", "", "", None),
            CacheScope::Path(p) => ("path", p, "", None),
            CacheScope::Prefix(p) => ("prefix", p, "", None),
            CacheScope::Uri { host, path, query } => ("uri", path, host, query),
        };
        let _: i64 = self
            .db
            .query(REMOVE, &[&route, &mode, &path, &host, &query])
            .await?;
        Ok(())
    }
}
