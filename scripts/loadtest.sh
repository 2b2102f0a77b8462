#!/usr/bin/env bash
# scripts/loadtest.sh: the ride-hailing surge scenario on this machine, without Docker.
#
# Starts redis-server, the demo upstream (an API with finite capacity) and floodgate as local processes on
# 127.0.0.1, then runs Locust headless against floodgate, once per run in RUNS:
#   no_limit          floodgate with every route's limits removed (the unprotected baseline)
#   with_limit        the ride-hailing config (token bucket, capacity 20, refill 10/s on rides and fares;
#                     the surge map cached for 1 s, the same bucket behind the cache)
#   no_cache          with_limit without the surge map's cache: its riders get what the bucket allows
#   adaptive          no limits, only `adaptive_concurrency: {}` on every route: no number configured
#   adaptive_degrade  the same, and the upstream gets sick a third of the way in (its service time × 3,
#                     through its /__capacity knob) and heals two thirds of the way in
#   waiting_room      (asked for in RUNS) adaptive, and a waiting room before rides and fares that opens
#                     when the gate sheds and admits half the identities (API_KEYS) at once: the tables
#                     count the riders told to wait ("(of which waiting)") apart from the ones admitted
#   replica_kill      (asked for in RUNS) the with_limit config in front of three replicas of the demo
#                     upstream on 127.0.0.2-4 (one port, as compose's replicas behind one name):
#                     `upstreams:` of three; the first replica is killed (SIGKILL) a third of the way in
#                     and started again at two thirds. What clients saw is in the tables (Fail%), what
#                     each replica got in NAME_endpoints.txt (floodgate_upstream_* from /metrics).
# Every config is derived from config/floodgate.docker.yaml. Results go to $RESULTS_DIR: Locust CSVs,
# logs, floodgate's learned limit over time (NAME_limit_timeline.csv), summary.json, summary.md and
# surge.png.
#
# At the seeds' scale (2,000 users, spawn rate 100, 3 minutes): USERS=2000 SPAWN_RATE=100 DURATION=3m
# LOCUST_PROCESSES=2 (Locust's --processes: one worker per process, one core each).
#
# Knobs (environment):
#   USERS=100  SPAWN_RATE=20  DURATION=30s  RESULTS_DIR=loadtest/results
#   STORE=redis|memory           limiter store for floodgate (storage.backend)
#   API_KEYS=5                   identities (X-API-Key rider-0..N-1) shared by the simulated riders
#   UPSTREAM_WORKERS=8 UPSTREAM_SERVICE_TIME=50ms UPSTREAM_QUEUE_TIMEOUT=250ms   demo upstream capacity
#   PIN_CPUS=1                   pin Locust to CPU 1 and the servers to CPU 0 (needs 2+ CPUs and taskset)
#   BUILD=1                      rebuild the release binaries even if they exist
#   RUNS="no_limit no_cache with_limit adaptive adaptive_degrade"   which runs, in order
#   LOCUST_PROCESSES=1           Locust worker processes (--processes; more for thousands of users)
# Setup (build, apt-get install redis-server, virtualenv) happens first, only when something is missing;
# after that the runs finish within (DURATION + 30 s) per run + 1 minute. Every process started here is stopped on exit.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
USERS="${USERS:-100}"
SPAWN_RATE="${SPAWN_RATE:-20}"
DURATION="${DURATION:-30s}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/loadtest/results}"
STORE="${STORE:-redis}"
API_KEYS="${API_KEYS:-5}"
UPSTREAM_WORKERS="${UPSTREAM_WORKERS:-8}"
UPSTREAM_SERVICE_TIME="${UPSTREAM_SERVICE_TIME:-50ms}"
UPSTREAM_QUEUE_TIMEOUT="${UPSTREAM_QUEUE_TIMEOUT:-250ms}"
PIN_CPUS="${PIN_CPUS:-1}"
BUILD="${BUILD:-0}"
BASE_CONFIG="$ROOT/config/floodgate.docker.yaml"
VENV="$ROOT/loadtest/.venv"
FLOODGATE="$ROOT/target/dist/floodgate"
DEMO_UPSTREAM="$ROOT/target/dist/floodgate-demo-upstream"
read -r -a RUNS <<<"${RUNS:-no_limit no_cache with_limit adaptive adaptive_degrade}"
LOCUST_PROCESSES="${LOCUST_PROCESSES:-1}"
# One process by default: with --processes, a master aggregates its workers' stats, which arrive
# every few seconds (the per-second history then comes in steps).
PROCESSES=()
if ((LOCUST_PROCESSES > 1)); then PROCESSES=(--processes "$LOCUST_PROCESSES"); fi

