#!/usr/bin/env bash
# scripts/bench-handshake.sh: what serving several certificates (chosen by SNI) costs a TLS
# handshake, and a request after it: floodgate beside nginx, one certificate against CERTS, in one
# run (#65's benchmark).
#
# Every target is a reverse proxy on TLS in front of one upstream (nginx `return 200`, not
# measured). `one`: a single certificate, for localhost. `many`: CERTS certificates (ECDSA P-256,
# one CA), for n0.example.test ... and localhost last (floodgate: `tls.certificates` in that
# order; nginx: one `server` block per name, each with its `ssl_certificate`, the first the
# default). The client (bench/handshakes.rs) always names localhost: the last of the list.
# Each handshake is full (TLS 1.3, X25519, no resumption) and its chain is verified for
# localhost, so a target that chose the wrong certificate fails the run.
#
#   handshakes/s  the target pinned to CPU 0 (floodgate with one runtime thread, nginx with one
#                 worker), the client and the upstream on CPU 1: CONCURRENCY connections in a
#                 closed loop for DURATION seconds, each a handshake and one GET; ROUNDS
#                 interleaved rounds, the median. The client verifies two signatures a
#                 handshake and is the bottleneck on this machine: the rate says little, the
#                 target's own CPU time per connection (from /proc) is the clock's figure
#   callgrind     instructions the target spends per connection (handshake + one GET):
#                 (total(H2) - total(H1)) / (H2 - H1) handshakes in sequence; and per request on
#                 a kept-alive TLS connection after it (h2load --h1 -c 1): R1 then R2 requests
#
# Knobs (environment): CERTS=50 ROUNDS=3 DURATION=8 CONCURRENCY=4 H1=100 H2=400 R1=1000 R2=3000
#   FLOODGATE=target/dist/floodgate  BUILD=1 (cargo build --profile dist first)
#   RESULTS=bench/results/handshake/bench.md (the one summary kept in git)
# Needs nginx, valgrind, h2load (installed when missing). All traffic goes to 127.0.0.1; every
# process started here is stopped on exit.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CERTS="${CERTS:-50}"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-8}"
CONCURRENCY="${CONCURRENCY:-4}"
H1="${H1:-100}" H2="${H2:-400}" R1="${R1:-1000}" R2="${R2:-3000}"
BUILD="${BUILD:-1}"
FLOODGATE="${FLOODGATE:-$ROOT/target/dist/floodgate}"
CLIENT="${CLIENT:-$ROOT/target/dist/examples/handshakes}"
RESULTS="${RESULTS:-$ROOT/bench/results/handshake/bench.md}"

log() { printf '[bench-handshake] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
command -v valgrind >/dev/null || missing+=(valgrind)
command -v h2load >/dev/null || missing+=(nghttp2-client)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --profile dist --bin floodgate --example handshakes) \
        || die "cargo build --profile dist failed"
fi
[ -x "$FLOODGATE" ] || die "no floodgate binary at $FLOODGATE"
[ -x "$CLIENT" ] || die "no $CLIENT (cargo build --profile dist --example handshakes)"

# shellcheck source=scripts/bench-lib.sh
. "$ROOT/scripts/bench-lib.sh"
bench_work bench-handshake
trap 'exit 130' INT TERM

"$CLIENT" gen "$WORK/certs" "$CERTS"
LAST=$((CERTS - 1))

nginx_conf() { # dir body
    cat >"$1/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $1/b; proxy_temp_path $1/p; fastcgi_temp_path $1/f;
    uwsgi_temp_path $1/u; scgi_temp_path $1/s;
    keepalive_requests 10000000;
$2
}
EOF
}

UP_PORT="$(free_port)"
mkdir -p "$WORK/up"
nginx_conf "$WORK/up" "    server { listen 127.0.0.1:$UP_PORT; location / { return 200 \"ok\n\"; } }"
taskset -c 1 nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" >/dev/null 2>&1 &
PIDS+=("$!")

PORT="$(free_port)"
# floodgate: the certificates in order (one: localhost's alone).
for set in one many; do
    {
        echo "listen: 127.0.0.1:$PORT"
        echo "tls:"
        echo "  certificates:"
        if [ "$set" = one ]; then first=$LAST; else first=0; fi
        for i in $(seq "$first" "$LAST"); do
            echo "    - {cert: $WORK/certs/cert$i.pem, key: $WORK/certs/key$i.pem}"
        done
        echo "routes:"
        echo "  - {name: bench, path_prefix: /, upstream: \"http://127.0.0.1:$UP_PORT\"}"
    } >"$WORK/floodgate-$set.yaml"
    mkdir -p "$WORK/nginx-$set"
    blocks=""
    for i in $(seq "$first" "$LAST"); do
        if [ "$i" = "$LAST" ]; then name=localhost; else name="n$i.example.test"; fi
        blocks="$blocks
    server { listen 127.0.0.1:$PORT ssl; server_name $name; ssl_protocols TLSv1.3;
        ssl_certificate $WORK/certs/cert$i.pem; ssl_certificate_key $WORK/certs/key$i.pem;
        location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
    done
    nginx_conf "$WORK/nginx-$set" "    upstream backend { server 127.0.0.1:$UP_PORT; keepalive 16; }$blocks"
done

# start TARGET [PREFIX...]: starts fg-one, fg-many, nginx-one or nginx-many on $PORT; sets PID.
start() {
    local target=$1
    shift
    case $target in
        fg-*) TOKIO_WORKER_THREADS=1 RUST_LOG=warn "$@" "$FLOODGATE" --config "$WORK/floodgate-${target#fg-}.yaml" \
            >"$WORK/$target.log" 2>&1 & ;;
        nginx-*) "$@" nginx -p "$WORK/$target" -c "$WORK/$target/nginx.conf" >"$WORK/$target.log" 2>&1 & ;;
    esac
    PID=$!
    for _ in $(seq 300); do
        curl -sk -o /dev/null --resolve "localhost:$PORT:127.0.0.1" "https://localhost:$PORT/" && return
        sleep 0.1
    done
    die "$target did not answer: $(cat "$WORK/$target.log")"
}
stop() { kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; }

