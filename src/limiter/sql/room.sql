-- floodgate's SQL waiting room: one client asks to enter a room, on the database's clock, the
-- room's state row locked so that every instance's calls for one room take turns. Mirrors
-- src/room/line.rs (the memory store's line) and src/limiter/redis/room.rs (Redis's script):
-- admitted clients (waiting = false) last `p_session` ms after their last request; waiting
-- clients hold a ticket and leave the line after `p_linger` ms without asking; admissions are
-- dealt from the front of the line while fewer than `p_active` are admitted, at most `p_rate` a
-- second (a bucket of one second's worth). Returns {admitted (0/1), position (0 when admitted),
-- admitted now, waiting now, admissions so far}.
CREATE OR REPLACE FUNCTION floodgate_room_enter__V(
  p_room text, p_client text, p_active bigint, p_rate double precision,
  p_session bigint, p_linger bigint, p_max bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
  st floodgate_room_state%ROWTYPE;
  now_ms bigint;
  burst double precision := greatest(p_rate, 1);
  n_active bigint;
  n_waiting bigint;
  head text;
  mine boolean := false;
  my_ticket bigint;
BEGIN
  INSERT INTO floodgate_room_state (room) VALUES (p_room) ON CONFLICT DO NOTHING;
  SELECT * INTO st FROM floodgate_room_state WHERE room = p_room FOR UPDATE;
  -- Read after the lock, so that calls for one room are stamped in the order they ran.
  now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  DELETE FROM floodgate_room_members m WHERE m.room = p_room
    AND ((NOT m.waiting AND m.last_ms <= now_ms - p_session)
      OR (m.waiting AND m.last_ms <= now_ms - p_linger));
  UPDATE floodgate_room_members m SET last_ms = now_ms
    WHERE m.room = p_room AND m.client = p_client AND NOT m.waiting;
  IF FOUND THEN
    RETURN ARRAY[1, 0,
      (SELECT count(*) FROM floodgate_room_members m WHERE m.room = p_room AND NOT m.waiting),
      (SELECT count(*) FROM floodgate_room_members m WHERE m.room = p_room AND m.waiting),
      st.admitted];
  END IF;
  IF st.at_ms IS NULL THEN
    st.tokens := burst;
  ELSE
    st.tokens := least(burst, st.tokens + greatest(0, now_ms - st.at_ms) * p_rate / 1000);
  END IF;
  SELECT m.ticket INTO my_ticket FROM floodgate_room_members m
    WHERE m.room = p_room AND m.client = p_client;
  IF FOUND THEN
    UPDATE floodgate_room_members m SET last_ms = now_ms
      WHERE m.room = p_room AND m.client = p_client;
  ELSE
    SELECT count(*) INTO n_waiting FROM floodgate_room_members m
      WHERE m.room = p_room AND m.waiting;
    IF n_waiting >= p_max THEN
      RETURN ARRAY[0, n_waiting + 1,
        (SELECT count(*) FROM floodgate_room_members m WHERE m.room = p_room AND NOT m.waiting),
        n_waiting, st.admitted];
    END IF;
    st.seq := st.seq + 1;
    my_ticket := st.seq;
    INSERT INTO floodgate_room_members (room, client, waiting, ticket, last_ms)
      VALUES (p_room, p_client, true, my_ticket, now_ms);
  END IF;
  SELECT count(*) INTO n_active FROM floodgate_room_members m
    WHERE m.room = p_room AND NOT m.waiting;
  WHILE n_active < p_active AND st.tokens >= 1 LOOP
    SELECT m.client INTO head FROM floodgate_room_members m
      WHERE m.room = p_room AND m.waiting ORDER BY m.ticket LIMIT 1;
    EXIT WHEN NOT FOUND;
    UPDATE floodgate_room_members m SET waiting = false, last_ms = now_ms
      WHERE m.room = p_room AND m.client = head;
    st.admitted := st.admitted + 1;
    st.tokens := st.tokens - 1;
    n_active := n_active + 1;
    IF head = p_client THEN
      mine := true;
    END IF;
  END LOOP;
  UPDATE floodgate_room_state SET seq = st.seq, tokens = st.tokens, at_ms = now_ms,
    admitted = st.admitted WHERE room = p_room;
  SELECT count(*) INTO n_waiting FROM floodgate_room_members m
    WHERE m.room = p_room AND m.waiting;
  IF mine THEN
    RETURN ARRAY[1, 0, n_active, n_waiting, st.admitted];
  END IF;
  RETURN ARRAY[0,
    (SELECT count(*) FROM floodgate_room_members m
      WHERE m.room = p_room AND m.waiting AND m.ticket < my_ticket) + 1,
    n_active, n_waiting, st.admitted];
END $$;
