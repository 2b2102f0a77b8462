"""Locust scenario for floodgate: the ride-hailing surge (riders at 10x their normal request rate).

Riders hammer POST /api/rides/request (weight 3) and POST /api/fares/estimate (weight 1), and poll the
surge map of one of 20 zones, GET /api/surge/zone/N (weight 4: the same read for every rider in a zone,
what a response cache absorbs), waiting only 0.1-0.5 s between requests. Each simulated rider sends an ``X-API-Key`` from a small pool of identities
(``rider-0`` .. ``rider-{N-1}``, N = $LOADTEST_API_KEYS, default 5), so several users share one budget,
like several app instances of one account, and floodgate's per-identity token buckets bite.

How responses are counted:
- 2xx: success, under the endpoint's name.
- 429: an expected rejection, not a failure. It is reported under its own name, e.g.
  ``/api/rides/request (429)``, so the stats CSVs have separate rows for rejections. A 429 without a
  ``Retry-After`` header breaks floodgate's contract and is counted as a failure instead.
- anything else (503 from an overloaded upstream, 502/504, connection errors): failure.

When Locust runs with ``--csv PREFIX``, the master (or the local runner) also writes
``PREFIX_histograms.json`` on exit: every stats entry with its raw response-time histogram, so that
loadtest/summarize.py can compute exact percentiles over any combination of rows (e.g. "all requests that
were not 429"), which the CSVs alone cannot give.

Importing this module has no side effects beyond registering an event listener, so tests can import it.
"""

from __future__ import annotations

import itertools
import json
import os
import random

from locust import between, events, tag, task
from locust.contrib.fasthttp import FastHttpUser
from locust.runners import WorkerRunner

#: Suffix appended to a request name for its 429 rows.
REJECTED_SUFFIX = " (429)"
#: Suffix appended to a request name for its rows told to wait by a waiting room (a 503 whose
#: problem is ``waiting_room``, with ``Retry-After``).
WAITING_SUFFIX = " (waiting)"

RIDES = "/api/rides/request"
FARES = "/api/fares/estimate"
SURGE_MAP = "/api/surge/zone/"
#: How many zones' maps riders poll (each rider a random one per poll).
ZONES = 20

#: Midtown Manhattan, as in the surge scenario.
TRIP = {
    "pickup_lat": 40.7505,
    "pickup_lng": -73.9934,
    "dropoff_lat": 40.7580,
    "dropoff_lng": -73.9855,
}


def api_key_pool() -> list[str]:
    """The identities riders share: rider-0 .. rider-{N-1}, N from $LOADTEST_API_KEYS (default 5)."""
    try:
        size = int(os.environ.get("LOADTEST_API_KEYS", "5"))
    except ValueError:
        size = 5
    return [f"rider-{n}" for n in range(max(1, size))]


API_KEYS = api_key_pool()
# Hands identities out round-robin as users spawn, so every key is shared by about USERS/N users.
_next_user = itertools.count()


class SurgeRider(FastHttpUser):
    """A rider's app during the surge: requests a ride three times as often as it re-estimates the fare."""

    wait_time = between(0.1, 0.5)  # 10x the normal request rate

    def on_start(self) -> None:
        self.api_key = API_KEYS[next(_next_user) % len(API_KEYS)]
        self.headers = {"X-API-Key": self.api_key}

    def post(self, path: str, body: dict) -> None:
        """POSTs ``body`` to ``path`` and classifies the answer (see the module docstring)."""
        with self.client.post(path, json=body, headers=self.headers, name=path, catch_response=True) as response:
            self.classify(response, path)

    def get(self, path: str, name: str) -> None:
        """GETs ``path`` (reported as ``name``) and classifies the answer."""
        with self.client.get(path, headers=self.headers, name=name, catch_response=True) as response:
            self.classify(response, name)

    @staticmethod
    def classify(response, path: str) -> None:
        """2xx: success; 429, or a waiting room's 503, with Retry-After: its own row; anything else: a
        failure."""
        status = response.status_code
        if 200 <= status < 300:
            response.success()
        elif status == 429:
            # Report the rejection under its own row. request_meta is what Locust fires on exit.
            response.request_meta["name"] = path + REJECTED_SUFFIX
            if response.headers.get("Retry-After"):
                response.success()
            else:
                response.failure("429 without Retry-After")
        elif status == 503 and b'"waiting_room"' in (response.content or b""):
            response.request_meta["name"] = path + WAITING_SUFFIX
            if response.headers.get("Retry-After"):
                response.success()
            else:
                response.failure("waiting room without Retry-After")
        elif status == 0:
            response.failure(f"connection error: {response.error}")
        else:
            response.failure(f"HTTP {status}")

    @tag("surge")
    @task(3)
    def request_ride(self) -> None:
        self.post(RIDES, {"rider_id": self.api_key, **TRIP})

    @tag("surge")
    @task(1)
    def fare_estimate(self) -> None:
        self.post(FARES, dict(TRIP))

    @tag("surge")
    @task(4)
    def surge_map(self) -> None:
        self.get(SURGE_MAP + str(random.randrange(ZONES)), name=SURGE_MAP + "[zone]")


