"""Receipts: build one from a tally, write it durably, verify one against its ledger.

spec/docket-receipt-1.md is the normative text; this module is its reference
implementation. Verification is a fixed sequence of checks and names the first
that fails: the receipt's shape, the chain over the whole file, the ledger's
count, head and size, the events' contents, the evidence, then every other
claim in the order of CLAIM_CHECKS. Nothing here writes to a ledger.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

try:
    import jiter
except ImportError:  # decode_json falls back to the standard library's parser
    jiter = None

from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, InputError
from docket.inputs import existing_file, read_text
from docket.ledger.chain import (
    CHAIN_BREAK,
    EMPTY_LEDGER,
    FORMAT_VERSION,
    GENESIS,
    MALFORMED_LINE,
    MONO_REGRESSION,
    SEQ_GAP,
    TORN_TAIL,
    UNSUPPORTED_VERSION,
    ChainError,
    ChainVerifier,
    _common_field_problem,
)
from docket.ledger.reader import CHUNK, LEDGER_MAGIC, MAX_LINE_BYTES
from docket.tally import (
    COUNTERS,
    EVIDENCE_FIELDS,
    MAX_INT,
    PRICE_PATTERN,
    UNBACKED,
    Tally,
    TallyError,
    check_evidence,
)

FORMAT = "docket-receipt-1"

# Failure codes beyond the chain's (exit 1). The chain's are in docket.ledger.chain.
RECEIPT_MALFORMED = "receipt_malformed"
COUNT_MISMATCH = "count_mismatch"
HEAD_MISMATCH = "head_mismatch"
BYTES_MISMATCH = "bytes_mismatch"
MALFORMED_EVENT = "malformed_event"
EVIDENCE_MISMATCH = "evidence_mismatch"
RUN_MISMATCH = "run_mismatch"
DURATION_MISMATCH = "duration_mismatch"
EXIT_MISMATCH = "exit_mismatch"
TOTAL_MISMATCH = "total_mismatch"
PRICING_MISMATCH = "pricing_mismatch"
CAPS_MISMATCH = "caps_mismatch"
POLICY_MISMATCH = "policy_mismatch"
FAULTS_MISMATCH = "faults_mismatch"

# Input error codes (exit 2): verification could not start.
RECEIPT_UNREADABLE = "receipt_unreadable"
RECEIPT_NOT_JSON = "receipt_not_json"
NOT_A_RECEIPT = "not_a_receipt"
LEDGER_UNREADABLE = "ledger_unreadable"
NOT_A_LEDGER = "not_a_ledger"

# The claims after the ledger's own and the evidence, in the order they are checked.
CLAIM_CHECKS = (
    ("run_id", RUN_MISMATCH),
    ("docket_version", RUN_MISMATCH),
    ("started_at", RUN_MISMATCH),
    ("ended_at", RUN_MISMATCH),
    ("duration_ms", DURATION_MISMATCH),
    ("exit", EXIT_MISMATCH),
    ("totals", TOTAL_MISMATCH),
    ("pricing", PRICING_MISMATCH),
    ("caps", CAPS_MISMATCH),
    ("policy_digest", POLICY_MISMATCH),
    ("faults", FAULTS_MISMATCH),
)


class VerifyInputError(InputError):
    """Verification could not start: an input is missing, unreadable or not what it claims."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} ({code})")
        self.code = code


# ---------------------------------------------------------------- strict JSON

MAX_DEPTH = 64  # objects and arrays nested deeper than this are malformed


class AmbiguousJSON(ValueError):
    """Well-formed JSON that implementations read differently: refused all the same."""


def _object_pairs(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise AmbiguousJSON(f"duplicate key {key!r}")
            seen.add(key)
    return obj


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_pairs, parse_constant=_no_constant, parse_float=Decimal
)
_SCAN = _DECODER.scan_once


def _check_unicode(value: object) -> None:
    # A \u escape may leave a lone surrogate, which is not Unicode text.
    try:
        if type(value) is str:
            value.encode("utf-8")
        elif type(value) is dict:
            for k, v in value.items():
                k.encode("utf-8")
                _check_unicode(v)
        elif type(value) is list:
            for v in value:
                _check_unicode(v)
    except UnicodeEncodeError:
        raise ValueError("a \\u escape leaves a lone surrogate: not Unicode text") from None


