-- floodgate limiter script, entry point for one decision: all the limits of a request,
-- all-or-nothing, in one round trip (decide.lua).
--
-- KEYS[i]: the state of limit i. On Redis Cluster they must share one slot (see redis.rs).
-- ARGV[1]: the time in µs for the test clock (clock_test.lua); "-" and unread in production.
-- ARGV[2]: the request's lease token; "-" to peek.
-- ARGV[3 + 9(i-1) ..]: limit i (decide.lua).

-- ARGV is passed on: a function library (FCALL) has no global ARGV, only this chunk's argument.
return decide_one(KEYS, 0, ARGV, 3, #KEYS, script_now(ARGV), ARGV[2])
