#!/usr/bin/env bash
# scripts/bench-grpc.sh: unary gRPC calls through floodgate and through nginx's grpc_pass, side by
# side on this machine, in one run.
#
# The upstream is bench/grpc_upstream.rs (hyper over h2c on one thread) reading each call's
# message and answering it with one fixed gRPC message and `grpc-status: 0` in trailers: a gRPC
# server that costs as little as possible, so that what is measured is the proxy. (nginx serving
# a static file is no such upstream: it answers before reading the body and resets the stream,
# and grpc_pass then fails calls on the reused connection.) The load is h2load (one thread, CONNECTIONS connections, STREAMS
# streams each) sending one framed gRPC message per call with `content-type: application/grpc`
# and `te: trailers`. Targets, measured in interleaved rounds:
#   upstream        the upstream alone: the ceiling
#   nginx_grpc      nginx as a gRPC proxy (grpc_pass grpc://, upstream keepalive 64, worker_processes
#                   auto)                                 <- every ratio is against this one
#   fg_grpc         floodgate, upstream_protocol: http2, no limit
#   fg_grpc_limit   the same with a token bucket every call passes (memory store)
# Each round runs h2load for DURATION after WARMUP; figures are medians across rounds. CPU per call
# is the target's own CPU time (from /proc: nginx's master and workers, or floodgate) over the
# calls it served (the upstream's is not included). It checks that no call failed.
#
# Knobs (environment): ROUNDS=3 DURATION=5 WARMUP=1 CONNECTIONS=16 STREAMS=8
#   FLOODGATE=target/dist/floodgate  BUILD=1 (cargo build --profile dist first)
# Results: a markdown table on stdout; h2load's own output in a temporary directory, removed on
# exit (KEEP=1 keeps it). All load goes to 127.0.0.1; every process started here is stopped on exit.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5}"
WARMUP="${WARMUP:-1}"
CONNECTIONS="${CONNECTIONS:-16}"
STREAMS="${STREAMS:-8}"
BUILD="${BUILD:-1}"
KEEP="${KEEP:-0}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
TARGETS=(upstream nginx_grpc fg_grpc fg_grpc_limit)

log() { printf '[bench-grpc] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
command -v h2load >/dev/null || missing+=(nghttp2-client)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --profile dist --bin floodgate --example grpc_upstream) \
        || die "cargo build --profile dist failed"
fi
[ -x "$FLOODGATE" ] || die "no floodgate binary at $FLOODGATE"
GRPC_UPSTREAM="${GRPC_UPSTREAM:-$ROOT/target/dist/examples/grpc_upstream}"
[ -x "$GRPC_UPSTREAM" ] || die "no $GRPC_UPSTREAM (cargo build --profile dist --example grpc_upstream)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/floodgate-bench-grpc.XXXXXX")"
PIDS=()
cleanup() {
    local status=$?
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ "$KEEP" = 1 ]; then log "raw output kept in $WORK"; else rm -rf "$WORK"; fi
    exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# nginx refuses to start when a compiled-in module's default temp dir is missing.
nginx_temp_paths() { # dir
    local v
    v="$(nginx -V 2>&1)"
    echo "client_body_temp_path $1/body; proxy_temp_path $1/proxy;"
    [[ $v == *without-http_fastcgi_module* ]] || echo "fastcgi_temp_path $1/fastcgi;"
    [[ $v == *without-http_uwsgi_module* ]] || echo "uwsgi_temp_path $1/uwsgi;"
    [[ $v == *without-http_scgi_module* ]] || echo "scgi_temp_path $1/scgi;"
}

start_nginx() { # name workers server-block  -> sets NGINX_PID
    local dir="$WORK/$1"
    mkdir -p "$dir"
    cat >"$dir/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes $2;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    $(nginx_temp_paths "$dir")
    keepalive_requests 10000000;
    keepalive_timeout 120s;
$3
}
EOF
    nginx -p "$dir" -c "$dir/nginx.conf" >"$dir/stdout.log" 2>&1 &
    NGINX_PID=$!
    PIDS+=("$NGINX_PID")
}

# One gRPC message ("hi"): what every call sends.
printf '\x00\x00\x00\x00\x02hi' >"$WORK/call.bin"
CALL_PATH=/floodgate.bench.Echo/Unary

mkdir -p "$WORK/upstream"
"$GRPC_UPSTREAM" 127.0.0.1:0 >"$WORK/upstream/stdout.log" 2>&1 &
UPSTREAM_PID=$!
PIDS+=("$UPSTREAM_PID")
UPSTREAM_PORT=""
for _ in $(seq 100); do
    UPSTREAM_PORT="$(sed -n 's#^listening on http://[^:]*:\([0-9]*\).*#\1#p' "$WORK/upstream/stdout.log")"
    [ -n "$UPSTREAM_PORT" ] && break
    sleep 0.1
done
[ -n "$UPSTREAM_PORT" ] || die "the gRPC upstream did not start"

NGINX_PORT="$(free_port)"
start_nginx nginx_grpc auto "    upstream grpc_backend {
        server 127.0.0.1:$UPSTREAM_PORT;
        keepalive 64;
        keepalive_requests 10000000;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT http2;
        location / { grpc_pass grpc://grpc_backend; }
    }"
