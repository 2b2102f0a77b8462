-- floodgate limiter script, part 2 of 9: token bucket and leaky bucket (GCRA); mirrors
-- gcra_check in src/limiter/algorithm.rs.
--
-- The key holds `tat`, the instant the bucket is full again (token bucket) or its queue has
-- drained (leaky bucket). The key lives until then: an absent key is a full bucket.
--
-- A token bucket leased from (decide.lua) also keeps its *holds*, the leased units the bucket
-- may not refill into until the lease ends (src/limiter/hold.rs, whose arithmetic this mirrors):
-- the key then reads "<tat> <end> <held_us> <end> <held_us> ...", soonest end first, and lives
-- until the last end too. A plain number is read at once; only a held bucket is parsed.

local function gcra_check(tat, now, capacity, interval, cost)
  if tat < now then
    tat = now
  end
  local burst = capacity * interval
  local new_tat = tat + cost * interval
  if new_tat - now <= burst then
    return { 1, capacity, math.floor((burst - (new_tat - now)) / interval), new_tat - now, 0, tat - now }, new_tat
  end
  return { 0, capacity, math.floor(math.max(burst - (tat - now), 0) / interval), tat - now, new_tat - now - burst, 0 }, nil
end

-- A token bucket's tat at `now` with its holds applied, and the holds still out (a flat list
-- end, held_us, ...; nil when none): Holds::fold. An ended hold missed the refill of every hold
-- still out when it ended (the bucket stopped that short of full), made up after its end.
local function bucket_read(key, now)
  local value = read('GET', key)
  local tat = tonumber(value)
  if tat or not value then
    return tat or 0, nil
  end
  local numbers = {}
  for n in string.gmatch(value, '%d+') do
    numbers[#numbers + 1] = tonumber(n)
  end
  tat = numbers[1] or 0
  local held = 0
  for i = 3, #numbers, 2 do
    held = held + numbers[i]
  end
  local live = {}
  for i = 2, #numbers - 1, 2 do
    local e, h = numbers[i], numbers[i + 1]
    if e <= now then
      tat = math.max(tat, e + held)
      held = held - h
    else
      live[#live + 1] = e
      live[#live + 1] = h
    end
  end
  if #live == 0 then
    live = nil
  end
  return math.max(tat, now + held), live
end

-- Writes a token bucket's tat and holds (`holds` nil or empty: a plain number).
local function bucket_write(key, now, tat, holds)
  local expires = tat
  if holds and #holds > 0 then
    local parts = { fmt(tat) }
    for i = 1, #holds do
      parts[i + 1] = fmt(holds[i])
    end
    expires = math.max(expires, holds[#holds - 1])
    if expires <= now then
      redis.call('DEL', key)
      return
    end
    redis.call('SET', key, table.concat(parts, ' '), 'PX', ttl_ms(expires, now))
  elseif tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, fmt(tat), 'PX', ttl_ms(tat, now))
  end
end

-- Adds a hold to a flat, sorted list of holds (Holds::hold): after those ending no later.
local function hold_add(holds, e, h)
  holds = holds or {}
  local at = #holds + 1
  while at > 1 and holds[at - 2] > e do
    at = at - 2
  end
  table.insert(holds, at, h)
  table.insert(holds, at, e)
  return holds
end

-- Releases the hold (e, h) if it is still out (Holds::release): true when it was.
local function hold_release(holds, e, h)
  if holds then
    for i = 1, #holds - 1, 2 do
      if holds[i] == e and holds[i + 1] == h then
        table.remove(holds, i)
        table.remove(holds, i)
        return true
      end
    end
  end
  return false
end

ALGORITHMS['token_bucket'] = {
  check = function(key, now, capacity, interval, cost)
    local tat, holds = bucket_read(key, now)
    local d, new_tat = gcra_check(tat, now, capacity, interval, cost)
    d[6] = 0 -- a token bucket never delays
    if new_tat == nil then
      return d, nil
    end
    return d, { new_tat, holds }
  end,
  -- (key, now, state from check, interval, cost, leased cost, lease end): the leased units are
  -- held until the lease ends.
  commit = function(key, now, state, interval, _cost, leased, lease_end)
    local holds = state[2]
    if leased and leased > 0 then
      holds = hold_add(holds, lease_end, leased * interval)
    end
    bucket_write(key, now, state[1], holds)
  end,
}
