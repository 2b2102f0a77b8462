#!/usr/bin/env bash
# scripts/bench-room.sh: what a waiting room costs Redis per request (#62), beside what one
# token bucket's decision costs it, in one run.
#
# floodgate on Redis before the demo API (8 workers x 1 ms: not the bottleneck); wrk 64
# connections for DURATION (10 s) with 2,000 API keys in turn (bench/surge_read.lua), against:
#   bucket  the route's one token bucket (capacity 1,000,000: every request allowed)
#   room    no limit, a waiting room on the route (`activate: always`, active 500, admit_rate 100,
#           session 1m): 500 clients admitted, the other 1,500 waiting their turn
# Per target: requests a second, answers by status, and from Redis's INFO (before and after)
# the script calls per request, µs of Redis per call (its own `usec_per_call`) and Redis's CPU
# per request (used_cpu_user + used_cpu_sys). Knobs: DURATION=10s FLOODGATE=... BUILD=1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DURATION="${DURATION:-10s}"
BUILD="${BUILD:-1}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
DEMO="${DEMO:-$ROOT/target/dist/floodgate-demo-upstream}"

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --profile dist --bin floodgate --bin floodgate-demo-upstream)
fi

source "$ROOT/scripts/bench-lib.sh"
bench_work bench-room
API_PORT="$(free_port)"
"$DEMO" --listen "127.0.0.1:$API_PORT" --workers 8 --service-time 1ms --queue-timeout 250ms \
    >"$WORK/api.log" 2>&1 &
PIDS+=("$!")
wait_port "$API_PORT"
start_redis

PORT="$(free_port)"
info() { redis-cli -p "$REDIS_PORT" info all; }
echo "wrk 64 connections for $DURATION, 2,000 keys, floodgate on Redis"
printf '%-8s %10s %10s %16s %14s %16s\n' target "req/s" "2xx/503" "calls/request" "µs/call" "Redis µs CPU/req"
for target in bucket room; do
    case $target in
        bucket) tail="    limits: [{algorithm: token_bucket, capacity: 1000000, refill_rate: 1000000}]"; room="" ;;
        room) tail=""; room="waiting_room: [{name: concert, routes: [surge-map], active: 500, admit_rate: 100, session: 1m, activate: always}]" ;;
    esac
    cat >"$WORK/floodgate.yaml" <<EOF
listen: 127.0.0.1:$PORT
identity:
  api_key_header: X-API-Key
storage: {backend: redis, url: "redis://127.0.0.1:$REDIS_PORT", on_error: allow}
$room
routes:
  - name: surge-map
    path_prefix: /
    upstream: http://127.0.0.1:$API_PORT
$tail
EOF
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    "$FLOODGATE" --config "$WORK/floodgate.yaml" >"$WORK/fg-$target.log" 2>&1 &
    pid=$!
    wait_port "$PORT"
    sleep 1
    redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
    info >"$WORK/before"
    wrk -t2 -c64 -d"$DURATION" -s "$ROOT/bench/surge_read.lua" "http://127.0.0.1:$PORT" >"$WORK/wrk.out"
    info >"$WORK/after"
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    python3 - "$target" "$WORK/wrk.out" "$WORK/before" "$WORK/after" <<'PY'
import re, sys
target, wrk, before, after = sys.argv[1:]
line = next(l for l in open(wrk) if l.startswith("BENCH"))
f = dict(kv.split("=") for kv in line.split()[1:])
requests, non2xx = int(f["requests"]), int(f["non2xx"])
secs = int(f["duration_us"]) / 1e6
def stats(path):
    text = open(path).read()
    cpu = sum(float(re.search(rf"^{k}:([\d.]+)", text, re.M).group(1)) for k in ("used_cpu_user", "used_cpu_sys"))
    calls = usec = 0
    for m in re.finditer(r"^cmdstat_(eval|evalsha|fcall):calls=(\d+),usec=(\d+)", text, re.M):
        calls += int(m.group(2)); usec += int(m.group(3))
    return cpu, calls, usec
(c0, n0, u0), (c1, n1, u1) = stats(before), stats(after)
calls = n1 - n0
print(f"{target:<8} {requests / secs:>10.0f} {requests - non2xx:>5}/{non2xx:<5} {calls / max(requests, 1):>15.2f} "
      f"{(u1 - u0) / max(calls, 1):>14.1f} {(c1 - c0) * 1e6 / max(requests, 1):>16.1f}")
PY
done