def _depth(value: object) -> int:
    if type(value) is dict:
        return 1 + max(map(_depth, value.values()), default=0)
    if type(value) is list:
        return 1 + max(map(_depth, value), default=0)
    return 0


def decode_json_stdlib(data: bytes) -> object:
    """decode_json with the standard library's parser, made as strict (and slower)."""
    text = data.decode("utf-8")
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):  # rare: surrounding whitespace, or not JSON (raises with a position)
        value = _DECODER.decode(text)
    if b"\\u" in data:
        _check_unicode(value)
    return value


_decode = (
    decode_json_stdlib
    if jiter is None
    else functools.partial(
        jiter.from_json,
        allow_inf_nan=False,
        catch_duplicate_keys=True,
        cache_mode="keys",
        float_mode="decimal",
    )
)
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"
_sha256 = hashlib.sha256
_JITER_DUPLICATE = "duplicate key"  # how jiter words the refusal that is AmbiguousJSON


def decode_json(data: bytes) -> object:
    """One JSON value from UTF-8 bytes, refusing what implementations read differently.

    Raises ValueError for what is not JSON text: invalid UTF-8 (a byte-order
    mark included), a lone surrogate, NaN/Infinity, bad syntax; and its
    subclass AmbiguousJSON for JSON that readers disagree on: a key twice in
    one object, nesting deeper than MAX_DEPTH. Non-integer numbers are read as
    exact Decimals. JSON whitespace may surround the value. Uses jiter (fast,
    Rust) when it is installed, else the standard library's parser.
    """
    try:
        value = _decode(data)
    except (ValueError, RecursionError) as exc:
        raise _refusal(exc) from None
    if _too_deep(data, value):
        raise AmbiguousJSON(_TOO_DEEP)
    return value


def _refusal(exc: ValueError | RecursionError) -> ValueError:
    """The parser's refusal, as AmbiguousJSON when the text is JSON that readers disagree on."""
    if isinstance(exc, (RecursionError, AmbiguousJSON)):
        return exc if isinstance(exc, AmbiguousJSON) else AmbiguousJSON(_TOO_DEEP)
    message = str(exc)
    if "recursion limit" in message:  # jiter's own limit, deeper than ours
        return AmbiguousJSON(_TOO_DEEP)
    if _JITER_DUPLICATE in message:
        return AmbiguousJSON(message)
    return exc


def _too_deep(data: bytes, value: object) -> bool:
    # Only a text with that many brackets can nest that deep, and counting is cheap.
    if data.count(b"{") + data.count(b"[") <= MAX_DEPTH:
        return False
    try:
        return _depth(value) > MAX_DEPTH
    except RecursionError:
        return True


# ---------------------------------------------------------------- the chain


class StrictChainVerifier(ChainVerifier):
    """ChainVerifier's rules and failure codes, with strict JSON and a fast path.

    A line that holds passes on equality checks alone; one that does not is
    diagnosed in the reference order (malformed, version, seq, prev, mono).
    """

    __slots__ = ()

    def feed(self, line: bytes) -> dict:
        seq = self.count
        try:  # decode_json, inlined: this runs once per line
            event = _decode(line)
            if _too_deep(line, event):
                raise AmbiguousJSON(_TOO_DEEP)
        except (ValueError, RecursionError) as exc:
            detail = f"not a JSON line ({_refusal(exc)})"
            raise ChainError(MALFORMED_LINE, seq, self.offset, detail) from None
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
            self._diagnose(event, seq)
        self.count = seq + 1
        self.head = _sha256(line).hexdigest()
        self.offset += len(line) + 1
        self.last_mono_ms = event["mono_ms"]
        return event

    def _diagnose(self, event: object, seq: int) -> None:
        offset = self.offset
        problem = _common_field_problem(event)
        if problem is None and (event["seq"] > MAX_INT or event["mono_ms"] > MAX_INT):
            problem = "seq and mono_ms must be at most 2^53-1"
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


