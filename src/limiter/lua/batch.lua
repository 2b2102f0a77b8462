-- floodgate limiter script, entry point for a batch: the decisions of many requests in one call,
-- under one TIME, each all-or-nothing on its own and taken in order (a later decision sees what
-- an earlier one spent).
--
-- ARGV[1]: the test clock, as in main.lua. ARGV[2]: the number of decisions, m. Then per
-- decision: its lease token, its number of limits n, and 9 arguments per limit (decide.lua);
-- its n keys follow the previous decisions' in KEYS.
-- Reply: { now_us, then per decision: decide.lua's reply, or a string "error: ..." when that
-- decision raised an error (a key Redis refuses, an unknown algorithm): it fails alone. (A
-- string, not an error reply: a client library would fail the whole reply on a nested error.)

local now = script_now(ARGV)
local m = tonumber(ARGV[2])
local reply = { now }
local k0, a = 0, 3
for d = 1, m do
  local lease, n = ARGV[a], tonumber(ARGV[a + 1])
  local ok, result = pcall(decide_one, KEYS, k0, ARGV, a + 2, n, now, lease)
  if ok then
    reply[d + 1] = result
  elseif type(result) == 'table' and result.err then
    reply[d + 1] = 'error: ' .. result.err
  else
    reply[d + 1] = 'error: ' .. tostring(result)
  end
  k0 = k0 + n
  a = a + 2 + ARGS * n
end
return reply
