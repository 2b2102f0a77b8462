"""Plots the surge load test over time from Locust's --csv-full-history files (matplotlib, Agg backend).

For each run NAME it reads RESULTS_DIR/NAME_stats_history.csv and, when present, the demo upstream's
per-second /__stats samples in RESULTS_DIR/NAME_upstream_timeline.csv (written by scripts/loadtest.sh), and
draws every run on the same axes:
  1. requests/s answered to Locust (all answers), per second,
  2. 429s/s (floodgate's rejections), per second,
  3. p95 latency of admitted (non-429) requests per endpoint; Locust computes it over a ~10 s window,
  4. requests/s the upstream served, and its 503s/s (when the timeline file exists),
  5. 503s/s answered to Locust (floodgate's upstream_overloaded, or the upstream's own),
  6. floodgate's learned limit (floodgate_adaptive_limit) for the adaptive runs, from
     RESULTS_DIR/NAME_limit_timeline.csv.

Usage: python plot.py RESULTS_DIR RUN [RUN ...]   -> RESULTS_DIR/surge.png
"""

from __future__ import annotations

import csv
import itertools
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use("Agg"): the backend must be chosen first

REJECTED_SUFFIX = " (429)"  # must match locustfile.REJECTED_SUFFIX
ENDPOINT_STYLES = {"/api/rides/request": "-", "/api/fares/estimate": "--"}
RUN_COLOURS = {
    "no_limit": "tab:red",
    "with_limit": "tab:blue",
    "adaptive": "tab:green",
    "adaptive_degrade": "tab:purple",
}


def number(text: str) -> float | None:
    """A CSV cell as a float; Locust writes N/A for percentiles with no data."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def read_history(path: Path) -> dict:
    """Series keyed by name: time offsets (s), requests/s, 429s/s and p95 per admitted endpoint."""
    by_time: dict[int, list[dict]] = defaultdict(list)
    with path.open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            by_time[int(row["Timestamp"])].append(row)
    if not by_time:
        return {"start": None, "t": [], "rps": [], "rejected": [], "failed": [], "p95": {}}
    start = min(by_time)
    series: dict = {
        "start": start, "t": [], "rps": [], "rejected": [], "failed": [], "p95": defaultdict(lambda: ([], []))
    }
    previous_failures: dict[str, float] = {}
    # Rates come from the cumulative "Total Request Count" per row, differenced between samples: Locust's own
    # "Requests/s" column is averaged over a trailing window and lags the ramp-up by several seconds.
    previous_counts: dict[str, float] = {}
    previous_ts = None
    for ts in sorted(by_time):
        rows = by_time[ts]
        counts = {r["Name"]: number(r["Total Request Count"]) or 0.0 for r in rows}
        failures = {r["Name"]: number(r.get("Total Failure Count")) or 0.0 for r in rows}
        if previous_ts is not None:
            dt = ts - previous_ts
            delta = {name: counts[name] - previous_counts.get(name, 0.0) for name in counts}
            series["t"].append(ts - start)
            series["rps"].append(delta.get("Aggregated", 0.0) / dt)
            series["rejected"].append(sum(d for name, d in delta.items() if name.endswith(REJECTED_SUFFIX)) / dt)
            failed = failures.get("Aggregated", 0.0) - previous_failures.get("Aggregated", 0.0)
            series["failed"].append(failed / dt)
        previous_counts, previous_failures, previous_ts = counts, failures, ts
        offset = ts - start
        for r in rows:
            if r["Name"] in ENDPOINT_STYLES:
                p95 = number(r["95%"])
                if p95 is not None:
                    times, values = series["p95"][r["Name"]]
                    times.append(offset)
                    values.append(p95)
    # Locust writes its history rows at uneven instants (two in one second, none in the next),
    # so per-sample rates saw-tooth between 0 and twice the rate: smooth over 4 samples.
    for key in ("rps", "rejected", "failed"):
        series[key] = smooth(series[key], 4)
    return series


def smooth(values: list[float], window: int) -> list[float]:
    """The trailing mean of `window` samples (fewer at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def read_upstream(path: Path, t0: float | None) -> dict | None:
    """Per-second served and 503 rates from cumulative /__stats samples (unix_time,served,rejected,in_flight).

    Times are offsets from t0 (the first Locust history timestamp), so both files share one time axis.
    """
    if not path.exists():
        return None
    samples = []
    with path.open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            samples.append((float(row["unix_time"]), int(row["served"]), int(row["rejected"])))
    if len(samples) < 2:
        return None
    if t0 is None:
        t0 = samples[0][0]
    out: dict = {"t": [], "served": [], "rejected": []}
    for (t_prev, s_prev, r_prev), (t, s, r) in itertools.pairwise(samples):
        dt = max(t - t_prev, 1e-6)
        out["t"].append(t - t0)
        out["served"].append((s - s_prev) / dt)
        out["rejected"].append((r - r_prev) / dt)
    return out


def read_limit(path: Path, t0: float | None) -> dict | None:
    """floodgate's learned limit over time (unix_time,limit), as offsets from t0."""
    if not path.exists():
        return None
    out: dict = {"t": [], "limit": []}
    with path.open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            t = float(row["unix_time"])
            out["t"].append(t - (t0 if t0 is not None else t))
            out["limit"].append(float(row["limit"]))
    return out if out["t"] else None


def plot(results: Path, runs: list[str]) -> Path:
    fig, axes = plt.subplots(6, 1, figsize=(11, 19), sharex=True)
    ax_rps, ax_429, ax_p95, ax_up, ax_503, ax_limit = axes
    for run in runs:
        colour = RUN_COLOURS.get(run)
        history = read_history(results / f"{run}_stats_history.csv")
        ax_rps.plot(history["t"], history["rps"], color=colour, label=run)
        ax_429.plot(history["t"], history["rejected"], color=colour, label=run)
        for endpoint, (times, values) in sorted(history["p95"].items()):
            ax_p95.plot(times, values, color=colour, linestyle=ENDPOINT_STYLES[endpoint], label=f"{run} {endpoint}")
        upstream = read_upstream(results / f"{run}_upstream_timeline.csv", history["start"])
        if upstream:
            ax_up.plot(upstream["t"], upstream["served"], color=colour, label=f"{run} served (200)")
            ax_up.plot(upstream["t"], upstream["rejected"], color=colour, linestyle=":", label=f"{run} 503s")
        ax_503.plot(history["t"], history["failed"], color=colour, label=run)
        limit = read_limit(results / f"{run}_limit_timeline.csv", history["start"])
        if limit:
            ax_limit.plot(limit["t"], limit["limit"], color=colour, label=run)

    ax_rps.set_ylabel("requests/s (Locust)")
    ax_rps.set_title("Ride-hailing surge through floodgate: " + ", ".join(runs))
    ax_429.set_ylabel("429s/s")
    ax_p95.set_ylabel("p95 of admitted requests (ms),\ntrailing 10 s window")
    ax_up.set_ylabel("upstream requests/s")
    ax_503.set_ylabel("503s/s to clients\n(shed or upstream)")
    ax_limit.set_ylabel("learned limit\n(requests in flight)")
    ax_limit.set_xlabel("seconds since the run started")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    out = results / "surge.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = plot(Path(argv[1]), argv[2:])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
