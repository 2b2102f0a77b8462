-- floodgate limiter script, part 7 of 9: concurrency; mirrors concurrency_check in
-- src/limiter/algorithm.rs. The key is a sorted set of leases: member "{lease token}-{i}",
-- scored by the instant the lease ends. A lease that was never released (the floodgate instance
-- holding it died) stops counting when it ends; the key lives until its last lease ends.

ALGORITHMS['concurrency'] = {
  check = function(key, now, limit, lease, cost)
    read('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    local count = redis.call('ZCARD', key)
    if count + cost <= limit then
      return { 1, limit, limit - count - cost, lease, 0, 0 }, count
    end
    local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) or now
    return { 0, limit, math.max(limit - count, 0), newest - now, 1000000, 0 }, nil
  end,
  commit = function(key, now, _count, lease, cost)
    for i = 1, cost do
      redis.call('ZADD', key, fmt(now + lease), LEASE .. '-' .. i)
    end
    redis.call('PEXPIRE', key, ttl_ms(now + lease, now))
  end,
}