log() { printf '[loadtest %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- processes -----------------------------------------------------------------------------------------
PIDS=()

# Stops one process we started: SIGTERM, then SIGKILL after 10 s.
stop_pid() {
  local pid="$1" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  if ((rc != 0)); then log "exiting with status $rc; stopping ${#PIDS[@]} process(es) started here"; fi
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

forget_pid() {
  local keep=() pid
  for pid in "${PIDS[@]}"; do [[ "$pid" == "$1" ]] || keep+=("$pid"); done
  PIDS=("${keep[@]}")
}

# Waits for the line "$3 listening on http://IP:PORT" in file $1 written by process $2; prints http://IP:PORT.
wait_for_address() {
  local file="$1" pid="$2" what="$3" i address
  for ((i = 0; i < 150; i++)); do
    address="$(grep -m1 -oE "^$what listening on http://[0-9.]+:[0-9]+" "$file" 2>/dev/null | sed 's/.* listening on //' || true)"
    if [[ -n "$address" ]]; then echo "$address"; return 0; fi
    kill -0 "$pid" 2>/dev/null || die "$what exited before listening; see ${file%.*}.log"
    sleep 0.1
  done
  die "$what did not print its address within 15 s; see $file"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# "30s", "2m", "1m30s", "1h" or plain seconds -> seconds.
duration_seconds() {
  local text="$1" total=0 rest
  if [[ "$text" =~ ^[0-9]+$ ]]; then echo "$text"; return; fi
  rest="$text"
  while [[ "$rest" =~ ^([0-9]+)([hms])(.*)$ ]]; do
    case "${BASH_REMATCH[2]}" in
      h) total=$((total + BASH_REMATCH[1] * 3600)) ;;
      m) total=$((total + BASH_REMATCH[1] * 60)) ;;
      s) total=$((total + BASH_REMATCH[1])) ;;
    esac
    rest="${BASH_REMATCH[3]}"
  done
  [[ -z "$rest" && "$total" -gt 0 ]] || die "DURATION=$text: use e.g. 30s, 2m or 1m30s"
  echo "$total"
}


# --- setup (only what is missing) ------------------------------------------------------------------------
DUR_S="$(duration_seconds "$DURATION")"
[[ "$STORE" == redis || "$STORE" == memory ]] || die "STORE=$STORE: use redis or memory"
if [[ "$PIN_CPUS" == 1 ]] && { ! command -v taskset >/dev/null || [[ "$(nproc)" -lt 2 ]]; }; then
  log "PIN_CPUS=1 needs taskset and 2 CPUs; running unpinned"
  PIN_CPUS=0
fi
# Command prefixes (arrays, not functions, so that $! is the server's own pid): with PIN_CPUS=1 the
# servers share CPU 0 and Locust gets CPU 1, so the load generator does not steal the proxy's CPU.
SERVER_PREFIX=()
CLIENT_PREFIX=()
if [[ "$PIN_CPUS" == 1 ]]; then SERVER_PREFIX=(taskset -c 0); CLIENT_PREFIX=(taskset -c 1); fi

if [[ "$BUILD" == 1 || ! -x "$FLOODGATE" || ! -x "$DEMO_UPSTREAM" ]]; then
  log "building release binaries (cargo build --profile dist --workspace --bins)"
  (cd "$ROOT" && cargo build --profile dist --workspace --bins)
fi

if [[ "$STORE" == redis ]] && ! command -v redis-server >/dev/null; then
  log "installing redis-server with apt-get"
  if [[ "$(id -u)" == 0 ]]; then SUDO=(); else SUDO=(sudo); fi
  "${SUDO[@]}" apt-get install -y redis-server >/dev/null
fi

REQUIREMENTS="$ROOT/loadtest/requirements.txt"
if [[ ! -x "$VENV/bin/locust" ]] || ! cmp -s "$REQUIREMENTS" "$VENV/.requirements.txt"; then
  log "creating the virtualenv $VENV (locust, matplotlib)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$VENV/.requirements.txt"
