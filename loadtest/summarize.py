"""Summarises the surge load test runs written by scripts/loadtest.sh into summary.json and summary.md.

For each run NAME it reads, from the results directory:
- NAME_histograms.json  (written by locustfile.py on exit: every stats entry with its response-time histogram)
- NAME_upstream.json    (optional; the demo upstream's /__stats before and after the run)

and writes:
- summary.json: {"runs": [{"name", "requests", "rps", "p50_ms", "p95_ms", "p99_ms", "fail_pct",
  "rejected_429", "upstream_requests", ...}]}. Latency figures cover only requests NOT rejected with 429,
  i.e. what the riders who got through experienced. fail_pct is over all requests.
- summary.md: the scenario's result table (Name, # reqs, Avg, Med, Min, Max, p95, p99, RPS, Fail%, with
  "(of which 429s)" rows) for every run, then a side-by-side comparison.

Percentiles use Locust's own method on its own rounded histograms, so they match what Locust reports.

Usage: python summarize.py RESULTS_DIR RUN [RUN ...]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REJECTED_SUFFIX = " (429)"  # must match locustfile.REJECTED_SUFFIX
WAITING_SUFFIX = " (waiting)"  # must match locustfile.WAITING_SUFFIX


@dataclass
class Histogram:
    """Requests merged from one or more Locust stats entries."""

    num_requests: int = 0
    num_failures: int = 0
    total_response_time: float = 0.0
    min_response_time: float | None = None
    max_response_time: float = 0.0
    response_times: dict[int, int] = field(default_factory=dict)

    def add(self, entry: dict) -> None:
        self.num_requests += entry["num_requests"]
        self.num_failures += entry["num_failures"]
        self.total_response_time += entry["total_response_time"]
        if entry["min_response_time"] is not None:
            if self.min_response_time is None:
                self.min_response_time = entry["min_response_time"]
            else:
                self.min_response_time = min(self.min_response_time, entry["min_response_time"])
        self.max_response_time = max(self.max_response_time, entry["max_response_time"])
        for ms, count in entry["response_times"].items():
            self.response_times[int(ms)] = self.response_times.get(int(ms), 0) + count

    @property
    def avg(self) -> float:
        return self.total_response_time / self.num_requests if self.num_requests else 0.0

    def percentile(self, percent: float) -> int:
        """Locust's calculate_response_time_percentile: the smallest bucket with >= percent below it."""
        if not self.num_requests:
            return 0
        wanted = int(self.num_requests * percent)
        processed = 0
        for ms in sorted(self.response_times, reverse=True):
            processed += self.response_times[ms]
            if self.num_requests - processed <= wanted:
                return ms
        return 0


def load_run(results: Path, name: str) -> dict:
    """Reads one run's files and computes its summary figures and table rows."""
    document = json.loads((results / f"{name}_histograms.json").read_text(encoding="utf-8"))
    entries = document["entries"]
    start = document.get("start_time") or 0.0
    end = document.get("last_request_timestamp") or start
    duration = max(end - start, 1e-9)

    endpoints: dict[str, dict[str, Histogram]] = {}
    everything, admitted, rejected, waiting = Histogram(), Histogram(), Histogram(), Histogram()
    for entry in entries:
        entry_name = entry["name"]
        base = entry_name.removesuffix(REJECTED_SUFFIX).removesuffix(WAITING_SUFFIX)
        rows = endpoints.setdefault(
            base, {"all": Histogram(), "rejected": Histogram(), "waiting": Histogram()}
        )
        rows["all"].add(entry)
        if entry_name.endswith(REJECTED_SUFFIX):
            rows["rejected"].add(entry)
            rejected.add(entry)
        elif entry_name.endswith(WAITING_SUFFIX):
            rows["waiting"].add(entry)
            waiting.add(entry)
        else:
            admitted.add(entry)
        everything.add(entry)

    upstream_requests = None
    upstream_rejected = None
    upstream_file = results / f"{name}_upstream.json"
    if upstream_file.exists():
        upstream = json.loads(upstream_file.read_text(encoding="utf-8"))
        upstream_requests = upstream["after"]["served"] - upstream["before"]["served"]
        upstream_rejected = upstream["after"]["rejected"] - upstream["before"]["rejected"]

    summary = {
        "name": name,
        "requests": everything.num_requests,
        "rps": round(everything.num_requests / duration, 1),
        "p50_ms": admitted.percentile(0.50),
        "p95_ms": admitted.percentile(0.95),
        "p99_ms": admitted.percentile(0.99),
        "fail_pct": round(100.0 * everything.num_failures / everything.num_requests, 2)
        if everything.num_requests
        else 0.0,
        "rejected_429": rejected.num_requests,
        "waiting_503": waiting.num_requests,
        "upstream_requests": upstream_requests,
        # Extras, for the comparison table.
        "admitted_requests": admitted.num_requests,
        "failures": everything.num_failures,
        "upstream_rejected_503": upstream_rejected,
        "duration_s": round(duration, 1),
    }
    return {"summary": summary, "endpoints": endpoints, "everything": everything, "duration": duration}


