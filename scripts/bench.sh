#!/usr/bin/env bash
# scripts/bench.sh: floodgate side by side with nginx, on this machine, in one run.
#
# One upstream (nginx `return 200`, one worker) and one load (wrk, 1 thread, 64 connections, 1000
# rotating API keys in X-API-Key) for five targets, measured in interleaved rounds:
#   upstream          the upstream alone: the ceiling
#   nginx_proxy       nginx as a plain reverse proxy (worker_processes auto, upstream keepalive 64,
#                     proxy_http_version 1.1, Connection "")       <- every ratio is against this one
#   fg_memory_allow   floodgate, memory store, a token bucket every request passes
#   fg_redis_allow    floodgate, Redis store, every request allowed
#   fg_redis_deny     floodgate, Redis store, every request denied (capacity 1, refill 0.001/s)
# Figures are medians across rounds; each run also charges the CPU time (from /proc) of the target,
# its upstream and redis-server to the requests it served. It checks that the allow targets answered
# only 2xx and the deny target ~100% non-2xx (wrk's "Non-2xx or 3xx responses"; a probe first checks
# that those are 429 rate_limit_exceeded with Retry-After), and exits 1 if not.
# Results: $RESULTS_DIR/bench.md (markdown tables) and $RESULTS_DIR/raw/*.txt (wrk's own output plus
# a BENCH line of exact figures and a CPU line, one file per target and round).
#
# Knobs (environment):
#   ROUNDS=3  DURATION=5s  WARMUP=2s  CONNECTIONS=64  THREADS=1  KEYS=1000
#   RESULTS_DIR=bench/results
#   PIN=1      pin wrk to CPU 1 and every server to CPU 0 with taskset (needs 2+ CPUs)
#   BUILD=1    run `cargo build --release` first (a no-op when the binary is fresh)
#   FLOODGATE=target/release/floodgate
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
FLOODGATE="${FLOODGATE:-$ROOT/target/release/floodgate}"
TARGETS=(upstream nginx_proxy fg_memory_allow fg_redis_allow fg_redis_deny)
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
    log "cargo build --release (no-op when fresh)"
    if ! (cd "$ROOT" && cargo build --release --bin floodgate); then
        [ -x "$FLOODGATE" ] || die "build failed and there is no $FLOODGATE"
        log "WARNING: build failed; benchmarking the existing $FLOODGATE ($(date -r "$FLOODGATE" '+%F %T'))"
    fi
fi
[ -x "$FLOODGATE" ] || die "no floodgate binary at $FLOODGATE (run cargo build --release)"

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
    rm -rf "$WORK"
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
        location / { default_type text/plain; return 200 "ok\n"; }
    }
}
EOF
UPSTREAM_PID=$NGINX_PID
UPSTREAM_URL="http://127.0.0.1:$UPSTREAM_PORT"
wait_http "$UPSTREAM_URL/"

# --- nginx as a plain reverse proxy ------------------------------------------------------------
PROXY_PORT="$(free_port)"
start_nginx nginx_proxy <<EOF
daemon off;
master_process on;
worker_processes auto;
pid $WORK/nginx_proxy/nginx.pid;
error_log $WORK/nginx_proxy/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    $(nginx_temp_paths "$WORK/nginx_proxy")
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    upstream backend {
        server 127.0.0.1:$UPSTREAM_PORT;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$PROXY_PORT;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
NGINX_PROXY_PID=$NGINX_PID
NGINX_PROXY_URL="http://127.0.0.1:$PROXY_PORT"
wait_http "$NGINX_PROXY_URL/"
NGINX_WORKERS="$(pgrep -c -P "$NGINX_PROXY_PID" || true)"

# --- redis -------------------------------------------------------------------------------------
REDIS_PORT="$(free_port)"
"${SERVER_PIN[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$WORK" >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$REDIS_PORT" ping >/dev/null || die "redis-server did not start"

# --- floodgate ---------------------------------------------------------------------------------
start_floodgate() { # name storage-yaml capacity refill_rate  -> sets FG_URL, FG_PID
    local name=$1 storage=$2 capacity=$3 rate=$4
    local dir="$WORK/$name"
    mkdir -p "$dir"
    cat >"$dir/floodgate.yaml" <<EOF
listen: 127.0.0.1:0
storage:
$storage
identity:
  api_key_header: X-API-Key
routes:
  - name: $name
    path_prefix: /
    upstream: $UPSTREAM_URL
    limits:
      - algorithm: token_bucket
        capacity: $capacity
        refill_rate: $rate
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
start_floodgate fg_memory_allow "  backend: memory" 1000000000 1000000
FG_MEMORY_URL=$FG_URL FG_MEMORY_PID=$FG_PID
start_floodgate fg_redis_allow "$REDIS_STORAGE" 1000000000 1000000
FG_REDIS_ALLOW_URL=$FG_URL FG_REDIS_ALLOW_PID=$FG_PID
start_floodgate fg_redis_deny "$REDIS_STORAGE" 1 0.001
FG_REDIS_DENY_URL=$FG_URL FG_REDIS_DENY_PID=$FG_PID

# The processes whose CPU time a run of each target is charged: (itself, its upstream, redis).
pids_of() {
    case $1 in
        upstream) echo "$UPSTREAM_PID - -" ;;
        nginx_proxy) echo "$NGINX_PROXY_PID $UPSTREAM_PID -" ;;
        fg_memory_allow) echo "$FG_MEMORY_PID $UPSTREAM_PID -" ;;
        fg_redis_allow) echo "$FG_REDIS_ALLOW_PID $UPSTREAM_PID $REDIS_PID" ;;
        fg_redis_deny) echo "$FG_REDIS_DENY_PID $UPSTREAM_PID $REDIS_PID" ;;
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
        fg_memory_allow) echo "$FG_MEMORY_URL/" ;;
        fg_redis_allow) echo "$FG_REDIS_ALLOW_URL/" ;;
        fg_redis_deny) echo "$FG_REDIS_DENY_URL/" ;;
    esac
}

