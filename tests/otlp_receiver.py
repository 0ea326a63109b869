"""A small OTLP/HTTP receiver for the export tests: a real HTTP server on 127.0.0.1
that decodes each protobuf request with opentelemetry-proto's generated classes and
keeps it, so a test reads what went over the wire, not what the exporter meant."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

MAX_BODY = 64 << 20


@dataclass
class Received:
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    status: int = 200  # what the receiver answers

    def spans(self) -> list:
        return [
            span
            for request in self.traces
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def histograms(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for request in self.metrics:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        out.setdefault(metric.name, []).extend(metric.histogram.data_points)
        return out


def value_of(v: AnyValue) -> object:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(kvs) -> dict[str, object]:
    return {kv.key: value_of(kv.value) for kv in kvs}


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """Yield (base URL, what it received); the server stops when the block ends."""
    got = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            size = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(min(size, MAX_BODY))
            got.headers.append(
                {k.lower(): v for k, v in self.headers.items()} | {"path": self.path}
            )
            if got.status != 200:
                self.send_response(got.status)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if self.path == "/v1/traces":
                got.traces.append(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
            elif self.path == "/v1/metrics":
                got.metrics.append(ExportMetricsServiceRequest.FromString(body))
                answer = ExportMetricsServiceResponse().SerializeToString()
            else:
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:  # quiet: the test reads `got`
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", got
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
