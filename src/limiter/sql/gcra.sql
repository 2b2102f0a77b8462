-- floodgate's SQL limiter, token bucket and leaky bucket (GCRA): mirrors gcra_check in
-- src/limiter/algorithm.rs and src/limiter/lua/gcra.lua, operation for operation.
--
-- Every algorithm function returns one bigint[9]: the decision (allowed 0/1, limit, remaining,
-- reset_after_us, retry_after_us, delay_us) and then the state to commit if every limit of the
-- request allows (a, b, c of floodgate_budgets). All arithmetic is exact bigint arithmetic
-- (every figure is below 2^53, which the Rust constructors guarantee); a division of two
-- non-negative bigints truncates, as Rust's u64 division does.
-- `keep_delay`: true for the leaky bucket, whose admitted request waits `delay`.
CREATE OR REPLACE FUNCTION floodgate_gcra__V(
  now bigint, tat bigint, capacity bigint, interval_us bigint, cost bigint, keep_delay boolean
) RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  burst bigint := capacity * interval_us;
  new_tat bigint;
BEGIN
  IF tat < now THEN
    tat := now;
  END IF;
  new_tat := tat + cost * interval_us;
  IF new_tat - now <= burst THEN
    RETURN ARRAY[1, capacity, (burst - (new_tat - now)) / interval_us, new_tat - now, 0,
                 CASE WHEN keep_delay THEN tat - now ELSE 0 END,
                 new_tat, 0, 0];
  END IF;
  RETURN ARRAY[0, capacity, greatest(burst - (tat - now), 0) / interval_us, tat - now,
               new_tat - now - burst, 0,
               tat, 0, 0];
END $$;
