#!/usr/bin/env bash
# scripts/websocket-bench.sh: what floodgate's WebSocket limits cost a message. One floodgate
# (memory store) before PyPI websockets' echo server (tests/websocket/peer.py), two routes to it:
# /limited has `websocket: {max_connections, messages, max_message, idle_timeout}` (a bucket no
# message empties: every message is counted and sized, none refused), /plain has none (the
# upgraded connections spliced as they are). 64-byte messages from the websockets client, in
# windows of 100, each echoed back.
#
#   1. messages a second, ROUNDS rounds of SECS seconds on each route, alternating (wall clock:
#      the Python client and server share the two cores with floodgate, so this is the whole
#      chain's rate, and the two routes' ratio);
#   2. floodgate's instructions per message under callgrind: M1 then M2 messages on one socket
#      per run, (total(M2) - total(M1)) / (M2 - M1), so start-up, the handshake and shutdown cancel.
# Knobs: SECS=5 ROUNDS=3 M1=2000 M2=6000 FLOODGATE=target/dist/floodgate BUILD=1
# Needs valgrind and tests/.venv (scripts/test.sh makes it). Loopback only; every process
# started here is stopped on exit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECS="${SECS:-5}" ROUNDS="${ROUNDS:-3}" M1="${M1:-2000}" M2="${M2:-6000}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
PY="$ROOT/tests/.venv/bin/python"
PEER="$ROOT/tests/websocket/peer.py"
[ "${BUILD:-1}" = 1 ] && (cd "$ROOT" && cargo build --profile dist --bin floodgate)
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/floodgate-ws.XXXXXX")"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$PY" "$PEER" serve >"$WORK/echo.out" &
PIDS+=("$!")
for _ in $(seq 100); do [ -s "$WORK/echo.out" ] && break; sleep 0.05; done
ECHO_PORT="$(awk '{print $2}' "$WORK/echo.out")"
PORT="$(free_port)"
cat >"$WORK/floodgate.yaml" <<YAML
listen: 127.0.0.1:$PORT
routes:
  - name: limited
    path_prefix: /limited
    upstream: http://127.0.0.1:$ECHO_PORT
    websocket: {max_connections: 100, messages: {capacity: 1000000000, refill_rate: 1000000}, max_message: 1MiB, idle_timeout: 5m}
  - name: plain
    path_prefix: /plain
    upstream: http://127.0.0.1:$ECHO_PORT
YAML

wait_up() { for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && return; sleep 0.1; done; exit 1; }
# One client command session: opens a socket on $1 and runs $2, printing the last answer.
client() { printf 'open s ws://127.0.0.1:%s%s\n%s\n' "$PORT" "$1" "$2" | "$PY" "$PEER" client | tail -1; }

RUST_LOG=warn "$FLOODGATE" --config "$WORK/floodgate.yaml" >/dev/null 2>&1 &
FG=$!
PIDS+=("$FG")
wait_up
declare -A rates
for round in $(seq "$ROUNDS"); do
    for route in limited plain; do
        r=$(client "/$route" "rate s $SECS" | awk '{print $3}')
        rates[$route]="${rates[$route]:-} $r"
        echo "round $round $route: $r messages/s"
    done
done
kill -TERM "$FG"; wait "$FG" 2>/dev/null || true

instructions() { # ROUTE COUNT
    local out="$WORK/cg.$1.$2.out"
    RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out" "$FLOODGATE" --config "$WORK/floodgate.yaml" >/dev/null 2>&1 &
    local pid=$!
    wait_up
    [ "$(client "/$1" "messages s $2")" = "messages s $2" ] || { echo "$1: the messages did not all come back" >&2; exit 1; }
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    sed -n 's/^summary: //p; s/^totals: //p' "$out" | head -1
}
for route in limited plain; do
    a=$(instructions "$route" "$M1")
    b=$(instructions "$route" "$M2")
    per=$(((b - a) / (M2 - M1)))
    eval "per_$route=$per"
    echo "$route: $per instructions per message (floodgate, callgrind)"
done
python3 - "${rates[limited]}" "${rates[plain]}" "$per_limited" "$per_plain" <<'PY'
import statistics, sys
lim, plain = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()]
print(f"median messages/s: limited {statistics.median(lim):.0f}, plain {statistics.median(plain):.0f} "
      f"(limited / plain {statistics.median(lim) / statistics.median(plain):.2f}); "
      f"instructions per message: limited {sys.argv[3]}, plain {sys.argv[4]} "
      f"(+{int(sys.argv[3]) - int(sys.argv[4])})")
PY
