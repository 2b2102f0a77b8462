-- floodgate's SQL limiter, many decisions in one call (`storage.batch`): the decisions waiting
-- for the database leave together, in one round trip and one transaction, each all-or-nothing
-- over its own limits and taken in order (a later decision sees what an earlier one spent), under
-- one reading of the clock. Mirrors src/limiter/lua/batch.lua.
--
-- Arguments: per decision, its number of limits (`limits`) and its lease token (`leases`); per
-- limit, as floodgate_decide_at__V takes them (with its lease arguments), the limits of each decision following the previous
-- decision's. Every row the batch touches is locked first, once, in key order (the order
-- floodgate_decide_at__V locks in), so batches and single decisions sharing budgets never
-- deadlock.
--
-- Reply: per decision, 1, the length of its reply and floodgate_decide_at__V's reply; or 0, 0 for
-- a decision naming an algorithm this function does not know (it fails alone). Any other error
-- fails the whole call: the table is typed, so no budget's row can hold what a decision cannot
-- read (unlike Redis, where a key may hold another type).
CREATE OR REPLACE FUNCTION floodgate_decide_batch__V(
  limits int[], keys text[], algorithms text[], pa bigint[], pb bigint[], costs bigint[],
  leases bigint[], wants bigint[], backs bigint[], back_ats bigint[], lease_us bigint[],
  lents bigint[]
) RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  k text;
  k0 int := 0;
  n int;
  now bigint;
  d bigint[];
  reply bigint[] := '{}';
BEGIN
  FOR k IN SELECT DISTINCT u FROM unnest(keys) u ORDER BY u LOOP
    LOOP
      PERFORM 1 FROM floodgate_budgets WHERE key = k FOR UPDATE;
      EXIT WHEN FOUND;
      INSERT INTO floodgate_budgets (key) VALUES (k) ON CONFLICT DO NOTHING;
      EXIT WHEN FOUND;
    END LOOP;
  END LOOP;
  now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
  FOR i IN 1 .. cardinality(limits) LOOP
    n := limits[i];
    IF EXISTS (SELECT 1 FROM unnest(algorithms[k0 + 1 : k0 + n]) a
               WHERE a NOT IN ('token_bucket', 'leaky_bucket', 'fixed_window', 'sliding_window_log',
                               'sliding_window_counter', 'concurrency', 'quota')) THEN
      reply := reply || ARRAY[0, 0]::bigint[];
    ELSE
      d := floodgate_decide_at__V(now, keys[k0 + 1 : k0 + n], algorithms[k0 + 1 : k0 + n],
        pa[k0 + 1 : k0 + n], pb[k0 + 1 : k0 + n], costs[k0 + 1 : k0 + n], leases[i],
        wants[k0 + 1 : k0 + n], backs[k0 + 1 : k0 + n], back_ats[k0 + 1 : k0 + n],
        lease_us[k0 + 1 : k0 + n], lents[k0 + 1 : k0 + n]);
      reply := reply || ARRAY[1, cardinality(d)]::bigint[] || d;
    END IF;
    k0 := k0 + n;
  END LOOP;
  RETURN reply;
END $$;
