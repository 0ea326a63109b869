"""The recorded calls of a verified ledger, and which one answers a request.

Pure: events (with each line's SHA-256) in, RecordedCall values out; a Matcher
holds which recorded answers are used and decides, for each request that
arrives (provider, path, body bytes), the recorded call that answers it or a
Miss naming the nearest one with a JSON diff of the bodies.

Policies:
  exact           the request's bytes have the recorded call's digest; among equal
                  digests, the earliest unused answers first
  order           the n-th request to a provider gets that provider's n-th recorded
                  answer, and its bytes must have that call's digest
  model+messages  the bodies compared as JSON values (member order and whitespace do
                  not count), without the members the user names (`--ignore`)

The digest compared is the one of the bytes that went upstream (the model.request's
forwarded_sha256 when the boundary changed the agent's body, else request_sha256):
the replay upstream sees the bytes the replay's boundary forwards, changed the same
way. For the JSON comparisons, the paths the boundary changed (forwarded_changes)
are left out of both sides.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from docket.boundary.bodies import RECORDED_BODY_BYTES
from docket.guards.redact import MARKER
from docket.replay.options import POLICIES

# Members model+messages never ignores: without them the call is not the same conversation.
NEVER_IGNORED = frozenset({"model", "messages"})
# The recorder keeps at most RECORDED_BODY_BYTES of a body (docket/boundary/bodies.py),
# then redacts it: each value it hides (one byte at least) becomes the marker's JSON, so
# the text kept grows at most that many times. A longer body did not come from the
# recorder: refused, never served.
MAX_BODY_BYTES = RECORDED_BODY_BYTES * len(json.dumps(MARKER))
# A Retry-After as served: seconds or an HTTP date; anything else is not sent.
_HEADER_VALUE = re.compile(r"[0-9A-Za-z ,:.+-]{1,64}")
_DIFF_LIMIT = 20  # differing paths shown in a miss
_SHOWN_CHARS = 200  # a value in a diff is cut to this many characters


class NotReplayable(ValueError):
    """A recording that cannot be served as it was: `seq` names the event."""

    def __init__(self, seq: int | None, reason: str) -> None:
        super().__init__(reason)
        self.seq = seq
        self.reason = reason


@dataclass(frozen=True)
class Answer:
    """What the upstream answered, as recorded."""

    status: int | None  # None: no answer came (a transport failure)
    body: str  # the recorded response body ("" when none)
    stream: bool  # an event stream (served event by event)
    complete: bool  # False: the stream was cut, or no answer: the connection is dropped
    retry_after: str | None = None
    ttfb_ms: int | None = None
    duration_ms: int | None = None

    def events(self) -> list[str]:
        """A stream's events in order, each with the blank line that ends it."""
        text = self.body.replace("\r\n", "\n")
        parts = [p for p in text.split("\n\n") if p.strip("\n")]
        tail_cut = not text.endswith("\n\n")
        out = [p + "\n\n" for p in parts]
        if out and tail_cut:
            out[-1] = parts[-1] + ("\n" if text.endswith("\n") else "")
        return out


@dataclass(frozen=True)
class RecordedCall:
    """One call of the recorded run: its request and the answer it got."""

    index: int  # its place among the recording's calls (0, 1, ...)
    request_seq: int
    seq: int  # the closing event's seq
    line_sha256: str  # the closing event's line hash: replayed_from names it
    provider: str
    path: str  # the path under the provider's base URL, e.g. "v1/chat/completions"
    digest: str  # SHA-256 of the bytes that went upstream
    request_text: str
    boundary_paths: tuple[str, ...]  # what the boundary changed in the agent's body
    answer: Answer

    @property
    def request_json(self) -> object:
        return _loads(self.request_text)


def recorded_calls(events: Iterable[tuple[dict, str]]) -> list[RecordedCall]:
    """The calls of a verified ledger, in the order they were closed, from (event,
    line_sha256) pairs in seq order. NotReplayable for a run recorded without bodies,
    a body recorded as `*_body_not_recorded` or cut (naming its seq)."""
    opened: dict[str, dict] = {}
    calls: list[RecordedCall] = []
    for event, line_sha in events:
        kind = event.get("type")
        if kind == "model.request":
            _check_request_body(event)
            opened[str(event.get("call_id"))] = event
        elif kind in ("model.response", "model.error"):
            request = opened.pop(str(event.get("call_id")), None)
            if request is None:
                continue  # a closing event without its request: nothing to match it by
            answer = _answer(event)
            calls.append(
                RecordedCall(
                    index=len(calls),
                    request_seq=request["seq"],
                    seq=event["seq"],
                    line_sha256=line_sha,
                    provider=str(request.get("provider", "")),
                    path=_path_of(request),
                    digest=str(request.get("forwarded_sha256") or request.get("request_sha256")),
                    request_text=request["request_body"],
                    boundary_paths=tuple(request.get("forwarded_changes") or ()),
                    answer=answer,
                )
            )
    return calls


