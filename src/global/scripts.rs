//! The Lua scripts of global budgets: in the global store, `take` and `give` (a token bucket on
//! the store's own clock, whose grants to regions are spends and whose returns are refunds);
//! in a region's store, a slice's `spend`, `add`, `read` and `drain`.

/// Brings the global bucket `KEYS[1]` up to now: `tokens` refilled one unit per `interval` µs
/// up to `cap` (the remainder of an interval kept in `ts`). Sets `now`, `cap`, `interval`,
/// `tokens`, `ts`.
const REFILL: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cap = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
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
  -- Kept until it would be full again, and a while after (a year at most).
  local full_ms = math.ceil((cap - tokens) * interval / 1000) + 60000
  redis.call('PEXPIRE', KEYS[1], math.min(full_ms, 31536000000))
end
"#;

/// `take`: ARGV cap, interval, need, want, region, ttl_ms, held. Grants `need` units (a
/// request's own, or none) and up to `want` more, at most half of what is left beyond `need`;
/// nothing when `need` cannot be met. Records the region's slice (what it holds, and its end)
/// and counts as lapsed the slices whose end passed unrenewed. Returns {granted, left, lapsed}.
pub(super) fn take() -> String {
    format!(
        "{REFILL}{}",
        r#"
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
return {granted, tokens, lapsed}
"#
    )
}

/// `give`: ARGV cap, interval, units, region. Refunds `units` (up to the capacity) and clears
/// the region's slice. Returns what is left.
pub(super) fn give() -> String {
    format!(
        "{REFILL}{}",
        r#"
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
pub(super) const SPEND: &str = r#"
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
/// renews it for the ttl. Returns what it holds.
pub(super) const ADD: &str = r#"
local units = redis.call('HINCRBY', KEYS[1], 'units', ARGV[1])
if tonumber(ARGV[3]) > 0 then redis.call('HINCRBY', KEYS[1], 'demand', ARGV[3]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return units
"#;

/// `read`: the slice's {units, demand since the last read, passes in a row without demand};
/// the demand starts again from 0.
pub(super) const READ: &str = r#"
local st = redis.call('HMGET', KEYS[1], 'units', 'demand', 'idle')
if st[1] == false then return {0, 0, 0} end
local demand = tonumber(st[2]) or 0
local idle = tonumber(st[3]) or 0
if demand == 0 then idle = idle + 1 else idle = 0 end
redis.call('HSET', KEYS[1], 'demand', 0, 'idle', idle)
return {tonumber(st[1]) or 0, demand, idle}
"#;

/// `drain`: takes every unit out of the slice (to give them back); returns how many.
pub(super) const DRAIN: &str = r#"
local units = tonumber(redis.call('HGET', KEYS[1], 'units')) or 0
if units > 0 then redis.call('HSET', KEYS[1], 'units', 0) end
return units
"#;
