-- floodgate limiter script, part 4 of 9: fixed window and calendar quota; mirror
-- fixed_window_check and quota_check in src/limiter/algorithm.rs. The key is a hash: s = the
-- window's start (a quota's: its period's end), c = count spent in it.

-- A counted window's decision (fixed window, quota; counted_window in algorithm.rs): the key's
-- count if its window is `id`, else 0; the window ending in `reset_after`.
local function counted_window(key, id, limit, cost, reset_after)
  local stored = read('HMGET', key, 's', 'c')
  local count = 0
  if tonumber(stored[1]) == id then
    count = tonumber(stored[2]) or 0
  end
  if count + cost <= limit then
    return { 1, limit, limit - count - cost, reset_after, 0, 0 }, { id, count + cost }
  end
  return { 0, limit, math.max(limit - count, 0), reset_after, reset_after, 0 }, nil
end

ALGORITHMS['fixed_window'] = {
  check = function(key, now, limit, window, cost)
    local current = now - (now % window)
    return counted_window(key, current, limit, cost, current + window - now)
  end,
  commit = function(key, now, state, window, _cost)
    redis.call('HSET', key, 's', fmt(state[1]), 'c', fmt(state[2]))
    redis.call('PEXPIRE', key, ttl_ms(state[1] + window, now))
  end,
}

-- A quota is a fixed window whose bounds floodgate takes from the calendar (src/limiter/calendar.rs):
-- `period_end` names the period and the count starts again when it changes. The time is still
-- this script's (Redis TIME).
ALGORITHMS['quota'] = {
  check = function(key, now, limit, period_end, cost)
    return counted_window(key, period_end, limit, cost, math.max(period_end - now, 1))
  end,
  commit = function(key, now, state, _period_end, _cost)
    redis.call('HSET', key, 's', fmt(state[1]), 'c', fmt(state[2]))
    redis.call('PEXPIRE', key, ttl_ms(state[1], now))
  end,
}
