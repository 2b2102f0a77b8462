#!/usr/bin/env python3
"""bench/global_slices_sim.py: a discrete-event model of global budgets leased to regions in
slices (issue #42, "Simulate first"), to choose `storage.global.lease_ttl` and the slice rules
before they are built.

The model, one unit per request:

- A global store holds the budget: a non-refilling quota of B units, or a token bucket of capacity
  C refilling at rho/s. Three regions each hold a slice of it: units taken out of the global budget
  before any is spent, with an end. Invariant: global + every slice's units never exceed the budget
  (for a bucket: its capacity); so all regions together never admit more than the budget.
- Requests arrive in each region as a Poisson process at lambda x skew[r] (80/15/5, and a shift:
  the skew rotates to 5/15/80 a third of the way in).
- A region renews its slice in the background when a quarter of its ttl is left, or when its
  units fall below a quarter of what it expects to spend in a ttl: one cross-region round trip
  (RTT). The renewal gives back what is left of the old slice and takes a new one sized from the
  region's demand over the last ttl (x HEADROOM), capped at a share (CAP_SHARE) of what the global
  store has left: near exhaustion slices shrink, so the last units go where the demand is.
- A request that finds its region's slice empty waits for a renewal (one in flight, or one it
  starts): that is a cross-region wait on the request path. If the global store has nothing left,
  the request is denied. A slice that ends unrenewed (an idle region) lapses: its units go back.

Reported per case: admitted against the ideal (one store, no regions), under-grant (units denied
while other regions' slices still held some, at the moment of each denial, summed as requests
denied that way), global calls per second, and the share of requests that waited on the global
store, split into waits while more than 10% of the budget was left and waits for the last units.

Deterministic (seeded). Runs in about 30 s:  python3 bench/global_slices_sim.py
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

RTT = 0.080  # seconds: 40 ms each way, as the test's delaying relay
LAMBDA = 2000.0  # requests per second over all regions
DURATION = 60.0
HEADROOM = 1.5
CAP_SHARE = 0.5
# A request that finds its slice empty while the global store was empty at the region's last
# call is denied at once instead of waiting (see main()).
DENY_WHEN_EMPTY = True
REGIONS = 3
SKEW = (0.80, 0.15, 0.05)
SHIFTED = (0.05, 0.15, 0.80)


@dataclass
class Region:
    units: int = 0
    end: float = 0.0
    # Requests seen in the current and the previous ttl-long period (the demand estimate).
    period_start: float = 0.0
    seen: int = 0
    previous: int = 0
    renewing: bool = False
    # What the global store had left at this region's last call (units).
    global_left: float = 1.0
    # Rate slices: the region's share of the refill, and the most its slice holds.
    rate: float = 0.0
    cap: float = 0.0
    accrued_at: float = 0.0

    def accrue(self, now: float) -> None:
        if self.rate and now < self.end:
            self.units = min(self.cap, self.units + (now - self.accrued_at) * self.rate)
        self.accrued_at = now
    waiting: list[float] = field(default_factory=list)  # arrival times of waiting requests


class Global:
    """The global budget: a quota (refill 0) or a token bucket. With rate slices, a region's
    share of the refill is the region's while its slice lasts: the global store accrues only the
    rest, so the refill handed out never exceeds the budget's."""

    def __init__(self, capacity: int, refill: float) -> None:
        self.capacity = capacity
        self.refill = refill
        self.tokens = float(capacity)
        self.at = 0.0
        self.shares = [0.0] * REGIONS  # refill per second each region holds
        self.share_ends = [0.0] * REGIONS
        self.demand = [0.0] * REGIONS  # each region's demand as it last said

    def level(self, now: float) -> float:
        if self.refill:
            own = self.refill - sum(self.shares)
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * own)
        self.at = now
        return self.tokens

    def assign(self, r: int, demand: float, end: float, now: float) -> float:
        """Region r's share of the refill until `end`, by its demand among the regions'."""
        self.level(now)
        for i in range(REGIONS):
            if self.share_ends[i] <= now:
                self.shares[i] = 0.0
                self.demand[i] = 0.0
        self.demand[r] = demand
        self.shares[r] = 0.0
        total = sum(self.demand) or 1.0
        free = self.refill - sum(self.shares)
        self.shares[r] = min(self.refill * demand / total, free)
        self.share_ends[r] = end
        return self.shares[r]

    def lapse(self, r: int, now: float) -> None:
        self.level(now)
        self.shares[r] = 0.0

    def take(self, want: int, now: float) -> int:
        have = int(self.level(now))
        granted = min(want, max(1, int(have * CAP_SHARE)) if have else 0)
        self.tokens -= granted
        return granted

    def give_back(self, units: int, now: float) -> None:
        self.level(now)
        # Never above capacity: what a slice held was taken out of it.
        self.tokens = min(self.capacity, self.tokens + units)


