"""An HTTP/3 client for tests/http3.rs, on aioquic (a QUIC and HTTP/3 stack written apart from
quinn and h3): it runs one scenario against floodgate's QUIC listener and prints what it saw as
one JSON object on stdout.

    client.py HOST PORT CA_FILE SCENARIO SPEC_JSON

Scenarios (SPEC_JSON's fields in brackets):
- requests [requests: [{method, path, headers, chunks, trailers}], concurrent]: on one
  connection, each request's answer {status, headers, body, trailers}, or {reset: CODE} when
  the server reset the stream instead;
- reset [streams, after, headers, pause, then]: opens `streams` request streams and resets each
  right after its headers (or all of them `after` seconds later), waits `pause` seconds (0.5),
  says whether the server closed the connection, then sends the requests of `then` on the same
  connection;
- idle [wait]: one request, then silence: when (seconds after the answer) and how the server
  closed the connection;
- zero_rtt [path]: one connection that keeps the server's session ticket, then a second that
  resumes with it and sends its request as early data if the ticket allowed it;
- flood [handshakes, then]: `handshakes` connection attempts from as many UDP ports that send
  their first packet and never another, then the requests of `then` on a fresh connection
  (which must be served: the server asks it to prove its address if it must);
- garbage [streams, open, then]: each of `streams` (hex) sent raw as a request stream on its
  own connection (left open, without its end, when `open`), and how the server closed it; then
  the requests of `then` on a fresh connection;
- silent [streams, then]: `streams` request streams that never finish their head, then the
  requests of `then` on the same connection, and how long they took;
- uni [connections, wait, then]: for each entry of `connections` (a list of hex strings), a
  fresh connection that speaks no HTTP/3 of its own (no control stream) and sends each string
  raw on a unidirectional stream of its own, and how the server closed it within `wait`
  seconds; then the requests of `then` on a fresh HTTP/3 connection;
- shutdown [path]: one request in flight (it prints `{"sent": true}` when sent, and the test
  signals floodgate); its answer, a request sent after, and how the connection closed.
"""

import asyncio
import json
import socket
import ssl
import sys
import time

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, StreamReset


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.answers = {}
        self.waiters = {}
        self.terminated = None
        self.terminated_at = None
        self.early_data_accepted = None

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.terminated = {"error_code": event.error_code, "reason": event.reason_phrase}
            self.terminated_at = time.monotonic()
            for waiter in self.waiters.values():
                if not waiter.done():
                    waiter.set_result(None)
        if isinstance(event, HandshakeCompleted):
            self.early_data_accepted = event.early_data_accepted
        if isinstance(event, StreamReset):
            waiter = self.waiters.get(event.stream_id)
            if waiter is not None and not waiter.done():
                waiter.set_result({"reset": event.error_code})
        for h3_event in self.h3.handle_event(event):
            self.h3_event(h3_event)

    def h3_event(self, event):
        answer = self.answers.get(getattr(event, "stream_id", None))
        if answer is None:
            return
        if isinstance(event, HeadersReceived):
            headers = [[k.decode(), v.decode()] for k, v in event.headers]
            if answer["status"] is None:
                answer["status"] = int(dict(headers)[":status"])
                answer["headers"] = [h for h in headers if not h[0].startswith(":")]
            else:
                answer["trailers"] = headers
        elif isinstance(event, DataReceived):
            answer["body"] += event.data
        if getattr(event, "stream_ended", False):
            waiter = self.waiters[event.stream_id]
            if not waiter.done():
                waiter.set_result(answer)

    def start(self, request, authority):
        """Sends a request's head and body (and trailers); returns its stream id."""
        stream_id = self._quic.get_next_available_stream_id()
        headers = [
            (b":method", request.get("method", "GET").encode()),
            (b":scheme", b"https"),
            (b":authority", request.get("authority", authority).encode()),
            (b":path", request.get("path", "/").encode()),
        ] + [(k.encode(), v.encode()) for k, v in request.get("headers", [])]
        chunks = [c.encode() for c in request.get("chunks", [])]
        trailers = [(k.encode(), v.encode()) for k, v in request.get("trailers", [])]
        self.answers[stream_id] = {"status": None, "headers": [], "body": b"", "trailers": []}
        self.waiters[stream_id] = asyncio.get_running_loop().create_future()
        self.h3.send_headers(stream_id, headers, end_stream=not chunks and not trailers)
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1 and not trailers
            self.h3.send_data(stream_id, chunk, end_stream=last)
        if trailers:
            self.h3.send_headers(stream_id, trailers, end_stream=True)
        self.transmit()
        return stream_id

    async def answer(self, stream_id, timeout=10):
        try:
            answer = await asyncio.wait_for(asyncio.shield(self.waiters[stream_id]), timeout)
        except asyncio.TimeoutError:
            return {"error": "no answer"}
        if answer is None:
            return {"error": "connection closed", "closed": self.terminated}
        if "reset" in answer:
            return answer
        out = dict(answer)
        out["body"] = answer["body"].decode(errors="replace")
        return out


