-- floodgate's lease renewal script: a connection that holds its concurrency slots for its life
-- (a WebSocket's `max_connections`) moves their end to a whole lease from now, on Redis' clock.
-- KEYS[i]: a concurrency budget; ARGV[1]: the lease token; ARGV[2i]: the cost taken in KEYS[i];
-- ARGV[2i + 1]: the limit's lease (µs). A lease that already ended (its member gone) is not
-- brought back: ZADD XX only updates members that are there.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
for i = 1, #KEYS do
  local cost = tonumber(ARGV[2 * i])
  local until_us = now + tonumber(ARGV[2 * i + 1])
  local renewed = 0
  for j = 1, cost do
    -- A key of another type holds no lease of ours: nothing to renew there.
    local ok = redis.pcall('ZADD', KEYS[i], 'XX', 'CH', string.format('%.0f', until_us), ARGV[1] .. '-' .. j)
    if type(ok) == 'number' then
      renewed = renewed + ok
    end
  end
  if renewed > 0 then
    -- The key lives until its last lease ends (a second past it, as the limiter script's keys).
    local ttl = math.ceil((until_us - now) / 1000) + 1000
    if redis.call('PTTL', KEYS[i]) < ttl then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
end
return 0
