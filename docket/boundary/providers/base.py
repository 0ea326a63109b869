"""What every provider adapter shares: the facts it returns and the stream tracker's frame.

Sans-IO: bytes and dicts in, bytes and small frozen values out. The boundary
calls these on its hot path, so a body is parsed once (RequestFacts keeps the
parsed object) and a stream event's JSON is decoded only when the event can
carry usage, an error or the end of the stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

try:
    import jiter
except ImportError:  # the standard library's parser, made as strict, does it alone
    jiter = None  # type: ignore[assignment]  # None marks "not installed" below

from docket import pricing
from docket.boundary.providers.headers import header_value
from docket.boundary.providers.sse import SSEEvent, SSEParser, parse_block

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

# An event larger than this is not a provider talking: the tracker stops inspecting.
DEFAULT_MAX_EVENT_BYTES = 32 * 1024 * 1024


class BadRequest(Exception):
    """A request the boundary answers itself with a 400 in the provider's shape.
    `code` (duplicate_key, too_deep) says which rule of the body's JSON it broke."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


# A request body whose objects and arrays nest deeper than this is refused (400): no
# model API needs it, and what reads the body after (the redactor, a recorder, an
# upstream) must not need a deeper stack. Far above real requests (a chat with tool
# schemas nests about 10 deep); below the standard library's own recursion limit.
MAX_REQUEST_DEPTH = 128


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the guards and the ledger need to know about one request.

    `endpoint` names the call ("chat.completions", "responses", "embeddings",
    "completions", "messages", "messages.count_tokens") or is "other" for a
    path the adapter does not interpret. `max_output_tokens` is the limit the
    request declares per choice; `choices` is how many completions it asks for
    (OpenAI `n`, or `best_of` on legacy completions), each billed. `payload` is
    the parsed body, kept so that nothing parses it twice.
    """

    kind: str
    endpoint: str
    model: str | None
    stream: bool
    max_output_tokens: int | None
    choices: int = 1
    payload: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def output_tokens_bound(self) -> int | None:
        """The most output tokens the request can be billed for, if it declares a limit."""
        if self.max_output_tokens is None:
            return None
        return self.max_output_tokens * self.choices


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one call, normalised across providers.

    `cached_tokens` (read from the prompt cache) and `cache_write_tokens`
    (written to it) are part of `input_tokens` when `cached_is_subset` (OpenAI)
    and come on top of it when not (Anthropic). A count the provider did not
    report is None: a fact to record, never a zero. `cache_write_1h_tokens` is
    the part of the writes Anthropic reports as kept for an hour (None when it
    gives no split).
    """

    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int = 0
    cached_is_subset: bool = True
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int | None = None

    @property
    def complete(self) -> bool:
        return self.input_tokens is not None and self.output_tokens is not None

    @property
    def total_input_tokens(self) -> int | None:
        """Every prompt token the call processed, cached or not."""
        if self.input_tokens is None:
            return None
        if self.cached_is_subset:
            return self.input_tokens
        return self.input_tokens + self.cached_tokens + self.cache_write_tokens

    def as_fields(self) -> dict[str, Any]:
        """The usage as event fields."""
        fields = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cached_is_subset": self.cached_is_subset,
        }
        if self.cache_write_1h_tokens is not None:
            fields["cache_write_1h_tokens"] = self.cache_write_1h_tokens
        return fields

    def priced(self) -> pricing.Usage:
        """The disjoint counts docket.pricing charges (a pricing.Usage).

        Raises ValueError when a count is missing or the counts contradict each
        other (more cached tokens than prompt tokens, a cache-write split that
        does not add up): the boundary then records the usage as unpriceable.
        """
        given, made = self.input_tokens, self.output_tokens
        if given is None or made is None:  # not self.complete
            raise ValueError("usage is incomplete: input or output tokens unknown")
        if self.cached_is_subset:
            return pricing.Usage.openai(given, made, self.cached_tokens)
        w1h = self.cache_write_1h_tokens
        return pricing.Usage.anthropic(
            given,
            made,
            self.cached_tokens,
            self.cache_write_tokens,
            ephemeral_5m_input_tokens=None if w1h is None else self.cache_write_tokens - w1h,
            ephemeral_1h_input_tokens=w1h,
        )


@dataclass(frozen=True, slots=True)
class ProviderError:
    """An error the provider reported, in a response body or inside a stream."""

    type: str | None
    message: str
    code: str | None = None


