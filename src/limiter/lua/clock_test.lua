-- floodgate limiter script, part 8 of 9 (tests only): the time as ARGV[1], so that the
-- differential tests drive the script and the Rust algorithms on one fake clock. Only
-- RedisStore::connect_for_test loads this file; the production script (clock_redis.lua) never
-- reads ARGV[1], so no argument a production caller sends can move its clock.

ttl_slack_ms = 3600000

local function script_now(argv)
  return tonumber(argv[1])
end