def _check_request_body(event: dict) -> None:
    seq = event.get("seq")
    if "request_body_not_recorded" in event:
        why = event["request_body_not_recorded"]
        raise NotReplayable(seq, f"the request body at seq {seq} was not recorded ({why})")
    if "request_body" not in event:
        raise NotReplayable(
            seq, f"the run was recorded without bodies (seq {seq}: set record_bodies = true)"
        )
    if event.get("request_body_truncated"):
        raise NotReplayable(seq, f"the request body at seq {seq} was recorded cut at 1 MiB")
    _check_size(event["request_body"], seq, "request")


def _answer(event: dict) -> Answer:
    seq = event.get("seq")
    status = event.get("status")
    if "response_body_not_recorded" in event:
        why = event["response_body_not_recorded"]
        raise NotReplayable(seq, f"the response body at seq {seq} was not recorded ({why})")
    if event.get("response_body_truncated"):
        raise NotReplayable(seq, f"the response body at seq {seq} was recorded cut at 1 MiB")
    if event.get("trimmed") and "response_body" not in event:
        raise NotReplayable(seq, f"the response body at seq {seq} was left out (ledger full)")
    if type(status) is not int:
        return Answer(None, "", False, False)  # no answer came: the connection is dropped
    if "response_body" not in event:
        raise NotReplayable(seq, f"the response at seq {seq} has no recorded body")
    body = event["response_body"]
    _check_size(body, seq, "response")
    stream = "events" in event
    ok = event["type"] == "model.response" or event.get("reason") in (
        "upstream_status",
        "upstream_error_event",
    )
    retry = event.get("retry_after")
    if not (isinstance(retry, str) and _HEADER_VALUE.fullmatch(retry)):
        retry = None  # what the recorder writes is the upstream's header, cut to 64
    return Answer(
        status=status,
        body=body if isinstance(body, str) else "",
        stream=stream,
        complete=ok,
        retry_after=retry,
        ttfb_ms=_int(event.get("ttfb_ms")),
        duration_ms=_int(event.get("duration_ms")),
    )


