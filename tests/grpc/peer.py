"""A real gRPC server and client (grpcio, the official Python implementation) for floodgate's
gRPC tests (tests/grpc.rs).

    peer.py serve [--tls CERT KEY]
        Serves floodgate.test.Echo and grpc.health.v1.Health on 127.0.0.1 (a free port), prints
        "listening PORT", and runs until stdin closes or it is killed.

    peer.py call TARGET SCENARIO... [--tls-ca CA] [--key API_KEY] [--authority NAME]
        Runs each scenario against TARGET (host:port) and prints one JSON object per line:
        {"scenario": ..., "code": "OK", ...}.

The service uses raw bytes (no generated code): grpcio's generic handlers carry whatever the
methods are sent. Scenarios:

    unary                 Echo/Unary: the message back, initial and trailing metadata
    slow:MS:DEADLINE_MS   Echo/Unary that the server answers after MS, with a client deadline
    fail                  Echo/Fail: NOT_FOUND with a message and trailing metadata
    server_stream:N       Echo/ServerStream: N messages back
    ticks:N:MS            Echo/Ticks: a server stream of N messages, one every MS
    client_stream:N       Echo/ClientStream: N messages sent, their count and size back
    bidi:N                Echo/Bidi: N messages, each answered upper-cased as it comes
    big:BYTES             Echo/Unary with a message of BYTES
    path:/SERVICE/METHOD  a unary call to another method (one no route matches, say)
    health                grpc.health.v1.Health/Check
    retry                 Echo/Unary under a retry policy for RESOURCE_EXHAUSTED (gRFC A6), whose
                          backoff (10 s) only pushback can shorten
    calm:N                N calls of Echo/Unary that the server answers after 50 ms
    shed:N                N calls of Echo/Shed: UNAVAILABLE after 50 ms, trailers-only (an
                          overloaded server shedding)
    exhausted:N           N calls of Echo/Exhausted: one message, then after 50 ms
                          RESOURCE_EXHAUSTED in the trailers
"""

import json
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from google.rpc import error_details_pb2

SERVICE = "floodgate.test.Echo"


def unary(request, context):
    if request.startswith(b"slow:"):
        time.sleep(int(request[5:]) / 1000)
    context.send_initial_metadata((("x-initial", "yes"),))
    context.set_trailing_metadata((("x-trailer", "kept"), ("x-trailer-bin", b"\x00\x01\xff")))
    return request


def fail(request, context):
    context.set_trailing_metadata((("x-why", "because"),))
    context.abort(grpc.StatusCode.NOT_FOUND, "nothing here")


def shed(request, context):
    time.sleep(0.05)
    context.abort(grpc.StatusCode.UNAVAILABLE, "overloaded")


def exhausted(request, context):
    yield b"partial"
    time.sleep(0.05)
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "out of capacity")


def server_stream(request, context):
    n = int(request)
    for i in range(n):
        yield b"msg-%d" % i
    context.set_trailing_metadata((("x-count", str(n)),))


def ticks(request, context):
    n, ms = (int(x) for x in request.split(b":"))
    for i in range(n):
        time.sleep(ms / 1000)
        yield b"tick-%d" % i


def client_stream(request_iterator, context):
    count = size = 0
    for message in request_iterator:
        count += 1
        size += len(message)
    return b"%d:%d" % (count, size)


def bidi(request_iterator, context):
    for message in request_iterator:
        yield message.upper()


def serve(args):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
        "Shed": grpc.unary_unary_rpc_method_handler(shed),
        "Exhausted": grpc.unary_stream_rpc_method_handler(exhausted),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "Ticks": grpc.unary_stream_rpc_method_handler(ticks),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if "--tls" in args:
        i = args.index("--tls")
        with open(args[i + 1], "rb") as f:
            cert = f.read()
        with open(args[i + 2], "rb") as f:
            key = f.read()
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(((key, cert),)))
    else:
        port = server.add_insecure_port(option(args, "--listen", "127.0.0.1:0"))
    server.start()
    print("listening %d" % port, flush=True)
    # Ends when the test closes stdin (or kills this process).
    threading.Thread(target=lambda: (sys.stdin.read(), server.stop(0)), daemon=True).start()
    server.wait_for_termination()


