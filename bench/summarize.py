"""Summarises a scripts/bench.sh run: medians across rounds, ratios to nginx_proxy, CPU per
request, and the response checks. Reads its settings from the environment bench.sh exports;
writes $RESULTS_DIR/bench.md and exits 1 when a target answered what it should not."""

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
    if t.endswith("_deny"):
        ok = share >= 0.99
        return ok, f"{non2xx[t]}/{total[t]} non-2xx ({share:.2%}) expect ~100% 429: {'OK' if ok else 'FAIL'}"
    ok = non2xx[t] == 0
    return ok, f"{non2xx[t]}/{total[t]} non-2xx, expect 0: {'OK' if ok else 'FAIL'}"

b = med[base]
ms = lambda us: f"{us / 1000:.3f} ms"
header = ["target", "req/s", "p50", "p99", "req/s vs nginx", "p50 vs nginx", "p99 vs nginx",
          "CPU µs/req: self+upstream+store", "responses"]
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
    "its store's server (redis-server, or PostgreSQL's processes) during the run, per request (with every server pinned to one busy core, "
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