@dataclass
class LedgerScan:
    """What one pass over a ledger file found."""

    events: int = 0
    head: str = GENESIS
    size: int = 0  # bytes of complete lines
    last_offset: int | None = None  # where the last complete line starts
    mark_offset: int | None = None  # where line number `mark` starts, if the file has it
    chain_error: ChainError | None = None  # the first line that breaks the chain, or the torn tail
    event_error: ChainError | None = None  # the first event the tally could not read
    tally: Tally = field(default_factory=Tally)


def _too_long(verifier: ChainVerifier) -> ChainError:
    # Longer than any line the writer makes: not read, so memory stays bounded.
    detail = f"a line longer than {MAX_LINE_BYTES} bytes"
    return ChainError(MALFORMED_LINE, verifier.count, verifier.offset, detail)


def scan_ledger(path: str | os.PathLike, *, mark: int | None = None) -> LedgerScan:
    """Check the chain over the whole file and fold every event, in one pass.

    Stops at the first chain failure; an event the tally cannot read is noted
    (the first one) and the pass goes on, because the chain outranks it.
    Raises OSError if the file cannot be read.
    """
    scan = LedgerScan()
    verifier = StrictChainVerifier()
    feed, add = verifier.feed, scan.tally.add
    carry: list[bytes] = []  # the start of a line that has no newline yet
    carried = 0
    line = b""
    try:
        with open(path, "rb", buffering=0) as f:
            while block := f.read(CHUNK):
                parts = block.split(b"\n")
                if len(parts) == 1:
                    carry.append(block)
                    carried += len(block)
                    if carried > MAX_LINE_BYTES:
                        raise _too_long(verifier)
                    continue
                if carry:
                    if carried + len(parts[0]) > MAX_LINE_BYTES:
                        raise _too_long(verifier)
                    parts[0] = b"".join(carry) + parts[0]
                rest = parts.pop()
                carry, carried = ([rest], len(rest)) if rest else ([], 0)
                for line in parts:
                    if verifier.count == mark:
                        scan.mark_offset = verifier.offset
                    offset = verifier.offset
                    event = feed(line)
                    try:
                        add(event)
                    except TallyError as exc:
                        if scan.event_error is None:
                            scan.event_error = ChainError(
                                MALFORMED_EVENT, event["seq"], offset, str(exc)
                            )
        if carry:
            torn = sum(len(piece) for piece in carry)
            raise ChainError(
                TORN_TAIL,
                verifier.count,
                verifier.offset,
                f"the last {torn} bytes are a line with no newline",
            )
    except ChainError as exc:
        scan.chain_error = exc
    scan.events, scan.head, scan.size = verifier.count, verifier.head, verifier.offset
    if scan.chain_error is None and verifier.count:
        scan.last_offset = verifier.offset - len(line) - 1  # `line` is the last one fed
    return scan


# ---------------------------------------------------------------- the receipt's shape


def _str(v: object) -> str | None:
    return None if type(v) is str else "must be a string"


def _str_or_null(v: object) -> str | None:
    return None if v is None or type(v) is str else "must be a string or null"


def _count(v: object) -> str | None:
    ok = type(v) is int and 0 <= v <= MAX_INT
    return None if ok else "must be an integer from 0 to 2^53-1"


def _count_or_null(v: object) -> str | None:
    return None if v is None else _count(v)


def _int_or_null(v: object) -> str | None:
    ok = v is None or type(v) is int and abs(v) <= MAX_INT
    return None if ok else "must be an integer or null"


def _bool(v: object) -> str | None:
    return None if type(v) is bool else "must be true or false"


def _hex64(v: object) -> str | None:
    ok = type(v) is str and re.fullmatch(r"[0-9a-f]{64}", v) is not None
    return None if ok else "must be 64 lowercase hex digits"


def _usd(v: object) -> str | None:
    ok = type(v) is str and re.fullmatch(r"(0|[1-9][0-9]*)\.[0-9]{9}", v) is not None
    return None if ok else "must be a decimal string with 9 places"


def _price(v: object) -> str | None:
    ok = type(v) is str and PRICE_PATTERN.fullmatch(v) is not None
    return None if ok else "must be a decimal string with at most 3 decimals"


def _relative_path(v: object) -> str | None:
    ok = type(v) is str and v != "" and not v.startswith("/") and "\\" not in v
    return None if ok else "must be a relative path with / separators"


