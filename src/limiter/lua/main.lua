-- floodgate limiter script, part 9 of 9: one decision over all the limits of a route,
-- all-or-nothing, in one round trip.
--
-- KEYS[i]: the state of limit i. On Redis Cluster they must share one slot (see redis.rs).
-- ARGV[1]: the time in µs for the test clock (clock_test.lua); "-" and unread in production.
-- ARGV[2]: the request's lease token, naming its concurrency leases; "-" to peek: decide and
--          reply as usual, but spend nothing (floodgate's /budgets endpoint).
-- ARGV[3 + 4(i-1) ..]: limit i as algorithm name, parameter a, parameter b, cost, where (a, b) is
--          (capacity, interval µs) for the buckets and (limit, window µs) for the windows.
-- Reply (REPLY_HEADER and REPLY_FIELDS in wire.rs): { allowed, now_us, then per limit: allowed,
--          limit, remaining, reset_after_us, retry_after_us, delay_us }.

-- ARGV is passed on: a function library (FCALL) has no global ARGV, only this chunk's argument.
local now = script_now(ARGV)
LEASE = ARGV[2]

local n = #KEYS
local decisions = {}
local states = {}
local all = 1
for i = 1, n do
  local base = 3 + 4 * (i - 1)
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

-- Nothing is spent from any limit unless every limit allowed (and never when peeking).
if all == 1 and LEASE ~= '-' then
  for i = 1, n do
    local base = 3 + 4 * (i - 1)
    ALGORITHMS[ARGV[base]].commit(KEYS[i], now, states[i], tonumber(ARGV[base + 2]),
      tonumber(ARGV[base + 3]))
  end
end

local reply = { all, now }
for i = 1, n do
  for j = 1, 6 do
    reply[#reply + 1] = decisions[i][j]
  end
end
return reply
