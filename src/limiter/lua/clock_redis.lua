-- floodgate limiter script, part 8 of 9 (production): the time, from Redis TIME, so that every
-- floodgate instance sharing this Redis decides on one clock.

local function script_now(_argv)
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
