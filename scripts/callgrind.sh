#!/usr/bin/env bash
# scripts/callgrind.sh: instructions per proxied request, floodgate beside nginx, counted by
# valgrind's callgrind (user space only; repeatable whatever else the machine does).
#
# Each proxy runs under callgrind in front of one upstream (nginx `return 200`, not measured) and
# serves N1, then (in a second run) N2 keep-alive requests from h2load --h1 on one connection;
# the instructions per request are (total(N2) - total(N1)) / (N2 - N1), so start-up and shutdown
# cancel out. floodgate runs its memory store with one token bucket every request passes (the
# X-API-Key of every request is the same); nginx is a plain reverse proxy (upstream keepalive);
# hyper_proxy is the floor under floodgate's allow path (bench/stack_floor.rs `proxy`: the
# smallest hyper reverse proxy, one upstream connection per client connection, nothing else).
#
# Knobs (environment): N1=1000 N2=3000 FLOODGATE=target/dist/floodgate BUILD=1
#   TELEMETRY=RATIO  floodgate with OpenTelemetry on at that sample_ratio (the upstream nginx as
#                    the OTLP sink, metrics off); unset: telemetry off, the default
#   KEEP=DIR         keep floodgate's callgrind output files there (callgrind_annotate them)
#   POOL=N           floodgate's route forwards to a pool of N endpoints (the upstream nginx on
#                    127.0.0.1 to 127.0.0.N, one port; balance least_request): compare with
#                    POOL unset (one upstream) for what a pool costs a request
#   DENY=1           the refusal path instead: floodgate's bucket holds one request and refills
#                    once in 1,000 s, so every counted request is answered 429 (the first,
#                    before counting, is allowed); nginx refuses with `limit_req` (one request a
#                    minute per X-API-Key, `limit_req_status 429`, `limit_req_log_level info`:
#                    no error-log line per refusal, as floodgate writes none) and answers nothing
#                    upstream.
#                    hyper_serve stands for the floor (bench/stack_floor.rs `serve`: hyper
#                    answering every request itself, with nothing else)
#   ACCESS_LOG=1     each proxy writes an access log line per request (off: the default of both)
#   ROUTES=first|last  floodgate's config is a table of 200 routes on 20 hosts (10 path prefixes
#                    each, as benches/route.rs), each with the bucket, and every request goes to
#                    the first route (h0.example /r0/) or the 200th (h19.example /r9/): what the
#                    route match costs a request at either end of the scan (nginx and the hyper
#                    floors are unchanged)
#   OVERRIDES=N      before the requests, N overrides are PUT on floodgate's admin listener
#                    (N-1 for other API keys, the last for the measured key, with the same
#                    limit): what a request costs with that many in the table (both runs load
#                    them, so their cost cancels out of the difference)
#   ADAPTIVE=none|identity  the route also has `adaptive_concurrency` (a fixed limit of 100, so
#                    no request waits) with that `fairness`: what the gate, and its flow, cost
#   WAIT=1           the route's bucket holds one request and refills every 20 ms, with `wait:
#                    100ms`: every counted request is held once for the next token (a timer, a
#                    second decision) and admitted (`delayed`); the run prints how many were
#   CACHE=1          the cache-hit path instead: floodgate's route has `cache: {ttl: 1h, public:
#                    true}` and no limit; nginx has `proxy_cache` (a keys zone, `proxy_cache_valid
#                    200 1h`); the start-up probe fills each cache, so every counted request is a
#                    hit (answered without the upstream)
#   DISCOVERED=1     floodgate's route comes from a container's labels instead of its file
#                    (providers.docker on a fake engine, bench/fake_engine.rs, whose one container
#                    is the upstream with the same route and bucket): compare with it unset for
#                    what a discovered route costs a request
#   CORS=allowed|preflight  the route has `cors` (one allowed origin, X-API-Key allowed) and
#                    every request carries that Origin: `allowed`, a GET answered with the CORS
#                    headers; `preflight`, an OPTIONS preflight floodgate answers 204 itself.
#                    nginx does the same work: the origin checked by a `map`, the same headers
#                    added (`always`), and a preflight answered `return 204` in an `if`
#   CONNECTIONS=1    every request on a connection of its own (a Python client, not measured:
#                    connect, one GET with `Connection: close`, read to the end): what a
#                    connection costs; with PROXY_PROTOCOL=1 each opens with a PROXY v1 header,
#                    floodgate has `proxy_protocol: {from: [127.0.0.1/32]}` and nginx `listen
#                    ... proxy_protocol`: compare with PROXY_PROTOCOL unset for the header's cost
# With KEEP, `scripts/callgrind-phases.py KEEP/floodgate.N1.out KEEP/floodgate.N2.out N1 N2`
# splits floodgate's figure phase by phase.
# Prints one line per proxy. Needs valgrind, nginx and h2load (installed when missing).
# All traffic goes to 127.0.0.1; every process started here is stopped on exit.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
N1="${N1:-1000}"
N2="${N2:-3000}"
BUILD="${BUILD:-1}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"

missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v nginx >/dev/null || missing+=(nginx-light)
command -v h2load >/dev/null || missing+=(nghttp2-client)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --profile dist --bin floodgate --example stack_floor --example fake_engine)
fi
STACK_FLOOR="${STACK_FLOOR:-$ROOT/target/dist/examples/stack_floor}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/floodgate-callgrind.XXXXXX")"
chmod 755 "$WORK"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# ACCESS_LOG=1: one access log line per request from each proxy (floodgate's `floodgate::access`
# target, nginx's `combined` format to a file), written where it would be (stdout, a file).
RUST_LOG_FG=warn
ACCESS_LOG_NGINX="access_log off;"
if [ -n "${ACCESS_LOG:-}" ]; then
    RUST_LOG_FG="warn,floodgate::access=info"
    ACCESS_LOG_NGINX="access_log @DIR@/access.log combined;"
fi

nginx_conf() { # dir port body
    cat >"$1/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 1024; }
http {
    ${ACCESS_LOG_NGINX//@DIR@/$1}
    client_body_temp_path $1/b; proxy_temp_path $1/p; fastcgi_temp_path $1/f;
    uwsgi_temp_path $1/u; scgi_temp_path $1/s;
    keepalive_requests 10000000;
$3
}
EOF
}

UP_PORT="$(free_port)"
mkdir -p "$WORK/up"
UP_LISTEN="listen 127.0.0.1:$UP_PORT;"
UPSTREAM="upstream: http://127.0.0.1:$UP_PORT"
if [ -n "${POOL:-}" ]; then
    UP_LISTEN=""
    UPSTREAM="upstreams: ["
    for i in $(seq 1 "$POOL"); do
        UP_LISTEN="$UP_LISTEN listen 127.0.0.$i:$UP_PORT;"
        UPSTREAM="${UPSTREAM}http://127.0.0.$i:$UP_PORT, "
    done
    UPSTREAM="${UPSTREAM%, }]"
fi
nginx_conf "$WORK/up" "$UP_PORT" "    server { $UP_LISTEN location / { return 200 \"ok\n\"; } }"
nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" >/dev/null 2>&1 &
PIDS+=("$!")

PORT="$(free_port)"
CAPACITY=1000000000 REFILL=1000000
[ -n "${DENY:-}" ] && CAPACITY=1 REFILL=0.001
# The route's tail: the bucket, or (CACHE) a cache and no limit.
ROUTE_TAIL="limits:
      - {algorithm: token_bucket, capacity: $CAPACITY, refill_rate: $REFILL}"
[ -n "${CACHE:-}" ] && ROUTE_TAIL="cache: {ttl: 1h, public: true}"
# ADAPTIVE: the upstream's gate on the route too, with room for every request (none waits).
[ -n "${ADAPTIVE:-}" ] && ROUTE_TAIL="$ROUTE_TAIL
    adaptive_concurrency: {min_limit: 100, max_limit: 100, fairness: $ADAPTIVE}"
# WAIT: a bucket of one that refills every 20 ms, with a wait: each request, sent as the last is
# answered (within 20 ms even under callgrind), is held for the next token and decided again.
[ -n "${WAIT:-}" ] && ROUTE_TAIL="limits:
      - {algorithm: token_bucket, capacity: 1, refill_rate: 50, wait: 100ms}"
# CORS: the route answers browsers on one origin.
[ -n "${CORS:-}" ] && ROUTE_TAIL="$ROUTE_TAIL
    cors: {origins: [\"https://app.example\"], headers: [X-API-Key]}"
cat >"$WORK/floodgate.yaml" <<EOF
listen: 127.0.0.1:$PORT
identity:
  api_key_header: X-API-Key
routes:
  - name: bench
    path_prefix: /
    $UPSTREAM
    $ROUTE_TAIL
EOF
# DISCOVERED: the same route from a container's labels, the file has none.
if [ -n "${DISCOVERED:-}" ]; then
    mkdir -p "$WORK/engine"
    "${FAKE_ENGINE:-$ROOT/target/dist/examples/fake_engine}" "$WORK/engine" "$UP_PORT" "$CAPACITY" "$REFILL" >"$WORK/engine.out" &
    PIDS+=("$!")
    for _ in $(seq 100); do [ -s "$WORK/engine.out" ] && break; sleep 0.05; done
    cat >"$WORK/floodgate.yaml" <<EOF
listen: 127.0.0.1:$PORT
identity:
  api_key_header: X-API-Key
providers:
  docker: {endpoint: "$(head -1 "$WORK/engine.out")"}
routes: []
EOF
fi
# ROUTES: the requests' path and host (`:authority`, which h2load writes as Host).
REQ_PATH=/
REQ_HOST=()
if [ -n "${ROUTES:-}" ]; then
    {
        echo "listen: 127.0.0.1:$PORT"
        echo "identity:"
        echo "  api_key_header: X-API-Key"
        echo "routes:"
        for h in $(seq 0 19); do
            for r in $(seq 0 9); do
                echo "  - {name: h${h}r${r}, hosts: [h${h}.example], path_prefix: /r${r}/, $UPSTREAM,"
                echo "     limits: [{algorithm: token_bucket, capacity: $CAPACITY, refill_rate: $REFILL}]}"
            done
        done
    } >"$WORK/floodgate.yaml"
    case $ROUTES in
        first) REQ_PATH=/r0/x REQ_HOST=(-H ':authority: h0.example') ;;
        last) REQ_PATH=/r9/x REQ_HOST=(-H ':authority: h19.example') ;;
        *) echo "ROUTES is first or last" >&2; exit 2 ;;
    esac
