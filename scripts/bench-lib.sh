# scripts/bench-lib.sh: what the benchmark scripts share (sourced, not run): a work folder whose
# processes are stopped on exit, free ports, waiting for a port, and the demo API of #61 and #62.

# bench_work NAME: $WORK, a fresh folder; $PIDS, processes stopped (and $WORK removed) on exit.
bench_work() {
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/floodgate-$1.XXXXXX")"
    chmod 755 "$WORK"
    PIDS=()
    trap bench_cleanup EXIT
}
bench_cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_port PORT: until something answers HTTP on 127.0.0.1:PORT (30 s at most).
wait_port() {
    for _ in $(seq 300); do
        curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0
        sleep 0.1
    done
    echo "nothing answers on $1" >&2
    exit 1
}

# start_api: the demo upstream at 160 req/s (8 workers x 50 ms, 503 past a 250 ms wait) on
# $API_PORT; `served` says how many requests it has served.
start_api() {
    API_PORT="$(free_port)"
    "$DEMO" --listen "127.0.0.1:$API_PORT" --workers 8 --service-time 50ms --queue-timeout 250ms \
        >"$WORK/api.log" 2>&1 &
    PIDS+=("$!")
    wait_port "$API_PORT"
}
served() {
    curl -s "http://127.0.0.1:$API_PORT/__stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["served"])'
}

# start_redis: a redis-server of its own on $REDIS_PORT (no persistence), once it answers.
start_redis() {
    REDIS_PORT="$(free_port)"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
        >"$WORK/redis.log" 2>&1 &
    PIDS+=("$!")
    for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
}
