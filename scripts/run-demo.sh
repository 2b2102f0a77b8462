#!/usr/bin/env bash
# The quick start: builds floodgate, starts the bundled demo upstream on 127.0.0.1:9000 and
# floodgate on the in-memory store on 127.0.0.1:8080 (admin on 127.0.0.1:9090) with
# config/floodgate.yaml. Ctrl-C stops both. Try, from another terminal:
#   for i in $(seq 1 8); do curl -s -o /dev/null -w '%{http_code}\n' -X POST localhost:8080/api/rides/request; done
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
./target/release/floodgate-demo-upstream --listen 127.0.0.1:9000 &
upstream=$!
trap 'kill $upstream 2>/dev/null || true' EXIT
exec_config=${1:-config/floodgate.yaml}
./target/release/floodgate --config "$exec_config"