#: The OpenAI-compatible endpoint of the demo upstream (token budgets: scripts/loadtest-tokens.sh).
CHAT = "/v1/chat/completions"


def usage_of(response) -> dict | None:
    """The ``usage`` of a chat completion: the JSON body's, or a stream's last event carrying one."""
    text = response.text or ""
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        usage = None
        for line in text.splitlines():
            if line.startswith("data: {"):
                event = json.loads(line[len("data: "):])
                usage = event.get("usage") or usage
        return usage
    try:
        return json.loads(text).get("usage")
    except ValueError:
        return None


class TokenClient(FastHttpUser):
    """An application calling an LLM API through floodgate with its team's key, as the openai SDK does
    (``Authorization: Bearer``): a random ``max_tokens`` (what floodgate reserves), every other call
    streamed with its usage in the last event. The tokens the responses said they used are summed in
    ``TOKENS_USED`` (per process), for scripts/loadtest-tokens.sh to compare with floodgate's budgets."""

    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        key = API_KEYS[next(_next_user) % len(API_KEYS)]
        self.headers = {"Authorization": f"Bearer {key}"}
        self.calls = 0

    @tag("tokens")
    @task
    def chat(self) -> None:
        self.calls += 1
        max_tokens = random.randint(50, 500)
        body = {
            "model": "demo-model",
            "messages": [{"role": "user", "content": " ".join(["word"] * random.randint(1, 80))}],
            "max_tokens": max_tokens,
        }
        if self.calls % 2 == 0:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        headers = {**self.headers, "X-Demo-Completion-Tokens": str(random.randint(1, max_tokens))}
        with self.client.post(CHAT, json=body, headers=headers, name=CHAT, catch_response=True) as response:
            if response.status_code == 200:
                usage = usage_of(response)
                if usage is None:
                    response.failure("no usage in the answer")
                    return
                TOKENS_USED["settled"] += usage["total_tokens"]
                TOKENS_USED["over_reserve"] += max(0, usage["total_tokens"] - max_tokens)
                response.success()
            elif response.status_code == 429:
                response.request_meta["name"] = CHAT + REJECTED_SUFFIX
                if response.headers.get("Retry-After"):
                    response.success()
                else:
                    response.failure("429 without Retry-After")
            else:
                response.failure(f"HTTP {response.status_code}")


#: What TokenClient's admitted calls used, as their responses said, and by how much they exceeded
#: their ``max_tokens`` (the reserves' error).
TOKENS_USED = {"settled": 0, "over_reserve": 0}


@events.quitting.add_listener
def write_tokens_used(environment, **_kwargs) -> None:
    """With $LOADTEST_TOKENS_FILE set, write TOKENS_USED there on exit."""
    path = os.environ.get("LOADTEST_TOKENS_FILE")
    if path and not isinstance(environment.runner, WorkerRunner):
        with open(path, "w", encoding="utf-8") as file:
            json.dump(TOKENS_USED, file)


@events.quitting.add_listener
def write_histograms(environment, **_kwargs) -> None:
    """On exit, next to the --csv files, store every entry's response-time histogram as JSON."""
    options = environment.parsed_options
    prefix = getattr(options, "csv_prefix", None) if options is not None else None
    if not prefix or isinstance(environment.runner, WorkerRunner):
        return
    entries = []
    for entry in environment.stats.entries.values():
        entries.append(
            {
                "name": entry.name,
                "method": entry.method,
                "num_requests": entry.num_requests,
                "num_failures": entry.num_failures,
                "total_response_time": entry.total_response_time,
                "min_response_time": entry.min_response_time,
                "max_response_time": entry.max_response_time,
                "start_time": entry.start_time,
                "last_request_timestamp": entry.last_request_timestamp,
                # JSON object keys are strings; summarize.py turns them back into ints.
                "response_times": {str(ms): n for ms, n in entry.response_times.items()},
            }
        )
    total = environment.stats.total
    document = {
        "start_time": total.start_time,
        "last_request_timestamp": total.last_request_timestamp,
        "entries": entries,
    }
    with open(f"{prefix}_histograms.json", "w", encoding="utf-8") as file:
        json.dump(document, file, indent=1)
