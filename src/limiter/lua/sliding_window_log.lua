-- floodgate limiter script, part 5 of 9: sliding window log; mirrors sliding_log_check in
-- src/limiter/algorithm.rs. The key is a sorted set: one member per admitted unit of cost,
-- scored by its timestamp. Denied requests are not added, so it never holds more than `limit`.
--
-- Leased units (decide.lua, src/limiter/lease.rs) are added when leased, stamped with the lease's
-- end: the instance holding them spends each between the grant and that end, so every entry
-- counts from before its request was admitted until a window after it, and no window of admitted
-- requests can ever hold more than `limit`. They are named after the grant's time, so that
-- unspent ones can be given back (if two leases share a grant time and so a stamp, a give-back
-- may take the other's entries: entries of one stamp expire together, so the log is the same).

-- The name prefix of the entries leased at `at`.
local function log_lease_prefix(at)
  return 'l' .. fmt(at) .. '-'
end

ALGORITHMS['sliding_window_log'] = {
  check = function(key, now, limit, window, cost)
    -- An entry stamped ts stops counting at ts + window.
    read('ZREMRANGEBYSCORE', key, '-inf', fmt(now - window))
    local count = redis.call('ZCARD', key)
    if count + cost <= limit then
      return { 1, limit, limit - count - cost, window, 0, 0 }, count
    end
    -- The retry passes once the oldest count + cost - limit entries have expired.
    local needed = count + cost - limit
    local freeing = tonumber(redis.call('ZRANGE', key, needed - 1, needed - 1, 'WITHSCORES')[2]) or now
    local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) or now
    return { 0, limit, math.max(limit - count, 0), math.max(newest + window - now, 0),
      math.max(freeing + window - now, 1), 0 }, nil
  end,
  -- `leased` of the `cost` units are a lease's, stamped `lease_end` (decide.lua; 0 otherwise).
  commit = function(key, now, count, window, cost, leased, lease_end)
    leased = leased or 0
    -- Members must be unique, or an entry replaces another and an admission goes uncounted.
    -- They are numbered from the count, but within one microsecond (one batch) a give-back
    -- can lower the count below a number already taken: ZADD NX skips to the next free one.
    local n = count
    local function add(score, prefix)
      repeat
        n = n + 1
      until redis.call('ZADD', key, 'NX', score, prefix .. n) == 1
    end
    for _ = 1, cost - leased do
      add(fmt(now), fmt(now) .. '-')
    end
    for _ = cost - leased + 1, cost do
      add(fmt(lease_end), log_lease_prefix(now))
    end
    local newest = now
    if leased > 0 then
      newest = math.max(now, lease_end)
    end
    redis.call('PEXPIRE', key, ttl_ms(newest + window, now))
  end,
}