fi
if [ -n "${OVERRIDES:-}" ]; then
    ADMIN_PORT="$(free_port)"
    echo bench-token >"$WORK/token"
    printf 'admin_listen: 127.0.0.1:%s\nadmin:\n  token_file: %s\n' "$ADMIN_PORT" "$WORK/token" \
        >>"$WORK/floodgate.yaml"
fi
if [ -n "${WAIT:-}" ]; then
    ADMIN_PORT="$(free_port)"
    echo "admin_listen: 127.0.0.1:$ADMIN_PORT" >>"$WORK/floodgate.yaml"
fi
if [ -n "${PROXY_PROTOCOL:-}" ]; then
    echo "proxy_protocol: {from: [127.0.0.1/32]}" >>"$WORK/floodgate.yaml"
fi
if [ -n "${TELEMETRY:-}" ]; then
    echo "telemetry: {otlp_endpoint: \"http://127.0.0.1:$UP_PORT\", sample_ratio: $TELEMETRY, metrics_interval: 0s}" \
        >>"$WORK/floodgate.yaml"
fi
mkdir -p "$WORK/proxy"
LIMIT_REQ=""
if [ -n "${DENY:-}" ]; then
    # limit_req_log_level info: no error-log line per refusal (nginx's default level, error,
    # passes `error_log warn`), as floodgate writes none; with ACCESS_LOG both write their line.
    LIMIT_REQ="limit_req zone=bench nodelay; limit_req_status 429; limit_req_log_level info;"
fi
PROXY_CACHE=""
if [ -n "${CACHE:-}" ]; then
    PROXY_CACHE="proxy_cache hits; proxy_cache_valid 200 1h;"
