#!/usr/bin/env bash
# scripts/bench-script-cost.sh: Redis CPU per limiter decision (INFO commandstats usec_per_call)
# for a one-limit and a three-limit request, through floodgate's store, on a redis-server of its
# own (loopback, a free port). Prints a markdown table.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
(cd "$ROOT" && cargo build --profile dist -q --example script_cost)
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
REDIS=$!
trap 'kill $REDIS 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$ROOT/target/dist/examples/script_cost" "redis://127.0.0.1:$PORT"
