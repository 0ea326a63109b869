"""The folded run (docket.export.otel_fold) sent as OTLP/HTTP protobuf, with the
OpenTelemetry SDK's own exporters (the `otel` extra: pip install 'docket[otel]').

Spans are handed to the exporter as finished ReadableSpans built from the ledger,
not recorded live through a tracer: their ids and times are the ledger's, not this
process's. The two histograms go through a MeterProvider read once, at the end.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

from docket import __version__
from docket.errors import InputError
from docket.export.otel_fold import (
    CLIENT,
    OPERATION_DURATION,
    TOKEN_USAGE,
    Measurement,
    SpanRecord,
)

try:  # the optional extra: a clear line, not a traceback, when it is missing
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import Histogram, MeterProvider
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        InMemoryMetricReader,
        MetricExportResult,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
except ImportError as exc:  # pragma: no cover - the test extra installs it
    raise InputError(
        f"export otel needs the OpenTelemetry SDK ({exc.name} is not installed): "
        "pip install 'docket[otel]'"
    ) from None

SPAN_BATCH = 512  # spans per OTLP request: a long run is sent in pieces, never held whole
# The conventions' advised bucket boundaries for the two histograms.
TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67,108,864
DURATION_BUCKETS = tuple(0.01 * 2**i for i in range(14))  # 0.01 s ... 81.92 s
SCOPE = InstrumentationScope("docket.export.otel", __version__)
_EXPORTER_LOGGERS = ("opentelemetry.exporter", "opentelemetry.sdk")


class ExportFailed(Exception):
    """The endpoint did not take what was sent: why, as the exporter said it."""


class _Said(logging.Handler):
    """The exporters' log lines, kept as the reason of a failed export instead of
    printed (an export's failure is said once, on one line, by the caller)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class OtlpSender:
    """Send spans in batches and the histograms once, to one OTLP/HTTP endpoint.
    Use as a context manager: the exporters' logs are captured while it is open."""

    def __init__(
        self, endpoint: str, headers: Mapping[str, str], timeout: float, run_id: str, trace_id: int
    ) -> None:
        self.base = base = endpoint.rstrip("/")
        self.resource = Resource.create(
            {"service.name": "docket", "service.version": __version__, "docket.run_id": run_id}
        )
        self.trace_id = trace_id
        self.spans = OTLPSpanExporter(
            endpoint=f"{base}/v1/traces", headers=dict(headers), timeout=timeout
        )
        self.metrics_exporter = OTLPMetricExporter(
            endpoint=f"{base}/v1/metrics", headers=dict(headers), timeout=timeout
        )
        self.reader = InMemoryMetricReader(
            preferred_temporality={Histogram: AggregationTemporality.DELTA}
        )
        self.meters = MeterProvider(resource=self.resource, metric_readers=[self.reader])
        meter = self.meters.get_meter(SCOPE.name, SCOPE.version)
        self.histograms = {
            TOKEN_USAGE: meter.create_histogram(
                TOKEN_USAGE,
                unit="{token}",
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            ),
            OPERATION_DURATION: meter.create_histogram(
                OPERATION_DURATION,
                unit="s",
                description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            ),
        }
        self.pending: list[ReadableSpan] = []
        self.sent = 0
        self._said = _Said()
        self._saved: list[tuple[logging.Logger, bool]] = []

    def __enter__(self) -> OtlpSender:
        for name in _EXPORTER_LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.propagate))
            logger.addHandler(self._said)
            logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        for logger, propagate in self._saved:
            logger.removeHandler(self._said)
            logger.propagate = propagate
        self.spans.shutdown()
        self.metrics_exporter.shutdown()
        self.meters.shutdown()

    def _failed(self, what: str) -> ExportFailed:
        lines = self._said.lines or ["no reason given"]
        said = next((line for line in reversed(lines) if "Failed" in line), lines[-1])
        # After retries the last line says only that it gave up; the cause (refused,
        # a DNS failure) is in the retry's warning before it.
        cause = next((line for line in reversed(lines) if line.startswith("Transient")), None)
        because = cause[:400] if cause else self._reach_problem()
        return ExportFailed(f"{what}: {said}" + (f" ({because})" if because else ""))

    def _reach_problem(self, seconds: float = 2.0) -> str | None:
        """Why the endpoint cannot be reached, when the exporter gave up before saying
        (its first backoff already past the deadline): one plain connect, to name it."""
        parts = urlsplit(self.base)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname or "", port), timeout=seconds).close()
        except OSError as exc:
            return f"connecting to {parts.hostname}:{port}: {exc.strerror or exc}"
        return None

    def span(self, record: SpanRecord) -> None:
        self.pending.append(self._readable(record))
        if len(self.pending) >= SPAN_BATCH:
            self.flush()

    def measure(self, measurements: list[Measurement]) -> None:
        for m in measurements:
            self.histograms[m.metric].record(m.value, m.attributes)  # type: ignore[arg-type]

    def flush(self) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        if self.spans.export(batch) is not SpanExportResult.SUCCESS:
            raise self._failed(f"traces ({len(batch)} spans)")
        self.sent += len(batch)

    def send_metrics(self) -> None:
        data = self.reader.get_metrics_data()
        if data is None or not data.resource_metrics:
            return
        if self.metrics_exporter.export(data) is not MetricExportResult.SUCCESS:
            raise self._failed("metrics")

    def _context(self, span_id: int) -> SpanContext:
        return SpanContext(self.trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))

    def _readable(self, record: SpanRecord) -> ReadableSpan:
        status = (
            Status(StatusCode.ERROR, record.error) if record.error else Status(StatusCode.UNSET)
        )
        return ReadableSpan(
            name=record.name,
            context=self._context(record.span_id),
            parent=None if record.parent_id is None else self._context(record.parent_id),
            resource=self.resource,
            attributes=record.attributes,  # type: ignore[arg-type]
            events=[
                Event(e.name, e.attributes, e.time_ns)  # type: ignore[arg-type]
                for e in record.events
            ],
            kind=SpanKind.CLIENT if record.kind == CLIENT else SpanKind.INTERNAL,
            status=status,
            start_time=record.start_ns,
            end_time=record.end_ns,
            instrumentation_scope=SCOPE,
        )