def table_row(name: str, hist: Histogram, duration: float, rejected_row: bool) -> str:
    """One row of the scenario table; a "(of which 429s)" row has no Fail%."""
    if rejected_row or not hist.num_requests:
        fail = "-"
    else:
        fail = f"{100.0 * hist.num_failures / hist.num_requests:.1f}%"
    cells = [
        name,
        str(hist.num_requests),
        f"{hist.avg:.0f}",
        str(hist.percentile(0.5)),
        f"{hist.min_response_time or 0:.0f}",
        f"{hist.max_response_time:.0f}",
        str(hist.percentile(0.95)),
        str(hist.percentile(0.99)),
        f"{hist.num_requests / duration:.1f}",
        fail,
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(runs: list[dict], context: str) -> str:
    """summary.md: one scenario table per run, then the runs side by side."""
    lines = ["# floodgate surge load test", ""]
    if context:
        lines += [context, ""]
    lines += [
        'Times in milliseconds. Each endpoint row counts every request; its "(of which 429s)" row is the',
        "part floodgate rejected (a success for Locust: an expected answer, not a failure).",
        "",
    ]
    header = "| Name | # reqs | Avg | Med | Min | Max | p95 | p99 | RPS | Fail% |"
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for run in runs:
        lines += [f"## {run['summary']['name']}", "", header, rule]
        for endpoint in sorted(run["endpoints"]):
            rows = run["endpoints"][endpoint]
            lines.append(table_row(endpoint, rows["all"], run["duration"], False))
            if rows["rejected"].num_requests:
                lines.append(table_row("(of which 429s)", rows["rejected"], run["duration"], True))
            if rows["waiting"].num_requests:
                lines.append(table_row("(of which waiting)", rows["waiting"], run["duration"], True))
        lines.append(table_row("Aggregated", run["everything"], run["duration"], False))
        lines.append("")

    lines += [
        "## Side by side",
        "",
        "Latencies here are for requests that were neither rejected with 429 nor told to wait by a",
        "waiting room (what admitted riders saw).",
        "",
        "| Run | requests | RPS | 429s | waiting | admitted | upstream served | upstream 503s | p50 | p95 | p99 | Fail% |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run["summary"]
        na = "n/a"
        lines.append(
            "| "
            + " | ".join(
                [
                    s["name"],
                    str(s["requests"]),
                    f"{s['rps']:.1f}",
                    str(s["rejected_429"]),
                    str(s["waiting_503"]),
                    str(s["admitted_requests"]),
                    na if s["upstream_requests"] is None else str(s["upstream_requests"]),
                    na if s["upstream_rejected_503"] is None else str(s["upstream_rejected_503"]),
                    str(s["p50_ms"]),
                    str(s["p95_ms"]),
                    str(s["p99_ms"]),
                    f"{s['fail_pct']:.2f}%",
                ]
            )
            + " |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    results = Path(argv[1])
    runs = [load_run(results, name) for name in argv[2:]]
    context_file = results / "context.md"
    context = context_file.read_text(encoding="utf-8").strip() if context_file.exists() else ""
    (results / "summary.json").write_text(
        json.dumps({"runs": [run["summary"] for run in runs]}, indent=2) + "\n", encoding="utf-8"
    )
    (results / "summary.md").write_text(markdown(runs, context), encoding="utf-8")
    print(f"wrote {results / 'summary.json'} and {results / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
