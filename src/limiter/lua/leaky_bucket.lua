-- floodgate limiter script, part 3 of 9: leaky bucket. The same GCRA arithmetic as the token
-- bucket (gcra.lua), but the admitted request's wait (`delay`) is kept: the proxy holds the
-- request that long, so the upstream sees at most `leak_rate` per second.

ALGORITHMS['leaky_bucket'] = {
  check = gcra_check,
  commit = gcra_commit,
}
