-- floodgate limiter script, part 2 of 9: token bucket and leaky bucket (GCRA); mirrors
-- gcra_check in src/limiter/algorithm.rs.
--
-- The key holds `tat`, the instant the bucket is full again (token bucket) or its queue has
-- drained (leaky bucket). The key lives until then: an absent key is a full bucket.

local function gcra_check(key, now, capacity, interval, cost)
  local tat = tonumber(read('GET', key)) or 0
  if tat < now then
    tat = now
  end
  local burst = capacity * interval
  local new_tat = tat + cost * interval
  if new_tat - now <= burst then
    return { 1, capacity, math.floor((burst - (new_tat - now)) / interval), new_tat - now, 0, tat - now }, new_tat
  end
  return { 0, capacity, math.floor(math.max(burst - (tat - now), 0) / interval), tat - now, new_tat - now - burst, 0 }, nil
end

-- Every algorithm's commit takes (key, now, state from check, parameter b, cost); GCRA needs
-- only the new tat.
local function gcra_commit(key, now, new_tat, _interval, _cost)
  redis.call('SET', key, fmt(new_tat), 'PX', ttl_ms(new_tat, now))
end

ALGORITHMS['token_bucket'] = {
  check = function(key, now, capacity, interval, cost)
    local d, state = gcra_check(key, now, capacity, interval, cost)
    d[6] = 0 -- a token bucket never delays
    return d, state
  end,
  commit = gcra_commit,
}
