-- floodgate limiter script, part 9 of 9: one decision over all the limits of a request, all-or-nothing; the
-- body of both entry points, main.lua (one decision per call) and batch.lua (many).
--
-- keys[k0 + i]: the state of limit i. argv[a0 + 4(i-1) ..]: limit i as algorithm name,
-- parameter a, parameter b, cost, where (a, b) is (capacity, interval µs) for the buckets and
-- (limit, window µs) for the windows. lease: the request's lease token, naming its concurrency
-- leases; "-" to peek (decide and reply as usual, but spend nothing: floodgate's /budgets).
-- Returns (REPLY_HEADER and REPLY_FIELDS in wire.rs): { allowed, now_us, then per limit: allowed,
-- limit, remaining, reset_after_us, retry_after_us, delay_us }. Raises an error for an unknown
-- algorithm (or whatever Redis raises about a key).

local function decide_one(keys, k0, argv, a0, n, now, lease)
  LEASE = lease
  local decisions = {}
  local states = {}
  local all = 1
  for i = 1, n do
    local base = a0 + 4 * (i - 1)
    local algorithm = ALGORITHMS[argv[base]]
    if algorithm == nil then
      error('floodgate: unknown algorithm ' .. tostring(argv[base]))
    end
    local d, state = algorithm.check(keys[k0 + i], now, tonumber(argv[base + 1]),
      tonumber(argv[base + 2]), tonumber(argv[base + 3]))
    decisions[i] = d
    states[i] = state
    if d[1] == 0 then
      all = 0
    end
  end

  -- Nothing is spent from any limit unless every limit allowed (and never when peeking).
  if all == 1 and lease ~= '-' then
    for i = 1, n do
      local base = a0 + 4 * (i - 1)
      ALGORITHMS[argv[base]].commit(keys[k0 + i], now, states[i], tonumber(argv[base + 2]),
        tonumber(argv[base + 3]))
    end
  end

  local reply = { all, now }
  for i = 1, n do
    for j = 1, 6 do
      reply[#reply + 1] = decisions[i][j]
    end
  end
  return reply
end
