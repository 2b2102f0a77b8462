#!/usr/bin/env bash
# scripts/bench-h3.sh: floodgate over HTTP/3 beside floodgate over HTTP/2 (TLS) and Caddy as an
# HTTP/3 reverse proxy, on this machine, in one run (#54's benchmark).
#
# One upstream (nginx `return 200`, one worker) behind every target. The load is bench/h3load.rs
# (quinn + h3 for HTTP/3; hyper + rustls for HTTP/2 over TLS, the same closed loop around it):
# CONNECTIONS connections with STREAMS requests in flight each, for DURATION seconds, after a
# warm-up. Targets, measured in interleaved rounds:
#   caddy_h3   Caddy (Debian's 2.6, quic-go) as a reverse proxy, over HTTP/3  <- the ratio's base
#   fg_h3      floodgate over HTTP/3: a token bucket every request passes (memory store), as
#              scripts/bench.sh's fg_memory_allow
#   fg_h2      the same floodgate over HTTP/2 on TLS (its TCP listener)
#   caddy_h2   Caddy over HTTP/2 on TLS, for reference
# CPU per request is the target's own CPU time (from /proc: Caddy, or floodgate) over the
# requests it answered; the upstream's and the load generator's are not included. Figures are
# medians across rounds. It checks that every target answered only 2xx.
#
# Knobs (environment): ROUNDS=3 DURATION=5 WARMUP=2 CONNECTIONS=8 STREAMS=16
#   FLOODGATE=target/dist/floodgate  BUILD=1 (cargo build --profile dist first)
#   RESULTS=bench/results/http3/bench.md (the one summary kept in git; raw output in a temporary
#   directory, KEEP=1 keeps it)
# All load goes to 127.0.0.1; every process started here is stopped on exit.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5}"
WARMUP="${WARMUP:-2}"
CONNECTIONS="${CONNECTIONS:-8}"
STREAMS="${STREAMS:-16}"
BUILD="${BUILD:-1}"
KEEP="${KEEP:-0}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
LOAD="${LOAD:-$ROOT/target/dist/examples/h3load}"
RESULTS="${RESULTS:-$ROOT/bench/results/http3/bench.md}"
TARGETS=(caddy_h3 fg_h3 fg_h2 caddy_h2)

log() { printf '[bench-h3] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
command -v caddy >/dev/null || missing+=(caddy)
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --profile dist --bin floodgate --example h3load) \
        || die "cargo build --profile dist failed"
fi
[ -x "$FLOODGATE" ] || die "no floodgate binary at $FLOODGATE"
[ -x "$LOAD" ] || die "no $LOAD (cargo build --profile dist --example h3load)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/floodgate-bench-h3.XXXXXX")"
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

free_port() { # a port free on TCP and UDP alike
    python3 -c '
import socket
while True:
    t = socket.socket(); t.bind(("127.0.0.1", 0)); port = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", port)); print(port); break
    except OSError:
        pass
    finally:
        u.close(); t.close()'
}

# --- the certificate every target serves (localhost) -------------------------------------------
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj /CN=localhost \
    -addext "subjectAltName=DNS:localhost" -addext "basicConstraints=critical,CA:FALSE" \
    -addext "extendedKeyUsage=serverAuth" 2>/dev/null

# --- upstream: nginx return 200, one worker ----------------------------------------------------
UPSTREAM_PORT="$(free_port)"
mkdir -p "$WORK/upstream"
cat >"$WORK/upstream/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $WORK/upstream/nginx.pid;
error_log $WORK/upstream/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/upstream/body; proxy_temp_path $WORK/upstream/proxy;
    fastcgi_temp_path $WORK/upstream/fastcgi; uwsgi_temp_path $WORK/upstream/uwsgi;
    scgi_temp_path $WORK/upstream/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    server {
        listen 127.0.0.1:$UPSTREAM_PORT;
        location / { default_type text/plain; return 200 "ok\n"; }
    }
}
EOF
nginx -p "$WORK/upstream" -c "$WORK/upstream/nginx.conf" >"$WORK/upstream/stdout.log" 2>&1 &
PIDS+=("$!")

# --- Caddy: HTTP/1.1, 2 and 3 on one port (TCP and UDP) ----------------------------------------
CADDY_PORT="$(free_port)"
cat >"$WORK/Caddyfile" <<EOF
{
    admin off
    auto_https off
    servers {
        protocols h1 h2 h3
    }
}
https://localhost:$CADDY_PORT {
    tls $WORK/cert.pem $WORK/key.pem
    reverse_proxy 127.0.0.1:$UPSTREAM_PORT
}
EOF
(cd "$WORK" && XDG_DATA_HOME="$WORK/caddy-data" XDG_CONFIG_HOME="$WORK/caddy-config" \
    exec caddy run --config "$WORK/Caddyfile" --adapter caddyfile >"$WORK/caddy.log" 2>&1) &
