-- floodgate limiter script, part 8 of 9 (tests only): the time as ARGV[1], so that the
-- differential tests drive the script and the Rust algorithms on one fake clock; a call that
-- gives none ('-': a peek) reads Redis TIME, as the production script does. Only
-- RedisStore::connect_for_test loads this file; the production script (clock_redis.lua) never
-- reads ARGV[1], so no argument a production caller sends can move its clock.

ttl_slack_ms = 3600000

local function script_now(argv)
  local now = tonumber(argv[1])
  if now then
    return now
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
