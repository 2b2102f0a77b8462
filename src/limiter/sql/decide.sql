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
-- Leases (src/limiter/lease.rs; mirrors src/limiter/lua/decide.lua): per limit, `wants` more
-- requests' worth to lease beyond this one, `backs` requests' worth of an ended lease of `lents`
-- given back, granted at `back_ats`, and `lease_us`, how long a lease lasts (NULL arrays: none of
-- these). A lease is granted only when every limit allowed, for the token bucket, the windows and
-- the log, at most `want` and half of what remains, debited here, now; a bucket also holds it
-- until it ends (gcra.sql: the holds in `entries`). Given back: a bucket releases the lease's
-- hold, if it is still out, and its tat moves back; a window's count falls if its window is still the one the units were counted in; a log
-- loses that many entries stamped with the lease's end (back_at + lease_us): entries are bare
-- timestamps, but entries of one stamp expire together, so whichever go, the log is the same.
--
-- Reply (REPLY_HEADER and REPLY_FIELDS in src/limiter/wire.rs): { allowed, now_us, then per
-- limit: allowed, limit, remaining, reset_after_us, retry_after_us, delay_us; then per limit the
-- requests' worth leased beyond this request }.
CREATE OR REPLACE FUNCTION floodgate_check__V(
  now bigint, r floodgate_budgets, algorithm text, pa bigint, pb bigint, cost bigint
) RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE algorithm
    WHEN 'token_bucket' THEN floodgate_gcra__V(now, r.a, pa, pb, cost, false)
    WHEN 'leaky_bucket' THEN floodgate_gcra__V(now, r.a, pa, pb, cost, true)
    WHEN 'fixed_window' THEN floodgate_fixed_window__V(now, r.a, r.b, pa, pb, cost)
    WHEN 'quota' THEN floodgate_quota__V(now, r.a, r.b, pa, pb, cost)
    WHEN 'sliding_window_log' THEN floodgate_sliding_window_log__V(now, r.entries, pa, pb, cost)
    WHEN 'sliding_window_counter' THEN
      floodgate_sliding_window_counter__V(now, r.a, r.b, r.c, pa, pb, cost)
    WHEN 'concurrency' THEN floodgate_concurrency__V(now, r.entries, pa, pb, cost)
  END
$$;

CREATE OR REPLACE FUNCTION floodgate_decide_at__V(
  clock bigint, keys text[], algorithms text[], pa bigint[], pb bigint[], costs bigint[],
  lease bigint, wants bigint[], backs bigint[], back_ats bigint[], lease_us bigint[],
  lents bigint[]
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
  leased bigint[] := array_fill(0::bigint, ARRAY[cardinality(keys)]);
  all_allowed bigint := 1;
  units bigint;
  at bigint;
  want bigint;
  extra bigint;
  pos int;
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
  -- A token bucket's holds, brought up to now: those ended folded into its tat.
  FOR i IN 1 .. n LOOP
    IF algorithms[i] = 'token_bucket' AND cardinality(rows[i].entries) > 0 THEN
      r := rows[i];
      r.a := floodgate_hold_fold__V(now, r.a, r.entries);
      r.entries := floodgate_hold_live__V(now, r.entries);
      rows[i] := r;
    END IF;
  END LOOP;

  -- Units an ended lease gives back, before anything is decided.
  IF lease IS NOT NULL THEN
    FOR i IN 1 .. n LOOP
      units := coalesce(backs[i], 0) * costs[i];
      at := coalesce(back_ats[i], 0);
      CONTINUE WHEN coalesce(lents[i], 0) <= 0 AND units <= 0;
      r := rows[i];
      IF algorithms[i] = 'token_bucket' THEN
        -- Without a lease, a decision's own units (nothing held them): credited as they are.
        pos := CASE WHEN coalesce(lents[i], 0) = 0 THEN -1 ELSE
          floodgate_hold_find__V(r.entries, at + coalesce(lease_us[i], 0),
            lents[i] * costs[i] * pb[i]) END;
        IF pos > 0 THEN
          r.entries := r.entries[1 : pos - 1] || r.entries[pos + 2 :];
        END IF;
        IF pos <> 0 THEN
          -- Never past what the holds still out allow.
          r.a := floodgate_hold_fold__V(now, greatest(r.a - units * pb[i], now), r.entries);
          UPDATE floodgate_budgets SET a = r.a, entries = r.entries,
            expires_at = greatest(r.a, coalesce(r.entries[cardinality(r.entries) - 1], 0))
            WHERE key = keys[i];
        END IF;
      ELSIF units <= 0 THEN
        CONTINUE;
      ELSIF algorithms[i] IN ('fixed_window', 'sliding_window_counter')
          AND r.a = now - now % pb[i] AND r.a = at - at % pb[i] THEN
        r.b := greatest(r.b - units, 0);
        UPDATE floodgate_budgets SET b = r.b WHERE key = keys[i];
      ELSIF algorithms[i] = 'quota' AND r.a = pb[i] AND now < pb[i] THEN
        -- pb is the period's end: units counted in a period that is over are gone with it.
        r.b := greatest(r.b - units, 0);
        UPDATE floodgate_budgets SET b = r.b WHERE key = keys[i];
      ELSIF algorithms[i] = 'sliding_window_log' THEN
        r.entries := ARRAY(
          SELECT e FROM (
            SELECT e, row_number() OVER (PARTITION BY e ORDER BY e) AS k FROM unnest(r.entries) e
          ) x
          -- The lease's entries (stamped with its end), then the decision's own (stamped
          -- `at`) beyond them: entries of one stamp expire together, whichever go.
          WHERE NOT (e = at + coalesce(lease_us[i], 0)
                       AND k <= least(units, coalesce(lents[i], 0) * costs[i]))
            AND NOT (e = at AND k <= units - least(units, coalesce(lents[i], 0) * costs[i]))
          ORDER BY e);
        UPDATE floodgate_budgets SET entries = r.entries WHERE key = keys[i];
      END IF;
      rows[i] := r;
    END LOOP;
  END IF;

  FOR i IN 1 .. n LOOP
    r := rows[i];
    d := floodgate_check__V(now, r, algorithms[i], pa[i], pb[i], costs[i]);
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
      want := coalesce(wants[i], 0);
      IF algorithms[i] = 'sliding_window_log' AND coalesce(lease_us[i], 0) <= 0 THEN
        want := 0;
      END IF;
      IF want > 0 AND costs[i] > 0 AND algorithms[i] IN
          ('token_bucket', 'fixed_window', 'sliding_window_counter', 'sliding_window_log',
           'quota') THEN
        extra := least(want, decisions[6 * (i - 1) + 3] / costs[i] / 2);
        IF extra > 0 THEN
          d := floodgate_check__V(now, rows[i], algorithms[i], pa[i], pb[i],
            costs[i] * (1 + extra));
          IF d[1] = 1 THEN
            sa[i] := d[7];
            sb[i] := d[8];
            sc[i] := d[9];
            leased[i] := extra;
          END IF;
        END IF;
      END IF;
    END LOOP;
    FOR i IN 1 .. n LOOP
      CASE algorithms[i]
        WHEN 'token_bucket' THEN
          r := rows[i];
          IF leased[i] > 0 THEN
            r.entries := floodgate_hold_add__V(r.entries, now + coalesce(lease_us[i], 0),
              costs[i] * leased[i] * pb[i]);
          END IF;
          UPDATE floodgate_budgets SET a = sa[i], entries = r.entries,
            expires_at = greatest(sa[i], coalesce(r.entries[cardinality(r.entries) - 1], 0))
            WHERE key = keys[i];
        WHEN 'leaky_bucket' THEN
          UPDATE floodgate_budgets SET a = sa[i], expires_at = sa[i] WHERE key = keys[i];
        WHEN 'fixed_window' THEN
          UPDATE floodgate_budgets SET a = sa[i], b = sb[i], expires_at = sa[i] + pb[i]
            WHERE key = keys[i];
        WHEN 'quota' THEN
          UPDATE floodgate_budgets SET a = sa[i], b = sb[i], expires_at = sa[i]
            WHERE key = keys[i];
        WHEN 'sliding_window_counter' THEN
          UPDATE floodgate_budgets SET a = sa[i], b = sb[i], c = sc[i],
            expires_at = sa[i] + 2 * pb[i] WHERE key = keys[i];
        WHEN 'sliding_window_log' THEN
          -- A lease's entries are stamped with its end (see sliding_window_log.lua).
          UPDATE floodgate_budgets t SET
            entries = ARRAY(SELECT e FROM unnest(t.entries
                || array_fill(now, ARRAY[costs[i]::int])
                || array_fill(now + coalesce(lease_us[i], 0),
                              ARRAY[(costs[i] * leased[i])::int])) e
              WHERE e + pb[i] > now ORDER BY e),
            expires_at = greatest(now + pb[i],
              CASE WHEN leased[i] > 0 THEN now + lease_us[i] + pb[i] ELSE 0 END)
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
  RETURN ARRAY[all_allowed, now] || decisions || leased;
END $$;

-- The production entry point: the database's clock, never a caller's.
CREATE OR REPLACE FUNCTION floodgate_decide__V(
  keys text[], algorithms text[], pa bigint[], pb bigint[], costs bigint[], lease bigint,
  wants bigint[], backs bigint[], back_ats bigint[], lease_us bigint[], lents bigint[]
) RETURNS bigint[] LANGUAGE sql AS $$
  SELECT floodgate_decide_at__V(NULL, keys, algorithms, pa, pb, costs, lease, wants, backs,
    back_ats, lease_us, lents)
$$;
