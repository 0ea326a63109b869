"""The hash chain, with no I/O: how a line is encoded, hashed and checked.

A line's hash is SHA-256 over its exact bytes without the trailing newline, and
every line carries `prev`, the hash of the line before it (64 zeros for the
first). Verifying therefore needs no JSON canonicalisation: an implementation in
any language hashes the bytes it read. spec/docket-receipt-1.md is the normative
text; this module is its reference implementation, and strict_json its JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from docket.ledger import strict_json
from docket.ledger.strict_json import MAX_INT

FORMAT_VERSION = 1
GENESIS = "0" * 64
COMMON_FIELDS = ("v", "seq", "ts", "mono_ms", "type", "prev")

# Events that record why and how a run started and stopped. They are exempt
# from the event ceiling (never from the byte ceiling) so that the record of
# why a run stopped always fits.
CONTROL_TYPES = frozenset(
    {
        "session.start",
        "session.end",
        "process.spawn",
        "process.exit",
        "signal.forwarded",
        "process.orphan",  # what the agent left outside its group, ended at the run's end
    }
)

# The ledger's event vocabulary: the one list of types an appender may write.
# Extend, never repurpose.
EVENT_TYPES = CONTROL_TYPES | frozenset(
    {
        "model.request",
        "model.response",
        "model.error",
        "cap.warning",
        "cap.exceeded",
        "policy.denied",
        "breaker.state",
        "x-docket.breaker-open",
        "x-docket.rate-limited",
        "load.shed",
        "net.connect",
        "net.denied",
        "fault.injected",
        "agent.backoff",
        "evidence.gap",
        "evidence.low_disk",
        "cache.hit",
        "cache.refused",  # a shared cache store refused (docs/cache.md): the run goes on without it
        "cache.waiting",  # a shared cache store's lock held by another run: waited for, bounded
        "provider.call",  # a relayed call that is not a model call (a models list): no spend
        "connection.pressure",  # an episode of connection pressure, counted (http/server.py)
        # --snapshot (docket.snapshot): the tree before the run, what the run changed,
        # what a rollback restored. Not control events: a long change list must not
        # eat the reserve kept for session.end.
        "snapshot.taken",
        "snapshot.changes",
        "snapshot.restored",
        # A fleet budget (docs/fleet.md): each change to this run's lease (drawn, renewed,
        # expired, lost, returned) and each exchange with its database that failed.
        "fleet.lease",
        "fleet.store",
    }
)

# Failure codes shared by verify and doctor (spec/docket-receipt-1.md lists them).
MALFORMED_LINE = "malformed_line"
UNSUPPORTED_VERSION = "unsupported_version"
SEQ_GAP = "seq_gap"
CHAIN_BREAK = "chain_break"
MONO_REGRESSION = "mono_regression"
TORN_TAIL = "torn_tail"
EMPTY_LEDGER = "empty_ledger"

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_HEX = frozenset("0123456789abcdef")
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_sha256 = hashlib.sha256
_too_deep = strict_json.too_deep
_refusal = strict_json.refusal


def line_hash(line: bytes) -> str:
    """Hex SHA-256 of one line's bytes, newline excluded."""
    return hashlib.sha256(line).hexdigest()