NGINX_GRPC_PID=$NGINX_PID

start_floodgate() { # name limits-yaml  -> sets FG_PID, FG_PORT
    local dir="$WORK/$1"
    mkdir -p "$dir"
    cat >"$dir/floodgate.yaml" <<EOF
listen: 127.0.0.1:0
routes:
  - name: $1
    path_prefix: /
    upstream: http://127.0.0.1:$UPSTREAM_PORT
    upstream_protocol: http2
$2
EOF
    RUST_LOG=warn "$FLOODGATE" --config "$dir/floodgate.yaml" >"$dir/stdout.log" 2>"$dir/stderr.log" &
    FG_PID=$!
    PIDS+=("$FG_PID")
    FG_PORT=""
    for _ in $(seq 100); do
        FG_PORT="$(sed -n 's#^floodgate listening on http://[^:]*:\([0-9]*\).*#\1#p' "$dir/stdout.log" | head -1)"
        [ -n "$FG_PORT" ] && break
        sleep 0.1
    done
    [ -n "$FG_PORT" ] || die "floodgate ($1) printed no listening line"
}
start_floodgate fg_grpc ""
FG_GRPC_PID=$FG_PID FG_GRPC_PORT=$FG_PORT
start_floodgate fg_grpc_limit "    limits:
      - {algorithm: token_bucket, capacity: 1000000000, refill_rate: 1000000}"
FG_LIMIT_PID=$FG_PID FG_LIMIT_PORT=$FG_PORT
sleep 1

port_of() {
    case $1 in
        upstream) echo "$UPSTREAM_PORT" ;;
        nginx_grpc) echo "$NGINX_PORT" ;;
        fg_grpc) echo "$FG_GRPC_PORT" ;;
        fg_grpc_limit) echo "$FG_LIMIT_PORT" ;;
    esac
}
pids_of() { # a server's process and its children (nginx's workers)
    local pid
    case $1 in
        upstream) pid=$UPSTREAM_PID ;;
        nginx_grpc) pid=$NGINX_GRPC_PID ;;
        fg_grpc) pid=$FG_GRPC_PID ;;
        fg_grpc_limit) pid=$FG_LIMIT_PID ;;
    esac
    echo "$pid" $(pgrep -P "$pid" || true)
}
cpu_ticks() { # pids...: utime + stime, in clock ticks
    local total=0 pid
    for pid in "$@"; do
        [ -r "/proc/$pid/stat" ] || continue
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    done
    echo "$total"
}
TICK="$(getconf CLK_TCK)"

h2load_run() { # port duration out
    h2load -t 1 -c "$CONNECTIONS" -m "$STREAMS" -D "$2" --warm-up-time="$WARMUP" \
        -d "$WORK/call.bin" -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$1$CALL_PATH" >"$3" 2>&1
}

log "rounds: $ROUNDS × ${DURATION}s, h2load -c $CONNECTIONS -m $STREAMS"
for round in $(seq "$ROUNDS"); do
    for target in "${TARGETS[@]}"; do
        out="$WORK/$target.$round.txt"
        pids=$(pids_of "$target")
        # shellcheck disable=SC2086
        before=$(cpu_ticks $pids)
        h2load_run "$(port_of "$target")" "$DURATION" "$out"
        # shellcheck disable=SC2086
        after=$(cpu_ticks $pids)
        rps=$(sed -n 's/^finished in .*, \([0-9.]*\) req\/s.*/\1/p' "$out")
        failed=$(sed -n 's/^requests: .* \([0-9]*\) failed, \([0-9]*\) errored.*/\1+\2/p' "$out")
        bad=$(sed -n 's/^status codes: [0-9]* 2xx, \([0-9]*\) 3xx, \([0-9]*\) 4xx, \([0-9]*\) 5xx.*/\1+\2+\3/p' "$out")
        [ -n "$rps" ] && [ -n "$failed" ] || die "$target: h2load failed: $(tail -5 "$out")"
        [ $((failed + bad)) = 0 ] || die "$target: $((failed)) calls failed, $((bad)) not answered 2xx"
        echo "$target $round $rps $((after - before))" >>"$WORK/results"
        log "round $round $target: $rps calls/s"
    done
done

python3 - "$WORK/results" "$TICK" "$DURATION" "$WARMUP" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
tick, duration, warmup = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
by = {}
for target, _round, rps, ticks in rows:
    by.setdefault(target, []).append((float(rps), float(ticks)))
base = statistics.median(r for r, _ in by["nginx_grpc"])
print("| target | calls/s (median) | × nginx grpc_pass | CPU µs / call |")
print("| --- | ---: | ---: | ---: |")
for target, runs in by.items():
    rps = statistics.median(r for r, _ in runs)
    # CPU over the whole h2load run (warm-up included) per call served in it: rps × (warm-up +
    # duration) calls.
    cpu = statistics.median(t / tick / (r * (duration + warmup)) * 1e6 for r, t in runs)
    print(f"| {target} | {rps:,.0f} | {rps / base:.2f} | {cpu:.1f} |")
PY