def _json_object(v: object) -> str | None:
    return None if type(v) is dict else "must be an object"


def _anything(v: object) -> str | None:
    return None


@dataclass(frozen=True)
class _MapOf:
    values: object


@dataclass(frozen=True)
class _ListOf:
    items: object


_COUNTER_SHAPE = dict.fromkeys(COUNTERS, _count) | {"usd": _usd}
_FIRST_CAP_SHAPE = {"cap": _str, "seq": _count, "limit": _anything, "observed": _anything}

RECEIPT_SHAPE = {
    "format": _str,
    "docket_version": _str,
    "run_id": _str,
    "started_at": _str,
    "ended_at": _str,
    "duration_ms": _count,
    "exit": {"status": _int_or_null, "reason": _str, "cap": _str_or_null},
    "ledger": {"file": _relative_path, "events": _count, "head": _hex64, "bytes": _count},
    "totals": _COUNTER_SHAPE | {"by_model": _MapOf(_COUNTER_SHAPE)},
    "pricing": {
        "table_date": _str_or_null,
        "provenance": _str_or_null,
        "unit_prices": _MapOf({"input": _price, "output": _price, "cached_input": _price}),
    },
    "caps": {
        "limits": _json_object,
        "warnings": _ListOf(_FIRST_CAP_SHAPE),
        "breaches": _ListOf(_FIRST_CAP_SHAPE),
    },
    "policy_digest": _str,
    "ops": {
        "evidence": {
            "ledger_complete": _bool,
            "unwritten_events": _count,
            "first_failing_seq": _count_or_null,
            "write_failures": _count,
        }
    },
    "faults": {"seed": _int_or_null, "injected": _count, "by_fault": _MapOf(_count)},
}

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _join(path: str, key: str | int) -> str:
    if type(key) is int:
        return f"{path}[{key}]"
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def shape_problem(value: object, shape: object, path: str = "") -> tuple[str, str] | None:
    """The first place where `value` departs from `shape`, as (path, problem)."""
    if isinstance(shape, dict):
        if type(value) is not dict:
            return path or "receipt", "must be an object"
        for key in sorted(value.keys() | shape.keys()):
            where = _join(path, key)
            if key not in value:
                return where, "is missing"
            if key not in shape:
                return where, "is not a field of " + FORMAT
            found = shape_problem(value[key], shape[key], where)
            if found:
                return found
        return None
    if isinstance(shape, _MapOf):
        if type(value) is not dict:
            return path, "must be an object"
        for key in sorted(value):
            found = shape_problem(value[key], shape.values, _join(path, key))
            if found:
                return found
        return None
    if isinstance(shape, _ListOf):
        if type(value) is not list:
            return path, "must be an array"
        for i, item in enumerate(value):
            found = shape_problem(item, shape.items, _join(path, i))
            if found:
                return found
        return None
    problem = shape(value)
    return (path, problem) if problem else None


# ---------------------------------------------------------------- building and writing


def build_receipt(
    tally: Tally,
    *,
    ledger_path: str | os.PathLike,
    head: str,
    count: int,
    size: int,
    evidence: dict,
    version: str,
    start: dict | None = None,
    end: dict | None = None,
    receipt_dir: str | os.PathLike | None = None,
) -> dict:
    """The receipt for a finished run, from the writer's tally and its own account.

    `count`, `head` and `size` are the ledger's durable events, last line hash
    and bytes; `evidence` is the writer's ops.evidence. If session.start or
    session.end could not be written, pass the event as it would have been as
    `start`/`end`: its claims then stand unbacked, and the evidence must say so.
    `ledger.file` is the ledger's path relative to `receipt_dir` (default: the
    receipt is written beside the ledger).
    """
    if count != tally.events:
        raise ValueError(f"count {count} is not the {tally.events} events the tally folded")
    claims = tally.to_claims(start=start, end=end)
    missing = [key for key, value in claims.items() if value is UNBACKED]
    if missing:
        raise ValueError(f"the ledger cannot supply {', '.join(missing)}: pass start= or end=")
    if claims["docket_version"] != version:
        raise ValueError(f"session.start says docket {claims['docket_version']}, not {version}")
    ledger_path = Path(ledger_path)
    file = (
        os.path.relpath(ledger_path, receipt_dir) if receipt_dir is not None else ledger_path.name
    )
    receipt = {
        "format": FORMAT,
        **claims,
        "ledger": {"file": Path(file).as_posix(), "events": count, "head": head, "bytes": size},
        "ops": {"evidence": check_evidence(evidence, "evidence")},
    }
    found = shape_problem(receipt, RECEIPT_SHAPE)
    if found:
        raise ValueError(f"receipt field {found[0]} {found[1]}")
    return receipt


