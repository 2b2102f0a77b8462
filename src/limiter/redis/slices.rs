//! Redis as a store of budgets across regions (`limiter/slices.rs`): the global store's `take`
//! and `give` (a token bucket on the server's clock, `TIME`, whose grants to regions are spends
//! and whose returns are refunds) and a region's slices (`spend`, `add`, `read`, `drain`), as Lua
//! scripts, each call one `EVALSHA` on one key.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use crate::limiter::slices::{
    Give, GlobalStore, Grant, OwnedCall, SliceRead, SliceStore, Take, Taken,
};
use crate::limiter::{Cause, LimiterError, StoreCall};

/// A Redis error as a [`LimiterError`] (the store failed, or refused what it was sent).
fn failed(e: redis::RedisError) -> LimiterError {
    LimiterError::unavailable(Cause::from_error(e))
}

/// A connection to the server at `url` (made lazily), waiting `timeout` to connect and `answer`
/// for a reply.
fn connection(
    url: &str,
    timeout: Duration,
    answer: Duration,
) -> Result<ConnectionManager, LimiterError> {
    let client = redis::Client::open(url).map_err(failed)?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(answer))
        .set_max_delay(Duration::from_secs(2))
        .set_number_of_retries(1);
    ConnectionManager::new_lazy_with_config(client, config).map_err(failed)
}

/// Loads `scripts` into the server (which also connects).
async fn load(connection: &ConnectionManager, scripts: &[&Script]) -> Result<(), LimiterError> {
    let mut connection = connection.clone();
    for script in scripts {
        script
            .prepare_invoke()
            .load_async(&mut connection)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

/// The global store on Redis.
pub struct RedisGlobal {
    connection: ConnectionManager,
    take: Arc<Script>,
    give: Arc<Script>,
}

impl RedisGlobal {
    /// Connects lazily to `url`: a call waits up to `timeout` to connect and 10 s for its
    /// answer (a late answer is still read: its grant is not lost).
    pub fn connect(url: &str, timeout: Duration) -> Result<RedisGlobal, LimiterError> {
        Ok(RedisGlobal {
            connection: connection(url, timeout, Duration::from_secs(10))?,
            take: Arc::new(Script::new(&take_script())),
            give: Arc::new(Script::new(&give_script())),
        })
    }
}

impl GlobalStore for RedisGlobal {
    fn prepare(&self) -> StoreCall<'_, ()> {
        Box::pin(async move { load(&self.connection, &[&self.take, &self.give]).await })
    }

    fn take(&self, a: Take) -> OwnedCall<Taken> {
        let (mut connection, script) = (self.connection.clone(), self.take.clone());
        Box::pin(async move {
            let answer = script
                .key(&a.key)
                .arg(a.capacity)
                .arg(a.interval_us)
                .arg(a.need)
                .arg(a.want)
                .arg(&a.region)
                .arg(a.ttl_ms)
                .arg(a.held)
                .arg(a.window.map_or(0, |w| w.0))
                .arg(a.window.map_or(0, |w| w.1))
                .invoke_async::<(u64, u64, u64, u64, u64)>(&mut connection)
                .await
                .map_err(failed)?;
            let (granted, left, lapsed, now_us, outside) = answer;
            Ok(Taken {
                granted,
                left,
                lapsed,
                now_us,
                outside: outside == 1,
            })
        })
    }

    fn give(&self, g: Give) -> OwnedCall<u64> {
        let (mut connection, script) = (self.connection.clone(), self.give.clone());
        Box::pin(async move {
            script
                .key(&g.key)
                .arg(g.capacity)
                .arg(g.interval_us)
                .arg(g.units)
                .arg(&g.region)
                .arg(g.window.map_or(0, |w| w.0))
                .arg(g.window.map_or(0, |w| w.1))
                .invoke_async::<u64>(&mut connection)
                .await
                .map_err(failed)
        })
    }
}

/// A region's slices on Redis: a hash per slice (`units`, `demand`, `idle`), its end the key's
/// expiry.
pub struct RedisSlices {
    connection: ConnectionManager,
    spend: Script,
    add: Script,
    read: Script,
    drain: Script,
}

impl RedisSlices {
    /// Connects lazily to `url`; every call waits at most `timeout`.
    pub fn connect(url: &str, timeout: Duration) -> Result<RedisSlices, LimiterError> {
        Ok(RedisSlices {
            connection: connection(url, timeout, timeout)?,
            spend: Script::new(SPEND),
            add: Script::new(ADD),
            read: Script::new(READ),
            drain: Script::new(DRAIN),
        })
    }
}

impl SliceStore for RedisSlices {
    fn prepare(&self) -> StoreCall<'_, ()> {
        Box::pin(async move {
            load(
                &self.connection,
                &[&self.spend, &self.add, &self.read, &self.drain],
            )
            .await
        })
    }

    fn spend<'a>(&'a self, key: &'a str, cost: u64) -> StoreCall<'a, (bool, u64)> {
        Box::pin(async move {
            let (paid, units): (i64, i64) = self
                .spend
                .key(key)
                .arg(cost)
                .invoke_async(&mut self.connection.clone())
                .await
                .map_err(failed)?;
            Ok((paid == 1, units.max(0) as u64))
        })
    }

    fn add<'a>(&'a self, key: &'a str, grant: Grant) -> StoreCall<'a, u64> {
        Box::pin(async move {
            self.add
                .key(key)
                .arg(grant.units)
                .arg(grant.ttl_ms)
                .arg(grant.demand)
                .invoke_async(&mut self.connection.clone())
                .await
                .map_err(failed)
        })
    }

    fn read<'a>(&'a self, key: &'a str) -> StoreCall<'a, SliceRead> {
        Box::pin(async move {
            let (units, demand, idle): (u64, u64, u64) = self
                .read
                .key(key)
                .invoke_async(&mut self.connection.clone())
                .await
                .map_err(failed)?;
            Ok(SliceRead {
                units,
                demand,
                idle,
            })
        })
    }

    fn drain<'a>(&'a self, key: &'a str) -> StoreCall<'a, u64> {
        Box::pin(async move {
            self.drain
                .key(key)
                .invoke_async(&mut self.connection.clone())
                .await
                .map_err(failed)
        })
    }

    fn held<'a>(&'a self, key: &'a str) -> StoreCall<'a, u64> {
        Box::pin(async move {
            let held: Option<u64> = self
                .connection
                .clone()
                .hget(key, "units")
                .await
                .map_err(failed)?;
            Ok(held.unwrap_or(0))
        })
    }

    fn claim<'a>(&'a self, key: &'a str, holder: &'a str, ms: u64) -> StoreCall<'a, bool> {
        Box::pin(async move {
            redis::cmd("SET")
                .arg(key)
                .arg(holder)
                .arg("NX")
                .arg("PX")
                .arg(ms.max(1))
                .query_async::<Option<String>>(&mut self.connection.clone())
                .await
                .map(|set| set.is_some())
                .map_err(failed)
        })
    }
}

