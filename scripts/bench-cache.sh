#!/usr/bin/env bash
# scripts/bench-cache.sh: the read surge of #61, floodgate beside nginx and Varnish, in one run.
#
# The API is the demo upstream at 160 req/s (8 workers x 50 ms; a request that waits 250 ms for a
# worker gets 503). Riders poll 20 hot reads (`/api/surge/zone/0..19`, 2,000 API keys in
# X-API-Key: bench/surge_read.lua) with wrk, 200 connections, DURATION (10 s), against each
# front door in turn:
#   fg_refuse     floodgate, a route-wide token bucket at the API's capacity (160, refill 160/s)
#   fg_adaptive   floodgate, `adaptive_concurrency: {}` on the route
#   fg_cache      floodgate, `cache: {ttl: 1s, public: true}` (public: the API key is a credential)
#   nginx_cache   nginx, proxy_cache valid 1 s, proxy_cache_lock on, use_stale updating,
#                 background_update on (worker_processes auto)
#   varnish       Varnish, beresp.ttl 1 s, grace 10 s (malloc storage, default thread pools)
# Per target: requests, the share and rate of 2xx answers (wrk's non-2xx count), and how many
# requests the API served (its /__stats before and after).
#
# Then (PAIR=1, the default) two floodgate instances on one Redis, caching on their own and with
# `cache.shared: true`: how many requests the API served for the same surge.
#
# Then one hot cached path under wrk (64 connections, DURATION): floodgate's hit against nginx's
# proxy_cache hit (ttl 1 h: every counted request is a hit). For instructions per hit, run
# `CACHE=1 scripts/callgrind.sh`.
#
# Knobs: DURATION=10s CONNECTIONS=200 FLOODGATE=target/dist/floodgate BUILD=1
#        TARGETS="fg_refuse fg_adaptive fg_cache nginx_cache varnish" PAIR=1
# Needs wrk, nginx, varnish, redis-server (installed when missing). Every process started here is stopped on
# exit; all traffic goes to 127.0.0.1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DURATION="${DURATION:-10s}"
CONNECTIONS="${CONNECTIONS:-200}"
BUILD="${BUILD:-1}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
DEMO="${DEMO:-$ROOT/target/dist/floodgate-demo-upstream}"
TARGETS="${TARGETS:-fg_refuse fg_adaptive fg_cache nginx_cache varnish}"
PAIR="${PAIR:-1}"

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx-light)
command -v varnishd >/dev/null || missing+=(varnish)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --profile dist --bin floodgate --bin floodgate-demo-upstream)
fi

source "$ROOT/scripts/bench-lib.sh"
bench_work bench-cache
start_api

PORT="$(free_port)"
floodgate_conf() { # extra route keys
    cat >"$WORK/floodgate.yaml" <<EOF
listen: 127.0.0.1:$PORT
identity:
  api_key_header: X-API-Key
routes:
  - name: surge-map
    path_prefix: /api/surge/
    upstream: http://127.0.0.1:$API_PORT
$1
EOF
}
nginx_conf() { # valid
    mkdir -p "$WORK/nginx"
    cat >"$WORK/nginx/nginx.conf" <<EOF
daemon off;
worker_processes auto;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
user root;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/b; proxy_temp_path $WORK/nginx/p;
    fastcgi_temp_path $WORK/nginx/f; uwsgi_temp_path $WORK/nginx/u; scgi_temp_path $WORK/nginx/s;
    keepalive_requests 10000000;
    proxy_cache_path $WORK/nginx/cache keys_zone=surge:10m;
    upstream api { server 127.0.0.1:$API_PORT; keepalive 64; }
    server {
        listen 127.0.0.1:$PORT;
        location / {
            proxy_pass http://api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache surge;
            proxy_cache_valid 200 $1;
            proxy_cache_lock on;
            proxy_cache_use_stale updating;
            proxy_cache_background_update on;
        }
    }
}
EOF
}
varnish_vcl() {
    cat >"$WORK/surge.vcl" <<EOF
vcl 4.1;
backend api { .host = "127.0.0.1"; .port = "$API_PORT"; }
sub vcl_backend_response { set beresp.ttl = 1s; set beresp.grace = 10s; }
EOF
}

start() { # target
    case $1 in
        fg_refuse)
            floodgate_conf "    limits:
      - {algorithm: token_bucket, capacity: 160, refill_rate: 160, per: route}"
            "$FLOODGATE" --config "$WORK/floodgate.yaml" >"$WORK/$1.log" 2>&1 & ;;
        fg_adaptive)
            floodgate_conf "    adaptive_concurrency: {}"
            "$FLOODGATE" --config "$WORK/floodgate.yaml" >"$WORK/$1.log" 2>&1 & ;;
        fg_cache)
            floodgate_conf "    cache: {ttl: 1s, public: true}"
            "$FLOODGATE" --config "$WORK/floodgate.yaml" >"$WORK/$1.log" 2>&1 & ;;
        fg_hit)
            floodgate_conf "    cache: {ttl: 1h, public: true}"
            "$FLOODGATE" --config "$WORK/floodgate.yaml" >"$WORK/$1.log" 2>&1 & ;;
        nginx_cache)
            nginx_conf 1s
            nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/$1.log" 2>&1 & ;;
        nginx_hit)
            nginx_conf 1h
            nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/$1.log" 2>&1 & ;;
        varnish)
            varnish_vcl
            varnishd -F -n "$WORK/varnish" -a "127.0.0.1:$PORT" -f "$WORK/surge.vcl" -s malloc,256m \
                >"$WORK/$1.log" 2>&1 & ;;
        *) echo "unknown target $1" >&2; exit 2 ;;
    esac
    echo $!
}

