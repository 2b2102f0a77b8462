#!/usr/bin/env bash
# scripts/bench-replay.sh: how fast `floodgate replay` reads floodgate's JSON access log.
#
# Generates LINES lines (default 2,000,000) of floodgate's own JSON access-log format: 10,000
# distinct API keys and 5,000 client IPs over one hour, against a three-limit route (a token
# bucket per key, a per: ip ceiling, a per: route cap), then times
#   floodgate replay --config bench/replay.yaml --format json LOG
# with one core (taskset) and prints lines per second and the peak resident memory.
#   LINES=2000000  FLOODGATE=target/dist/floodgate  BUILD=1
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LINES="${LINES:-2000000}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
[ "${BUILD:-1}" = 1 ] && (cd "$ROOT" && cargo build --profile dist -q)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 "$ROOT/bench/replay_log.py" "$LINES" >"$WORK/access.log"
log_mb=$(( $(stat -c %s "$WORK/access.log") / 1000000 ))
echo "generated $LINES lines ($log_mb MB)" >&2
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
start=$(date +%s.%N)
/usr/bin/time -f '%M' -o "$WORK/rss" "${pin[@]}" "$FLOODGATE" replay --config "$ROOT/bench/replay.yaml" \
    --format json "$WORK/access.log" >"$WORK/report.json"
end=$(date +%s.%N)
python3 - "$start" "$end" "$LINES" "$WORK/rss" "$WORK/report.json" <<'PY'
import json, sys
start, end, lines, rss_file, report = sys.argv[1:]
seconds = float(end) - float(start)
rss_mb = int(open(rss_file).read().split()[-1]) / 1024
r = json.load(open(report))
api = r["routes"][0]
print(f"replay: {int(lines):,} lines in {seconds:.2f} s = {int(lines) / seconds:,.0f} lines/s on one core; "
      f"peak RSS {rss_mb:.0f} MB; route api: {api['requests']:,} requests, {api['allowed']:,} allowed, "
      f"{api['denied']:,} denied; malformed {r['malformed']['total']}")
PY
