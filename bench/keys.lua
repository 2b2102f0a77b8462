-- wrk script for scripts/bench.sh: KEYS rotating API keys, requests formatted once; prints one BENCH line with exact figures.
local n = tonumber(os.getenv("BENCH_KEYS") or "1000")
local requests = {}
local i = 0
function init(args)
  for k = 1, n do
    requests[k] = wrk.format("GET", "/", {
      ["Host"] = wrk.headers["Host"],
      ["X-API-Key"] = string.format("bench-key-%04d", k),
    })
  end
end
function request()
  i = i % n + 1
  return requests[i]
end
function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d non2xx=%d socket_errors=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
