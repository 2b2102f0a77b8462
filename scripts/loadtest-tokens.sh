#!/usr/bin/env bash
# scripts/loadtest-tokens.sh: token budgets for an LLM API under load, on this machine.
#
# Starts redis-server, the demo upstream (its OpenAI-compatible POST /v1/chat/completions) and two
# floodgate instances sharing one Redis with config/llm-tokens.yaml (addresses made local), then
# runs Locust's TokenClient (loadtest/locustfile.py) against both at once: applications with 5
# keys calling with random max_tokens, every other call streamed. floodgate holds each call's
# max_tokens and settles at the usage the answer reports.
#
# Writes to $RESULTS_DIR: each Locust's CSVs and log, each floodgate's /metrics, and
# tokens_summary.md: calls admitted and refused, tokens reserved, settled, refunded and charged
# (floodgate_cost_units_total, both instances), and the tokens the clients saw used, which must
# equal what floodgate settled.
#
# Knobs (environment): USERS=40 SPAWN_RATE=20 DURATION=30s API_KEYS=5 RESULTS_DIR=loadtest/results
#   BUILD=1 to rebuild the release binaries.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
USERS="${USERS:-40}"
SPAWN_RATE="${SPAWN_RATE:-20}"
DURATION="${DURATION:-30s}"
API_KEYS="${API_KEYS:-5}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/loadtest/results}"
BUILD="${BUILD:-0}"
VENV="$ROOT/loadtest/.venv"
FLOODGATE="$ROOT/target/dist/floodgate"
DEMO_UPSTREAM="$ROOT/target/dist/floodgate-demo-upstream"

