"""A client that traces its own call with the OpenTelemetry Python SDK and sends the W3C
`traceparent` floodgate continues (tests/telemetry.rs).

    client.py URL [sampled|unsampled]

prints {"trace_id", "span_id", "status"} as JSON.
"""
import json
import sys
import urllib.error
import urllib.request

from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

url = sys.argv[1]
sampled = (sys.argv[2] if len(sys.argv) > 2 else "sampled") == "sampled"
trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF))
tracer = trace.get_tracer("floodgate-test-client")
with tracer.start_as_current_span("client call", kind=trace.SpanKind.CLIENT) as span:
    headers = {}
    inject(headers)
    request = urllib.request.Request(url, headers=headers)
    try:
        status = urllib.request.urlopen(request).status
    except urllib.error.HTTPError as e:
        status = e.code
    ctx = span.get_span_context()
    print(json.dumps({
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "traceparent": headers.get("traceparent"),
        "status": status,
    }))
