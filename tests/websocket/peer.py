"""WebSocket peers for tests/websocket.rs, on PyPI's `websockets` (a client and server written
apart from floodgate's framing).

    peer.py serve          an echo server on 127.0.0.1, a free port; prints "port N"
    peer.py client         WebSocket connections driven by lines on stdin, one answer line each:
        open NAME URL [KEY]     -> "open NAME ok" | "open NAME refused STATUS"
        send NAME BYTES         -> "sent NAME" once the echo came back
        burst NAME COUNT        -> "burst NAME ECHOED" (messages of 8 bytes, each echo awaited;
                                   stops at the first failure)
        wait_close NAME SECS    -> "closed NAME CODE" | "open NAME still"
        close NAME              -> "closed NAME"
        rate NAME SECS          -> "rate NAME MESSAGES_PER_SECOND" (64-byte messages, pipelined
                                   in windows of 100, for SECS seconds)
        messages NAME COUNT     -> "messages NAME COUNT" (COUNT 64-byte messages, as rate sends)
"""

import asyncio
import sys
import time

import websockets
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve


async def echo(ws):
    try:
        async for message in ws:
            await ws.send(message)
    except websockets.ConnectionClosed:
        pass


async def run_server():
    async with serve(echo, "127.0.0.1", 0, max_size=None, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"port {port}", flush=True)
        await asyncio.Future()


def close_code(ws):
    code = ws.close_code
    return "none" if code is None else str(code)


async def run_client():
    conns = {}
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            return
        words = line.decode().split()
        if not words:
            continue
        op, name, args = words[0], words[1], words[2:]
        if op == "open":
            headers = {"X-API-Key": args[1]} if len(args) > 1 else {}
            try:
                conns[name] = await connect(
                    args[0], additional_headers=headers, max_size=None, open_timeout=10,
                    ping_interval=None,
                )
                print(f"open {name} ok", flush=True)
            except websockets.InvalidStatus as e:
                print(f"open {name} refused {e.response.status_code}", flush=True)
        elif op == "send":
            ws = conns[name]
            payload = b"x" * int(args[0])
            try:
                await ws.send(payload)
                await asyncio.wait_for(ws.recv(), 10)
                print(f"sent {name}", flush=True)
            except (websockets.ConnectionClosed, asyncio.TimeoutError):
                print(f"failed {name}", flush=True)
        elif op == "burst":
            ws = conns[name]
            echoed = 0
            for _ in range(int(args[0])):
                try:
                    await ws.send(b"12345678")
                    await asyncio.wait_for(ws.recv(), 10)
                    echoed += 1
                except (websockets.ConnectionClosed, asyncio.TimeoutError):
                    break
            print(f"burst {name} {echoed}", flush=True)
        elif op == "wait_close":
            ws = conns[name]
            try:
                await asyncio.wait_for(ws.wait_closed(), float(args[0]))
                print(f"closed {name} {close_code(ws)}", flush=True)
            except asyncio.TimeoutError:
                print(f"open {name} still", flush=True)
        elif op == "close":
            await conns.pop(name).close()
            print(f"closed {name}", flush=True)
        elif op == "rate":
            ws = conns[name]
            payload = b"m" * 64
            count, until = 0, time.monotonic() + float(args[0])
            while time.monotonic() < until:
                for _ in range(100):
                    await ws.send(payload)
                for _ in range(100):
                    await ws.recv()
                count += 100
            print(f"rate {name} {count / float(args[0]):.0f}", flush=True)
        elif op == "messages":
            ws = conns[name]
            payload, left = b"m" * 64, int(args[0])
            while left > 0:
                window = min(100, left)
                for _ in range(window):
                    await ws.send(payload)
                for _ in range(window):
                    await ws.recv()
                left -= window
            print(f"messages {name} {args[0]}", flush=True)


if __name__ == "__main__":
    asyncio.run(run_server() if sys.argv[1] == "serve" else run_client())