def option(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def channel(target, args, service_config=None):
    options = [("grpc.enable_retries", 1 if service_config else 0)]
    if service_config:
        options.append(("grpc.service_config", json.dumps(service_config)))
    authority = option(args, "--authority")
    if authority:
        options.append(("grpc.ssl_target_name_override", authority))
        options.append(("grpc.default_authority", authority))
    ca = option(args, "--tls-ca")
    if ca:
        with open(ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        return grpc.secure_channel(target, creds, options=options)
    return grpc.insecure_channel(target, options=options)


def metadata(args):
    key = option(args, "--key")
    return (("x-api-key", key),) if key else ()


def describe_error(error):
    """What a failed call said: code, message, the rich status' retry delay, trailing metadata."""
    out = {"code": error.code().name, "details": error.details()}
    trailing = error.trailing_metadata() or ()
    out["trailing"] = {k: (v if isinstance(v, str) else v.hex()) for k, v in trailing}
    status = rpc_status.from_call(error)
    if status is not None:
        out["status_code"] = status.code
        out["status_message"] = status.message
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                out["retry_delay_ms"] = info.retry_delay.ToMilliseconds()
    return out


def run(scenario, target, args):
    name, _, rest = scenario.partition(":")
    md = metadata(args)
    started = time.monotonic()
    config = None
    if name == "retry":
        config = {
            "methodConfig": [
                {
                    "name": [{"service": SERVICE}],
                    "retryPolicy": {
                        "maxAttempts": 5,
                        "initialBackoff": "10s",
                        "maxBackoff": "10s",
                        "backoffMultiplier": 1,
                        "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
                    },
                }
            ]
        }
    ch = channel(target, args, config)
    out = {"scenario": scenario}
    try:
        if name in ("unary", "retry", "big", "slow"):
            request = b"hello"
            timeout = None
            if name == "big":
                request = b"x" * int(rest)
            if name == "slow":
                ms, _, deadline = rest.partition(":")
                request = b"slow:" + ms.encode()
                timeout = int(deadline) / 1000
            call = ch.unary_unary("/%s/Unary" % SERVICE)
            response, c = call.with_call(request, metadata=md, timeout=timeout)
            out.update(
                code="OK",
                response_len=len(response),
                echoed=response == request,
                initial=dict(c.initial_metadata()),
                trailing={
                    k: (v if isinstance(v, str) else v.hex()) for k, v in c.trailing_metadata()
                },
            )
        elif name == "path":
            ch.unary_unary(rest)(b"", metadata=md)
            out["code"] = "OK"
        elif name in ("calm", "shed", "exhausted"):
            codes = {}
            for _ in range(int(rest)):
                try:
                    if name == "calm":
                        ch.unary_unary("/%s/Unary" % SERVICE)(b"slow:50", metadata=md)
                    elif name == "shed":
                        ch.unary_unary("/%s/Shed" % SERVICE)(b"", metadata=md)
                    else:
                        list(ch.unary_stream("/%s/Exhausted" % SERVICE)(b"", metadata=md))
                    code = "OK"
                except grpc.RpcError as error:
                    code = error.code().name
                codes[code] = codes.get(code, 0) + 1
            out.update(code="OK", codes=codes)
        elif name == "fail":
            ch.unary_unary("/%s/Fail" % SERVICE)(b"", metadata=md)
            out["code"] = "OK"
        elif name == "server_stream":
            call = ch.unary_stream("/%s/ServerStream" % SERVICE)(rest.encode(), metadata=md)
            messages = [m for m in call]
            out.update(
                code=call.code().name,
                count=len(messages),
                in_order=messages == [b"msg-%d" % i for i in range(int(rest))],
                trailing=dict(call.trailing_metadata()),
            )
        elif name == "ticks":
            call = ch.unary_stream("/%s/Ticks" % SERVICE)(rest.encode(), metadata=md)
            messages = [m for m in call]
            out.update(code=call.code().name, count=len(messages))
        elif name == "client_stream":
            n = int(rest)
            response = ch.stream_unary("/%s/ClientStream" % SERVICE)(
                iter([b"part"] * n), metadata=md
            )
            out.update(code="OK", response=response.decode())
        elif name == "bidi":
            n = int(rest)
            sent = [b"m%d" % i for i in range(n)]
            replies = list(ch.stream_stream("/%s/Bidi" % SERVICE)(iter(sent), metadata=md))
            out.update(code="OK", count=len(replies), echoed=replies == [s.upper() for s in sent])
        elif name == "health":
            stub = health_pb2_grpc.HealthStub(ch)
            reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), metadata=md)
            out.update(code="OK", status=health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
        else:
            raise SystemExit("unknown scenario %r" % scenario)
    except grpc.RpcError as error:
        out.update(describe_error(error))
    out["elapsed_ms"] = round((time.monotonic() - started) * 1000)
    ch.close()
    return out


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    if args[0] == "serve":
        serve(args[1:])
    elif args[0] == "call":
        target = args[1]
        scenarios = [a for a in args[2:] if not a.startswith("--")]
        # Values of options are not scenarios.
        for flag in ("--tls-ca", "--key", "--authority"):
            if flag in args:
                scenarios.remove(option(args, flag))
        for scenario in scenarios:
            print(json.dumps(run(scenario, target, args)), flush=True)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