MAX_COUNT = 2**53 - 1


def count(value: object) -> int | None:
    """A token count as the provider sent it, or None when it is not a count.

    Counts above 2^53-1 are not counts (the ledger's integers must survive any JSON
    reader exactly, and no call has that many tokens)."""
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    return None


def loads(data: bytes | str) -> object:
    """json.loads that treats too-deep nesting like any other malformed JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def encode_json(obj: object) -> bytes:
    return _ENCODER.encode(obj).encode("utf-8")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_members(pairs: list[tuple[str, object]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number (RFC 8259 section 6)")


# NaN and Infinity are Python's extensions, not JSON: an upstream's reader may refuse
# them, or read them as something the caps did not price.
_REQUEST_DECODER = json.JSONDecoder(object_pairs_hook=_unique_members, parse_constant=_no_constant)


class _NotText(Exception):
    """A request body whose bytes are not JSON text: `code` says how (not_utf8,
    byte_order_mark, bad_unicode)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# A \uD800-\uDFFF escape: only a body with one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _decode_request(body: bytes) -> object:
    """The body's JSON value. jiter (Rust, in 2.3 ms for a 0.9 MB chat where the
    standard library takes 5.9) reads it when it can; whatever it refuses is read
    again by the standard library, made to refuse duplicates, so that the message
    for what is refused stays the standard library's. Both read JSON text only as
    RFC 8259 8.1 has it exchanged: UTF-8, without a byte order mark, and no string
    holding a lone surrogate (an unpaired \\ud800 escape is no Unicode text: no
    UTF-8 encodes it, and readers differ on it). json.loads(bytes) would take UTF-16
    and -32 and skip a BOM, and an upstream might read those otherwise than the
    boundary did. Raises _NotText, _DuplicateKey, RecursionError or ValueError."""
    if jiter is not None:
        try:
            return jiter.from_json(
                body, catch_duplicate_keys=True, cache_mode="keys", allow_inf_nan=False
            )
        except ValueError as exc:
            if "recursion limit" in str(exc):  # jiter's own bound, deeper than ours
                raise RecursionError(str(exc)) from None
    encoding = json.detect_encoding(body)  # from its first bytes, as json.loads does
    try:
        if not encoding.startswith("utf-8"):
            raise UnicodeDecodeError(encoding, body, 0, 1, "not UTF-8")
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        looks = "" if encoding.startswith("utf-8") else f"; it looks like {encoding.upper()}"
        raise _NotText(
            f"is not UTF-8 (byte {exc.start}{looks}); JSON is sent as UTF-8 (RFC 8259 8.1)",
            "not_utf8",
        ) from None
    if text.startswith("\ufeff"):
        raise _NotText(
            "starts with a byte order mark; JSON is sent without one (RFC 8259 8.1)",
            "byte_order_mark",
        )
    obj = _REQUEST_DECODER.decode(text)
    if _SURROGATE_ESCAPE.search(body) is not None and _holds_lone_surrogate(obj):
        raise _NotText(
            "holds a string with a lone surrogate (an unpaired \\ud800-\\udfff escape), "
            "which is not Unicode text",
            "bad_unicode",
        )
    return obj


def _holds_lone_surrogate(value: object) -> bool:
    """Whether a decoded value has a member name or string with a lone surrogate
    (the decoder joins a proper pair into one character). With a stack of its own."""
    stack = [value]
    while stack:
        value = stack.pop()
        if type(value) is str:
            if _LONE_SURROGATE.search(value):
                return True
        elif type(value) is dict:
            stack.extend(value)
            stack.extend(value.values())
        elif type(value) is list:
            stack.extend(value)
    return False