class Raw(QuicConnectionProtocol):
    """A QUIC connection that speaks no HTTP/3 of its own: what the test sends is all it sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.terminated = None

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.terminated = {"error_code": event.error_code, "reason": event.reason_phrase}


def configuration(ca_file, **kwargs):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, **kwargs)
    config.load_verify_locations(ca_file)
    config.server_name = "localhost"
    return config


async def run_requests(client, authority, requests, concurrent):
    if concurrent:
        ids = [client.start(r, authority) for r in requests]
        return [await client.answer(i) for i in ids]
    out = []
    for request in requests:
        out.append(await client.answer(client.start(request, authority)))
    return out


async def main():
    host, port, ca_file, scenario, spec = sys.argv[1:6]
    port = int(port)
    spec = json.loads(spec)
    authority = f"localhost:{port}"
    result = {}
    if scenario == "requests":
        async with connect(host, port, configuration=configuration(ca_file), create_protocol=Client) as client:
            result["answers"] = await run_requests(client, authority, spec["requests"], spec.get("concurrent", False))
    elif scenario == "reset":
        async with connect(host, port, configuration=configuration(ca_file), create_protocol=Client) as client:
            opened = []
            for _ in range(spec["streams"]):
                stream_id = client._quic.get_next_available_stream_id()
                client.h3.send_headers(
                    stream_id,
                    [
                        (b":method", b"POST"),
                        (b":scheme", b"https"),
                        (b":authority", authority.encode()),
                        (b":path", spec.get("path", "/").encode()),
                    ]
                    + [(k.encode(), v.encode()) for k, v in spec.get("headers", [])],
                    end_stream=False,
                )
                opened.append(stream_id)
                if not spec.get("after"):
                    client._quic.reset_stream(stream_id, 0x10C)  # H3_REQUEST_CANCELLED
                    client._quic.stop_stream(stream_id, 0x10C)
                client.transmit()
            if spec.get("after"):
                # Every head sent first; the resets `after` seconds later, while floodgate
                # decides.
                await asyncio.sleep(spec["after"])
                for stream_id in opened:
                    client._quic.reset_stream(stream_id, 0x10C)
                    client._quic.stop_stream(stream_id, 0x10C)
                client.transmit()
            await asyncio.sleep(spec.get("pause", 0.5))
            result["closed"] = client.terminated
            result["answers"] = await run_requests(client, authority, spec["then"], False)
    elif scenario == "idle":
        config = configuration(ca_file)
        # The client's own idle timeout far longer: the server's is what is measured.
        config.idle_timeout = 600
        async with connect(host, port, configuration=config, create_protocol=Client) as client:
            answer = await client.answer(client.start({"path": spec.get("path", "/")}, authority))
            answered = time.monotonic()
            result["answers"] = [answer]
            deadline = answered + spec["wait"]
            while client.terminated is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            result["closed"] = client.terminated
            result["closed_after"] = None if client.terminated_at is None else client.terminated_at - answered
    elif scenario == "zero_rtt":
        tickets = []
        config = configuration(ca_file)
        async with connect(
            host, port, configuration=config, create_protocol=Client, session_ticket_handler=tickets.append
        ) as client:
            result["first"] = await client.answer(client.start({"path": spec["path"]}, authority))
            await asyncio.sleep(0.3)  # the ticket comes after the handshake
        result["tickets"] = len(tickets)
        if tickets:
            ticket = tickets[-1]
            result["ticket_max_early_data"] = ticket.max_early_data_size
            config = configuration(ca_file, session_ticket=ticket)
            async with connect(host, port, configuration=config, create_protocol=Client, wait_connected=False) as client:
                stream_id = client.start({"path": spec["path"]}, authority)
                result["second"] = await client.answer(stream_id)
                result["early_data_accepted"] = client.early_data_accepted
    elif scenario == "flood":
        sockets = []
        for _ in range(spec["handshakes"]):
            config = configuration(ca_file)
            quic = QuicConnection(configuration=config)
            quic.connect((host, port), now=time.time())
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setblocking(False)
            for data, addr in quic.datagrams_to_send(now=time.time()):
                sock.sendto(data, addr)
            sockets.append(sock)
        await asyncio.sleep(0.5)
        started = time.monotonic()
        async with connect(host, port, configuration=configuration(ca_file), create_protocol=Client) as client:
            result["retried"] = client._quic._retry_count > 0
            result["answers"] = await run_requests(client, authority, spec["then"], False)
        result["legitimate_seconds"] = time.monotonic() - started
        for sock in sockets:
            sock.close()
    elif scenario == "garbage":
        # Each entry: hex bytes sent raw on a new request stream of a fresh connection; how the
        # server ended that connection.
        result["closed"] = []
        for raw in spec["streams"]:
            async with connect(host, port, configuration=configuration(ca_file), create_protocol=Client) as client:
                stream_id = client._quic.get_next_available_stream_id()
                client._quic.send_stream_data(stream_id, bytes.fromhex(raw), end_stream=not spec.get("open"))
                client.transmit()
                deadline = time.monotonic() + 5
                while client.terminated is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                result["closed"].append(client.terminated)
        async with connect(host, port, configuration=configuration(ca_file), create_protocol=Client) as client:
            result["answers"] = await run_requests(client, authority, spec["then"], False)
    elif scenario == "silent":
        # `streams` request streams opened with one byte (a frame type, no frame), then
        # nothing; then the requests of `then` on the same connection.
        async with connect(host, port, configuration=configuration(ca_file), create_protocol=Client) as client:
            for _ in range(spec["streams"]):
                stream_id = client._quic.get_next_available_stream_id()
                client._quic.send_stream_data(stream_id, b"\x01", end_stream=False)
            client.transmit()
            started = time.monotonic()
            result["answers"] = await run_requests(client, authority, spec["then"], False)
            result["seconds"] = time.monotonic() - started
    elif scenario == "uni":
        result["closed"] = []
        for streams in spec["connections"]:
            async with connect(host, port, configuration=configuration(ca_file), create_protocol=Raw) as client:
                for raw in streams:
                    stream_id = client._quic.get_next_available_stream_id(is_unidirectional=True)
                    client._quic.send_stream_data(stream_id, bytes.fromhex(raw), end_stream=False)
                client.transmit()
                deadline = time.monotonic() + spec.get("wait", 5)
                while client.terminated is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                result["closed"].append(client.terminated)
        async with connect(host, port, configuration=configuration(ca_file), create_protocol=Client) as client:
            result["answers"] = await run_requests(client, authority, spec["then"], False)
    elif scenario == "shutdown":
        async with connect(host, port, configuration=configuration(ca_file), create_protocol=Client) as client:
            stream_id = client.start({"path": spec["path"]}, authority)
            print(json.dumps({"sent": True}), flush=True)
            result["answers"] = [await client.answer(stream_id, timeout=15)]
            # Sent after the drain began: refused (aioquic reads no GOAWAY, so it asks).
            late = client.start({"path": "/"}, authority)
            result["late"] = await client.answer(late, timeout=5)
            deadline = time.monotonic() + 5
            while client.terminated is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            result["closed"] = client.terminated
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
