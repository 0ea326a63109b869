"""A verified ledger folded into what an OpenTelemetry trace of the run says, with no I/O.

One trace per run: a root `invoke_agent` span for the run, one CLIENT span per
forwarded model call (its model.request to the model.response or model.error that
closes it), and the boundary's refusals, breaker transitions, injected faults and
cap warnings as events on the root span. Names follow the OpenTelemetry GenAI
semantic conventions (gen_ai.*); what they have no name for is docket.*.
docs/export.md is the table of what maps to what, and what is left out.

Pure and incremental: feed events in seq order; a call's span comes back when its
closing event arrives, so memory holds only the calls in flight, never the run.
No OpenTelemetry import here: docket.export.otel_send turns these into OTLP.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from docket.errors import InputError

# What one export holds in memory, whatever the ledger: a ledger is a file any process
# of the same user can write, so its sizes are the writer's choice, not ours.
MAX_OPEN_CALLS = 65536  # calls in flight at once (a real run: at most its connections)
MAX_ROOT_EVENTS = 1024  # span events on the run's span; the rest are counted
MAX_TEXT = 1024  # characters of one string attribute (a model name, a reason)
MAX_ARGV = 64  # arguments of the agent's command kept

# The ledger's endpoint (docket.boundary.providers) -> gen_ai.operation.name and
# gen_ai.provider.name, as the conventions name them. The provider is the API's shape:
# a provider named "stub" in the policy that speaks OpenAI's API is "openai" here.
ENDPOINTS: Mapping[str, tuple[str, str]] = {
    "chat.completions": ("chat", "openai"),
    "responses": ("chat", "openai"),
    "completions": ("text_completion", "openai"),
    "embeddings": ("embeddings", "openai"),
    "messages": ("chat", "anthropic"),
    "messages.count_tokens": ("count_tokens", "anthropic"),
}

# Events that become span events on the run's span, and the members each carries
# (as docket.<member>). Scalars as they are; any other JSON value as its JSON text.
ROOT_EVENT_MEMBERS: Mapping[str, tuple[str, ...]] = {
    "policy.denied": (
        "rule", "reason", "cap", "provider", "model", "error_type", "client_attempt",
    ),
    "x-docket.rate-limited": (
        "rule", "limit", "provider", "model", "error_type", "retry_after_s", "client_attempt",
    ),
    "x-docket.breaker-open": (
        "rule", "upstream", "state", "provider", "model", "error_type", "retry_after_s",
        "client_attempt",
    ),
    "load.shed": (
        "rule", "reason", "provider", "model", "error_type", "queue", "in_flight",
        "retry_after_s", "client_attempt",
    ),
    "net.denied": ("rule", "reason", "host", "port", "method"),
    "breaker.state": ("upstream", "from", "to", "reason", "cooldown_s", "failures"),
    "fault.injected": ("fault", "seed", "ordinal", "counter", "target", "kind", "provider"),
    "cap.warning": ("cap", "limit", "observed", "unit"),
    "cap.exceeded": ("cap", "limit", "observed", "unit"),
    "cache.hit": ("provider", "model", "saved_nusd", "replays_seq", "replays_run"),
    "evidence.gap": ("lost", "first_failing_seq"),
    "signal.forwarded": ("signal", "reason"),
    "process.orphan": ("pid", "reason"),
    # A model.error that closes no call this ledger opened (refused in intake).
    "model.error": ("provider", "model", "reason", "status", "client_attempt"),
}  # fmt: skip

INTERNAL, CLIENT = "internal", "client"
UNCLOSED = "docket.unclosed"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # error.type of a call the ledger never closed


@dataclass
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, object]


@dataclass
class SpanRecord:
    name: str
    span_id: int
    parent_id: int | None
    kind: str  # INTERNAL or CLIENT
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    events: list[SpanEvent] = field(default_factory=list)
    error: str | None = None  # error.type, when the span failed


@dataclass(frozen=True)
class Measurement:
    """One value for one of the two GenAI histograms."""

    metric: str  # TOKEN_USAGE or OPERATION_DURATION
    value: float
    attributes: dict[str, object]


TOKEN_USAGE = "gen_ai.client.token.usage"
OPERATION_DURATION = "gen_ai.client.operation.duration"


@dataclass(frozen=True)
class Upstream:
    """What the policy says about a provider the ledger names (the ledger keeps only
    the path of the upstream URL): its API kind and where it lives."""

    kind: str
    host: str
    port: int


def _digest_int(label: str, size: int) -> int:
    value = int.from_bytes(hashlib.sha256(label.encode("utf-8")).digest()[:size], "big")
    return value or 1  # an all-zero id is invalid in OTLP; 1 in 2^64 odds, still handled


# Ids are derived, not drawn: the same ledger exported twice (a retry after a failed
# export, or the run's own export and a later `docket export otel`) gives the same
# trace and span ids, so a backend updates one trace instead of showing two, and
# anyone holding a run id can compute its trace id to look it up.
def trace_id_of(run_id: str) -> int:
    return _digest_int(f"docket-otel trace {run_id}", 16)


def span_id_of(run_id: str, seq: int | str) -> int:
    return _digest_int(f"docket-otel span {run_id} {seq}", 8)


def text(value: object) -> str:
    s = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + "…"


def attribute(value: object) -> object:
    """A ledger member as an attribute value: bool, int, float or bounded text."""
    if isinstance(value, bool | float):
        return value
    if isinstance(value, int) and -(2**63) <= value < 2**63:  # OTLP's int is 64-bit
        return value
    return text(value)


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _str(value: object) -> str:
    return value if type(value) is str else ""


def _time_ns(ts: object, seq: int) -> int:
    try:
        when = datetime.fromisoformat(ts) if isinstance(ts, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InputError(f"ledger: seq {seq}'s ts is not an RFC 3339 time: {text(ts)!r}")
    # Exact integer arithmetic: a float timestamp would round .355 s to .354999 s.
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


class RunFold:
    """Feed a verified ledger's events (with each line's hash) in seq order."""

    def __init__(self, upstreams: Mapping[str, Upstream] | None = None) -> None:
        self.upstreams = upstreams or {}
        self.run_id = ""
        self.trace_id = 0
        self.root: SpanRecord | None = None
        self.open: dict[str, SpanRecord] = {}  # calls in flight, by call_id
        self.events_dropped = 0
        self.calls = 0
        self._anchor_ns = 0  # wall-clock ns of mono_ms 0, from the first event's ts
        self._last_ns = 0
        self._head = ""
        self._count = 0

    def at(self, event: dict) -> int:
        when = self._anchor_ns + event["mono_ms"] * 1_000_000
        if not 0 <= when < 2**64:  # OTLP's times are unsigned 64-bit nanoseconds
            raise InputError(
                f"ledger: seq {event['seq']} falls outside 1970-2554 (ts of the first event "
                f"plus mono_ms {event['mono_ms']})"
            )
        return when

    def add(self, event: dict, line_sha256: str) -> tuple[list[SpanRecord], list[Measurement]]:
        """Fold one event; the call spans it closed, and their measurements."""
        if self.root is None:
            self._begin(event, line_sha256)
        now = self.at(event)
        self._last_ns, self._head, self._count = now, line_sha256, self._count + 1
        kind = event["type"]
        if kind == "session.start":
            return [], []
        if kind == "model.request":
            self._open_call(event, line_sha256, now)
            return [], []
        call_id = event.get("call_id")
        if kind in ("model.response", "model.error") and call_id in self.open:
            span = self.open.pop(call_id)
            return [span], self._close_call(span, event, line_sha256, now)
        if kind == "session.end":
            self._end(event, line_sha256)
        elif kind == "process.spawn" and "docket.argv" not in self._root.attributes:
            self._argv(event.get("argv"))
        elif kind in ROOT_EVENT_MEMBERS:
            self._root_event(event, line_sha256, now)
        return [], []

    @property
    def _root(self) -> SpanRecord:
        assert self.root is not None  # set by the first event
        return self.root

    def _begin(self, first: dict, line_sha256: str) -> None:
        self._anchor_ns = _time_ns(first["ts"], first["seq"]) - first["mono_ms"] * 1_000_000
        if first["type"] == "session.start" and isinstance(first.get("run_id"), str):
            self.run_id = first["run_id"]
        else:  # a ledger with no session.start: named by its first line
            self.run_id = f"ledger-{line_sha256[:16]}"
        self.trace_id = trace_id_of(self.run_id)
        attrs: dict[str, object] = {
            "gen_ai.operation.name": "invoke_agent",
            "docket.run_id": text(self.run_id),
            "docket.seq": first["seq"],
            "docket.line_sha256": line_sha256,
        }
        for member in ("docket_version", "policy_digest"):
            if isinstance(first.get(member), str):
                attrs[f"docket.{member}"] = text(first[member])
        chaos = first.get("chaos")
        if isinstance(chaos, dict) and type(chaos.get("seed")) is int:
            attrs["docket.chaos.seed"] = attribute(chaos["seed"])
        start = self.at(first)
        self.root = SpanRecord(
            "invoke_agent", span_id_of(self.run_id, "run"), None, INTERNAL, start, start, attrs
        )
        self._argv(first.get("argv"))

    def _argv(self, argv: object) -> None:
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return
        self._root.attributes["docket.argv"] = [text(a) for a in argv[:MAX_ARGV]]
        if len(argv) > MAX_ARGV:
            self._root.attributes["docket.argv_dropped"] = len(argv) - MAX_ARGV
        agent = text(argv[0].rsplit("/", 1)[-1])
        self._root.attributes["gen_ai.agent.name"] = agent
        self._root.name = f"invoke_agent {agent}"

    def _open_call(self, event: dict, line_sha256: str, now: int) -> None:
        call_id = event.get("call_id")
        if not isinstance(call_id, str):  # pairs with nothing (spec 7.5): a point in time
            self._root_event(event, line_sha256, now)
            return
        if len(self.open) >= MAX_OPEN_CALLS:
            raise InputError(
                f"ledger: more than {MAX_OPEN_CALLS} calls open at once at seq {event['seq']}"
            )
        endpoint = _str(event.get("endpoint"))
        provider = _str(event.get("provider"))
        upstream = self.upstreams.get(provider)
        operation, kind = ENDPOINTS.get(endpoint, (endpoint or "chat", provider))
        if upstream is not None:
            kind = upstream.kind
        model = _str(event.get("model"))
        attrs: dict[str, object] = {
            "gen_ai.operation.name": text(operation),
            "gen_ai.provider.name": text(kind),
            "gen_ai.request.model": text(model),
            "docket.seq": event["seq"],
            "docket.line_sha256": line_sha256,
            "docket.call_id": text(call_id),
            "docket.provider": text(provider),
            "docket.endpoint": text(endpoint),
        }
        if isinstance(event.get("stream"), bool):
            attrs["gen_ai.request.stream"] = event["stream"]
        if _count(event.get("max_output_tokens")) is not None:
            attrs["gen_ai.request.max_tokens"] = event["max_output_tokens"]
        if _count(event.get("client_attempt")) is not None:
            attrs["docket.client_attempt"] = event["client_attempt"]
        if event.get("cache") == "miss":
            attrs["docket.cache"] = "miss"
        if upstream is not None:
            attrs["server.address"], attrs["server.port"] = upstream.host, upstream.port
        name = f"{operation} {model}" if model else operation
        span = SpanRecord(
            text(name), span_id_of(self.run_id, event["seq"]), self._root.span_id, CLIENT,
            now, now, attrs,
        )  # fmt: skip
        self.open[call_id] = span
        self.calls += 1

    def _close_call(
        self, span: SpanRecord, event: dict, line_sha256: str, now: int
    ) -> list[Measurement]:
        attrs = span.attributes
        span.end_ns = now
        attrs["docket.end_seq"] = event["seq"]
        attrs["docket.end_line_sha256"] = line_sha256
        model = _str(event.get("model"))
        if model:
            attrs["gen_ai.response.model"] = text(model)
        status = event.get("status")
        if type(status) is int:
            attrs["http.response.status_code"] = status
        usage = event.get("usage")
        tokens: dict[str, int] = {}
        if isinstance(usage, dict):
            tokens = _usage(usage, attrs["gen_ai.provider.name"])
            for name, value in tokens.items():
                attrs[f"gen_ai.usage.{name}"] = value
        cost = _count(event.get("cost_nusd"))
        if cost is not None:
            attrs["docket.cost.nusd"] = cost
            attrs["docket.cost.usd"] = cost / 1e9
        if isinstance(event.get("priced"), bool):
            attrs["docket.priced"] = event["priced"]
        failed = event["type"] == "model.error" or (type(status) is int and status >= 400)
        if failed:
            reason = event.get("reason")
            if type(status) is int and status >= 400:
                span.error = str(status)
            else:
                span.error = text(reason) if isinstance(reason, str) and reason else "_OTHER"
            attrs["error.type"] = span.error
            if isinstance(reason, str):
                attrs["docket.reason"] = text(reason)
        return self._measure(span, tokens)

    def _measure(self, span: SpanRecord, tokens: dict[str, int]) -> list[Measurement]:
        keys = (
            "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
            "gen_ai.response.model", "server.address", "server.port",
        )  # fmt: skip
        common = {k: span.attributes[k] for k in keys if k in span.attributes}
        out = [
            Measurement(TOKEN_USAGE, tokens[name], {**common, "gen_ai.token.type": token_type})
            for name, token_type in (("input_tokens", "input"), ("output_tokens", "output"))
            if name in tokens
        ]
        seconds = (span.end_ns - span.start_ns) / 1e9
        failed = {"error.type": span.error} if span.error else {}
        out.append(Measurement(OPERATION_DURATION, seconds, {**common, **failed}))
        return out

    def _root_event(self, event: dict, line_sha256: str, now: int) -> None:
        if len(self._root.events) >= MAX_ROOT_EVENTS:
            self.events_dropped += 1
            return
        attrs: dict[str, object] = {"docket.seq": event["seq"], "docket.line_sha256": line_sha256}
        for member in ROOT_EVENT_MEMBERS.get(event["type"], ()):
            value = event.get(member)
            if value is not None:
                attrs[f"docket.{member}"] = attribute(value)
        self._root.events.append(SpanEvent(event["type"], now, attrs))

    def _end(self, event: dict, line_sha256: str) -> None:
        attrs = self._root.attributes
        attrs["docket.end_seq"] = event["seq"]
        attrs["docket.end_line_sha256"] = line_sha256
        reason, status, cap = event.get("reason"), event.get("exit_status"), event.get("cap")
        if isinstance(reason, str):
            attrs["docket.exit.reason"] = text(reason)
        if type(status) is int:
            attrs["docket.exit.status"] = attribute(status)
        if isinstance(cap, str):
            attrs["docket.exit.cap"] = text(cap)
            self._root.error = "docket.cap"
        elif type(status) is int and status != 0:
            self._root.error = "docket.exit_status"

    def finish(self) -> tuple[SpanRecord, list[SpanRecord]]:
        """The run's span, and the calls still open at the ledger's end (closed there,
        as failed: the ledger never said how they ended)."""
        root = self._root
        root.end_ns = self._last_ns
        root.attributes["docket.ledger.events"] = self._count
        root.attributes["docket.ledger.head"] = self._head
        root.attributes["docket.calls"] = self.calls
        if self.events_dropped:
            root.attributes["docket.span_events_dropped"] = self.events_dropped
        if root.error:
            root.attributes["error.type"] = root.error
        unclosed = []
        for span in self.open.values():
            span.end_ns = self._last_ns
            span.error = UNCLOSED
            span.attributes["error.type"] = UNCLOSED
            unclosed.append(span)
        self.open.clear()
        return root, unclosed


def _usage(usage: dict, provider_kind: object) -> dict[str, int]:
    """The ledger's usage as gen_ai.usage.* counts. The conventions count cached input
    within input_tokens; the ledger keeps Anthropic's cache reads and writes on top of
    it (docket.boundary.providers.base.Usage), so they are added back there."""
    given, made = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    read, written = _count(usage.get("cached_tokens")), _count(usage.get("cache_write_tokens"))
    subset = usage.get("cached_is_subset")
    if not isinstance(subset, bool):
        subset = provider_kind != "anthropic"
    out: dict[str, int] = {}
    if given is not None:
        out["input_tokens"] = given if subset else given + (read or 0) + (written or 0)
    if made is not None:
        out["output_tokens"] = made
    if read is not None and "cached_tokens" in usage:
        out["cache_read.input_tokens"] = read
    if written is not None and "cache_write_tokens" in usage:
        out["cache_creation.input_tokens"] = written
    return out
