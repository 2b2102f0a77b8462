#!/usr/bin/env bash
# scripts/bench-lua-vs-watch.sh: seed 002's comparison with floodgate's own Redis client (one
# Lua script per decision, three separate commands, WATCH/MULTI/EXEC with retries): cost per
# decision, Redis round trips per decision, and the over-grant test. Starts its own redis-server
# on a free loopback port; prints two markdown tables. RUN_SECONDS=3 sets each performance run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
(cd "$ROOT" && cargo build --profile dist -q --example lua_vs_watch)
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
REDIS=$!
trap 'kill $REDIS 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$ROOT/target/dist/examples/lua_vs_watch" "redis://127.0.0.1:$PORT"
