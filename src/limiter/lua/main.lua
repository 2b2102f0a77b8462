-- floodgate limiter script, part 7 of 7: one decision over all the limits of a route,
-- all-or-nothing, in one round trip.
--
-- KEYS[i]: the state of limit i (all share one {hash tag}, so one Redis Cluster slot).
-- ARGV[1]: "-" to read the time from Redis TIME (always, in production); a microsecond count
--          only in floodgate's differential tests, which drive the script on a fake clock.
-- ARGV[2 + 4(i-1) ..]: limit i as algorithm name, parameter a, parameter b, cost, where (a, b) is
--          (capacity, interval µs) for the buckets and (limit, window µs) for the windows.
-- Reply: { allowed, now_us, then per limit: allowed, limit, remaining, reset_after_us,
--          retry_after_us, delay_us }.

local now
if ARGV[1] == '-' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
  ttl_slack_ms = 3600000
end

local n = #KEYS
local decisions = {}
local states = {}
local all = 1
for i = 1, n do
  local base = 2 + 4 * (i - 1)
  local algorithm = ALGORITHMS[ARGV[base]]
  if algorithm == nil then
    return redis.error_reply('floodgate: unknown algorithm ' .. tostring(ARGV[base]))
  end
  local d, state = algorithm.check(KEYS[i], now, tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]),
    tonumber(ARGV[base + 3]))
  decisions[i] = d
  states[i] = state
  if d[1] == 0 then
    all = 0
  end
end

-- Nothing is spent from any limit unless every limit allowed.
if all == 1 then
  for i = 1, n do
    local base = 2 + 4 * (i - 1)
    local name = ARGV[base]
    local b = tonumber(ARGV[base + 2])
    local cost = tonumber(ARGV[base + 3])
    if name == 'sliding_window_log' then
      ALGORITHMS[name].commit(KEYS[i], now, states[i], b, cost)
    else
      ALGORITHMS[name].commit(KEYS[i], now, states[i], b)
    end
  end
end

local reply = { all, now }
for i = 1, n do
  for j = 1, 6 do
    reply[#reply + 1] = decisions[i][j]
  end
end
return reply
