-- floodgate limiter script, part 3 of 9: leaky bucket. The same GCRA arithmetic as the token
-- bucket (gcra.lua), but the admitted request's wait (`delay`) is kept: the proxy holds the
-- request that long, so the upstream sees at most `leak_rate` per second. Never leased, so it
-- keeps no holds (a key holding a token bucket's holds, after a reload changed the algorithm,
-- reads as a fresh bucket).

ALGORITHMS['leaky_bucket'] = {
  check = function(key, now, capacity, interval, cost)
    return gcra_check(tonumber(read('GET', key)) or 0, now, capacity, interval, cost)
  end,
  commit = function(key, now, new_tat, _interval, _cost)
    redis.call('SET', key, fmt(new_tat), 'PX', ttl_ms(new_tat, now))
  end,
}
