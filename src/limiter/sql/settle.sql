-- floodgate's SQL limiter: settles reserved costs (`cost: {reserve, actual}`). Mirrors
-- State::settle in src/limiter/algorithm.rs and src/limiter/lua/settle.lua: per budget, gives
-- back `refunds[i]` units while they still count (a bucket not refilled past them, the window
-- or period they were spent in), and takes `charges[i]` more, past the limit if need be (a
-- debt). pb is a window's length (a quota's period end now), pb_at a quota's period end at the
-- reservation (pb otherwise), ats when the reserve was decided (this database's clock). clock:
-- NULL for the database's own (production), a time for the differential tests. Rows are
-- locked in key order, as decisions lock them, so a settlement and a decision never deadlock.
-- pa is the limit (a bucket's capacity): refunds and charges are cut to it and a debt is at
-- most one limit (Settlement::bounded, debt_capped), so no figure overflows a bigint.
CREATE OR REPLACE FUNCTION floodgate_settle__V(
  clock bigint, keys text[], algorithms text[], pa bigint[], pb bigint[], pb_at bigint[],
  refunds bigint[], charges bigint[], ats bigint[]
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  now bigint := coalesce(clock, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  i int;
  r floodgate_budgets%ROWTYPE;
  current bigint;
  reserved_in bigint;
  refund bigint;
  charge bigint;
BEGIN
  FOR i IN SELECT s FROM generate_subscripts(keys, 1) s ORDER BY keys[s], s LOOP
    refund := least(greatest(refunds[i], 0), pa[i]);
    charge := least(greatest(charges[i], 0), pa[i]);
    LOOP
      SELECT * INTO r FROM floodgate_budgets WHERE key = keys[i] FOR UPDATE;
      EXIT WHEN FOUND;
      INSERT INTO floodgate_budgets (key) VALUES (keys[i]) ON CONFLICT DO NOTHING
        RETURNING * INTO r;
      EXIT WHEN FOUND;
    END LOOP;
    CASE algorithms[i]
      WHEN 'token_bucket' THEN
        IF cardinality(r.entries) > 0 THEN
          r.a := floodgate_hold_fold__V(now, r.a, r.entries);
          r.entries := floodgate_hold_live__V(now, r.entries);
        END IF;
        r.a := greatest(r.a - refund * pb[i], now);
        r.a := least(r.a + charge * pb[i], greatest(now + 2 * pa[i] * pb[i], r.a));
        UPDATE floodgate_budgets SET a = r.a, entries = r.entries,
          expires_at = greatest(r.a, coalesce(r.entries[cardinality(r.entries) - 1], 0))
          WHERE key = keys[i];
      WHEN 'fixed_window' THEN
        current := now - now % pb[i];
        IF r.a = current AND ats[i] - ats[i] % pb[i] = current THEN
          r.b := greatest(r.b - refund, 0);
        END IF;
        IF charge > 0 AND r.a <> current THEN
          r.a := current;
          r.b := 0;
        END IF;
        IF r.a = current THEN
          UPDATE floodgate_budgets SET a = r.a, b = least(r.b + charge, greatest(2 * pa[i], r.b)),
            expires_at = r.a + pb[i]
            WHERE key = keys[i];
        END IF;
      WHEN 'quota' THEN
        IF r.a = pb_at[i] AND pb_at[i] = pb[i] THEN
          r.b := greatest(r.b - refund, 0);
        END IF;
        IF charge > 0 AND r.a <> pb[i] THEN
          r.a := pb[i];
          r.b := 0;
        END IF;
        IF r.a = pb[i] THEN
          UPDATE floodgate_budgets SET a = r.a, b = least(r.b + charge, greatest(2 * pa[i], r.b)),
            expires_at = r.a
            WHERE key = keys[i];
        END IF;
      WHEN 'sliding_window_counter' THEN
        current := now - now % pb[i];
        IF r.a <> current THEN
          r.c := CASE WHEN r.a + pb[i] = current THEN r.b ELSE 0 END;
          r.b := 0;
          r.a := current;
        END IF;
        reserved_in := ats[i] - ats[i] % pb[i];
        IF reserved_in = current THEN
          r.b := greatest(r.b - refund, 0);
        ELSIF reserved_in + pb[i] = current THEN
          r.c := greatest(r.c - refund, 0);
        END IF;
        UPDATE floodgate_budgets SET a = r.a, b = least(r.b + charge, greatest(2 * pa[i], r.b)),
          c = r.c,
          expires_at = r.a + 2 * pb[i] WHERE key = keys[i];
      ELSE
        NULL;
    END CASE;
  END LOOP;
  RETURN now;
END $$;