def nests_deeper(value: dict[str, Any] | list[Any], limit: int) -> bool:
    """Whether objects and arrays in a decoded value nest deeper than `limit` (a
    bare object is 1 deep). With a stack of its own, not Python's: any depth is safe."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        members = value.values() if type(value) is dict else value
        for member in members:
            if type(member) is dict or type(member) is list:
                if depth + 1 > limit:
                    return True
                stack.append((member, depth + 1))
    return False


def parse_json_object(body: bytes, what: str) -> dict[str, Any]:
    """The body as a JSON object, or BadRequest naming what is wrong with it.

    Stricter than JSON readers in general, because the boundary's reading must be
    the upstream's: a member named twice in one object is refused (code
    duplicate_key: an upstream that takes the first "model" or "max_tokens" would
    run a call other than the one recorded and capped), and so is nesting deeper
    than MAX_REQUEST_DEPTH (code too_deep)."""
    if not body.strip():
        raise BadRequest(f"{what} is empty; expected a JSON object")
    too_deep = BadRequest(
        f"{what} nests objects and arrays more than {MAX_REQUEST_DEPTH} levels deep",
        code="too_deep",
    )
    try:
        obj = _decode_request(body)
    except _DuplicateKey as dup:
        raise BadRequest(
            f"{what} names the member {json.dumps(dup.key)[:80]} twice in one object; "
            "readers disagree on which value counts, so the call is refused",
            param=dup.key[:64],
            code="duplicate_key",
        ) from None
    except RecursionError:  # the parser's own stack: deeper than our bound too
        raise too_deep from None
    except _NotText as bad:
        raise BadRequest(f"{what} {bad.message}", code=bad.code) from None
    except ValueError as exc:
        raise BadRequest(f"{what} is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"{what} must be a JSON object, not {_json_kind(obj)}")
    # Only a body with that many brackets can nest that deep, and counting is cheap.
    if body.count(b"{") + body.count(b"[") > MAX_REQUEST_DEPTH and nests_deeper(
        obj, MAX_REQUEST_DEPTH
    ):
        raise too_deep
    return obj


def require_identity_encoding(headers: Iterable[tuple[bytes, bytes]]) -> None:
    encoding = header_value(headers, b"content-encoding")
    if encoding is not None and encoding.strip().lower() != b"identity":
        raise BadRequest(
            f"request bodies with content-encoding {encoding.decode('latin-1')!r} are not supported"
        )


def require_model(payload: dict[str, Any], path: str) -> str:
    model = payload.get("model")
    if isinstance(model, str) and model:
        return model
    if model is None:
        problem = 'has no "model"'
    elif model == "":
        problem = 'has an empty "model"'
    else:
        problem = f'has {_json_kind(model)} as its "model"'
    raise BadRequest(f"request body {problem}; {path} needs a model name", param="model")


def stream_flag(payload: dict[str, Any]) -> bool:
    stream = payload.get("stream")
    if stream is None:
        return False
    if type(stream) is not bool:
        raise BadRequest(f'"stream" must be true or false, not {stream!r}', param="stream")
    return stream


def token_limit(payload: dict[str, Any], *names: str) -> int | None:
    """The first of `names` present (and not null), checked to be a positive integer."""
    for name in names:
        value = payload.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 1:
            raise BadRequest(f'"{name}" must be a positive integer, not {value!r}', param=name)
        return value
    return None


def choice_count(payload: dict[str, Any], name: str) -> int:
    """How many completions a field asks for (1 when absent or null)."""
    value = payload.get(name)
    if value is None:
        return 1
    if type(value) is not int or value < 1:
        raise BadRequest(f'"{name}" must be a positive integer, not {value!r}', param=name)
    return value


def _json_kind(obj: object) -> str:
    if isinstance(obj, bool):
        return "a boolean"
    if isinstance(obj, list):
        return "an array"
    if isinstance(obj, str):
        return "a string"
    if isinstance(obj, (int, float)):
        return "a number"
    if obj is None:
        return "null"
    return "an object"


# --- streams -----------------------------------------------------------------


class StreamTracker:
    """Watches one streamed response on its way to the client.

    `feed(chunk)` returns the bytes to send to the client now. Without
    stripping that is the chunk itself, at once and uncopied. With stripping
    (an OpenAI usage chunk the boundary asked for), complete events go out the
    moment their blank line arrives, minus the usage event; only an incomplete
    event's bytes are held, and `flush()` returns them when the upstream body ends.

    Read after feeding: `usage` (None until the provider reports it), `events`
    (events dispatched), `finished` (the provider's end-of-stream marker
    arrived), `error` (an error the provider sent inside the stream), `problem`
    (something the tracker could not read; it then passes bytes through
    unexamined) and `pending` (bytes of a cut event).
    """

    def __init__(
        self, *, strip_usage_chunk: bool = False, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    ) -> None:
        self.strip_usage_chunk = strip_usage_chunk
        self.usage: Usage | None = None
        self.events = 0
        self.finished = False
        self.error: ProviderError | None = None
        self.problem: str | None = None
        self.max_event_bytes = max_event_bytes
        self._parser = SSEParser()
        self._blind = False  # after a problem: forward everything, inspect nothing

    @property
    def pending(self) -> int:
        return self._parser.pending

    def feed(self, chunk: bytes) -> bytes:
        if self._blind:
            return chunk
        blocks = self._parser.feed_blocks(chunk)
        if not self.strip_usage_chunk:
            for block in blocks:
                event = parse_block(block)
                if event is not None:
                    self.events += 1
                    self.observe(event)
            self._release_if_oversized()  # already forwarded: only the memory is freed
            return chunk
        kept = []
        for block in blocks:
            event = parse_block(block)
            if event is not None:
                self.events += 1
                if self.observe(event):
                    # A stray blank line ahead of the event belongs to the stream, not to it.
                    lead = len(block) - len(block.lstrip(b"\r\n"))
                    if lead:
                        kept.append(block[:lead])
                    continue
            kept.append(block)
        kept.append(self._release_if_oversized())
        return b"".join(kept)

    def _release_if_oversized(self) -> bytes:
        """The held bytes, once an incomplete event outgrows the bound; the tracker then
        passes everything through unexamined. Otherwise b""."""
        if self._parser.pending <= self.max_event_bytes:
            return b""
        self.note_problem(f"an event grew past {self.max_event_bytes} bytes without its blank line")
        self._blind = True
        return self._parser.take_pending()

    def flush(self) -> bytes:
        """At the end of the upstream body: held bytes still owed to the client."""
        pending = self._parser.take_pending()
        return pending if self.strip_usage_chunk else b""

    def observe(self, event: SSEEvent) -> bool:
        """Take the facts one event carries; True when it is the usage chunk to strip."""
        raise NotImplementedError

    def note_problem(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def decode(self, event: SSEEvent) -> dict[str, Any] | None:
        """The event's data as a JSON object, or None with the problem noted."""
        try:
            obj = loads(event.data)
        except ValueError as exc:
            self.note_problem(f"a {event.event or 'data'} event is not valid JSON ({exc})")
            return None
        if not isinstance(obj, dict):
            self.note_problem(f"a {event.event or 'data'} event is not a JSON object")
            return None
        return obj


