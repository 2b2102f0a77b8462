-- floodgate's SQL limiter, sliding window counter: mirrors sliding_counter_check in
-- src/limiter/algorithm.rs with the same double-precision operations in the same order (float8 is
-- an IEEE 754 double, like Rust's f64 and Lua's numbers), so all three stores agree bit for bit.
-- State: a = the current window's start, b = its count, c = the previous window's count.
CREATE OR REPLACE FUNCTION floodgate_sliding_window_counter__V(
  now bigint, start bigint, curr bigint, prev bigint, lim bigint, window_us bigint, cost bigint
) RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  win_start bigint := now - now % window_us;
  elapsed bigint;
  w float8 := window_us::float8;
  estimate float8;
  allowed boolean;
  spent float8;
  spent_now bigint := 0;
  reset_after bigint := 0;
  retry_after bigint := 0;
  t bigint;
BEGIN
  IF start <> win_start THEN
    IF start + window_us = win_start THEN
      prev := curr;
    ELSE
      prev := 0;
    END IF;
    curr := 0;
  END IF;
  elapsed := now - win_start;
  estimate := prev::float8 * (window_us - elapsed)::float8 / w + curr::float8;
  allowed := estimate + cost::float8 <= lim::float8;
  spent := estimate;
  IF allowed THEN
    spent := estimate + cost::float8;
    spent_now := cost;
  END IF;
  IF curr + spent_now > 0 THEN
    reset_after := win_start + 2 * window_us - now;
  ELSIF prev > 0 THEN
    reset_after := win_start + window_us - now;
  END IF;
  IF NOT allowed THEN
    IF curr + cost <= lim THEN
      -- Wait, in this window, until the previous window's weight has fallen far enough.
      t := greatest(ceil(w - (lim - curr - cost)::float8 * w / prev::float8), 0)::bigint;
      retry_after := greatest(greatest(t - elapsed, 0), 1);
    ELSE
      -- Wait for the next window, where this window's count becomes the weighted one.
      t := greatest(ceil(w - (lim - cost)::float8 * w / curr::float8), 0)::bigint;
      retry_after := window_us - elapsed + t;
    END IF;
  END IF;
  RETURN ARRAY[CASE WHEN allowed THEN 1 ELSE 0 END, lim,
               greatest(floor(lim::float8 - spent), 0)::bigint, reset_after, retry_after, 0,
               win_start, curr + cost, prev];
END $$;