CADDY_PID=$!
PIDS+=("$CADDY_PID")

# --- floodgate: TLS on TCP, HTTP/3 on the same port over UDP -----------------------------------
FG_PORT="$(free_port)"
cat >"$WORK/floodgate.yaml" <<EOF
listen: 127.0.0.1:$FG_PORT
tls: {cert: $WORK/cert.pem, key: $WORK/key.pem}
http3: {listen: 127.0.0.1:$FG_PORT}
routes:
  - name: api
    path_prefix: /
    upstream: http://127.0.0.1:$UPSTREAM_PORT
    limits:
      - {algorithm: token_bucket, capacity: 1000000000, refill_rate: 1000000}
EOF
RUST_LOG=warn "$FLOODGATE" --config "$WORK/floodgate.yaml" >"$WORK/floodgate.out" 2>"$WORK/floodgate.err" &
FG_PID=$!
PIDS+=("$FG_PID")
sleep 2
grep -q "floodgate http3 listening" "$WORK/floodgate.out" || die "floodgate did not start: $(cat "$WORK/floodgate.err")"

proto_of() { case $1 in *_h3) echo h3 ;; *) echo h2 ;; esac; }
port_of() { case $1 in caddy_*) echo "$CADDY_PORT" ;; fg_*) echo "$FG_PORT" ;; esac; }
pid_of() { case $1 in caddy_*) echo "$CADDY_PID" ;; fg_*) echo "$FG_PID" ;; esac; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK="$(getconf CLK_TCK)"

run() { # target seconds out
    local pid before after
    pid="$(pid_of "$1")"
    before="$(cpu_ticks "$pid")"
    "$LOAD" "$(proto_of "$1")" "127.0.0.1:$(port_of "$1")" "$WORK/cert.pem" \
        "$CONNECTIONS" "$STREAMS" "$2" / >"$3" 2>&1 || { cat "$3" >&2; die "load against $1 failed"; }
    after="$(cpu_ticks "$pid")"
    echo "CPU ticks=$((after - before)) clk_tck=$TICK" >>"$3"
}

log "warm-up: ${WARMUP}s per target"
for t in "${TARGETS[@]}"; do run "$t" "$WARMUP" "$WORK/warmup-$t.txt"; done
for round in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do
        log "round $round/$ROUNDS: $t (${DURATION}s)"
        run "$t" "$DURATION" "$WORK/$t-round$round.txt"
    done
done

# --- summary -----------------------------------------------------------------------------------
mkdir -p "$(dirname "$RESULTS")"
python3 - "$WORK" "$RESULTS" "$ROUNDS" "$DURATION" "$CONNECTIONS" "$STREAMS" "${TARGETS[@]}" <<'PY'
import re, statistics, subprocess, sys, datetime
work, out, rounds, duration, conns, streams, *targets = sys.argv[1:]
rows = {}
for t in targets:
    rps, cpu, p50, p99 = [], [], [], []
    for r in range(1, int(rounds) + 1):
        text = open(f"{work}/{t}-round{r}.txt").read()
        m = dict(re.findall(r"(\w+)=([\d.]+)", text.split("RESULT", 1)[1].splitlines()[0]))
        if int(m["other"]) or int(m["errors"]) or int(m["refused"]):
            sys.exit(f"{t} round {r}: non-2xx answers or errors: {m}")
        ticks = re.search(r"CPU ticks=(\d+) clk_tck=(\d+)", text)
        requests = int(m["requests"])
        rps.append(float(m["rps"]))
        cpu.append(int(ticks[1]) / int(ticks[2]) * 1e6 / requests)
        p50.append(int(m["p50_us"]))
        p99.append(int(m["p99_us"]))
    rows[t] = (statistics.median(rps), statistics.median(cpu), statistics.median(p50), statistics.median(p99))
base = rows["caddy_h3"][0]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
lines = [
    "# HTTP/3: floodgate beside Caddy, and beside its own HTTP/2 on TLS",
    "",
    f"`scripts/bench-h3.sh` at {commit}, {datetime.date.today()}: {rounds} interleaved rounds of {duration} s,",
    f"bench/h3load.rs with {conns} connections × {streams} streams, one nginx `return 200` upstream.",
    "CPU µs/request: the target's own process (not the upstream's, not the load generator's).",
    "",
    "| target | requests/s | × Caddy HTTP/3 | CPU µs / request | p50 µs | p99 µs |",
    "| --- | ---: | ---: | ---: | ---: | ---: |",
]
for t in targets:
    r, c, a, b = rows[t]
    lines.append(f"| {t} | {r:,.0f} | {r / base:.2f} | {c:.1f} | {a:,.0f} | {b:,.0f} |")
fg3, fg2 = rows["fg_h3"][0], rows["fg_h2"][0]
lines += ["", f"floodgate's HTTP/3 is {fg3 / fg2:.2f}× its HTTP/2 on TLS in requests/s."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
log "summary written to $RESULTS"