def _plain_number(value: object) -> object:
    # A Decimal read from a ledger line, written back as a JSON number.
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def encode_receipt(receipt: dict) -> bytes:
    """Sorted keys, two-space indent, UTF-8, a trailing newline."""
    text = json.dumps(
        receipt,
        sort_keys=True,
        indent=2,
        ensure_ascii=False,
        allow_nan=False,
        default=_plain_number,
    )
    return (text + "\n").encode("utf-8")


def write_receipt(path: str | os.PathLike, receipt: dict) -> None:
    """Write atomically and durably: a temp file, fsync, rename over `path`, fsync the folder."""
    target = Path(path)
    folder = target.parent
    data = encode_receipt(receipt)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ---------------------------------------------------------------- verifying


@dataclass(frozen=True)
class Verdict:
    """The outcome of verify: ok, or the first failure; and what the ledger re-derives."""

    ok: bool
    code: str | None = None
    seq: int | None = None
    offset: int | None = None
    field: str | None = None  # the receipt field a claim failure is about
    detail: str = ""
    events: int | None = None
    head: str | None = None
    bytes: int | None = None
    claims: dict | None = None  # the re-derived claims (UNBACKED where the ledger cannot say)
    unbacked: tuple[str, ...] = ()
    complete: bool | None = None  # the receipt's ledger_complete, once checked

    def summary(self) -> str:
        if not self.ok:
            where = []
            if self.seq is not None:
                where.append(f"seq {self.seq}")
            if self.offset is not None:
                where.append(f"byte {self.offset}")
            at = f" at {', '.join(where)}" if where else ""
            return f"FAIL {self.code}{at}: {self.detail}"
        t = self.claims["totals"]
        line = (
            f"ok: {self.events} events, head {self.head}, {self.bytes} bytes; "
            f"{t['model_calls']} model calls, {t['input_tokens']} input + "
            f"{t['output_tokens']} output tokens, ${t['usd']}; "
            + ("ledger complete" if self.complete else "ledger incomplete (disclosed)")
        )
        if self.unbacked:
            line += f"; not backed by the ledger: {', '.join(self.unbacked)}"
        return line


def _failed(code: str, **kw: object) -> Verdict:
    return Verdict(ok=False, code=code, **kw)


def _show(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=_plain_number)
    return text if len(text) <= 80 else text[:77] + "..."


def first_difference(
    claimed: object, derived: object, path: str, unbacked: list[str]
) -> tuple[str, str] | None:
    """Compare a claim with its re-derivation: same JSON types and values, keys in code-point order.

    Returns (path, what differs) for the first difference. Paths whose derived
    value is UNBACKED are skipped and appended to `unbacked`.
    """
    if derived is UNBACKED:
        unbacked.append(path)
        return None
    if type(claimed) is dict and type(derived) is dict:
        for key in sorted(claimed.keys() | derived.keys()):
            where = _join(path, key)
            if key not in derived:
                return where, f"the receipt claims {_show(claimed[key])}; the ledger has none"
            if key not in claimed:
                return where, f"the receipt omits it; the ledger has {_show(derived[key])}"
            found = first_difference(claimed[key], derived[key], where, unbacked)
            if found:
                return found
        return None
    if type(claimed) is list and type(derived) is list:
        for i, (c, d) in enumerate(zip(claimed, derived, strict=False)):
            found = first_difference(c, d, _join(path, i), unbacked)
            if found:
                return found
        if len(claimed) != len(derived):
            n = min(len(claimed), len(derived))
            return _join(
                path, n
            ), f"the receipt lists {len(claimed)}, the ledger has {len(derived)}"
        return None
    if _same_scalar(claimed, derived):
        return None
    return path, f"the receipt says {_show(claimed)}, the ledger says {_show(derived)}"


