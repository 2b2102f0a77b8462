-- floodgate's SQL limiter: extends one connection's concurrency leases (a WebSocket's
-- `max_connections`, held for its life) to a whole lease from now on the database's clock;
-- returns how many budgets held one. Mirrors src/limiter/lua/renew.lua. Rows are updated one
-- at a time in key order, as decisions lock them. A lease that already ended is not brought
-- back: its entries no longer count, and are left as the decision left them.
CREATE OR REPLACE FUNCTION floodgate_renew__V(keys text[], lease bigint, spans bigint[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  i integer;
  now bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
  renewed integer := 0;
BEGIN
  FOR i IN SELECT o FROM unnest(keys) WITH ORDINALITY AS u(k, o) ORDER BY k LOOP
    UPDATE floodgate_budgets t SET (entries, holders) = (
        SELECT coalesce(array_agg(e ORDER BY e, h), '{}'), coalesce(array_agg(h ORDER BY e, h), '{}')
        FROM (SELECT CASE WHEN h = lease THEN now + spans[i] ELSE e END AS e, h
              FROM unnest(t.entries, t.holders) AS u(e, h)) AS moved),
        expires_at = greatest(t.expires_at, now + spans[i])
      WHERE t.key = keys[i] AND EXISTS (
        SELECT 1 FROM unnest(t.entries, t.holders) AS u(e, h) WHERE h = lease AND e > now);
    IF FOUND THEN
      renewed := renewed + 1;
    END IF;
  END LOOP;
  RETURN renewed;
END $$;