def simulate(
    ttl: float, shift: bool, capacity: int, refill: float, rates: bool = False, seed: int = 7
) -> dict:
    rng = random.Random(seed)
    store = Global(capacity, refill)
    regions = [Region() for _ in range(REGIONS)]
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(at: float, kind: str, r: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, r))

    def skew(now: float) -> tuple[float, ...]:
        return SHIFTED if shift and now >= DURATION / 3 else SKEW

    for r in range(REGIONS):
        push(rng.expovariate(LAMBDA * SKEW[r]), "arrive", r)
    admitted = denied = stranded = calls = 0
    waits_early = waits_late = 0

    def demand(reg: Region, now: float) -> int:
        if now - reg.period_start >= ttl:
            reg.previous = reg.seen if now - reg.period_start < 2 * ttl else 0
            reg.seen = 0
            reg.period_start = now
        return max(reg.previous, reg.seen)

    def renew(r: int, now: float) -> None:
        nonlocal calls
        reg = regions[r]
        if reg.renewing:
            return
        reg.renewing = True
        calls += 1
        push(now + RTT, "granted", r)

    while events:
        now, _, kind, r = heapq.heappop(events)
        if now > DURATION:
            break
        reg = regions[r]
        if kind == "arrive":
            push(now + rng.expovariate(LAMBDA * skew(now)[r]), "arrive", r)
            demand(reg, now)
            reg.seen += 1
            reg.accrue(now)
            if reg.units >= 1 and now < reg.end:
                reg.units -= 1
                admitted += 1
                low = reg.units < HEADROOM * demand(reg, now) / 4
                if (reg.end - now < ttl / 4 or low) and not reg.renewing:
                    renew(r, now)
            elif reg.global_left < 1 and DENY_WHEN_EMPTY:
                # Empty here, and the global store was empty at the last call: denied at once
                # (as a single store's empty bucket denies), renewed in the background.
                denied += 1
                if any(int(x.units) for i, x in enumerate(regions) if i != r):
                    stranded += 1
                renew(r, now)
            else:
                # Empty: wait for a renewal.
                reg.waiting.append(now)
                renew(r, now)
        elif kind == "granted":
            reg.renewing = False
            # The old slice's rest goes back, then a new one is taken (one call).
            reg.accrue(now)
            if int(reg.units):
                store.give_back(int(reg.units), now)
            reg.units = 0
            want = max(1, int(HEADROOM * demand(reg, now)) + len(reg.waiting))
            reg.accrue(now)
            reg.units = int(reg.units)
            reg.units = store.take(want, now)
            reg.end = now + ttl
            if rates:
                reg.rate = store.assign(r, demand(reg, now) / ttl, reg.end, now)
                reg.cap = max(reg.units, HEADROOM * reg.rate * ttl)
                reg.accrued_at = now
            reg.global_left = store.level(now)
            reg.end = now + ttl
            push(reg.end, "lapse", r)
            left = store.level(now) + sum(x.units for x in regions)
            while reg.waiting and reg.units >= 1:
                reg.waiting.pop(0)
                reg.units -= 1
                admitted += 1
                if left > 0.1 * capacity:
                    waits_early += 1
                else:
                    waits_late += 1
            if reg.waiting:
                if store.level(now) >= 1:
                    renew(r, now)  # more is left: ask again
                else:
                    elsewhere = sum(int(x.units) for i, x in enumerate(regions) if i != r)
                    for _ in reg.waiting:
                        denied += 1
                        if elsewhere:
                            stranded += 1
                    reg.waiting.clear()
        elif kind == "lapse":
            if now >= reg.end:
                reg.accrue(reg.end)
                if int(reg.units):
                    store.give_back(int(reg.units), now)
                reg.units = 0
                if rates and store.share_ends[r] <= now:
                    store.lapse(r, now)
                    reg.rate = 0.0
    if refill:
        ideal = capacity + refill * DURATION
    else:
        ideal = capacity
    return {
        "admitted": admitted,
        "ideal": int(ideal),
        "denied": denied,
        "stranded": stranded,
        "calls_per_s": calls / DURATION,
        "waits_early": waits_early,
        "waits_late": waits_late,
    }


def main() -> None:
    global DENY_WHEN_EMPTY
    cases = [
        ("quota 60,000 (no refill)", 60_000, 0.0, False),
        ("bucket 2,000 + 1,000/s, unit slices", 2_000, 1_000.0, False),
        ("bucket 2,000 + 1,000/s, rate slices", 2_000, 1_000.0, True),
    ]
    print(f"lambda {LAMBDA:.0f}/s for {DURATION:.0f} s, RTT {RTT * 1000:.0f} ms, 3 regions, "
          f"headroom {HEADROOM}, a slice at most {CAP_SHARE:.0%} of what is left\n")
    print("| budget | lease_ttl | skew | admitted / ideal | under-grant | stranded denials | "
          "global calls/s | waited, >10% left | waited, last 10% |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, capacity, refill, rates, deny in [(*c, d) for c in cases for d in (False, True)]:
        DENY_WHEN_EMPTY = deny
        if deny:
            name += ", empty: deny at once"
        for ttl in (0.5, 1.0, 2.0, 5.0):
            for shift in (False, True):
                res = simulate(ttl, shift, capacity, refill, rates)
                under = res["ideal"] - res["admitted"]
                print(
                    f"| {name} | {ttl:g}s | {'80/15/5 then 5/15/80' if shift else '80/15/5'} "
                    f"| {res['admitted']:,} / {res['ideal']:,} | {under:,} ({under / res['ideal']:.2%}) "
                    f"| {res['stranded']:,} | {res['calls_per_s']:.1f} | {res['waits_early']:,} "
                    f"| {res['waits_late']:,} |"
                )


if __name__ == "__main__":
    main()
