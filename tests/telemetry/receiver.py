"""An OTLP/HTTP receiver for tests/telemetry.rs, built on opentelemetry-proto's own message
classes: it decodes exactly what floodgate sent to /v1/traces and /v1/metrics and prints one
JSON line per span or metric on stdout. The first line is `listening PORT`.

    receiver.py                 answer 200 to every export
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def value(any_value):
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


# Each export is handled on its own thread (ThreadingHTTPServer), and a span export and a metrics
# export often arrive together. `print` writes a line's text and its newline separately, so two
# threads printing at once could join two JSON objects on one line, which the test cannot parse:
# the span on it was lost (one run in three of the end-to-end trace test). A line is written whole,
# under a lock.
OUT = threading.Lock()


def emit(record):
    line = json.dumps(record) + "\n"
    with OUT:
        sys.stdout.write(line)
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(415)
            self.end_headers()
            return
        if self.path == "/v1/traces":
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            for rs in request.resource_spans:
                resource = attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        emit({
                            "signal": "span",
                            "service": resource.get("service.name"),
                            "name": span.name,
                            "kind": KINDS.get(span.kind, str(span.kind)),
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "attributes": attributes(span.attributes),
                            "status": span.status.code,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                        })
        elif self.path == "/v1/metrics":
            request = metrics_service_pb2.ExportMetricsServiceRequest()
            request.ParseFromString(body)
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        kind = metric.WhichOneof("data")
                        points = getattr(metric, kind).data_points
                        emit({
                            "signal": "metric",
                            "name": metric.name,
                            "kind": kind,
                            "points": [
                                {"attributes": attributes(p.attributes),
                                 "value": getattr(p, "as_double", None) if kind != "histogram" else p.count}
                                for p in points
                            ],
                        })
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print("listening %d" % server.server_address[1], flush=True)
server.serve_forever()
