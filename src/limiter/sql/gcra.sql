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

-- A token bucket's holds (src/limiter/hold.rs, whose arithmetic these mirror; leased units the
-- bucket may not refill into until the lease ends) are kept in its row's `entries` as a flat
-- list end, held_us, end, held_us, ..., soonest end first.
--
-- The bucket's tat at `now` with its holds applied (Holds::fold): an ended hold missed the refill
-- of every hold still out when it ended, made up after its end.
CREATE OR REPLACE FUNCTION floodgate_hold_fold__V(now bigint, tat bigint, holds bigint[])
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  held bigint := 0;
  n int := cardinality(holds) / 2;
BEGIN
  IF n = 0 THEN
    RETURN tat;
  END IF;
  FOR i IN 1 .. n LOOP
    held := held + holds[2 * i];
  END LOOP;
  FOR i IN 1 .. n LOOP
    EXIT WHEN holds[2 * i - 1] > now;
    tat := greatest(tat, holds[2 * i - 1] + held);
    held := held - holds[2 * i];
  END LOOP;
  RETURN greatest(tat, now + held);
END $$;

-- The holds still out at `now`.
CREATE OR REPLACE FUNCTION floodgate_hold_live__V(now bigint, holds bigint[])
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  n int := cardinality(holds) / 2;
BEGIN
  FOR i IN 1 .. n LOOP
    IF holds[2 * i - 1] > now THEN
      RETURN holds[2 * i - 1 :];
    END IF;
  END LOOP;
  RETURN '{}';
END $$;

-- `holds` with the hold (e, h) added after those ending no later (Holds::hold).
CREATE OR REPLACE FUNCTION floodgate_hold_add__V(holds bigint[], e bigint, h bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  n int := cardinality(holds) / 2;
  at int := n;
BEGIN
  WHILE at > 0 AND holds[2 * at - 1] > e LOOP
    at := at - 1;
  END LOOP;
  RETURN holds[1 : 2 * at] || ARRAY[e, h] || holds[2 * at + 1 :];
END $$;

-- The position (1-based, of its end) of the hold (e, h) in `holds`, or 0 (Holds::release finds
-- it so).
CREATE OR REPLACE FUNCTION floodgate_hold_find__V(holds bigint[], e bigint, h bigint)
RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  FOR i IN 1 .. cardinality(holds) / 2 LOOP
    IF holds[2 * i - 1] = e AND holds[2 * i] = h THEN
      RETURN 2 * i - 1;
    END IF;
  END LOOP;
  RETURN 0;
END $$;
