-- wrk script for scripts/bench.sh's *_flood_deny targets: every request carries an API key never
-- sent before ("flood-<thread>-<n>"), so no answer can come from floodgate's deny cache: a flood
-- from ever-new identities. Prints the same BENCH line as keys.lua.
local counter = 0
-- Each thread's own prefix (a global: setup runs in wrk's main state and sets it in the thread's).
prefix = "flood-"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("prefix", "flood-" .. threads .. "-")
end
function request()
  counter = counter + 1
  return wrk.format("GET", "/", { ["Host"] = wrk.headers["Host"], ["X-API-Key"] = prefix .. counter })
end
-- The BENCH line, from report.lua beside this file.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")