log() { printf '[loadtest-tokens %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

PIDS=()
cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Waits for "$3 listening on http://IP:PORT" in file $1 written by process $2; prints the URL.
wait_for_address() {
  local file="$1" pid="$2" what="$3" i address
  for ((i = 0; i < 150; i++)); do
    address="$(grep -m1 -oE "^$what listening on http://[0-9.]+:[0-9]+" "$file" 2>/dev/null | sed 's/.* listening on //' || true)"
    if [[ -n "$address" ]]; then echo "$address"; return 0; fi
    kill -0 "$pid" 2>/dev/null || die "$what exited before listening; see $file"
    sleep 0.1
  done
  die "$what did not print its address within 15 s; see $file"
}

# --- setup (only what is missing) ------------------------------------------------------------------
mkdir -p "$RESULTS_DIR"
if [[ "$BUILD" == 1 || ! -x "$FLOODGATE" || ! -x "$DEMO_UPSTREAM" ]]; then
  log "building the release binaries"
  (cd "$ROOT" && cargo build --profile dist -p floodgate -p floodgate-demo-upstream >/dev/null)
fi
if ! command -v redis-server >/dev/null; then
  log "installing redis-server with apt-get"
  SUDO=(); if [[ "$(id -u)" != 0 ]]; then SUDO=(sudo); fi
  "${SUDO[@]}" apt-get install -y redis-server >/dev/null
fi
if [[ ! -x "$VENV/bin/locust" ]]; then
  log "making $VENV with Locust"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$ROOT/loadtest/requirements.txt"
fi

# --- processes --------------------------------------------------------------------------------------
REDIS_PORT="$(free_port)"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  >"$RESULTS_DIR/tokens_redis.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

"$DEMO_UPSTREAM" --listen 127.0.0.1:0 --workers 64 --service-time 20ms --queue-timeout 2s \
  >"$RESULTS_DIR/tokens_upstream.out" 2>"$RESULTS_DIR/tokens_upstream.log" &
PIDS+=("$!")
UPSTREAM="$(wait_for_address "$RESULTS_DIR/tokens_upstream.out" "$!" floodgate-demo-upstream)"

PROXIES=() ADMINS=()
for n in a b; do
  admin_port="$(free_port)"
  config="$RESULTS_DIR/tokens_floodgate_$n.yaml"
  sed -E \
    -e "s#^listen:.*#listen: 127.0.0.1:0#" \
    -e "s#^admin_listen:.*#admin_listen: 127.0.0.1:$admin_port#" \
    -e "s#http://127.0.0.1:9000#$UPSTREAM#g" \
    -e "s#redis://127.0.0.1:6379#redis://127.0.0.1:$REDIS_PORT#" \
    "$ROOT/config/llm-tokens.yaml" >"$config"
  RUST_LOG=warn "$FLOODGATE" --config "$config" \
    >"$RESULTS_DIR/tokens_floodgate_$n.out" 2>"$RESULTS_DIR/tokens_floodgate_$n.log" &
  PIDS+=("$!")
  PROXIES+=("$(wait_for_address "$RESULTS_DIR/tokens_floodgate_$n.out" "$!" floodgate)")
  ADMINS+=("http://127.0.0.1:$admin_port")
done

# --- the run: half the users on each instance ----------------------------------------------------------
log "Locust: $USERS users for $DURATION against ${PROXIES[*]}"
LOCUSTS=()
for i in 0 1; do
  env LOADTEST_API_KEYS="$API_KEYS" LOADTEST_TOKENS_FILE="$RESULTS_DIR/tokens_used_$i.json" \
    "$VENV/bin/locust" -f "$ROOT/loadtest/locustfile.py" TokenClient --headless \
    -u "$((USERS / 2))" -r "$((SPAWN_RATE / 2 + 1))" -t "$DURATION" -H "${PROXIES[$i]}" \
    --csv "$RESULTS_DIR/tokens_$i" --only-summary --exit-code-on-error 0 \
    >"$RESULTS_DIR/tokens_locust_$i.log" 2>&1 &
  LOCUSTS+=("$!")
done
for pid in "${LOCUSTS[@]}"; do wait "$pid" || die "Locust failed; see $RESULTS_DIR/tokens_locust_*.log"; done
sleep 1 # the last responses' settlements
for i in 0 1; do curl -fsS "${ADMINS[$i]}/metrics" >"$RESULTS_DIR/tokens_metrics_$i.txt"; done

"$VENV/bin/python" - "$RESULTS_DIR" <<'PY'
import csv, json, re, sys
from pathlib import Path

results = Path(sys.argv[1])
units = {}
for i in (0, 1):
    for line in (results / f"tokens_metrics_{i}.txt").read_text().splitlines():
        m = re.match(r'floodgate_cost_units_total\{route="chat",limit="([^"]+)",outcome="(\w+)"\} (\d+)', line)
        if m:
            key = (m.group(1), m.group(2))
            units[key] = units.get(key, 0) + int(m.group(3))
calls = {"admitted": 0, "refused": 0, "failed": 0}
used = {"settled": 0, "over_reserve": 0}
for i in (0, 1):
    for row in csv.DictReader(open(results / f"tokens_{i}_stats.csv")):
        if row["Name"] == "/v1/chat/completions":
            calls["admitted"] += int(row["Request Count"]) - int(row["Failure Count"])
            calls["failed"] += int(row["Failure Count"])
        elif row["Name"] == "/v1/chat/completions (429)":
            calls["refused"] += int(row["Request Count"])
    for k, v in json.loads((results / f"tokens_used_{i}.json").read_text()).items():
        used[k] += v
lines = [
    "# Token budgets under load (scripts/loadtest-tokens.sh)",
    "",
    f"Calls: {calls['admitted']} admitted, {calls['refused']} refused (429), {calls['failed']} failed.",
    f"Tokens the clients saw used: {used['settled']} ({used['over_reserve']} beyond their max_tokens).",
    "",
    "| limit | reserved | settled | refunded | charged |",
    "| --- | --- | --- | --- | --- |",
]
for limit in sorted({k[0] for k in units}):
    row = [units.get((limit, o), 0) for o in ("reserved", "settled", "refunded", "charged")]
    lines.append(f"| {limit} | " + " | ".join(str(n) for n in row) + " |")
settled = units.get(("chat-0", "settled"), 0)
verdict = "equal" if settled == used["settled"] else "DIFFERENT"
lines += ["", f"chat-0 (total tokens) settled {settled}; the clients saw {used['settled']}: {verdict}."]
(results / "tokens_summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if verdict == "equal" and calls["failed"] == 0 else 1)
PY