/// Brings the global bucket `KEYS[1]` up to now: `tokens` refilled one unit per `interval` µs
/// up to `cap` (the remainder of an interval kept in `ts`). Sets `now`, `cap`, `interval`,
/// `tokens`, `ts`, and `w_start`, `w_end`: a windowed budget's window, the script's last two
/// arguments (0, 0 for a token bucket). A window's key is that window's alone (its start is in
/// the key) and never refills: its interval is the window's length, and it is decided only
/// while `now` is inside it.
const REFILL: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cap = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local w_start = tonumber(ARGV[#ARGV - 1])
local w_end = tonumber(ARGV[#ARGV])
local outside = w_end > 0 and (now < w_start or now >= w_end)
if w_end > 0 then interval = w_end - w_start end
local st = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(st[1])
local ts = tonumber(st[2])
if tokens == nil or ts == nil then
  tokens = cap
  ts = now
end
if now > ts then
  local add = math.floor((now - ts) / interval)
  if add > 0 then
    tokens = math.min(cap, tokens + add)
    ts = ts + add * interval
  end
  if tokens >= cap then ts = now end
end
local function save()
  redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', ts)
  -- Kept until it would be full again (a window: until it ends), and a while after (a year
  -- at most).
  local full_ms = math.ceil((cap - tokens) * interval / 1000) + 60000
  if w_end > 0 then full_ms = math.ceil((w_end - now) / 1000) + 60000 end
  redis.call('PEXPIRE', KEYS[1], math.min(full_ms, 31536000000))
end
"#;

/// `take`: ARGV cap, interval, need, want, region, ttl_ms, held, w_start, w_end. Grants `need`
/// units (a request's own, or none) and up to `want` more, at most half of what is left beyond
/// `need`; nothing when `need` cannot be met. Records the region's slice (what it holds, and its
/// end) and counts as lapsed the slices whose end passed unrenewed. Returns {granted, left,
/// lapsed, now, outside}: outside 1 (nothing touched) when `now` is not in the window.
fn take_script() -> String {
    format!(
        "{REFILL}{}",
        r#"
if outside then return {0, 0, 0, now, 1} end
local need = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local region = ARGV[5]
local ttl_ms = tonumber(ARGV[6])
local held = tonumber(ARGV[7])
local lapsed = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = all[i]
  if string.sub(f, 1, 2) == 'e:' and tonumber(all[i + 1]) * 1000 < now then
    local r = string.sub(f, 3)
    if r ~= region then
      lapsed = lapsed + (tonumber(redis.call('HGET', KEYS[1], 's:' .. r)) or 0)
    end
    redis.call('HDEL', KEYS[1], f, 's:' .. r)
  end
end
local granted = 0
if tokens >= need then
  local extra = math.min(want, math.floor((tokens - need) / 2))
  if need == 0 and extra == 0 and tokens > 0 and want > 0 then extra = 1 end
  granted = need + extra
  tokens = tokens - granted
end
local slice = held
if granted > 0 then slice = held + granted - need end
if slice > 0 then
  redis.call('HSET', KEYS[1], 's:' .. region, slice, 'e:' .. region, math.floor(now / 1000) + ttl_ms)
else
  redis.call('HDEL', KEYS[1], 's:' .. region, 'e:' .. region)
end
save()
return {granted, tokens, lapsed, now, 0}
"#
    )
}

/// `give`: ARGV cap, interval, units, region, w_start, w_end. Refunds `units` (up to the
/// capacity) and clears the region's slice; a window's units only while it lasts (once it has
/// ended they are nobody's). Returns what is left.
fn give_script() -> String {
    format!(
        "{REFILL}{}",
        r#"
if outside then return 0 end
tokens = math.min(cap, tokens + tonumber(ARGV[3]))
redis.call('HDEL', KEYS[1], 's:' .. ARGV[4], 'e:' .. ARGV[4])
save()
return tokens
"#
    )
}

/// `spend`: ARGV cost. Pays `cost` from the slice `KEYS[1]` if it holds that much; counts the
/// demand either way (an existing slice only: a missing one is not made without its ttl).
/// Returns {1 paid or 0, units left}.
const SPEND: &str = r#"
local cost = tonumber(ARGV[1])
local units = tonumber(redis.call('HGET', KEYS[1], 'units'))
if units == nil then return {0, 0} end
redis.call('HINCRBY', KEYS[1], 'demand', cost)
if units >= cost then
  return {1, redis.call('HINCRBY', KEYS[1], 'units', -cost)}
end
return {0, units}
"#;

/// `add`: ARGV units, ttl_ms, demand. Adds granted units and demand seen to the slice and
/// renews it for the ttl; with ttl 0 (units given back), only to a slice still there, its end
/// kept. Returns what it holds.
const ADD: &str = r#"
if tonumber(ARGV[2]) == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  return redis.call('HINCRBY', KEYS[1], 'units', ARGV[1])
end
local units = redis.call('HINCRBY', KEYS[1], 'units', ARGV[1])
if tonumber(ARGV[3]) > 0 then redis.call('HINCRBY', KEYS[1], 'demand', ARGV[3]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return units
"#;

/// `read`: the slice's {units, demand since the last read, passes in a row without demand};
/// the demand starts again from 0.
const READ: &str = r#"
local st = redis.call('HMGET', KEYS[1], 'units', 'demand', 'idle')
if st[1] == false then return {0, 0, 0} end
local demand = tonumber(st[2]) or 0
local idle = tonumber(st[3]) or 0
if demand == 0 then idle = idle + 1 else idle = 0 end
redis.call('HSET', KEYS[1], 'demand', 0, 'idle', idle)
return {tonumber(st[1]) or 0, demand, idle}
"#;

/// `drain`: takes every unit out of the slice (to give them back); returns how many.
const DRAIN: &str = r#"
local units = tonumber(redis.call('HGET', KEYS[1], 'units')) or 0
if units > 0 then redis.call('HSET', KEYS[1], 'units', 0) end
return units
"#;
