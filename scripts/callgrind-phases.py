#!/usr/bin/env python3
"""A request's instructions phase by phase, from two callgrind profiles of one proxy.

    scripts/callgrind-phases.py SMALL.out LARGE.out N_SMALL N_LARGE

SMALL.out and LARGE.out are callgrind's output for runs that served N_SMALL and N_LARGE
requests (scripts/callgrind.sh KEEP=DIR keeps floodgate's). A function's inclusive cost per
request is its difference between the runs over the difference in requests, so start-up and
shutdown cancel out. With fat LTO much is inlined: a function's cost is summed over every source
file callgrind attributes part of it to, and a phase whose functions were all inlined into
their caller shows as part of that caller (the table says "inlined" for it).

Prints a Markdown table: phase, instructions per request, share of the request.
"""
import re
import subprocess
import sys
from collections import defaultdict

# (phase, pattern over the symbol, indentation). A row's cost includes the rows indented below it.
PHASES = [
    ("whole request (the process, per request)", r"^PROGRAM TOTALS$", 0),
    ("tokio: parking and waking the worker threads", r"worker::Context::park_internal$", 1),
    ("hyper: reading and parsing heads (the request's; the upstream's answer)", r"h1::conn::Conn<I,B,T>::poll_read_head$", 1),
    ("floodgate: what it answers without waiting (`Proxy::begin`)", r"floodgate::proxy::Proxy::begin$", 1),
    ("floodgate: what waits (`Proxy::go_on`: a forward, a decision that waited)", r"floodgate::proxy::Proxy::go_on::\{\{closure\}\}$", 1),
    ("normalising the path", r"floodgate::proxy::Proxy::normalize$", 2),
    ("finding the route", r"floodgate::proxy::Proxy::route$|RouteTable::find$", 2),
    ("the decision (`Proxy::decide_in_place`: the cache phase, admission)", r"floodgate::proxy::Proxy::decide_in_place::\{\{closure\}\}$", 2),
    ("admission (identity, decision)", r"floodgate::proxy::admit::<impl floodgate::proxy::Proxy>::admit::\{\{closure\}\}$", 3),
    ("identity", r"floodgate::proxy::admit::<impl floodgate::proxy::Proxy>::identify$", 4),
    ("the decision (`Decider::attempt`)", r"floodgate::decider::Decider::attempt::\{\{closure\}\}$", 4),
    ("the limiter (`Limiter::decide`)", r"floodgate::limiter::front::Limiter::decide::\{\{closure\}\}$", 5),
    ("the memory store", r"floodgate::limiter::memory::MemoryStore::decide_into$", 6),
    ("the refusal's answer (`Rejection::respond`)", r"floodgate::answer::Rejection::respond$", 2),
    ("its rate-limit headers", r"floodgate::answer::RateLimitHeaders::write$", 3),
    ("its body", r"floodgate::answer::rate_limited_body$", 3),
    ("forwarding (`Forwarder::forward`)", r"floodgate::proxy::forward::Forwarder::forward::\{\{closure\}\}::\{\{closure\}\}$", 2),
    ("hop-by-hop headers", r"floodgate::proxy::forward::headers::strip_hop_by_hop$", 3),
    ("the upstream exchange (`Pool::send_on`)", r"floodgate::proxy::pool::Pool::send_on::\{\{closure\}\}$", 3),
    ("metrics, log line, after-response (`Proxy::respond`)", r"floodgate::proxy::Proxy::respond$", 2),
    ("the access log line", r"floodgate::proxy::context::PendingLog::write$", 3),
    ("reading what is left of the request (`linger`)", r"floodgate::proxy::linger$", 2),
    ("hyper: writing heads (the response's; the upstream request's)", r"h1::conn::Conn<I,B,T>::write_head$", 1),
    ("hyper: the upstream connection's task", r"<hyper::client::conn::http1::Connection<T,B> as core::future::future::Future>::poll$", 1),
    ("hyper: flushing to the socket", r"h1::io::Buffered<T,B>::poll_flush$", 1),
    ("allocation (malloc, all callers)", r"^mi_malloc_aligned$|^mi_zalloc_aligned$|^_mi_malloc_generic$", 1),
    ("freeing (all callers)", r"^mi_free$", 1),
    ("memcpy (moving futures and structs, all callers)", r"^__memcpy_avx_unaligned_erms$", 1),
]

LINE = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+([*<])\s+(.*?)(?: \(\d[\d,]*x\))?(?: \[[^\]]*\])?$")
TOTAL = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+PROGRAM TOTALS")


def symbol_of(where):
    """The function of callgrind_annotate's "file:function" (file may be "???")."""
    return re.sub(r"^(?:\?\?\?|[^:]*\.(?:rs|c|h|S|cc|cpp)):", "", where)


def costs(path):
    """Inclusive instructions by function: the sum of the calls into it from other functions
    (callgrind_annotate's caller tree), so that code inlined from other files, which callgrind
    lists as parts of the function, is counted once, inside the calls."""
    out = subprocess.run(
        ["callgrind_annotate", "--tree=caller", "--inclusive=yes", "--threshold=100", path],
        capture_output=True, text=True, check=True,
    ).stdout
    by_symbol = defaultdict(int)
    callers = []
    for line in out.splitlines():
        m = TOTAL.match(line)
        if m:
            by_symbol["PROGRAM TOTALS"] = int(m.group(1).replace(",", ""))
            continue
        m = LINE.match(line)
        if not m:
            if not line.strip():
                callers = []
            continue
        cost, mark, symbol = int(m.group(1).replace(",", "")), m.group(2), symbol_of(m.group(3))
        if mark == "<":
            callers.append((symbol, cost))
            continue
        # Recursive calls (an async fn's poll calling itself through a `'2` copy) are left out.
        base = symbol.rstrip("'0123456789")
        by_symbol[symbol] += sum(c for s, c in callers if s.rstrip("'0123456789") != base)
        callers = []
    return by_symbol


def main():
    small, large, n_small, n_large = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    a, b = costs(small), costs(large)
    n = n_large - n_small
    whole = (b["PROGRAM TOTALS"] - a["PROGRAM TOTALS"]) / n
    print("| phase | instructions per request | share |")
    print("| --- | ---: | ---: |")
    for label, pattern, depth in PHASES:
        rx = re.compile(pattern)
        names = [s for s in set(a) | set(b) if rx.search(s)]
        indent = "&nbsp;&nbsp;" * 2 * depth
        if not names:
            print(f"| {indent}{label} | inlined | |")
            continue
        per = sum(b.get(s, 0) - a.get(s, 0) for s in names) / n
        print(f"| {indent}{label} | {per:,.0f} | {100 * per / whole:.0f}% |")


if __name__ == "__main__":
    main()
