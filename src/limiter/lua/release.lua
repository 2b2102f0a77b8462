-- floodgate's lease release script: gives back one request's concurrency leases.
-- KEYS[i]: a concurrency budget; ARGV[1]: the lease token; ARGV[1 + i]: the cost taken in KEYS[i].
-- Releasing a lease that already ended (or was never granted) removes nothing.

for i = 1, #KEYS do
  for j = 1, tonumber(ARGV[1 + i]) do
    -- A key of another type holds no lease of ours: nothing to release there.
    redis.pcall('ZREM', KEYS[i], ARGV[1] .. '-' .. j)
  end
end
return 0
