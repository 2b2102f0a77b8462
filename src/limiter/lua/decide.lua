-- floodgate limiter script, part 9 of 9: one decision over all the limits of a request, all-or-nothing; the
-- body of both entry points, main.lua (one decision per call) and batch.lua (many).
--
-- keys[k0 + i]: the state of limit i. argv[a0 + 9(i-1) ..]: limit i as algorithm name,
-- parameter a, parameter b, cost, want, back, back_at, lease_us, lent, where (a, b) is (capacity,
-- interval µs) for the buckets, (limit, window µs) for the windows and (limit, the calendar
-- period's end µs) for a quota; want is how many more
-- requests' worth of units the caller would like to lease (0: none); back is how many requests'
-- worth of an earlier lease of `lent` it gives back unspent, granted at the store's time back_at
-- (lent 0: no lease ends with this request); lease_us is how long the caller spends a lease for
-- (the sliding window log stamps leased units with the lease's end, a bucket holds them until
-- then). lease: the request's lease token, naming its concurrency leases; "-" to
-- peek (decide and reply as usual, but spend nothing: floodgate's /budgets).
-- Returns (REPLY_HEADER and REPLY_FIELDS in wire.rs): { allowed, now_us, then per limit: allowed,
-- limit, remaining, reset_after_us, retry_after_us, delay_us; then per limit the requests' worth
-- of units leased beyond this request (0 unless allowed and wanted) }. Raises an error for an
-- unknown algorithm (or whatever Redis raises about a key).
--
-- Leases (src/limiter/lease.rs): only when every limit allowed, and only for the algorithms in
-- LEASABLE, a limit grants at most `want` and at most half of what remains after this request,
-- debited here, now, as if that many more requests had come: the units are spent before anyone
-- else can have them, so no instance can ever be granted what another holds; a token bucket also
-- holds them (gcra.lua) until the lease ends, refilling only to its capacity less what is held.

local LEASABLE = {
  token_bucket = true, fixed_window = true, sliding_window_counter = true, sliding_window_log = true,
  quota = true,
}
local ARGS = 9

-- Ends a lease of `lent` units granted at `at` for `lease_us`, giving back `units` unspent (of
-- the lease, and beyond it those of a decision made at `at` whose answer reached nobody,
-- src/limiter/lease.rs `owe`): a bucket releases the lease's hold, if it is still out (it ended in
-- the store otherwise, and the bucket has refilled past it), and moves its tat back by what is
-- given back (a bucket fuller than full is just full); a window's count falls, if the window is
-- still the one they were counted in (after it, they are gone with it); a log loses that many of
-- the lease's entries (sliding_window_log.lua names them) and then of the decision's own,
-- stamped `at`, if they are still there.
local function give_back(name, key, now, b, units, at, lease_us, lent)
  if name == 'token_bucket' then
    local tat, holds = bucket_read(key, now)
    if lent > 0 then
      if hold_release(holds, at + lease_us, lent * b) then
        bucket_write(key, now, math.max(tat - units * b, now), holds)
      end
    elseif units > 0 then
      bucket_write(key, now, math.max(tat - units * b, now), holds)
    end
  elseif units <= 0 then
    return
  elseif name == 'fixed_window' or name == 'sliding_window_counter' then
    local current = now - (now % b)
    if current == at - (at % b) then
      local stored = read('HMGET', key, 's', 'c')
      if tonumber(stored[1]) == current then
        redis.call('HSET', key, 'c', fmt(math.max((tonumber(stored[2]) or 0) - units, 0)))
      end
    end
  elseif name == 'quota' then
    -- b is the period's end: units counted in a period that is over are gone with it.
    if now < b then
      local stored = read('HMGET', key, 's', 'c')
      if tonumber(stored[1]) == b then
        redis.call('HSET', key, 'c', fmt(math.max((tonumber(stored[2]) or 0) - units, 0)))
      end
    end
  elseif name == 'sliding_window_log' then
    local prefix = log_lease_prefix(at)
    local stamp = fmt(at + lease_us)
    local left = math.min(units, lent)
    local own = units - left
    for _, member in ipairs(read('ZRANGEBYSCORE', key, stamp, stamp)) do
      if left == 0 then
        break
      end
      if string.sub(member, 1, #prefix) == prefix then
        redis.call('ZREM', key, member)
        left = left - 1
      end
    end
    -- Entries of one stamp expire together: whichever go, the log is the same.
    if own > 0 then
      for _, member in ipairs(read('ZRANGEBYSCORE', key, fmt(at), fmt(at), 'LIMIT', 0, own)) do
        redis.call('ZREM', key, member)
      end
    end
  end
end

local function decide_one(keys, k0, argv, a0, n, now, lease)
  LEASE = lease
  if lease ~= '-' then
    for i = 1, n do
      local base = a0 + ARGS * (i - 1)
      local lent = tonumber(argv[base + 8]) or 0
      local back = tonumber(argv[base + 5]) or 0
      if (lent > 0 or back > 0) and LEASABLE[argv[base]] then
        local cost = tonumber(argv[base + 3])
        give_back(argv[base], keys[k0 + i], now, tonumber(argv[base + 2]),
          back * cost, tonumber(argv[base + 6]),
          tonumber(argv[base + 7]) or 0, lent * cost)
      end
    end
  end
  local decisions = {}
  local states = {}
  local all = 1
  for i = 1, n do
    local base = a0 + ARGS * (i - 1)
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
  local leased = {}
  for i = 1, n do
    leased[i] = 0
  end
  if all == 1 and lease ~= '-' then
    for i = 1, n do
      local base = a0 + ARGS * (i - 1)
      local name = argv[base]
      local cost = tonumber(argv[base + 3])
      local want = tonumber(argv[base + 4]) or 0
      local lease_us = tonumber(argv[base + 7]) or 0
      if name == 'sliding_window_log' and lease_us <= 0 then
        want = 0
      end
      if want > 0 and LEASABLE[name] and cost > 0 then
        local extra = math.min(want, math.floor(decisions[i][3] / cost / 2))
        if extra > 0 then
          local d, state = ALGORITHMS[name].check(keys[k0 + i], now, tonumber(argv[base + 1]),
            tonumber(argv[base + 2]), cost * (1 + extra))
          if d[1] == 1 then
            states[i] = state
            leased[i] = extra
          end
        end
      end
      -- (Only the log reads the last two: its leased entries are stamped with the lease's end.)
      ALGORITHMS[name].commit(keys[k0 + i], now, states[i], tonumber(argv[base + 2]),
        cost * (1 + leased[i]), cost * leased[i], now + lease_us)
    end
  end

  local reply = { all, now }
  for i = 1, n do
    for j = 1, 6 do
      reply[#reply + 1] = decisions[i][j]
    end
  end
  for i = 1, n do
    reply[#reply + 1] = leased[i]
  end
  return reply
end
