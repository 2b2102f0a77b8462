-- floodgate's SQL limiter, concurrency: mirrors concurrency_check in src/limiter/algorithm.rs.
-- State: entries = the instants the leases end, ascending; holders = their lease tokens. A lease
-- that was never released (the floodgate instance holding it died) stops counting when it ends.
-- A denial's Retry-After is one second, as in the other stores.
CREATE OR REPLACE FUNCTION floodgate_concurrency__V(
  now bigint, ends bigint[], lim bigint, lease_us bigint, cost bigint
) RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  live_count bigint;
  newest bigint;
BEGIN
  SELECT count(*), max(e) INTO live_count, newest FROM unnest(ends) e WHERE e > now;
  IF live_count + cost <= lim THEN
    RETURN ARRAY[1, lim, lim - live_count - cost, lease_us, 0, 0, 0, 0, 0];
  END IF;
  RETURN ARRAY[0, lim, greatest(lim - live_count, 0), coalesce(newest, now) - now, 1000000, 0, 0, 0, 0];
END $$;