_NUMBERS = (int, float, Decimal)


def _same_scalar(a: object, b: object) -> bool:
    # Numbers are equal when they denote the same value (1 and 1.0 alike); true is not 1.
    if type(a) in _NUMBERS and type(b) in _NUMBERS:
        return a == b
    return type(a) is type(b) and a == b


def evidence_problem(claimed: dict, tally: Tally, events: int) -> tuple[str, str] | None:
    """The first rule of spec section 7.4 that ops.evidence breaks, as (path, what), or None.

    ops.evidence is the writer's own count of what never reached the disk, so
    it cannot be re-derived; it must be consistent with what the ledger shows.
    """
    path = "ops.evidence"
    complete = claimed["ledger_complete"]
    unwritten = claimed["unwritten_events"]
    first = claimed["first_failing_seq"]
    failures = claimed["write_failures"]
    says = f"the receipt says {_show(complete)}"
    if complete != (unwritten == 0):
        return f"{path}.ledger_complete", f"{says} with {unwritten} unwritten events"
    if complete and failures:
        return f"{path}.write_failures", f"the receipt says {failures} with ledger_complete true"
    if complete and first is not None:
        return f"{path}.first_failing_seq", f"the receipt says {first} with ledger_complete true"
    if not complete and first is None:
        return f"{path}.first_failing_seq", "the receipt says null with ledger_complete false"
    if first is not None and first > events:
        return f"{path}.first_failing_seq", f"{first} is beyond the ledger's {events} events"
    if tally.end is not None:
        for key in EVIDENCE_FIELDS:
            ours, theirs = claimed[key], tally.end["evidence"][key]
            if ours != theirs:
                return (
                    f"{path}.{key}",
                    f"the receipt says {_show(ours)}, session.end {_show(theirs)}",
                )
    for event, present in (("session.start", tally.start), ("session.end", tally.end)):
        if complete and present is None:
            return f"{path}.ledger_complete", f"{says}, but the ledger has no {event}"
    if tally.gaps:
        if complete:
            return (
                f"{path}.ledger_complete",
                f"{says}, but the ledger has {tally.gaps} evidence.gap",
            )
        if unwritten < tally.lost:
            return (
                f"{path}.unwritten_events",
                f"the receipt says {unwritten}, below the {tally.lost} the evidence.gap events lost",
            )
        if first != tally.first_gap_seq:
            return (
                f"{path}.first_failing_seq",
                f"the receipt says {first}, the first evidence.gap {tally.first_gap_seq}",
            )
    return None


def load_receipt(path: str | os.PathLike) -> dict | Verdict:
    """The receipt as a JSON object, a receipt_malformed verdict, or VerifyInputError."""
    try:
        text = read_text(path, "receipt")
    except InputError as exc:
        raise VerifyInputError(RECEIPT_UNREADABLE, str(exc)) from None
    try:
        receipt = decode_json(text.encode("utf-8"))
    except AmbiguousJSON as exc:  # well-formed, but readers would disagree on it
        return _failed(RECEIPT_MALFORMED, detail=f"receipt: {exc}")
    except ValueError as exc:
        raise VerifyInputError(RECEIPT_NOT_JSON, f"receipt {path}: not JSON ({exc})") from None
    if type(receipt) is not dict or "format" not in receipt:
        raise VerifyInputError(
            NOT_A_RECEIPT, f'receipt {path}: not a docket receipt (no "format": "{FORMAT}")'
        )
    if receipt["format"] != FORMAT:
        raise VerifyInputError(
            NOT_A_RECEIPT,
            f"receipt {path}: format {_show(receipt['format'])} is not one this docket reads ({FORMAT})",
        )
    return receipt


def _check_ledger_file(path: Path) -> None:
    if path.is_file() and path.stat().st_size == 0:
        raise VerifyInputError(EMPTY_LEDGER, f"ledger {path}: is empty")
    try:
        existing_file(path, "ledger")
        with open(path, "rb") as f:
            magic = f.read(len(LEDGER_MAGIC))
    except InputError as exc:
        raise VerifyInputError(LEDGER_UNREADABLE, str(exc)) from None
    except OSError as exc:
        raise VerifyInputError(
            LEDGER_UNREADABLE, f"ledger {path}: cannot read ({exc.strerror})"
        ) from None
    if magic != LEDGER_MAGIC:
        raise VerifyInputError(
            NOT_A_LEDGER,
            f"ledger {path}: not a docket ledger (it does not begin with {LEDGER_MAGIC.decode()})",
        )


