-- floodgate's SQL limiter: removes expired budgets in small batches. Each call walks the next
-- `batch` keys after `after` in primary-key order and deletes those whose expires_at passed more
-- than `grace_us` ago (by the database's clock): a budget in steady use is full again between
-- two requests often (a bucket that refills faster than it is spent), and deleting it each time
-- would turn every decision into an insert. It returns the last key it looked at (NULL once past the end, when
-- the caller starts again from the beginning) and how many rows it deleted. A row a decision has
-- locked is waited for and checked again, so a budget in use is never deleted.
CREATE OR REPLACE FUNCTION floodgate_sweep__V(after text, batch int, grace_us bigint,
  OUT last_key text, OUT deleted bigint) LANGUAGE plpgsql AS $$
DECLARE
  now bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
BEGIN
  SELECT max(s.key) INTO last_key
    FROM (SELECT key FROM floodgate_budgets WHERE key > after ORDER BY key LIMIT batch) s;
  deleted := 0;
  IF last_key IS NOT NULL THEN
    DELETE FROM floodgate_budgets WHERE key > after AND key <= last_key AND expires_at < now - grace_us;
    GET DIAGNOSTICS deleted = ROW_COUNT;
  END IF;
END $$;
