//! `cache.shared` on Redis: each cache entry a hash (one field per variant, its value the
//! instant Redis wrote it and the entry's bytes), kept as long as its longest-kept variant.
//! Removals find entries through two indexes, both beside the entries in the route's slot (the
//! hash tag `{cache:ROUTE}`, so one script reaches them on Redis Cluster too): a sorted set of
//! the route's entries by where they sit (host, path, query), scored by when they expire (what
//! a purge walks; members past their expiry are dropped at every write), and a set per URI
//! (what an unsafe method's invalidation removes, without walking the route).

use sha2::{Digest, Sha256};

use super::RedisStore;
use crate::limiter::store::{CacheScope, CacheVariant, CacheWrite};
use crate::limiter::{LimiterError, hex};

/// The variants of an entry, each with how long ago (µs, on Redis's clock) it was written.
const READ: &str = "local t = redis.call('TIME') \
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
  local all = redis.call('HGETALL', KEYS[1]) \
  local out = {} \
  for i = 2, #all, 2 do \
    local v = all[i] \
    local nl = string.find(v, '\\n', 1, true) \
    if nl then \
      out[#out + 1] = string.format('%.0f', math.max(0, now - tonumber(string.sub(v, 1, nl - 1)))) \
      out[#out + 1] = string.sub(v, nl + 1) \
    end \
  end \
  return out";

/// KEYS: the entry, the route's index, the URI's set. ARGV: the variant, the bytes, how long
/// to keep them (ms), the index member.
const WRITE: &str = "local t = redis.call('TIME') \
  local stamp = t[1] .. string.format('%06d', tonumber(t[2])) \
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
  local keep = tonumber(ARGV[3]) \
  redis.call('HSET', KEYS[1], ARGV[1], stamp .. '\\n' .. ARGV[2]) \
  for _, k in ipairs({KEYS[1], KEYS[3]}) do \
    if k == KEYS[3] then redis.call('SADD', k, KEYS[1]) end \
    if redis.call('PTTL', k) < keep then redis.call('PEXPIRE', k, keep) end \
  end \
  local old = redis.call('ZSCORE', KEYS[2], ARGV[4]) \
  if not old or tonumber(old) < ms + keep then redis.call('ZADD', KEYS[2], ms + keep, ARGV[4]) end \
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ms) \
  if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end \
  return 1";

/// KEYS: the route's index. ARGV: `route`, `path` or `prefix`, and the path. Members are
/// `host \0 path \0 query \0 entry`.
const PURGE: &str = "local n = 0 \
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do \
    local a = string.find(m, '\\0', 1, true) \
    local b = a and string.find(m, '\\0', a + 1, true) \
    local c = b and string.find(m, '\\0', b + 1, true) \
    if c then \
      local path = string.sub(m, a + 1, b - 1) \
      local mode = ARGV[1] \
      if mode == 'route' or (mode == 'path' and path == ARGV[2]) \
         or (mode == 'prefix' and string.sub(path, 1, #ARGV[2]) == ARGV[2]) then \
        n = n + redis.call('DEL', string.sub(m, c + 1)) \
        redis.call('ZREM', KEYS[1], m) \
      end \
    end \
  end \
  return n";

/// KEYS: the URI's set.
const INVALIDATE: &str = "local n = 0 \
  for _, e in ipairs(redis.call('SMEMBERS', KEYS[1])) do n = n + redis.call('DEL', e) end \
  redis.call('DEL', KEYS[1]) \
  return n";

/// The query as the index writes it: absent and empty kept apart.
fn query_text(query: Option<&str>) -> String {
    query.map_or(String::new(), |q| format!("?{q}"))
}

impl RedisStore {
    /// The names of `route`'s cache keys share its hash tag.
    fn cache_name(&self, route: &str, rest: &str) -> String {
        format!("{}{{cache:{route}}}:{rest}", self.prefix)
    }

    fn uri_set(&self, route: &str, host: &str, path: &str, query: Option<&str>) -> String {
        let mut hash = Sha256::new();
        for part in [host, path, &query_text(query)] {
            hash.update(part.as_bytes());
            hash.update([0]);
        }
        let digest = hash.finalize();
        self.cache_name(route, &format!("uri:{}", hex(&digest[..16])))
    }

    pub(super) async fn read_cached(
        &self,
        route: &str,
        key: &str,
    ) -> Result<Vec<CacheVariant>, LimiterError> {
        let name = self.cache_name(route, &format!("e:{key}"));
        let reply: Vec<Vec<u8>> = self
            .query(redis::cmd("EVAL").arg(READ).arg(1).arg(&name))
            .await?;
        let mut variants = Vec::with_capacity(reply.len() / 2);
        let mut pairs = reply.into_iter();
        while let (Some(elapsed), Some(bytes)) = (pairs.next(), pairs.next()) {
            let elapsed_us = std::str::from_utf8(&elapsed)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or_else(|| LimiterError::unavailable("a cache entry's time is not a number"))?;
            variants.push(CacheVariant { elapsed_us, bytes });
        }
        Ok(variants)
    }

    pub(super) async fn write_cached(&self, write: CacheWrite<'_>) -> Result<(), LimiterError> {
        let entry = self.cache_name(write.route, &format!("e:{}", write.key));
        let index = self.cache_name(write.route, "index");
        let uri = self.uri_set(write.route, write.host, write.path, write.query);
        let member = format!(
            "{}\0{}\0{}\0{entry}",
            write.host,
            write.path,
            query_text(write.query)
        );
        let keep_ms = write.keep_us.div_ceil(1000).max(1);
        let _: i64 = self
            .query(
                redis::cmd("EVAL")
                    .arg(WRITE)
                    .arg(3)
                    .arg(&entry)
                    .arg(&index)
                    .arg(&uri)
                    .arg(write.variant)
                    .arg(write.bytes)
                    .arg(keep_ms)
                    .arg(&member),
            )
            .await?;
        Ok(())
    }

    pub(super) async fn remove_cached(
        &self,
        route: &str,
        scope: CacheScope<'_>,
    ) -> Result<(), LimiterError> {
        let mut cmd = redis::cmd("EVAL");
        match scope {
            CacheScope::Uri { host, path, query } => {
                cmd.arg(INVALIDATE)
                    .arg(1)
                    .arg(self.uri_set(route, host, path, query));
            }
            CacheScope::Route | CacheScope::Path(_) | CacheScope::Prefix(_) => {
                let (mode, path) = match scope {
                    CacheScope::Path(p) => ("path", p),
                    CacheScope::Prefix(p) => ("prefix", p),
                    _ => ("route", ""),
                };
                cmd.arg(PURGE)
                    .arg(1)
                    .arg(self.cache_name(route, "index"))
                    .arg(mode)
                    .arg(path);
            }
        }
        let _: i64 = self.query(&cmd).await?;
        Ok(())
    }
}
