-- floodgate's SQL limiter, sliding window log: mirrors sliding_log_check in
-- src/limiter/algorithm.rs. State: entries = one timestamp per admitted unit of cost, ascending;
-- an entry stamped ts stops counting at ts + window. The commit (in floodgate_decide_at) drops the
-- expired entries and appends `cost` copies of now.
CREATE OR REPLACE FUNCTION floodgate_sliding_window_log__V(
  now bigint, entries bigint[], lim bigint, window_us bigint, cost bigint
) RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  live bigint[] := ARRAY(SELECT e FROM unnest(entries) e WHERE e + window_us > now ORDER BY e);
  live_count bigint := cardinality(live);
  needed bigint;
  freeing bigint;
  newest bigint;
BEGIN
  IF live_count + cost <= lim THEN
    RETURN ARRAY[1, lim, lim - live_count - cost, window_us, 0, 0, 0, 0, 0];
  END IF;
  -- The retry passes once the oldest live_count + cost - limit entries have expired (arrays count
  -- from 1, so the Rust entries[needed - 1] is live[needed]; past the end it is NULL).
  needed := live_count + cost - lim;
  freeing := coalesce(live[needed], now);
  newest := coalesce(live[live_count], now);
  RETURN ARRAY[0, lim, greatest(lim - live_count, 0), greatest(newest + window_us - now, 0),
               greatest(freeing + window_us - now, 1), 0, 0, 0, 0];
END $$;
