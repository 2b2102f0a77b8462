-- floodgate's SQL limiter: one decision over all the limits of a route, all-or-nothing, in one
-- function call (one round trip, one transaction). Mirrors src/limiter/lua/main.lua.
--
-- Arguments, one array element per limit: the row key, the algorithm's name, its parameters
-- (capacity and interval µs for the buckets, limit and window or lease µs for the others) and the
-- cost. `lease`: the request's lease token, naming its concurrency leases; NULL to peek (decide
-- and reply as usual, but lock and write nothing: floodgate's /budgets endpoint).
-- `clock`: the time in µs for the differential tests; NULL in production, where the database's
-- clock (clock_timestamp()) is read once every row is locked, so that the decisions on one budget
-- are stamped in the order they were made, whichever connection made them.
--
-- Concurrency: each row is locked and read (SELECT ... FOR UPDATE, or the INSERT of a missing
-- row, which holds the new row until commit) in key order, so two decisions sharing budgets never
-- deadlock, and no decision reads a budget another has read but not yet written. No SERIALIZABLE
-- retries.
--
-- Reply (REPLY_HEADER and REPLY_FIELDS in src/limiter/wire.rs): { allowed, now_us, then per
-- limit: allowed, limit, remaining, reset_after_us, retry_after_us, delay_us }.
CREATE OR REPLACE FUNCTION floodgate_decide_at__V(
  clock bigint, keys text[], algorithms text[], pa bigint[], pb bigint[], costs bigint[],
  lease bigint
) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  n int := cardinality(keys);
  now bigint := clock;
  lock_order int[];
  j int;
  r floodgate_budgets%ROWTYPE;
  rows floodgate_budgets[] := '{}';
  d bigint[];
  decisions bigint[] := '{}';
  sa bigint[] := '{}';
  sb bigint[] := '{}';
  sc bigint[] := '{}';
  all_allowed bigint := 1;
BEGIN
  IF lease IS NOT NULL THEN
    -- Lock (and read) every row in key order; a row's values cannot change once it is locked.
    IF n = 1 THEN
      lock_order := ARRAY[1];
    ELSE
      SELECT array_agg(i ORDER BY keys[i], i) INTO lock_order FROM generate_subscripts(keys, 1) i;
    END IF;
    FOREACH j IN ARRAY lock_order LOOP
      LOOP
        SELECT * INTO r FROM floodgate_budgets WHERE key = keys[j] FOR UPDATE;
        EXIT WHEN FOUND;
        -- Absent: insert it fresh (a fresh row is a full budget). The new row is this
        -- transaction's until it commits; if another inserted it first, lock theirs.
        INSERT INTO floodgate_budgets (key) VALUES (keys[j]) ON CONFLICT DO NOTHING
          RETURNING * INTO r;
        EXIT WHEN FOUND;
      END LOOP;
      rows[j] := r;
    END LOOP;
  ELSE
    FOR i IN 1 .. n LOOP
      SELECT * INTO r FROM floodgate_budgets WHERE key = keys[i];
      IF NOT FOUND THEN
        r := ROW(keys[i], 0, 0, 0, '{}', '{}', 0);
      END IF;
      rows[i] := r;
    END LOOP;
  END IF;
  IF now IS NULL THEN
    now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
  END IF;

  FOR i IN 1 .. n LOOP
    r := rows[i];
    d := CASE algorithms[i]
      WHEN 'token_bucket' THEN floodgate_gcra__V(now, r.a, pa[i], pb[i], costs[i], false)
      WHEN 'leaky_bucket' THEN floodgate_gcra__V(now, r.a, pa[i], pb[i], costs[i], true)
      WHEN 'fixed_window' THEN floodgate_fixed_window__V(now, r.a, r.b, pa[i], pb[i], costs[i])
      WHEN 'sliding_window_log' THEN
        floodgate_sliding_window_log__V(now, r.entries, pa[i], pb[i], costs[i])
      WHEN 'sliding_window_counter' THEN
        floodgate_sliding_window_counter__V(now, r.a, r.b, r.c, pa[i], pb[i], costs[i])
      WHEN 'concurrency' THEN floodgate_concurrency__V(now, r.entries, pa[i], pb[i], costs[i])
    END;
    IF d IS NULL THEN
      RAISE EXCEPTION 'floodgate: unknown algorithm %', algorithms[i];
    END IF;
    decisions := decisions || d[1:6];
    sa := sa || d[7];
    sb := sb || d[8];
    sc := sc || d[9];
    IF d[1] = 0 THEN
      all_allowed := 0;
    END IF;
  END LOOP;

  -- Nothing is spent from any limit unless every limit allowed (and never when peeking). Each
  -- UPDATE also sets expires_at as State::expires_at does in Rust.
  IF all_allowed = 1 AND lease IS NOT NULL THEN
    FOR i IN 1 .. n LOOP
      CASE algorithms[i]
        WHEN 'token_bucket', 'leaky_bucket' THEN
          UPDATE floodgate_budgets SET a = sa[i], expires_at = sa[i] WHERE key = keys[i];
        WHEN 'fixed_window' THEN
          UPDATE floodgate_budgets SET a = sa[i], b = sb[i], expires_at = sa[i] + pb[i]
            WHERE key = keys[i];
        WHEN 'sliding_window_counter' THEN
          UPDATE floodgate_budgets SET a = sa[i], b = sb[i], c = sc[i],
            expires_at = sa[i] + 2 * pb[i] WHERE key = keys[i];
        WHEN 'sliding_window_log' THEN
          UPDATE floodgate_budgets t SET
            entries = ARRAY(SELECT e FROM unnest(t.entries) e WHERE e + pb[i] > now ORDER BY e)
              || array_fill(now, ARRAY[costs[i]::int]),
            expires_at = now + pb[i]
            WHERE key = keys[i];
        WHEN 'concurrency' THEN
          UPDATE floodgate_budgets t SET
            (entries, holders) = (
              SELECT coalesce(array_agg(e ORDER BY e), '{}')
                       || array_fill(now + pb[i], ARRAY[costs[i]::int]),
                     coalesce(array_agg(h ORDER BY e), '{}')
                       || array_fill(lease, ARRAY[costs[i]::int])
              FROM unnest(t.entries, t.holders) AS u(e, h) WHERE e > now),
            expires_at = now + pb[i]
            WHERE key = keys[i];
      END CASE;
    END LOOP;
  END IF;
  RETURN ARRAY[all_allowed, now] || decisions;
END $$;

-- The production entry point: the database's clock, never a caller's.
CREATE OR REPLACE FUNCTION floodgate_decide__V(
  keys text[], algorithms text[], pa bigint[], pb bigint[], costs bigint[], lease bigint
) RETURNS bigint[] LANGUAGE sql AS $$
  SELECT floodgate_decide_at__V(NULL, keys, algorithms, pa, pb, costs, lease)
$$;