def _check_size(body: object, seq: int | None, what: str) -> None:
    if not isinstance(body, str):
        raise NotReplayable(seq, f"the {what} body at seq {seq} is not text")
    if len(body) > MAX_BODY_BYTES:
        raise NotReplayable(seq, f"the {what} body at seq {seq} is too long: not the recorder's")
    try:
        size = len(body.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: the recorder keeps UTF-8 text only
        raise NotReplayable(seq, f"the {what} body at seq {seq} is not UTF-8 text") from None
    if size > MAX_BODY_BYTES:
        raise NotReplayable(
            seq, f"the {what} body at seq {seq} is over {MAX_BODY_BYTES} bytes: not the recorder's"
        )


def _int(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _path_of(request: dict) -> str:
    """The path under the provider's base URL: the recorded url's path without the
    base URL's (the agent asked `/<provider>/<this>` of the boundary)."""
    url_path = urlsplit(str(request.get("url", ""))).path
    base_path = urlsplit(str(request.get("base_url", ""))).path.rstrip("/")
    if base_path and url_path.startswith(base_path + "/"):
        url_path = url_path[len(base_path) :]
    return url_path.lstrip("/")


# ---------------------------------------------------------------- matching


@dataclass(frozen=True)
class Hit:
    call: RecordedCall


@dataclass(frozen=True)
class Miss:
    """A request no unused recorded call answers: the nearest one, and how they differ."""

    provider: str
    path: str
    nearest: RecordedCall | None
    diff: list[dict] = field(default_factory=list)
    reason: str = ""

    def describe(self) -> str:
        if self.nearest is None:
            return f"{self.reason}: nothing was recorded for {self.provider} /{self.path}"
        n = self.nearest
        shown = json.dumps(self.diff, ensure_ascii=False)
        return (
            f"{self.reason}; nearest recorded call: #{n.index} (seq {n.request_seq}, "
            f"{n.provider} /{n.path}); body diff (recorded vs asked): {shown}"
        )


class Matcher:
    """Which recorded call answers each request, each answer served at most once."""

    def __init__(
        self, calls: list[RecordedCall], policy: str = "exact", ignore: Iterable[str] = ()
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"matching policy {policy!r}: one of {', '.join(POLICIES)}")
        ignored = frozenset(ignore)
        if ignored & NEVER_IGNORED:
            raise ValueError(
                f"--ignore {', '.join(sorted(ignored & NEVER_IGNORED))}: never ignored"
            )
        self.calls = calls
        self.policy = policy
        self.ignore = ignored
        self.used: set[int] = set()
        # The unused calls of each (provider, path, digest), earliest first: an exact
        # match is one dict lookup, not a scan of every recorded call (the scan took
        # 164 us a request over 6,000 recorded calls).
        self._waiting: dict[tuple[str, str, str], list[int]] = {}
        self._by_index = {call.index: call for call in calls}
        for call in calls:
            self._waiting.setdefault((call.provider, call.path, call.digest), []).append(call.index)
        self.asked: dict[str, int] = {}  # requests seen per provider (order policy)
        self.matched = 0
        self.missed = 0

    @property
    def unused(self) -> list[RecordedCall]:
        return [c for c in self.calls if c.index not in self.used]

    def match(self, provider: str, path: str, body: bytes) -> Hit | Miss:
        n = self.asked.get(provider, 0)
        self.asked[provider] = n + 1
        found = self._find(provider, path, body, n)
        if isinstance(found, RecordedCall):
            self.used.add(found.index)
            self._waiting[(found.provider, found.path, found.digest)].remove(found.index)
            self.matched += 1
            return Hit(found)
        self.missed += 1
        return self._miss(provider, path, body, found)

    def release(self, call: RecordedCall) -> None:
        """Undo the match of `call`: a fault replaced its answer (docket/replay/faults.py),
        so the same request asked again is served it."""
        self.used.discard(call.index)
        bisect.insort(self._waiting[(call.provider, call.path, call.digest)], call.index)
        self.matched -= 1
        self.asked[call.provider] -= 1

    def _find(self, provider: str, path: str, body: bytes, n: int) -> RecordedCall | str:
        digest = hashlib.sha256(body).hexdigest()
        if self.policy == "order":
            mine = [c for c in self.calls if c.provider == provider]
            if n >= len(mine):
                return f"request {n + 1} to {provider}: only {len(mine)} were recorded"
            call = mine[n]
            if call.path == path and call.digest == digest:
                return call
            return f"request {n + 1} to {provider} differs from recorded call #{call.index}"
        if self.policy == "exact":
            waiting = self._waiting.get((provider, path, digest))
            if waiting:
                return self._by_index[waiting[0]]
            return f"no unused recorded call of {provider} /{path} has this body (exact)"
        asked = _loads(body.decode("utf-8", "replace"))
        for call in self.unused:
            if call.provider != provider or call.path != path:
                continue
            if self._same(call, asked):
                return call
        return f"no unused recorded call of {provider} /{path} has this body ({self.policy})"

    def _same(self, call: RecordedCall, asked: object) -> bool:
        return self._view(call, call.request_json) == self._view(call, asked)

    def _view(self, call: RecordedCall, value: object) -> object:
        """The body as compared: without the ignored members and the boundary's paths."""
        return _without(value, [p.split(".") for p in (*self.ignore, *call.boundary_paths)])

    def _miss(self, provider: str, path: str, body: bytes, reason: str) -> Miss:
        asked = _loads(body.decode("utf-8", "replace"))
        pool = [c for c in self.calls if c.provider == provider] or self.calls
        best: tuple[tuple[int, int, int], RecordedCall, list[dict]] | None = None
        for call in pool:
            diff = json_diff(self._view(call, call.request_json), self._view(call, asked))
            # Fewest differences; then an unused call before a used one; then the earliest.
            rank = (
                len(diff) + (0 if call.path == path else 1),
                call.index in self.used,
                call.index,
            )
            if best is None or rank < best[0]:
                best = (rank, call, diff)
        if best is None:
            return Miss(provider, path, None, [], reason)
        return Miss(provider, path, best[1], best[2][:_DIFF_LIMIT], reason)


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text  # compared as a string: a body that is not JSON differs as a whole


def _without(value: object, paths: list[list[str]]) -> object:
    if not paths or not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        here = [p for p in paths if p[0] == key]
        if any(len(p) == 1 for p in here):
            continue
        if not here:
            out[key] = item
            continue
        kept = _without(item, [p[1:] for p in here])
        if kept != {} or item == {}:  # an object left empty by the removal goes too
            out[key] = kept
    return out


def json_diff(recorded: object, asked: object, path: str = "") -> list[dict]:
    """Where two JSON values differ: [{"path", "recorded", "asked"}], depth first
    (a member on one side only is shown with the other side's value absent)."""
    return list(_diff(recorded, asked, path))


_ABSENT = object()


def _diff(a: object, b: object, path: str) -> Iterator[dict]:
    if type(a) is dict and type(b) is dict:
        for key in sorted(a.keys() | b.keys()):
            yield from _diff(
                a.get(key, _ABSENT), b.get(key, _ABSENT), f"{path}.{key}" if path else key
            )
        return
    if type(a) is list and type(b) is list and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _diff(x, y, f"{path}[{i}]")
        return
    if type(a) is type(b) and a == b:
        return
    entry: dict = {"path": path or "(root)"}
    if a is not _ABSENT:
        entry["recorded"] = _shown(a)
    if b is not _ABSENT:
        entry["asked"] = _shown(b)
    yield entry


def _shown(value: object) -> object:
    text = json.dumps(value, ensure_ascii=False)
    if len(text) <= _SHOWN_CHARS:
        return value
    return text[:_SHOWN_CHARS] + "…"