client() { # CONCURRENCY LIMIT: the RESULT line, after checking every connection got its 200
    local out
    out=$(taskset -c 1 "$CLIENT" run "127.0.0.1:$PORT" localhost "$WORK/certs/ca.pem" "$1" "$2")
    echo "$out" >>"$WORK/client.log"
    [[ "$out" == *" errors=0" ]] || die "a handshake or its request failed: $out"
    echo "$out"
}

TARGETS=(fg-one fg-many nginx-one nginx-many)

# --- handshakes per second -------------------------------------------------------------------
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime of one process
declare -A RATES CPUS
for round in $(seq "$ROUNDS"); do
    for target in "${TARGETS[@]}"; do
        start "$target" taskset -c 0
        client "$CONCURRENCY" 1s >/dev/null # warm-up
        before=$(cpu_ticks "$PID")
        line=$(client "$CONCURRENCY" "${DURATION}s")
        after=$(cpu_ticks "$PID")
        rate=$(sed -n 's/.* per_second=\([0-9.]*\).*/\1/p' <<<"$line")
        done_=$(sed -n 's/.*handshakes=\([0-9]*\).*/\1/p' <<<"$line")
        # The target's own CPU per connection, µs (clock ticks are 1/100 s here: getconf CLK_TCK).
        cpu=$(python3 -c "print(f'{($after - $before) * 1e6 / $(getconf CLK_TCK) / $done_:.0f}')")
        RATES[$target]="${RATES[$target]:-} $rate"
        CPUS[$target]="${CPUS[$target]:-} $cpu"
        log "round $round $target: $rate handshakes/s, $cpu µs of its CPU each"
        stop
    done
done
median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# --- callgrind: per connection, and per request after the handshake --------------------------
total() { # OUT: callgrind's total instructions
    sed -n 's/^summary: //p; s/^totals: //p' "$1" | head -1
}
under_callgrind() { # TARGET KIND N: total instructions of the target serving N of KIND
    local target=$1 kind=$2 n=$3 out="$WORK/$1.$2.$3.cg"
    start "$target" valgrind --tool=callgrind --callgrind-out-file="$out"
    if [ "$kind" = handshake ]; then
        client 1 "$n" >/dev/null
    else
        h2load --h1 -n "$n" -c 1 "https://localhost:$PORT/" >"$WORK/h2load.$target.$n" 2>&1 ||
            die "h2load failed: $(cat "$WORK/h2load.$target.$n")"
        grep -q "$n succeeded" "$WORK/h2load.$target.$n" ||
            die "$target: not every request succeeded: $(cat "$WORK/h2load.$target.$n")"
    fi
    stop
    total "$out"
}
declare -A PER_HS PER_REQ
for target in "${TARGETS[@]}"; do
    a=$(under_callgrind "$target" handshake "$H1")
    b=$(under_callgrind "$target" handshake "$H2")
    PER_HS[$target]=$(((b - a) / (H2 - H1)))
    a=$(under_callgrind "$target" request "$R1")
    b=$(under_callgrind "$target" request "$R2")
    PER_REQ[$target]=$(((b - a) / (R2 - R1)))
    log "$target: ${PER_HS[$target]} instructions per connection, ${PER_REQ[$target]} per request after it"
done

# --- the summary -----------------------------------------------------------------------------
mkdir -p "$(dirname "$RESULTS")"
{
    echo "# TLS handshakes with one certificate and with $CERTS (chosen by SNI)"
    echo
    echo "\`scripts/bench-handshake.sh\` (CERTS=$CERTS ROUNDS=$ROUNDS DURATION=$DURATION CONCURRENCY=$CONCURRENCY"
    echo "H1=$H1 H2=$H2 R1=$R1 R2=$R2), $(date -u +%Y-%m-%d), $(nproc) cores; $(nginx -v 2>&1)."
    echo "Full TLS 1.3 handshakes (X25519, ECDSA P-256, no resumption) naming the last certificate"
    echo "of the list, each followed by one GET; the target on one core."
    echo
    echo "| target | connections/s (median of $ROUNDS) | its CPU µs per connection (median) | instructions per connection | instructions per request after the handshake |"
    echo "| --- | ---: | ---: | ---: | ---: |"
    for target in "${TARGETS[@]}"; do
        echo "| $target | $(median "${RATES[$target]}") | $(median "${CPUS[$target]}") | ${PER_HS[$target]} | ${PER_REQ[$target]} |"
    done
    echo
    python3 - "${PER_HS[fg-one]}" "${PER_HS[fg-many]}" "${PER_HS[nginx-one]}" "${PER_HS[nginx-many]}" \
        "${PER_REQ[fg-one]}" "${PER_REQ[fg-many]}" <<'PY'
import sys
fo, fm, no, nm, ro, rm = map(int, sys.argv[1:])
print(f"- {fm - fo:+,} instructions per connection for floodgate with many certificates "
      f"({(fm - fo) / fo:+.2%}); nginx {nm - no:+,} ({(nm - no) / no:+.2%})")
print(f"- floodgate / nginx per connection: {fo / no:.2f}x with one, {fm / nm:.2f}x with many")
print(f"- per request after the handshake, floodgate many - one: {rm - ro:+,} instructions")
PY
} >"$RESULTS"
cat "$RESULTS"
