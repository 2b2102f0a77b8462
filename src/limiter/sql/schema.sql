-- floodgate's PostgreSQL schema, version 5: the tables. Run once per database, under the
-- installer's advisory lock, when floodgate_schema says an older version (or none) is installed
-- (see src/limiter/postgres.rs). The functions are in the other files of this folder and are
-- installed at every start with CREATE OR REPLACE.

-- One row per budget and limit: the same state the Rust algorithms keep (src/limiter/algorithm.rs),
-- in columns whose meaning depends on the algorithm, named in the key's last segment:
--   token_bucket, leaky_bucket   a = tat (the instant the bucket is full again / the queue empty)
--   fixed_window                 a = window start, b = count spent in it
--   quota                        a = the calendar period's end, b = count spent in it
--   sliding_window_counter       a = current window start, b = its count, c = the previous count
--   sliding_window_log           entries = one timestamp per admitted unit of cost, ascending
--   concurrency                  entries = lease ends, ascending; holders = their lease tokens
-- A row with every column at its default is a fresh budget. expires_at (µs since the epoch): past
-- it the row says nothing a fresh row would not, and the sweeper (floodgate_sweep) may delete it.
-- Time is an integer count of microseconds since the Unix epoch, as in the other stores.
--
-- fillfactor 50 leaves room in each page so that the update every decision makes stays a HOT
-- update (no index touches the updated columns: the sweeper walks the primary key instead of an
-- index on expires_at for that reason).
CREATE TABLE IF NOT EXISTS floodgate_budgets (
  key        text COLLATE "C" PRIMARY KEY,
  a          bigint   NOT NULL DEFAULT 0,
  b          bigint   NOT NULL DEFAULT 0,
  c          bigint   NOT NULL DEFAULT 0,
  entries    bigint[] NOT NULL DEFAULT '{}',
  holders    bigint[] NOT NULL DEFAULT '{}',
  expires_at bigint   NOT NULL DEFAULT 0
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.02);

-- Version 2: the control list (bans, overrides, resets: src/control.rs), one row per entry, named
-- with the instance's key prefix; the sequence's value is the list's version, bumped with every
-- write, which every instance reads every 300 ms (the entries only when it changed).
CREATE TABLE IF NOT EXISTS floodgate_control (
  id    text COLLATE "C" PRIMARY KEY,
  entry text NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS floodgate_control_version;

-- Claims made once for every instance (an alert sent once per crossing: src/alerts.rs), each
-- until an instant on the database's clock (µs since the epoch).
CREATE TABLE IF NOT EXISTS floodgate_claims (
  key      text COLLATE "C" PRIMARY KEY,
  until_us bigint NOT NULL
);

-- Version 3: the shared response cache (`cache.shared`: src/cache/shared.rs), one row per entry
-- and variant, named with the instance's key prefix: the entry's bytes, when the database wrote
-- them and until when they are kept (µs since the epoch, on the database's clock). Purges find
-- rows by route and path; every write deletes a few rows past their time.
CREATE TABLE IF NOT EXISTS floodgate_cache (
  key       text COLLATE "C" NOT NULL,
  variant   text COLLATE "C" NOT NULL,
  route     text COLLATE "C" NOT NULL,
  host      text COLLATE "C" NOT NULL,
  path      text COLLATE "C" NOT NULL,
  query     text COLLATE "C",
  stored_us bigint NOT NULL,
  until_us  bigint NOT NULL,
  value     bytea  NOT NULL,
  PRIMARY KEY (key, variant)
);
CREATE INDEX IF NOT EXISTS floodgate_cache_place ON floodgate_cache (route, path);
CREATE INDEX IF NOT EXISTS floodgate_cache_until ON floodgate_cache (until_us);

-- Version 4: waiting rooms (`waiting_room:`: src/room.rs, room.sql), named with the instance's
-- key prefix: each room's state (the next ticket, the admission bucket, admissions so far) and
-- its members, admitted or waiting with a ticket, each with its last request (ms since the
-- epoch, on the database's clock).
CREATE TABLE IF NOT EXISTS floodgate_room_state (
  room     text COLLATE "C" PRIMARY KEY,
  seq      bigint NOT NULL DEFAULT 0,
  tokens   double precision,
  at_ms    bigint,
  admitted bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS floodgate_room_members (
  room    text COLLATE "C" NOT NULL,
  client  text COLLATE "C" NOT NULL,
  waiting boolean NOT NULL,
  ticket  bigint NOT NULL,
  last_ms bigint NOT NULL,
  PRIMARY KEY (room, client)
);
CREATE INDEX IF NOT EXISTS floodgate_room_line ON floodgate_room_members (room, waiting, ticket);

-- Version 5: bytes kept for every instance (ACME's account key, certificates and challenge
-- answers: src/acme.rs), named with the instance's key prefix.
CREATE TABLE IF NOT EXISTS floodgate_blobs (
  key   text COLLATE "C" PRIMARY KEY,
  value bytea NOT NULL
);
