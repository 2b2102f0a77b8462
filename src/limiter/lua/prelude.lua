-- floodgate limiter script, part 1 of 9: shared helpers.
--
-- The script Redis runs is the concatenation of prelude.lua, the six algorithm files (the
-- leaky bucket shares gcra.lua's code), one clock file (clock_redis.lua in production,
-- clock_test.lua in the differential tests), decide.lua and an entry point, main.lua or
-- batch.lua (see src/limiter/redis/script.rs). Each algorithm file mirrors, operation for operation, the
-- Rust function of the same name in src/limiter/algorithm.rs, so both stores decide alike.
--
-- Time is an integer count of microseconds since the Unix epoch, held in a Lua number (a double:
-- exact up to 2^53, about 285 years of microseconds). Lua turns numbers into strings with "%.14g",
-- which would round such times, so every number written to Redis goes through fmt().

local function fmt(n)
  return string.format('%.0f', n)
end

-- Redis expires keys on its own clock. When a test injects the time (clock_test.lua), that clock
-- and the script's no longer agree, so keys are kept an hour longer than they need to be: a
-- stalled test must not see state vanish that its fake clock says is still alive. 0 in production.
local ttl_slack_ms = 0

-- Milliseconds for PEXPIRE: the time until `expires_at`, rounded up, at least 1.
local function ttl_ms(expires_at, now)
  return math.max(math.ceil((expires_at - now) / 1000), 1) + ttl_slack_ms
end

-- Reads a key with `redis.call(command, key, ...)`, but a key holding the wrong type (written by
-- something else, or left by an older floodgate) is deleted and read again as absent: one bad key
-- must not turn every request that spends it into an error (and open the circuit breaker for
-- every other client). Other errors are raised as they are.
local function read(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'WRONGTYPE', 1, true) then
      redis.call('DEL', key)
      return redis.call(command, key, ...)
    end
    error(reply)
  end
  return reply
end

-- The request's lease token (main.lua sets it from ARGV[2]), for concurrency.lua.
local LEASE = '0'

-- A decision is a list: allowed (0/1), limit, remaining, reset_after_us, retry_after_us, delay_us.
local ALGORITHMS = {}
