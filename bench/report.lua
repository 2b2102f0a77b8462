-- The BENCH line every wrk script of scripts/bench.sh prints when done (bench/summarize.py reads
-- it): exact request and error counts and latency percentiles, which wrk's own text rounds.
function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d non2xx=%d socket_errors=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
