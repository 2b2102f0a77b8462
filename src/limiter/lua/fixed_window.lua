-- floodgate limiter script, part 4 of 9: fixed window; mirrors fixed_window_check in
-- src/limiter/algorithm.rs. The key is a hash: s = window start, c = count spent in it.

ALGORITHMS['fixed_window'] = {
  check = function(key, now, limit, window, cost)
    local current = now - (now % window)
    local stored = read('HMGET', key, 's', 'c')
    local count = 0
    if tonumber(stored[1]) == current then
      count = tonumber(stored[2]) or 0
    end
    local reset_after = current + window - now
    if count + cost <= limit then
      return { 1, limit, limit - count - cost, reset_after, 0, 0 }, { current, count + cost }
    end
    return { 0, limit, limit - count, reset_after, reset_after, 0 }, nil
  end,
  commit = function(key, now, state, window, _cost)
    redis.call('HSET', key, 's', fmt(state[1]), 'c', fmt(state[2]))
    redis.call('PEXPIRE', key, ttl_ms(state[1] + window, now))
  end,
}
