#!/usr/bin/env bash
# Measures floodgate's Redis decision hot path with redis-rs's ConnectionManager (what floodgate
# uses) against deadpool-redis, in one run, against a fresh local redis-server.
# Usage: scripts/bench-redis-clients.sh [tasks=64] [seconds=5] [rounds=3]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
cargo build --profile dist --example redis_clients -q
./target/dist/examples/redis_clients "redis://127.0.0.1:$port" "${1:-64}" "${2:-5}" "${3:-3}"
