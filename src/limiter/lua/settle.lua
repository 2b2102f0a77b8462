-- floodgate limiter script, entry point for settling reserved costs (`cost: {reserve, actual}`):
-- mirrors State::settle in src/limiter/algorithm.rs. Runs after the library's parts (it uses
-- gcra.lua's bucket helpers and the clock).
--
-- KEYS[i]: a budget that reserved. ARGV[1]: the time for the test clock ("-" in production);
-- ARGV[2 + 7(i-1) ..]: its algorithm name, parameter a, parameter b (a window's length, a
-- quota's period end now), b_at (a quota's period end at the reservation; b otherwise),
-- refund, charge, at (when the reserve was decided, this store's clock).
--
-- A refund counts only while what it gives back still counts (the bucket has not refilled past
-- it, the window or period is the one it was spent in); a charge always counts, past the limit
-- if need be (a debt: the next requests are refused until the budget has refilled past it).
-- Refunds and charges are cut to the limit and a debt is at most one limit (debt_capped), so
-- no figure can write a number Redis would return unreadable (Settlement::bounded, debt_capped).

-- `used` plus `charge`, never past `cap` unless it was already there.
local function debt_capped(used, charge, cap)
  return math.min(used + charge, math.max(cap, used))
end

local now = script_now(ARGV)
for i = 1, #KEYS do
  local base = 2 + 7 * (i - 1)
  local key, name = KEYS[i], ARGV[base]
  local a = tonumber(ARGV[base + 1])
  local b, b_at = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local refund = math.min(tonumber(ARGV[base + 4]), a)
  local charge = math.min(tonumber(ARGV[base + 5]), a)
  local at = tonumber(ARGV[base + 6])
  if name == 'token_bucket' then
    local tat, holds = bucket_read(key, now)
    tat = debt_capped(math.max(tat - refund * b, now), charge * b, now + 2 * a * b)
    bucket_write(key, now, tat, holds)
  elseif name == 'fixed_window' then
    local current = now - (now % b)
    local stored = read('HMGET', key, 's', 'c')
    local start, count = tonumber(stored[1]), tonumber(stored[2]) or 0
    if start == current and at - (at % b) == current then
      count = math.max(count - refund, 0)
    end
    if charge > 0 and start ~= current then
      start, count = current, 0
    end
    if start == current then
      redis.call('HSET', key, 's', fmt(start), 'c', fmt(debt_capped(count, charge, 2 * a)))
      redis.call('PEXPIRE', key, ttl_ms(start + b, now))
    end
  elseif name == 'quota' then
    local stored = read('HMGET', key, 's', 'c')
    local stored_end, count = tonumber(stored[1]), tonumber(stored[2]) or 0
    if stored_end == b_at and b_at == b then
      count = math.max(count - refund, 0)
    end
    if charge > 0 and stored_end ~= b then
      stored_end, count = b, 0
    end
    if stored_end == b then
      redis.call('HSET', key, 's', fmt(b), 'c', fmt(debt_capped(count, charge, 2 * a)))
      redis.call('PEXPIRE', key, ttl_ms(b, now))
    end
  elseif name == 'sliding_window_counter' then
    local current, curr, prev = counter_read(key, now, b)
    local reserved_in = at - (at % b)
    if reserved_in == current then
      curr = math.max(curr - refund, 0)
    elseif reserved_in + b == current then
      prev = math.max(prev - refund, 0)
    end
    curr = debt_capped(curr, charge, 2 * a)
    redis.call('HSET', key, 's', fmt(current), 'c', fmt(curr), 'p', fmt(prev))
    redis.call('PEXPIRE', key, ttl_ms(current + 2 * b, now))
  end
end
return now