fi
# CORS: nginx checks the origin as floodgate does (a map) and adds the same headers to every
# answer; a preflight is answered 204 in an `if` with what floodgate sends.
CORS_MAP="" CORS_NGINX=""
if [ -n "${CORS:-}" ]; then
    CORS_MAP="map \$http_origin \$cors_origin { \"https://app.example\" \$http_origin; default \"\"; }"
    CORS_NGINX="add_header Access-Control-Allow-Origin \$cors_origin always; add_header Vary Origin always;
        add_header Access-Control-Expose-Headers \"Retry-After, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset\" always;
        if (\$request_method = OPTIONS) { add_header Access-Control-Allow-Origin \$cors_origin;
            add_header Vary Origin; add_header Access-Control-Allow-Methods \"GET, HEAD, POST, PUT, PATCH, DELETE\";
            add_header Access-Control-Allow-Headers X-API-Key; add_header Access-Control-Max-Age 600; return 204; }"
fi
NGINX_LISTEN="listen 127.0.0.1:$PORT;"
[ -n "${PROXY_PROTOCOL:-}" ] && NGINX_LISTEN="listen 127.0.0.1:$PORT proxy_protocol;"
nginx_conf "$WORK/proxy" "$PORT" "    upstream backend { server 127.0.0.1:$UP_PORT; keepalive 16; }
    limit_req_zone \$http_x_api_key zone=bench:1m rate=1r/m;
    proxy_cache_path $WORK/proxy/cache keys_zone=hits:10m;
    $CORS_MAP
    server { $NGINX_LISTEN location / { $LIMIT_REQ $PROXY_CACHE $CORS_NGINX proxy_pass http://backend;
        proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"

# total instructions of one proxy process serving $2 requests: run_one NAME N COMMAND...
run_one() {
    local name=$1 n=$2 out="$WORK/$1.$2.out"
    shift 2
    RUST_LOG="$RUST_LOG_FG" valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>&1 &
    local pid=$!
    local probe=()
    [ -n "${PROXY_PROTOCOL:-}" ] && [[ "$name" != hyper_* ]] && probe=(--haproxy-protocol)
    for _ in $(seq 300); do
        curl -s "${probe[@]}" -o /dev/null "http://127.0.0.1:$PORT/" && break
        sleep 0.1
    done
    # A discovered route exists once the engine has been listed: until then, a 404.
    if [ -n "${DISCOVERED:-}" ] && [ "$name" = floodgate ]; then
        for _ in $(seq 300); do
            [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: probe' "http://127.0.0.1:$PORT/")" = 200 ] && break
            sleep 0.1
        done
    fi
    if [ -n "${OVERRIDES:-}" ] && [ "$name" = floodgate ]; then
        python3 - "$ADMIN_PORT" "$OVERRIDES" <<'PY'
import http.client, json, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
limits = [{"algorithm": "token_bucket", "capacity": 1000000000, "refill_rate": 1000000}]
for i in range(n):
    key = "callgrind" if i == n - 1 else f"other-{i}"
    body = json.dumps({"route": "bench", "api_key": key, "limits": limits})
    conn.request("PUT", "/overrides", body, {"Authorization": "Bearer bench-token"})
    answer = conn.getresponse()
    answer.read()
    if answer.status != 200:
        sys.exit(f"PUT /overrides: {answer.status}")
PY
    fi
    local path=/ host=()
    [ "$name" = floodgate ] && path=$REQ_PATH host=("${REQ_HOST[@]}")
    case "${CORS:-}" in
        allowed) host+=(-H 'origin: https://app.example') ;;
        preflight) host+=(-H ':method: OPTIONS' -H 'origin: https://app.example'
            -H 'access-control-request-method: POST' -H 'access-control-request-headers: x-api-key') ;;
    esac
    if [ -n "${CONNECTIONS:-}" ]; then
        # One connection a request, written as h2load's summary so that the checks below read it.
        python3 - "$PORT" "$n" "$([ -n "${PROXY_PROTOCOL:-}" ] && [[ "$name" != hyper_* ]] && echo 1)" \
            >"$WORK/$name.$n.h2load" <<'PY'
import socket, sys
port, n, proxy = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
ok = 0
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    local = s.getsockname()
    head = f"PROXY TCP4 192.0.2.{i % 250 + 1} 127.0.0.1 {local[1]} {port}\r\n" if proxy else ""
    s.sendall((head + "GET / HTTP/1.1\r\nHost: bench\r\nX-API-Key: callgrind\r\nConnection: close\r\n\r\n").encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    ok += data.startswith(b"HTTP/1.1 200")
print(f"requests: {n} total, {n} started, {n} done, {ok} succeeded")
print(f"status codes: {ok} 2xx, 0 3xx, {n - ok} 4xx, 0 5xx")
PY
    else
        h2load --h1 -n "$n" -c 1 -H 'x-api-key: callgrind' "${host[@]}" "http://127.0.0.1:$PORT$path" >"$WORK/$name.$n.h2load" 2>&1
    fi
    # Every request was answered (h2load counts a 4xx as done, not succeeded), and each took the
    # path being measured: all 2xx, or (DENY) all but the first 4xx.
    grep -q "$n done" "$WORK/$name.$n.h2load" || { echo "$name: not every request was answered" >&2; exit 1; }
    local ok
    ok=$(sed -n 's/^status codes: \([0-9]*\) 2xx.*/\1/p' "$WORK/$name.$n.h2load")
    if [ -n "${DENY:-}" ] && [[ "$name" != hyper_* ]]; then
        [ "$ok" -le 1 ] || { echo "$name: $ok of $n requests were allowed, not refused" >&2; exit 1; }
    else
        [ "$ok" = "$n" ] || { echo "$name: only $ok of $n requests were answered 2xx" >&2; exit 1; }
    fi
    if [ -n "${WAIT:-}" ] && [ "$name" = floodgate ]; then
        curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" |
            sed -n 's/^floodgate_requests_total{route="bench",decision="delayed"} //p' >"$WORK/delayed.$n"
    fi
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    if [ -n "${KEEP:-}" ] && [ "$name" = floodgate ]; then mkdir -p "$KEEP" && cp "$out" "$KEEP/"; fi
    sed -n 's/^summary: //p; s/^totals: //p' "$out" | head -1
}

per_request() { # NAME COMMAND...
    local name=$1
    shift
    local a b
    a=$(run_one "$name" "$N1" "$@")
    b=$(run_one "$name" "$N2" "$@")
    echo $(((b - a) / (N2 - N1)))
}

fg=$(per_request floodgate "$FLOODGATE" --config "$WORK/floodgate.yaml")
ng=$(per_request nginx nginx -p "$WORK/proxy" -c "$WORK/proxy/nginx.conf")
if [ -n "${DENY:-}" ]; then
    hs=$(per_request hyper_serve "$STACK_FLOOR" serve "127.0.0.1:$PORT")
    echo "floodgate (memory store, one token bucket): $fg instructions per refused request"
    echo "nginx limit_req:                            $ng instructions per refused request"
    echo "hyper_serve (the stack's floor: a fixed answer): $hs instructions per request"
    python3 -c "print(f'floodgate / nginx: {$fg / $ng:.2f}x; hyper_serve / nginx: {$hs / $ng:.2f}x')"
    exit 0
fi
if [ -n "${CACHE:-}" ]; then
    hs=$(per_request hyper_serve "$STACK_FLOOR" serve "127.0.0.1:$PORT")
    echo "floodgate (a cache hit, memory):             $fg instructions per request"
    echo "nginx proxy_cache (a hit):                   $ng instructions per request"
    echo "hyper_serve (the stack's floor: a fixed answer): $hs instructions per request"
    python3 -c "print(f'floodgate / nginx: {$fg / $ng:.2f}x; hyper_serve / nginx: {$hs / $ng:.2f}x')"
    exit 0
fi
hp=$(per_request hyper_proxy "$STACK_FLOOR" proxy "127.0.0.1:$PORT" "127.0.0.1:$UP_PORT")
if [ -n "${WAIT:-}" ]; then
    echo "held, then admitted (delayed): $(cat "$WORK/delayed.$N1") of $N1, $(cat "$WORK/delayed.$N2") of $N2 requests (each run's first one, and the probe's, are allowed at once)"
fi
echo "floodgate (memory store, one token bucket): $fg instructions per proxied request"
echo "nginx reverse proxy:                        $ng instructions per proxied request"
echo "hyper_proxy (the stack's floor):            $hp instructions per proxied request"
python3 -c "print(f'floodgate / nginx: {$fg / $ng:.2f}x; hyper_proxy / nginx: {$hp / $ng:.2f}x')"