# --- probes: each target answers what it should ------------------------------------------------
status_of() { curl -s -o /dev/null -w '%{http_code}' --max-time 2 -H "X-API-Key: $2" "$1"; }
for t in "${TARGETS[@]}"; do
    got="$(status_of "$(url_of "$t")" probe-key)"
    [ "$got" = 200 ] || die "$t answered $got to its first request, expected 200"
done
got="$(status_of "$FG_REDIS_DENY_URL/" probe-key)"
[ "$got" = 429 ] || die "fg_redis_deny answered $got to a second request, expected 429"
DENY_SAMPLE="$(curl -s -D - --max-time 2 -H 'X-API-Key: probe-key' "$FG_REDIS_DENY_URL/" | tr -d '\r')"
grep -q '"error":"rate_limit_exceeded"' <<<"$DENY_SAMPLE" || die "fg_redis_deny's 429 body lacks rate_limit_exceeded"
grep -qi '^retry-after: ' <<<"$DENY_SAMPLE" || die "fg_redis_deny's 429 lacks Retry-After"
log "probes ok (fg_redis_deny answers 429 rate_limit_exceeded with Retry-After)"

# --- load --------------------------------------------------------------------------------------
LUA="$WORK/keys.lua"
cat >"$LUA" <<'EOF'
-- KEYS rotating API keys, requests formatted once; prints one BENCH line with exact figures.
local n = tonumber(os.getenv("BENCH_KEYS") or "1000")
local requests = {}
local i = 0
function init(args)
  for k = 1, n do
    requests[k] = wrk.format("GET", "/", {
      ["Host"] = wrk.headers["Host"],
      ["X-API-Key"] = string.format("bench-key-%04d", k),
    })
  end
end
function request()
  i = i % n + 1
  return requests[i]
end
function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d non2xx=%d socket_errors=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
EOF