stop() { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; sleep 1; }

echo "read surge: the API at 160 req/s, wrk $CONNECTIONS connections for $DURATION, 20 hot paths, 2,000 keys"
printf '%-12s %10s %8s %12s %14s\n' target requests 2xx% "2xx/s" "API served"
for target in $TARGETS; do
    pid=$(start "$target")
    wait_port "$PORT"
    sleep 1
    before=$(served)
    line=$(wrk -t2 -c"$CONNECTIONS" -d"$DURATION" -s "$ROOT/bench/surge_read.lua" "http://127.0.0.1:$PORT" | grep '^BENCH')
    after=$(served)
    stop "$pid"
    python3 - "$target" "$line" "$((after - before))" <<'PY'
import sys
target, line, api = sys.argv[1], sys.argv[2], int(sys.argv[3])
f = dict(kv.split("=") for kv in line.split()[1:])
requests, non2xx, errors = int(f["requests"]), int(f["non2xx"]), int(f["socket_errors"])
ok = requests - non2xx
secs = int(f["duration_us"]) / 1e6
print(f"{target:<12} {requests:>10} {100 * ok / max(requests, 1):>7.1f}% {ok / secs:>12.0f} {api:>14}")
PY
done

if [ "$PAIR" = 1 ]; then
    # Two floodgate instances on one Redis, each behind its own wrk (half the connections):
    # caching on their own (`cache.shared: false`), each fetches every zone once a second; with
    # `cache.shared: true`, the two together fetch it once.
    start_redis
    PORT_B="$(free_port)"
    pair_conf() { # file port shared
        cat >"$1" <<EOF
listen: 127.0.0.1:$2
identity:
  api_key_header: X-API-Key
storage: {backend: redis, url: "redis://127.0.0.1:$REDIS_PORT", on_error: allow}
cache: {shared: $3}
routes:
  - name: surge-map
    path_prefix: /api/surge/
    upstream: http://127.0.0.1:$API_PORT
    cache: {ttl: 1s, public: true}
EOF
    }
    echo
    echo "two floodgate instances on one Redis, wrk $((CONNECTIONS / 2)) connections to each for $DURATION"
    printf '%-15s %10s %8s %12s %14s\n' target requests 2xx% "2xx/s" "API served"
    for shared in false true; do
        pair_conf "$WORK/a.yaml" "$PORT" "$shared"
        pair_conf "$WORK/b.yaml" "$PORT_B" "$shared"
        "$FLOODGATE" --config "$WORK/a.yaml" >"$WORK/pair-a.log" 2>&1 &
        pid_a=$!
        "$FLOODGATE" --config "$WORK/b.yaml" >"$WORK/pair-b.log" 2>&1 &
        pid_b=$!
        wait_port "$PORT"
        wait_port "$PORT_B"
        redis-cli -p "$REDIS_PORT" flushall >/dev/null
        sleep 1
        before=$(served)
        loads=()
        for port in "$PORT" "$PORT_B"; do
            wrk -t1 -c"$((CONNECTIONS / 2))" -d"$DURATION" -s "$ROOT/bench/surge_read.lua" \
                "http://127.0.0.1:$port" >"$WORK/wrk-$port.out" &
            loads+=("$!")
        done
        wait "${loads[@]}"
        after=$(served)
        stop "$pid_a"
        stop "$pid_b"
        python3 - "fg_pair_shared=$shared" "$((after - before))" "$WORK/wrk-$PORT.out" "$WORK/wrk-$PORT_B.out" <<'PY'
import sys
target, api = sys.argv[1], int(sys.argv[2])
requests = ok = 0
secs = 0.0
for path in sys.argv[3:]:
    line = next(l for l in open(path) if l.startswith("BENCH"))
    f = dict(kv.split("=") for kv in line.split()[1:])
    requests += int(f["requests"])
    ok += int(f["requests"]) - int(f["non2xx"])
    secs = max(secs, int(f["duration_us"]) / 1e6)
print(f"{target:<15} {requests:>10} {100 * ok / max(requests, 1):>7.1f}% {ok / secs:>12.0f} {api:>14}")
PY
    done
fi

echo
echo "one hot cached path: wrk 64 connections for $DURATION (every request a hit)"
printf '%-12s %12s %10s %10s\n' target "req/s" p50_us p99_us
for target in fg_hit nginx_hit; do
    pid=$(start "$target")
    wait_port "$PORT"
    curl -s -o /dev/null "http://127.0.0.1:$PORT/api/surge/zone/0"
    sleep 1
    line=$(BENCH_ZONES=1 BENCH_KEYS=1 wrk -t2 -c64 -d"$DURATION" -s "$ROOT/bench/surge_read.lua" "http://127.0.0.1:$PORT" | grep '^BENCH')
    stop "$pid"
    python3 - "$target" "$line" <<'PY'
import sys
target, line = sys.argv[1], sys.argv[2]
f = dict(kv.split("=") for kv in line.split()[1:])
secs = int(f["duration_us"]) / 1e6
assert int(f["non2xx"]) == 0, f
print(f"{target:<12} {int(f['requests']) / secs:>12.0f} {f['p50_us']:>10} {f['p99_us']:>10}")
PY
done
