#!/usr/bin/env python3
"""scripts/bench-batch-cost.py: Redis time per decision, one decision per call against batches.

Starts a redis-server of its own (loopback, a free port), lets target/release/floodgate load its
function library into it, then drives the library's functions directly with redis-benchmark
(4 clients, no floodgate in the loop, so Redis is not preempted by a proxy sharing its cores) and
reads INFO commandstats: usec_per_call of FCALL divided by the decisions per call. Each decision
is a one-limit token bucket on a key of its own. Prints a markdown table.

    cargo build --release && scripts/bench-batch-cost.py
"""

import os, re, socket, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOODGATE = os.environ.get("FLOODGATE", os.path.join(ROOT, "target/release/floodgate"))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, check=True).stdout


def per_call_us(port, command, requests):
    cli(port, "CONFIG", "RESETSTAT")
    subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", "4", "-q", *command],
                   capture_output=True, check=True)
    stats = cli(port, "INFO", "commandstats")
    return float(re.search(r"cmdstat_fcall:.*usec_per_call=([\d.]+)", stats).group(1))


def main():
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        # floodgate loads its library before it listens; then it is stopped.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
            config.write(f"listen: 127.0.0.1:0\nstorage: {{backend: redis, url: 'redis://127.0.0.1:{port}'}}\n"
                         "routes: [{name: r, path_prefix: /, upstream: 'http://127.0.0.1:1'}]\n")
            config.flush()
            fg = subprocess.Popen([FLOODGATE, "--config", config.name], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
            fg.stdout.readline()  # "floodgate listening on ..." (the library is loaded by then)
            fg.terminate()
            fg.wait()
        names = re.findall(r"floodgate_(?:decide|batch)_[0-9a-f]+", cli(port, "FUNCTION", "LIST"))
        decide = next(n for n in names if n.startswith("floodgate_decide_"))
        batch = next(n for n in names if n.startswith("floodgate_batch_"))
        # capacity, interval µs, cost (always allows), then no lease wanted, given back or timed
        limit = ["token_bucket", "1000000000", "1", "1", "0", "0", "0", "0"]
        rows = [("one decision per call (main.lua)", 1,
                 per_call_us(port, ["FCALL", decide, "1", "k:{t}", "-", "7", *limit], 50000))]
        for m in (4, 16, 64):
            keys = [f"k{i}:{{t{i}}}" for i in range(m)]
            args = ["-", str(m)]
            for i in range(m):
                args += [str(i), "1", *limit]
            rows.append((f"batch of {m} (batch.lua)", m,
                         per_call_us(port, ["FCALL", batch, str(m), *keys, *args], 20000)))
        print("| call | µs per call | µs per decision |")
        print("| --- | ---: | ---: |")
        for name, m, us in rows:
            print(f"| {name} | {us:.1f} | {us / m:.2f} |")
    finally:
        redis.terminate()


if __name__ == "__main__":
    sys.exit(main())