CLK_TCK="$(getconf CLK_TCK)"
run_wrk() { # target duration outfile
    local pids before after i
    read -r -a pids <<<"$(pids_of "$1")"
    before=(); for i in 0 1 2; do before+=("$(cpu_ticks "${pids[$i]}")"); done
    BENCH_KEYS="$KEYS" "${CLIENT_PIN[@]}" wrk -t "$THREADS" -c "$CONNECTIONS" -d "$2" --latency \
        -s "$LUA" "$(url_of "$1")" >"$3" 2>&1 || true
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
python3 - <<'EOF'
import os, re, statistics, datetime, glob

results = os.environ["RESULTS_DIR"]
targets = os.environ["TARGETS_LIST"].split()
base = os.environ["BASELINE"]
rounds = int(os.environ["ROUNDS"])

def parse(path):
    text = open(path).read()
    m = re.search(r"^BENCH (.*)$", text, re.M)
    f = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    f["non2xx_line"] = int(non2xx.group(1)) if non2xx else 0
    f["rps"] = f["requests"] / (f["duration_us"] / 1e6)
    cpu = re.search(r"^CPU (.*)$", text, re.M)
    c = {k: int(v) for k, v in (kv.split("=") for kv in cpu.group(1).split())}
    for part in ("target", "upstream", "redis"):
        f[f"cpu_{part}_us"] = c[f"{part}_ticks"] * 1e6 / c["clk_tck"] / f["requests"]
    return f

runs = {t: [parse(f"{results}/raw/{t}-round{r}.txt") for r in range(1, rounds + 1)] for t in targets}
keys = ("rps", "p50_us", "p99_us", "cpu_target_us", "cpu_upstream_us", "cpu_redis_us")
med = {t: {k: statistics.median(run[k] for run in runs[t]) for k in keys} for t in targets}
total = {t: sum(run["requests"] for run in runs[t]) for t in targets}
non2xx = {t: sum(run["non2xx_line"] for run in runs[t]) for t in targets}
errors = {t: sum(run["socket_errors"] for run in runs[t]) for t in targets}

def check(t):
    share = non2xx[t] / total[t] if total[t] else 0
    if t == "fg_redis_deny":
        ok = share >= 0.99
        return ok, f"{non2xx[t]}/{total[t]} non-2xx ({share:.2%}) expect ~100% 429: {'OK' if ok else 'FAIL'}"
    ok = non2xx[t] == 0
    return ok, f"{non2xx[t]}/{total[t]} non-2xx, expect 0: {'OK' if ok else 'FAIL'}"

b = med[base]
ms = lambda us: f"{us / 1000:.3f} ms"
header = ["target", "req/s", "p50", "p99", "req/s vs nginx", "p50 vs nginx", "p99 vs nginx",
          "CPU µs/req: self+upstream+redis", "responses"]
cpu = lambda m: "{:.0f} + {} + {}".format(m["cpu_target_us"],
    f"{m['cpu_upstream_us']:.0f}" if m["cpu_upstream_us"] else "-",
    f"{m['cpu_redis_us']:.0f}" if m["cpu_redis_us"] else "-")
rows = []
for t in targets:
    m = med[t]
    rows.append([t, f"{m['rps']:,.0f}", ms(m["p50_us"]), ms(m["p99_us"]),
                 f"{m['rps'] / b['rps']:.2f}x", f"{m['p50_us'] / b['p50_us']:.2f}x",
                 f"{m['p99_us'] / b['p99_us']:.2f}x", cpu(m), check(t)[1] + (f"; {errors[t]} socket errors" if errors[t] else "")])

now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
env = os.environ
intro = [
    f"date: {now}; commit {env['COMMIT']}{env['DIRTY']}",
    f"machine: {env['MACHINE']}",
    f"load: wrk -t{env['THREADS']} -c{env['CONNECTIONS']}, {env['KEYS']} rotating X-API-Key values, "
    f"{rounds} interleaved rounds of {env['DURATION']}; figures are medians across rounds",
    f"pinning: {env['PINNING']}",
    f"nginx_proxy workers: {env['NGINX_WORKERS']}; upstream: nginx return 200, 1 worker",
    "CPU µs/req: CPU time (user+system, from /proc) of the target process(es), its upstream and "
    "redis-server during the run, per request (with every server pinned to one busy core, "
    "req/s is about 1e6 / their sum)",
]

widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
print()
for line in intro:
    print(line)
print()
for r in [header] + rows:
    print("  ".join(str(c).ljust(w) if i in (0, 8) else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
print()

md = ["# floodgate vs nginx", ""] + [f"- {l}" for l in intro] + ["",
      "| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * 7 + ["---"]) + "|"]
md += ["| " + " | ".join(r) + " |" for r in rows]
md += ["", "Per round: req/s (its ratio to nginx_proxy in the same round), p50, p99:", "",
       "| target | " + " | ".join(f"round {r}" for r in range(1, rounds + 1)) + " | median of the round ratios |",
       "|---|" + "---:|" * (rounds + 1)]
for t in targets:
    ratios = [run["rps"] / base_run["rps"] for run, base_run in zip(runs[t], runs[base])]
    md.append(f"| {t} | " + " | ".join(
        f"{run['rps']:,.0f} ({ratio:.2f}x), {ms(run['p50_us'])}, {ms(run['p99_us'])}"
        for run, ratio in zip(runs[t], ratios)) + f" | {statistics.median(ratios):.2f}x |")
md += ["", "Raw wrk output: `raw/<target>-round<N>.txt`.", ""]
open(f"{results}/bench.md", "w").write("\n".join(md))
print(f"written: {results}/bench.md and {results}/raw/")
bad = [t for t in targets if not check(t)[0]]
if bad:
    print("RESPONSE CHECK FAILED for: " + ", ".join(bad))
    raise SystemExit(1)
EOF
