#!/usr/bin/env bash
# scripts/bench-fair.sh: the adaptive gate at its limit, first come first served against fair
# queues (`fairness: identity`), in one run (#62).
#
# The API is the demo upstream at 160 req/s (8 workers x 50 ms; 503 past a 250 ms wait). Two wrk
# loads at once for DURATION (10 s) through floodgate with `adaptive_concurrency: {queue_timeout:
# 100ms}` on the route: a flood (one API key, 64 connections, no pause) and light riders (16 API
# keys in turn, 4 connections: bench/surge_read.lua with BENCH_KEYS). Per target: each load's
# requests and share answered 2xx, the 2xx a second of both together, and what the API served
# (its /__stats). Knobs: DURATION=10s FLOODGATE=target/dist/floodgate BUILD=1.
# Needs wrk (installed when missing). All traffic goes to 127.0.0.1; every process started here
# is stopped on exit.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DURATION="${DURATION:-10s}"
BUILD="${BUILD:-1}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
DEMO="${DEMO:-$ROOT/target/dist/floodgate-demo-upstream}"

if ! command -v wrk >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --profile dist --bin floodgate --bin floodgate-demo-upstream)
fi

source "$ROOT/scripts/bench-lib.sh"
bench_work bench-fair
start_api

PORT="$(free_port)"
echo "the gate at its limit: a flood (1 key, 64 connections) beside light riders (16 keys, 4 connections), $DURATION"
printf '%-10s %10s %8s %10s %8s %8s %12s\n' target flood 2xx% light 2xx% "2xx/s" "API served"
for fairness in none identity; do
    cat >"$WORK/floodgate.yaml" <<EOF
listen: 127.0.0.1:$PORT
identity:
  api_key_header: X-API-Key
routes:
  - name: rides
    path_prefix: /
    upstream: http://127.0.0.1:$API_PORT
    adaptive_concurrency: {queue_timeout: 100ms, fairness: $fairness}
EOF
    "$FLOODGATE" --config "$WORK/floodgate.yaml" >"$WORK/fg-$fairness.log" 2>&1 &
    pid=$!
    wait_port "$PORT"
    sleep 1
    before=$(served)
    BENCH_KEYS=1 wrk -t1 -c64 -d"$DURATION" -s "$ROOT/bench/surge_read.lua" "http://127.0.0.1:$PORT" \
        >"$WORK/flood.out" &
    flood=$!
    BENCH_KEYS=16 wrk -t1 -c4 -d"$DURATION" -s "$ROOT/bench/surge_read.lua" "http://127.0.0.1:$PORT" \
        >"$WORK/light.out" &
    light=$!
    wait "$flood" "$light"
    after=$(served)
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    python3 - "$fairness" "$((after - before))" "$WORK/flood.out" "$WORK/light.out" <<'PY'
import sys
target, api = sys.argv[1], int(sys.argv[2])
def read(path):
    line = next(l for l in open(path) if l.startswith("BENCH"))
    f = dict(kv.split("=") for kv in line.split()[1:])
    n = int(f["requests"])
    return n, n - int(f["non2xx"]), int(f["duration_us"]) / 1e6
(fn, fok, fs), (ln, lok, ls) = read(sys.argv[3]), read(sys.argv[4])
print(f"{target:<10} {fn:>10} {100 * fok / max(fn, 1):>7.1f}% {ln:>10} {100 * lok / max(ln, 1):>7.1f}% "
      f"{(fok + lok) / max(fs, ls):>8.0f} {api:>12}")
PY
done