fi

mkdir -p "$RESULTS_DIR"
RESULTS_DIR="$(cd "$RESULTS_DIR" && pwd)"
for run in "${RUNS[@]}"; do rm -f "$RESULTS_DIR/${run}"_*; done
rm -f "$RESULTS_DIR"/summary.{json,md} "$RESULTS_DIR"/surge.png

# From here on the clock runs: every run must end within (DURATION + 30 s) each, plus 60 s.
DEADLINE=$((SECONDS + ${#RUNS[@]} * (DUR_S + 30) + 60))
remaining() { echo $((DEADLINE - SECONDS)); }

# --- redis and the demo upstream (shared by both runs) -----------------------------------------------------
REDIS_URL=""
if [[ "$STORE" == redis ]]; then
  REDIS_PORT="$(free_port)"
  "${SERVER_PREFIX[@]}" redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
    >"$RESULTS_DIR/redis.log" 2>&1 &
  PIDS+=($!)
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  for ((i = 0; i < 50; i++)); do
    if redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then break; fi
    sleep 0.1
  done
  redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG || die "redis-server did not answer; see $RESULTS_DIR/redis.log"
  log "redis-server on $REDIS_URL"
fi

"${SERVER_PREFIX[@]}" "$DEMO_UPSTREAM" --listen 127.0.0.1:0 --workers "$UPSTREAM_WORKERS" \
  --service-time "$UPSTREAM_SERVICE_TIME" --queue-timeout "$UPSTREAM_QUEUE_TIMEOUT" \
  >"$RESULTS_DIR/upstream.out" 2>"$RESULTS_DIR/upstream.log" &
UPSTREAM_PID=$!
PIDS+=("$UPSTREAM_PID")
UPSTREAM="$(wait_for_address "$RESULTS_DIR/upstream.out" "$UPSTREAM_PID" floodgate-demo-upstream)"
log "demo upstream on $UPSTREAM ($(cat "$RESULTS_DIR/upstream.log"))"

upstream_stats() { curl -fsS --max-time 2 "$UPSTREAM/__stats"; }
stat_field() { sed -E "s/.*\"$1\":([0-9]+).*/\1/"; }

# Samples /__stats once a second into $1 (CSV) until killed (run it in the background). On SIGTERM it
# also stops its pending `sleep`, so nothing is left behind.
poll_upstream() {
  local stats sleeper=""
  trap '[[ -n "$sleeper" ]] && kill "$sleeper" 2>/dev/null; exit 0' TERM
  echo "unix_time,served,rejected,in_flight" >"$1"
  while :; do
    if stats="$(upstream_stats 2>/dev/null)"; then
      echo "$(date +%s.%N),$(stat_field served <<<"$stats"),$(stat_field rejected <<<"$stats"),$(stat_field in_flight <<<"$stats")" >>"$1"
    fi
    sleep 1 &
    sleeper=$!
    wait "$sleeper" || true
  done
}

# Waits (at most 10 s) until the upstream has no queued or running requests.
wait_upstream_idle() {
  local i
  for ((i = 0; i < 100; i++)); do
    [[ "$(upstream_stats | stat_field in_flight)" == 0 ]] && return 0
    sleep 0.1
  done
  log "warning: the upstream still has requests in flight"
}

# --- floodgate configs --------------------------------------------------------------------------------------
ADMIN_PORT="$(free_port)"

# Writes the local with_limit config: same routes and limits as the Docker one, local addresses.
make_with_limit_config() {
  sed -E \
    -e "s#^listen:.*#listen: 127.0.0.1:0#" \
    -e "s#^admin_listen:.*#admin_listen: 127.0.0.1:$ADMIN_PORT#" \
    -e "s#http://upstream:9000#$UPSTREAM#g" \
    -e "s#^(  backend:).*#\\1 $STORE#" \
    -e "s#^(  url:).*#\\1 ${REDIS_URL:-redis://127.0.0.1:6379}#" \
    "$BASE_CONFIG" >"$1"
}

# Writes the no_limit config from the with_limit one: every `limits:` block becomes `limits: []`.
make_no_limit_config() {
  awk '
    function indent(line) { match(line, /^ */); return RLENGTH }
    skipping {
      if ($0 ~ /^[[:space:]]*(#.*)?$/ || indent($0) > limits_indent) next
      if (indent($0) == limits_indent && $0 ~ /^ *- /) next
      skipping = 0
    }
    $0 ~ /^[[:space:]]*limits:[[:space:]]*(#.*)?$/ {
      limits_indent = indent($0)
      printf "%" limits_indent "s%s\n", "", "limits: []"
      skipping = 1
      next
    }
    { print }
  ' "$2" >"$1"
  if grep -q 'algorithm:' "$1"; then die "could not remove the limits from $2"; fi
}

# Writes the adaptive config from the no_limit one: `adaptive_concurrency: {}` on every route (they all
# forward to the demo upstream, so they share its one learned limit).
make_adaptive_config() {
  sed -E 's#^( +)upstream: (.*)$#\1upstream: \2\n\1adaptive_concurrency: {}#' "$2" >"$1"
  grep -q 'adaptive_concurrency' "$1" || die "could not add adaptive_concurrency to $2"
}

make_with_limit_config "$RESULTS_DIR/with_limit_floodgate.yaml"
# no_cache: the with_limit config without the surge map's cache.
grep -v '^    cache:' "$RESULTS_DIR/with_limit_floodgate.yaml" >"$RESULTS_DIR/no_cache_floodgate.yaml"
grep -q '^    cache:' "$RESULTS_DIR/with_limit_floodgate.yaml" || die "the surge map has no cache in $BASE_CONFIG"
make_no_limit_config "$RESULTS_DIR/no_limit_floodgate.yaml" "$RESULTS_DIR/no_cache_floodgate.yaml"
make_adaptive_config "$RESULTS_DIR/adaptive_floodgate.yaml" "$RESULTS_DIR/no_limit_floodgate.yaml"

# replica_kill: three replicas of the demo upstream on one port, 127.0.0.2-4, for that run only.
REPLICA_PORT="$(free_port)"
REPLICAS=(127.0.0.2 127.0.0.3 127.0.0.4)
REPLICA_PIDS=()
start_replica() { # index
  local ip="${REPLICAS[$1]}"
  "${SERVER_PREFIX[@]}" "$DEMO_UPSTREAM" --listen "$ip:$REPLICA_PORT" --workers "$UPSTREAM_WORKERS" \
    --service-time "$UPSTREAM_SERVICE_TIME" --queue-timeout "$UPSTREAM_QUEUE_TIMEOUT" \
    >"$RESULTS_DIR/replica-$1.out" 2>>"$RESULTS_DIR/replica-$1.log" &
  REPLICA_PIDS[$1]=$!
  PIDS+=("${REPLICA_PIDS[$1]}")
  wait_for_address "$RESULTS_DIR/replica-$1.out" "${REPLICA_PIDS[$1]}" floodgate-demo-upstream >/dev/null
  echo "${REPLICA_PIDS[$1]}" >"$RESULTS_DIR/replica-$1.pid"
}
if [[ " ${RUNS[*]} " == *" replica_kill "* ]]; then
  origins="$(printf "http://%s:$REPLICA_PORT, " "${REPLICAS[@]}" | sed 's/, $//')"
  sed -E "s#^( +)upstream: $UPSTREAM\$#\1upstreams: [$origins]#" \
    "$RESULTS_DIR/with_limit_floodgate.yaml" >"$RESULTS_DIR/replica_kill_floodgate.yaml"
  grep -q 'upstreams:' "$RESULTS_DIR/replica_kill_floodgate.yaml" || die "could not make the replica_kill config"
fi

# The first replica is killed a third of the way into the run and started again at two thirds.
kill_replica_midrun() {
  local third=$((DUR_S / 3))
  sleep "$third"
  log "[$1] kill -9 of the replica on ${REPLICAS[0]}:$REPLICA_PORT"
  kill -KILL "${REPLICA_PIDS[0]}" 2>/dev/null || true
  sleep "$third"
  log "[$1] the replica on ${REPLICAS[0]} starts again"
  start_replica 0
}
cp "$RESULTS_DIR/adaptive_floodgate.yaml" "$RESULTS_DIR/adaptive_degrade_floodgate.yaml"
# waiting_room: the adaptive config, and a room before rides and fares that opens when the gate
# sheds (`activate: overloaded`) and admits about half the identities at once.
ROOM_ACTIVE=$(((API_KEYS + 1) / 2))
{
  cat "$RESULTS_DIR/adaptive_floodgate.yaml"
  echo "waiting_room:"
  echo "  - {name: surge, routes: [rides, fares], active: $ROOM_ACTIVE, admit_rate: 10, session: 5s}"
} >"$RESULTS_DIR/waiting_room_floodgate.yaml"

cat >"$RESULTS_DIR/context.md" <<EOF
Run on $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs$([[ "$PIN_CPUS" == 1 ]] && echo " (Locust pinned to CPU 1; floodgate, upstream and Redis on CPU 0)").
Locust: $USERS users, spawn rate $SPAWN_RATE/s, $DURATION per run, $API_KEYS shared API keys, wait 0.1-0.5 s.
Demo upstream: $(sed 's/^floodgate-demo-upstream: //' "$RESULTS_DIR/upstream.log"); it answers 503 after the queue timeout.
floodgate storage backend: $STORE.
EOF

# floodgate's learned limit (floodgate_adaptive_limit, any upstream) once a second: unix_time,limit.
poll_limit() {
  local value sleeper=""
  trap '[[ -n "$sleeper" ]] && kill "$sleeper" 2>/dev/null; exit 0' TERM
  echo "unix_time,limit" >"$1"
  while :; do
    value="$(curl -fsS --max-time 1 "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null \
      | awk '/^floodgate_adaptive_limit\{/ {print $2; exit}')" || true
    if [[ -n "$value" ]]; then echo "$(date +%s.%N),$value" >>"$1"; fi
    sleep 1 &
    sleeper=$!
    wait "$sleeper" || true
  done
}

# The upstream gets sick a third of the way into the run (service time × 3) and heals at two thirds.
degrade_midrun() {
  local third=$((DUR_S / 3)) sick
  sick="$(awk -v t="$UPSTREAM_SERVICE_TIME" 'BEGIN { n = t + 0; u = t; sub(/^[0-9.]+/, "", u); print n * 3 u }')"
  sleep "$third"
  log "[$1] the upstream gets sick: service time $sick"
  curl -fsS -o /dev/null -X POST "$UPSTREAM/__capacity?service_time=$sick"
  sleep "$third"
  log "[$1] the upstream heals: service time $UPSTREAM_SERVICE_TIME"
  curl -fsS -o /dev/null -X POST "$UPSTREAM/__capacity?service_time=$UPSTREAM_SERVICE_TIME"
}

# --- one run ----------------------------------------------------------------------------------------------
run_scenario() {
  local run="$1" config="$RESULTS_DIR/$1_floodgate.yaml" fg_pid proxy status before after poll_pid locust_pid rc budget
  if [[ "$run" == replica_kill ]]; then
    local i
    for i in 0 1 2; do start_replica "$i"; done
    log "[$run] replicas on ${REPLICAS[*]} port $REPLICA_PORT"
  fi
  log "[$run] starting floodgate with $config"
  local environment=(RUST_LOG="${RUST_LOG:-warn}")
  if [[ -n "$REDIS_URL" ]]; then environment+=(FLOODGATE_REDIS_URL="$REDIS_URL"); fi
  "${SERVER_PREFIX[@]}" env "${environment[@]}" "$FLOODGATE" --config "$config" \
    >"$RESULTS_DIR/${run}_floodgate.out" 2>"$RESULTS_DIR/${run}_floodgate.log" &
  fg_pid=$!
  PIDS+=("$fg_pid")
  proxy="$(wait_for_address "$RESULTS_DIR/${run}_floodgate.out" "$fg_pid" floodgate)"

  # One request through the proxy (its own identity, so no rider's budget is spent) proves the wiring.
  status="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST -H 'X-API-Key: loadtest-smoke' \
    -H 'Content-Type: application/json' -d '{}' "$proxy/api/fares/estimate" || true)"
  [[ "$status" == 200 ]] || die "[$run] smoke request through floodgate ($proxy) got HTTP $status, expected 200"

  wait_upstream_idle
  if [[ -n "$REDIS_URL" ]]; then redis-cli -p "$REDIS_PORT" config resetstat >/dev/null; fi
  before="$(upstream_stats)"
  poll_upstream "$RESULTS_DIR/${run}_upstream_timeline.csv" &
  poll_pid=$!
  PIDS+=("$poll_pid")
  poll_limit "$RESULTS_DIR/${run}_limit_timeline.csv" &
  local limit_pid=$!
  PIDS+=("$limit_pid")
  local sick_pid=""
  if [[ "$run" == *degrade* ]]; then
    degrade_midrun "$run" &
    sick_pid=$!
    PIDS+=("$sick_pid")
  fi
  if [[ "$run" == replica_kill ]]; then
    kill_replica_midrun "$run" &
    sick_pid=$!
    PIDS+=("$sick_pid")
  fi

  budget=$((DUR_S + 25))
  if ((budget > $(remaining) - 5)); then budget=$(($(remaining) - 5)); fi
  ((budget > 5)) || die "out of time budget before the $run run"
  log "[$run] Locust: $USERS users for $DURATION against $proxy"
  "${CLIENT_PREFIX[@]}" env LOADTEST_API_KEYS="$API_KEYS" timeout --kill-after=5 "$budget" \
    "$VENV/bin/locust" -f "$ROOT/loadtest/locustfile.py" SurgeRider --headless \
    -u "$USERS" -r "$SPAWN_RATE" -t "$DURATION" -H "$proxy" "${PROCESSES[@]}" \
    --csv "$RESULTS_DIR/$run" --csv-full-history --only-summary --exit-code-on-error 0 \
    >"$RESULTS_DIR/${run}_locust.log" 2>&1 &
  locust_pid=$!
  PIDS+=("$locust_pid")
  rc=0
  wait "$locust_pid" || rc=$?
  forget_pid "$locust_pid"
  [[ "$rc" == 0 ]] || die "[$run] Locust exited with $rc; see $RESULTS_DIR/${run}_locust.log"

  if [[ -n "$sick_pid" ]]; then stop_pid "$sick_pid"; forget_pid "$sick_pid"; fi
  # Healthy again for whatever comes next.
  curl -fsS -o /dev/null -X POST "$UPSTREAM/__capacity?service_time=$UPSTREAM_SERVICE_TIME" || true
  wait_upstream_idle
  after="$(upstream_stats)"
  stop_pid "$poll_pid"
  forget_pid "$poll_pid"
  stop_pid "$limit_pid"
  forget_pid "$limit_pid"
  # (The replicas' own counts end with the killed one: floodgate's per-endpoint counters say it.)
  [[ "$run" == replica_kill ]] ||
    printf '{"before": %s, "after": %s}\n' "$before" "$after" >"$RESULTS_DIR/${run}_upstream.json"

  if curl -fsS --max-time 2 "http://127.0.0.1:$ADMIN_PORT/metrics" >"$RESULTS_DIR/${run}_metrics.txt" 2>/dev/null; then
    log "[$run] saved floodgate's /metrics"
    grep -E '^floodgate_upstream_' "$RESULTS_DIR/${run}_metrics.txt" >"$RESULTS_DIR/${run}_endpoints.txt" || true
  else
    rm -f "$RESULTS_DIR/${run}_metrics.txt"
  fi
  if [[ -n "$REDIS_URL" ]]; then
    # Evidence of which store decided: Redis command counts during the run, and the keys floodgate left.
    { echo "dbsize $(redis-cli -p "$REDIS_PORT" dbsize)"; redis-cli -p "$REDIS_PORT" info commandstats; } \
      >"$RESULTS_DIR/${run}_redis.txt" 2>&1 || true
  fi
  stop_pid "$fg_pid"
  forget_pid "$fg_pid"
  if [[ "$run" == replica_kill ]]; then
    # (The restarted replica's pid is in its file: it was started by the background kill.)
    for i in 0 1 2; do stop_pid "$(cat "$RESULTS_DIR/replica-$i.pid")"; done
  fi
  log "[$run] done: upstream $before -> $after"
}

for run in "${RUNS[@]}"; do run_scenario "$run"; done

"$VENV/bin/python" "$ROOT/loadtest/summarize.py" "$RESULTS_DIR" "${RUNS[@]}"
"$VENV/bin/python" "$ROOT/loadtest/plot.py" "$RESULTS_DIR" "${RUNS[@]}"
cat "$RESULTS_DIR/summary.md"
log "finished in $((SECONDS))s; results in $RESULTS_DIR"
