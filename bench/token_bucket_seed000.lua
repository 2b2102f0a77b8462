-- The token bucket of seed 000 (the article floodgate grew from), as Kong and APISIX users run it
-- in OpenResty: one EVALSHA per request, time from the caller. scripts/bench.sh loads it into
-- Redis (SCRIPT LOAD) for its openresty_limit target; floodgate does not use it.
-- KEYS[1] = rate limit key; ARGV[1] = capacity; ARGV[2] = refill rate (tokens per second);
-- ARGV[3] = now (seconds, fractional); ARGV[4] = tokens to consume.
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local refill_rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])

local bucket = redis.call('HMGET', key, 'tokens', 'last_refill')
local tokens = tonumber(bucket[1])
local last_refill = tonumber(bucket[2])
if tokens == nil then
  tokens = capacity
  last_refill = now
end
local elapsed = now - last_refill
tokens = math.min(capacity, tokens + elapsed * refill_rate)

local allowed = 0
local remaining = tokens
if tokens >= requested then
  tokens = tokens - requested
  allowed = 1
  remaining = tokens
end
redis.call('HMSET', key, 'tokens', tokens, 'last_refill', now)
redis.call('EXPIRE', key, math.ceil(capacity / refill_rate) * 2)

local retry_after = 0
if allowed == 0 then
  retry_after = (requested - tokens) / refill_rate
end
return { allowed, math.floor(remaining), math.ceil(retry_after) }
