-- floodgate limiter script, part 6 of 9: sliding window counter; mirrors sliding_counter_check
-- in src/limiter/algorithm.rs, with the same floating-point operations in the same order. The
-- key is a hash: s = current window start, c = its count, p = the previous window's count.

-- The counter's counts brought to the window holding `now` (roll_counter in algorithm.rs):
-- the window starting at `current`, its count and the previous window's.
local function counter_read(key, now, window)
  local current = now - (now % window)
  local stored = read('HMGET', key, 's', 'c', 'p')
  local start = tonumber(stored[1]) or 0
  local curr = tonumber(stored[2]) or 0
  local prev = tonumber(stored[3]) or 0
  if start ~= current then
    if start + window == current then
      prev = curr
    else
      prev = 0
    end
    curr = 0
  end
  return current, curr, prev
end

ALGORITHMS['sliding_window_counter'] = {
  check = function(key, now, limit, window, cost)
    local current, curr, prev = counter_read(key, now, window)
    local elapsed = now - current
    local w = window
    local estimate = prev * (window - elapsed) / w + curr
    local allowed = estimate + cost <= limit
    local spent = estimate
    local spent_now = 0
    if allowed then
      spent = estimate + cost
      spent_now = cost
    end
    local reset_after = 0
    if curr + spent_now > 0 then
      reset_after = current + 2 * window - now
    elseif prev > 0 then
      reset_after = current + window - now
    end
    local retry_after = 0
    if not allowed then
      if curr + cost <= limit then
        local t = math.ceil(w - (limit - curr - cost) * w / prev)
        retry_after = math.max(t - elapsed, 1)
      else
        local t = math.max(math.ceil(w - (limit - cost) * w / curr), 0)
        retry_after = window - elapsed + t
      end
    end
    local decision = { (allowed and 1) or 0, limit, math.max(math.floor(limit - spent), 0), reset_after, retry_after, 0 }
    return decision, { current, curr + cost, prev }
  end,
  commit = function(key, now, state, window, _cost)
    redis.call('HSET', key, 's', fmt(state[1]), 'c', fmt(state[2]), 'p', fmt(state[3]))
    redis.call('PEXPIRE', key, ttl_ms(state[1] + 2 * window, now))
  end,
}