def verify(
    receipt_path: str | os.PathLike, ledger_path: str | os.PathLike | None = None
) -> Verdict:
    """Re-derive every claim of the receipt from the ledger; the first that fails, or ok.

    The ledger defaults to the one the receipt names, relative to the receipt's
    folder. Raises VerifyInputError (exit 2) when verification cannot start.
    """
    loaded = load_receipt(receipt_path)
    if isinstance(loaded, Verdict):
        return loaded
    receipt = loaded
    found = shape_problem(receipt, RECEIPT_SHAPE)
    if found:
        return _failed(RECEIPT_MALFORMED, field=found[0], detail=f"{found[0]} {found[1]}")
    claimed = receipt["ledger"]
    if ledger_path is None:
        ledger = Path(receipt_path).parent / claimed["file"]
    else:
        ledger = Path(ledger_path)
    _check_ledger_file(ledger)
    try:
        scan = scan_ledger(ledger, mark=claimed["events"])
    except OSError as exc:
        raise VerifyInputError(
            LEDGER_UNREADABLE, f"ledger {ledger}: cannot read ({exc.strerror})"
        ) from None
    figures = {"events": scan.events, "head": scan.head, "bytes": scan.size}

    error = scan.chain_error
    if error is not None:
        if error.seq == 0 and error.code in (MALFORMED_LINE, UNSUPPORTED_VERSION):
            raise VerifyInputError(
                NOT_A_LEDGER, f"ledger {ledger}: not a docket ledger (line 1: {error.detail})"
            )
        return _failed(
            error.code, seq=error.seq, offset=error.offset, detail=error.detail, **figures
        )
    if claimed["events"] != scan.events:
        if claimed["events"] < scan.events:
            seq, offset = claimed["events"], scan.mark_offset
        else:
            seq, offset = scan.events, scan.size
        return _failed(
            COUNT_MISMATCH,
            seq=seq,
            offset=offset,
            field="ledger.events",
            detail=f"the receipt says {claimed['events']} events, the ledger has {scan.events}",
            **figures,
        )
    if claimed["head"] != scan.head:
        return _failed(
            HEAD_MISMATCH,
            seq=scan.events - 1,
            offset=scan.last_offset,
            field="ledger.head",
            detail=f"the receipt says head {claimed['head']}, the last line hashes to {scan.head}",
            **figures,
        )
    if claimed["bytes"] != scan.size:
        return _failed(
            BYTES_MISMATCH,
            field="ledger.bytes",
            detail=f"the receipt says {claimed['bytes']} bytes, the ledger has {scan.size}",
            **figures,
        )
    error = scan.event_error
    if error is not None:
        return _failed(
            error.code, seq=error.seq, offset=error.offset, detail=error.detail, **figures
        )
    found = evidence_problem(receipt["ops"]["evidence"], scan.tally, scan.events)
    if found:
        return _failed(
            EVIDENCE_MISMATCH, field=found[0], detail=f"{found[0]}: {found[1]}", **figures
        )
    claims = scan.tally.to_claims()
    unbacked: list[str] = []
    for key, code in CLAIM_CHECKS:
        found = first_difference(receipt[key], claims[key], key, unbacked)
        if found:
            return _failed(code, field=found[0], detail=f"{found[0]}: {found[1]}", **figures)
    return Verdict(
        ok=True,
        claims=claims,
        unbacked=tuple(unbacked),
        complete=receipt["ops"]["evidence"]["ledger_complete"],
        **figures,
    )


def verify_command(receipt_path: str, ledger_path: str | None) -> int:
    """`docket verify`: one line on stdout, exit 0 if every claim holds, else 1."""
    verdict = verify(receipt_path, ledger_path)
    print(verdict.summary())
    return EXIT_OK if verdict.ok else EXIT_CHECK_FAILED
