-- floodgate's SQL limiter: gives back one request's concurrency leases, and returns how many
-- budgets held one. Mirrors src/limiter/lua/release.lua. Rows are updated one at a time in key
-- order, the order decisions lock them in, so a release and a decision never deadlock. Releasing
-- a lease that already ended (or was never granted, or whose row the sweeper removed) changes
-- nothing.
CREATE OR REPLACE FUNCTION floodgate_release__V(keys text[], lease bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  k text;
  released integer := 0;
BEGIN
  FOR k IN SELECT DISTINCT u FROM unnest(keys) u ORDER BY 1 LOOP
    UPDATE floodgate_budgets t SET (entries, holders) = (
        SELECT coalesce(array_agg(e ORDER BY e), '{}'), coalesce(array_agg(h ORDER BY e), '{}')
        FROM unnest(t.entries, t.holders) AS u(e, h) WHERE h <> lease)
      WHERE t.key = k AND lease = ANY(t.holders);
    IF FOUND THEN
      released := released + 1;
    END IF;
  END LOOP;
  RETURN released;
END $$;
