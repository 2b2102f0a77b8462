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
function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d non2xx=%d socket_errors=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