def encode_body(fields: dict[str, Any]) -> bytes:
    """Encode an event's own fields (everything but the common ones) as a JSON object.

    Done once, when the event is accepted, so that its exact size is known
    before a seq or prev is assigned to it.
    """
    clash = [k for k in COMMON_FIELDS if k in fields]
    if clash:
        raise ValueError(f"event fields may not be named {', '.join(clash)}")
    text = _ENCODER.encode(fields)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (legal in a provider's JSON string, never in UTF-8): the
        # line must stay valid UTF-8, so it becomes U+FFFD rather than costing the event.
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def encode_line(*, seq: int, ts: str, mono_ms: int, type: str, prev: str, body: bytes) -> bytes:
    """Assemble one ledger line (without its newline) from the common fields and a body."""
    head = (
        f'{{"v":{FORMAT_VERSION},"seq":{seq},"ts":{json_string(ts)},'
        f'"mono_ms":{mono_ms},"type":{json_string(type)},"prev":"{prev}"'
    ).encode()
    if body == b"{}":
        return head + b"}"
    return head + b"," + body[1:]


# What needs no escape in a JSON string: a timestamp, an event type. Two of these
# are encoded for every line, and the encoder's call costs more than the check.
_PLAIN_TEXT = frozenset("0123456789-:.TZ+_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def json_string(text: str) -> str:
    """`text` as a JSON string, as the ledger's encoder writes it."""
    if _PLAIN_TEXT.issuperset(text):
        return f'"{text}"'
    return _ENCODER.encode(text)


def line_overhead(seq: int, ts: str, type: str, mono_ms: int) -> int:
    """Bytes a line adds beyond its body, newline included (for ceiling arithmetic)."""
    return (
        len(encode_line(seq=seq, ts=ts, mono_ms=mono_ms, type=type, prev=GENESIS, body=b"{}")) + 1
    )


# Not frozen: Python sets __traceback__ on an exception as it passes through a
# @contextmanager or trio's nursery, and a frozen dataclass refuses that assignment.
@dataclass(eq=False)
class ChainError(Exception):
    """The first line at which a ledger stops being a valid chain."""

    code: str
    seq: int | None  # the seq the line should have had
    offset: int  # byte offset of the line's first byte
    detail: str

    def __str__(self) -> str:
        where = f"seq {self.seq}, " if self.seq is not None else ""
        return f"{self.code} at {where}byte {self.offset}: {self.detail}"


class ChainVerifier:
    """Feed complete lines in order; each is checked against the chain so far.

    The one verifier of spec section 4, used by verify, doctor and the writer
    when it continues a file: strict JSON (strict_json), the common fields'
    types and bounds, then version, seq, prev and mono_ms, in that order. Pure
    and incremental: memory does not grow with the ledger. `feed` returns the
    decoded event or raises ChainError for the first line that does not hold.

    `exact`: non-integer numbers in the events come back as exact Decimals
    (what verify compares claims with) rather than floats. It changes what is
    returned, never what is accepted.
    """

    __slots__ = ("count", "head", "offset", "last_mono_ms", "exact", "_parse")

    def __init__(self, *, exact: bool = False) -> None:
        self.count = 0  # lines accepted; also the seq the next line must carry
        self.head = GENESIS  # hash of the last accepted line
        self.offset = 0  # byte offset where the next line starts
        self.last_mono_ms = 0
        self.exact = exact
        self._parse = strict_json.parsers[exact]

    def copy(self) -> ChainVerifier:
        """A verifier in the same state, to try a line without committing to it."""
        trial = ChainVerifier(exact=self.exact)
        trial.count, trial.head = self.count, self.head
        trial.offset, trial.last_mono_ms = self.offset, self.last_mono_ms
        trial._parse = self._parse
        return trial

    def feed(self, line: bytes) -> dict[str, Any]:
        """Check one line (without its newline) at the current offset."""
        seq = self.count
        try:  # strict_json.decode_json, inlined: this runs once per line
            # Any: the parsed line is untrusted; the checks below narrow it by hand.
            event: Any = self._parse(line)
            if _too_deep(line, event):
                raise strict_json.AmbiguousJSON(strict_json.TOO_DEEP)
        except (ValueError, RecursionError) as exc:  # ValueError includes invalid UTF-8
            detail = f"not a JSON line ({_refusal(exc)})"
            raise ChainError(MALFORMED_LINE, seq, self.offset, detail) from None
        # The fast path: a line that holds passes on equality checks alone (prev
        # equal to the head is hex64; seq equal to the count is in bounds).
        mono: Any  # an int once `holds` is true
        if type(event) is dict:
            n, v, mono, kind = (
                event.get("seq"),
                event.get("v"),
                event.get("mono_ms"),
                event.get("type"),
            )
            holds = (
                event.get("prev") == self.head
                and type(n) is int
                and n == seq
                and type(v) is int
                and v == FORMAT_VERSION
                and type(mono) is int
                and self.last_mono_ms <= mono <= MAX_INT
                and type(event.get("ts")) is str
                and type(kind) is str
                and kind != ""
            )
        else:
            holds = False
        if not holds:
            self._diagnose(event, seq)  # raises, naming the first check that fails
        self.count = seq + 1
        self.head = _sha256(line).hexdigest()
        self.offset += len(line) + 1
        self.last_mono_ms = mono
        checked: dict[str, Any] = event  # every check passed: a JSON object
        return checked

    def _diagnose(self, event: Any, seq: int) -> None:
        """The checks of spec section 4, steps 2 to 6, in order."""
        offset = self.offset
        problem = _common_field_problem(event)
        if problem:
            raise ChainError(MALFORMED_LINE, seq, offset, problem)
        if event["v"] != FORMAT_VERSION:
            raise ChainError(UNSUPPORTED_VERSION, seq, offset, f"v is {event['v']!r}")
        if event["seq"] != seq:
            raise ChainError(SEQ_GAP, seq, offset, f"expected seq {seq}, found {event['seq']}")
        if event["prev"] != self.head:
            raise ChainError(
                CHAIN_BREAK, seq, offset, "prev does not match the hash of the line before"
            )
        if event["mono_ms"] < self.last_mono_ms:
            raise ChainError(
                MONO_REGRESSION,
                seq,
                offset,
                f"mono_ms {event['mono_ms']} is below {self.last_mono_ms}",
            )
        raise AssertionError(f"line at seq {seq} failed the fast path but no check")


def _common_field_problem(event: object) -> str | None:
    if not isinstance(event, dict):
        return "a line must be a JSON object"
    for name in COMMON_FIELDS:
        if name not in event:
            return f"missing field {name!r}"
    for name in ("v", "seq", "mono_ms"):
        value = event[name]
        if type(value) is not int or value < 0:
            return f"{name} must be a non-negative integer"
    if event["seq"] > MAX_INT or event["mono_ms"] > MAX_INT:
        return "seq and mono_ms must be at most 2^53-1"
    if not isinstance(event["ts"], str) or not isinstance(event["type"], str) or not event["type"]:
        return "ts and type must be strings"
    prev = event["prev"]
    if not isinstance(prev, str) or len(prev) != 64 or not _HEX.issuperset(prev):
        return "prev must be 64 lowercase hex digits"
    return None
