-- floodgate's SQL limiter, fixed window: mirrors fixed_window_check in src/limiter/algorithm.rs.
-- State: a = the window's start, b = the count spent in it.
CREATE OR REPLACE FUNCTION floodgate_fixed_window__V(
  now bigint, start bigint, used bigint, lim bigint, window_us bigint, cost bigint
) RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  win_start bigint := now - now % window_us;
  reset_after bigint := win_start + window_us - now;
BEGIN
  IF start <> win_start THEN
    used := 0;
  END IF;
  IF used + cost <= lim THEN
    RETURN ARRAY[1, lim, lim - used - cost, reset_after, 0, 0, win_start, used + cost, 0];
  END IF;
  RETURN ARRAY[0, lim, greatest(lim - used, 0), reset_after, reset_after, 0, win_start, used, 0];
END $$;

-- The calendar quota: mirrors quota_check in src/limiter/algorithm.rs. State: a = the period's
-- end (floodgate's calendar arithmetic names the period by it: src/limiter/calendar.rs), b = the
-- count spent in it. The time is still the database's.
CREATE OR REPLACE FUNCTION floodgate_quota__V(
  now bigint, stored_end bigint, used bigint, lim bigint, period_end bigint, cost bigint
) RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  reset_after bigint := greatest(period_end - now, 1);
BEGIN
  IF stored_end <> period_end THEN
    used := 0;
  END IF;
  IF used + cost <= lim THEN
    RETURN ARRAY[1, lim, lim - used - cost, reset_after, 0, 0, period_end, used + cost, 0];
  END IF;
  RETURN ARRAY[0, lim, greatest(lim - used, 0), reset_after, reset_after, 0, period_end, used, 0];
END $$;
