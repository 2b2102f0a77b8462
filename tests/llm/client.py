"""The openai Python SDK (software nobody here wrote) pointed at floodgate in front of the demo
upstream's OpenAI-compatible /v1/chat/completions, for tests/llm.rs.

    client.py call BASE_URL KEY MODE MAX_TOKENS COMPLETION WORDS [MAX_RETRIES [HEADERS]]
        one chat completion (MODE plain or stream, the stream asking for its usage), printed
        as JSON: {"ok": true, "usage": {...}} or {"ok": false, "status": 429, "error": {...}},
        or {"ok": false, "broken": "..."} when the answer broke off. HEADERS: a JSON object of
        more request headers (the demo's x-demo-content-encoding, x-demo-cut-after). The SDK
        sends Accept-Encoding: gzip, deflate, br, zstd (with brotli and backports.zstd in the
        venv) and decodes what comes back, as it does against a real API.
    client.py load KEY CLIENTS REQUESTS BASE_URL...
        CLIENTS concurrent clients, each making REQUESTS calls (alternating plain and streamed,
        and the base URLs), each with a random max_tokens (the reserve), completion length and
        prompt; prints what was admitted and what it cost, as the clients saw it.
"""

import asyncio
import json
import random
import sys

import openai
from openai import AsyncOpenAI, OpenAI

COMPLETION_HEADER = "x-demo-completion-tokens"


def prompt(words):
    return " ".join(f"p{i}" for i in range(words))


def call(base_url, key, mode, max_tokens, completion, words, max_retries=0, headers=None):
    client = OpenAI(base_url=base_url, api_key=key, max_retries=max_retries, timeout=20)
    args = dict(
        model="demo-model",
        messages=[{"role": "user", "content": prompt(words)}],
        max_tokens=max_tokens,
        extra_headers={COMPLETION_HEADER: str(completion), **(headers or {})},
    )
    try:
        if mode == "stream":
            usage = None
            content = ""
            for chunk in client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **args
            ):
                if chunk.choices:
                    content += chunk.choices[0].delta.content or ""
                if chunk.usage is not None:
                    usage = chunk.usage.model_dump()
            return {"ok": True, "usage": usage, "words": len(content.split())}
        answer = client.chat.completions.create(**args)
        return {"ok": True, "usage": answer.usage.model_dump()}
    except openai.RateLimitError as e:
        return {
            "ok": False,
            "status": e.status_code,
            "error": e.body,
            "retry_after": e.response.headers.get("retry-after"),
        }
    except (openai.APIConnectionError, openai.APIError) as e:
        return {"ok": False, "broken": repr(e)}


async def load(key, clients, requests, base_urls):
    rng = random.Random(7)
    results = {"admitted": 0, "refused": 0, "settled": 0, "reserved": 0, "reserve_error": 0,
               "other": {}}

    async def one_client(n):
        sdk = [AsyncOpenAI(base_url=u, api_key=key, max_retries=0, timeout=30) for u in base_urls]
        for i in range(requests):
            max_tokens = rng.randint(50, 300)
            completion = rng.randint(1, max_tokens)
            words = rng.randint(1, 60)
            client = sdk[(n + i) % len(sdk)]
            args = dict(
                model="demo-model",
                messages=[{"role": "user", "content": prompt(words)}],
                max_tokens=max_tokens,
                extra_headers={COMPLETION_HEADER: str(completion)},
            )
            try:
                if i % 2 == 0:
                    usage = None
                    stream = await client.chat.completions.create(
                        stream=True, stream_options={"include_usage": True}, **args
                    )
                    async for chunk in stream:
                        if chunk.usage is not None:
                            usage = chunk.usage
                else:
                    usage = (await client.chat.completions.create(**args)).usage
            except openai.RateLimitError:
                results["refused"] += 1
                continue
            except Exception as e:  # anything else fails the test, named and counted
                results["other"][repr(e)] = results["other"].get(repr(e), 0) + 1
                continue
            total = usage.total_tokens
            results["admitted"] += 1
            results["settled"] += total
            results["reserved"] += max_tokens
            results["reserve_error"] += max(0, total - max_tokens)

    await asyncio.gather(*(one_client(n) for n in range(clients)))
    return results


def main():
    command = sys.argv[1]
    if command == "call":
        base_url, key, mode, max_tokens, completion, words = sys.argv[2:8]
        max_retries = int(sys.argv[8]) if len(sys.argv) > 8 else 0
        headers = json.loads(sys.argv[9]) if len(sys.argv) > 9 else None
        print(json.dumps(call(base_url, key, mode, int(max_tokens), int(completion), int(words),
                              max_retries, headers)))
    elif command == "load":
        key, clients, requests = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        print(json.dumps(asyncio.run(load(key, clients, requests, sys.argv[5:]))))
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