# --- refusals ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RefusalKind:
    """How a docket_* refusal is answered: its status, and whether a retry can help.

    SDKs built by Stainless (openai, anthropic) obey `x-should-retry`; a refusal
    that no retry can lift says so, so that the agent does not burn its retries on it.
    """

    status: int
    retryable: bool


DOCKET_ERRORS: dict[str, RefusalKind] = {
    "docket_policy_denied": RefusalKind(403, False),
    "docket_breaker_open": RefusalKind(503, True),
    "docket_rate_limited": RefusalKind(429, True),
    # A cap the call fits under once the calls in flight settle (on_breach = "deny"):
    # a 429 with Retry-After, which SDKs retry; a call past the cap even then is a 403.
    "docket_caps_pending": RefusalKind(429, True),
    "docket_load_shed": RefusalKind(503, True),
    # A fleet budget's slice cannot cover the call and no more can be leased now
    # (spent elsewhere, or its database unreachable): 503 with Retry-After.
    "docket_fleet_unavailable": RefusalKind(503, True),
    "docket_unauthorized": RefusalKind(401, False),
    "docket_bad_request": RefusalKind(400, False),
    "docket_upstream_timeout": RefusalKind(504, True),
    "docket_upstream_unreachable": RefusalKind(502, True),
    "docket_ledger_full": RefusalKind(503, False),  # with code max_events | max_ledger_bytes
    "docket_evidence_lost": RefusalKind(503, False),
    # The boundary itself failed on the call (a bug, or input it could not handle):
    # recorded (model.error or policy.denied, reason internal_error); a retry of the
    # same request would most likely fail the same way.
    "docket_internal_error": RefusalKind(500, False),
    # `docket replay --on-miss error|fail`: no recorded answer for this request
    # (docket/replay/upstream.py); the same request would miss again.
    "docket_replay_miss": RefusalKind(400, False),
}


def check_error_args(status: int, error_type: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    if not 400 <= status <= 599:
        raise ValueError(f"an error status must be 4xx or 5xx, not {status}")
    if error_type.startswith("docket_") and error_type not in DOCKET_ERRORS:
        raise ValueError(f"unknown docket error type {error_type!r}")
    extra = dict(extra or {})
    clash = {"type", "message"} & extra.keys()
    if clash:
        raise ValueError(f"extra may not set {', '.join(sorted(clash))}")
    return extra
