"""`docket verify`: re-derive each claim of a receipt from its ledger, or name the first that fails.

spec/docket-receipt-1.md section 8 is the normative text. Verification is a
fixed sequence of checks and names the first that fails: the receipt's shape,
the chain over the whole file, the ledger's count, head and size, the events'
contents, the evidence, a call left open in a ledger said to be complete (a
model.request with no closing event), then every claim in the order of CLAIMS,
the one table both the comparison and `docket verify --json`'s `claims` read.
Nothing here writes to a ledger.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, InputError
from docket.inputs import existing_file, read_text
from docket.ledger.chain import (
    EMPTY_LEDGER,
    GENESIS,
    MALFORMED_LINE,
    TORN_TAIL,
    UNSUPPORTED_VERSION,
    ChainError,
    ChainVerifier,
)
from docket.ledger.reader import LEDGER_MAGIC, Lines, LineTooLong
from docket.ledger.strict_json import AmbiguousJSON, decode_json
from docket.receipts.json_syntax import json_syntax_problem
from docket.receipts.receipt import (
    FORMAT,
    NO_CACHE,
    RECEIPT_SHAPE,
    join_path,
    plain_number,
    shape_problem,
)
from docket.receipts.tally import (
    EVIDENCE_EXTRA,
    EVIDENCE_FIELDS,
    OPTIONAL_CLAIMS,
    UNBACKED,
    Tally,
    TallyError,
)

__all__ = [
    "BYTES_MISMATCH",
    "CAPS_MISMATCH",
    "CLAIMS",
    "CLIENT_RETRIES_MISMATCH",
    "COUNT_MISMATCH",
    "DURATION_MISMATCH",
    "EVIDENCE_MISMATCH",
    "EXIT_MISMATCH",
    "FAULTS_MISMATCH",
    "HEAD_MISMATCH",
    "LEDGER_UNREADABLE",
    "MALFORMED_EVENT",
    "NOT_A_LEDGER",
    "NOT_A_RECEIPT",
    "OPEN_CALL",
    "POLICY_MISMATCH",
    "PRICING_MISMATCH",
    "RECEIPT_MALFORMED",
    "RECEIPT_NOT_JSON",
    "RECEIPT_UNREADABLE",
    "RUN_MISMATCH",
    "TOTAL_MISMATCH",
    "Claim",
    "LedgerScan",
    "Verdict",
    "VerifyInputError",
    "claim_problem",
    "derive_claims",
    "evidence_problem",
    "first_difference",
    "load_receipt",
    "open_calls_problem",
    "scan_ledger",
    "verify",
    "verify_command",
]

# Failure codes beyond the chain's (exit 1). The chain's are in docket.ledger.chain.
RECEIPT_MALFORMED = "receipt_malformed"
COUNT_MISMATCH = "count_mismatch"
HEAD_MISMATCH = "head_mismatch"
BYTES_MISMATCH = "bytes_mismatch"
MALFORMED_EVENT = "malformed_event"
EVIDENCE_MISMATCH = "evidence_mismatch"
OPEN_CALL = "open_call"
RUN_MISMATCH = "run_mismatch"
DURATION_MISMATCH = "duration_mismatch"
EXIT_MISMATCH = "exit_mismatch"
TOTAL_MISMATCH = "total_mismatch"
PRICING_MISMATCH = "pricing_mismatch"
CAPS_MISMATCH = "caps_mismatch"
POLICY_MISMATCH = "policy_mismatch"
FAULTS_MISMATCH = "faults_mismatch"
CLIENT_RETRIES_MISMATCH = "client_retries_mismatch"
# ops.client_retries when the receipt omits it (spec section 7.6): no request was marked.
NO_CLIENT_RETRIES = {"marked": 0, "retries": 0, "by_attempt": {}}
SNAPSHOT_MISMATCH = "snapshot_mismatch"
CACHE_MISMATCH = "cache_mismatch"
REPLAY_MISMATCH = "replay_mismatch"
FLEET_MISMATCH = "fleet_mismatch"

# Input error codes (exit 2): verification could not start.
RECEIPT_UNREADABLE = "receipt_unreadable"
RECEIPT_NOT_JSON = "receipt_not_json"
NOT_A_RECEIPT = "not_a_receipt"
LEDGER_UNREADABLE = "ledger_unreadable"
NOT_A_LEDGER = "not_a_ledger"

# What a receipt without an optional claim states is the claim's `absent`; REQUIRED: the
# receipt's shape requires the member, so it is always stated.
REQUIRED: Any = object()


@dataclass(frozen=True)
class Claim:
    """One claim verify re-derives from the ledger and compares with the receipt's."""

    path: str  # where the receipt states it; its name in verify --json's `claims`
    code: str  # the failure when the receipt's and the ledger's differ
    absent: Any = REQUIRED  # what a receipt without the member states (spec sections 7.5-7.10)
    # Backed by session.start alone (spec 7.9, 7.10): without a session.start it is unbacked
    # when the receipt states it, and nothing is claimed when the receipt does not.
    start_only: bool = False


# Every claim verify re-derives and compares, in the order it compares them (spec section 8,
# the list of step 11, then step 12): the comparison walks this table, and verify --json's
# `claims` is keyed by these paths in this order. The ledger's own events, head and bytes
# (steps 6-8) are the verdict's figures; ops.evidence (step 10) is the writer's disclosure,
# held to the ledger but not derived from it.
CLAIMS = (
    Claim("ops.open_calls", OPEN_CALL, absent=[]),
    Claim("run_id", RUN_MISMATCH),
    Claim("docket_version", RUN_MISMATCH),
    Claim("started_at", RUN_MISMATCH),
    Claim("ended_at", RUN_MISMATCH),
    Claim("duration_ms", DURATION_MISMATCH),
    Claim("exit", EXIT_MISMATCH),
    Claim("totals", TOTAL_MISMATCH),
    Claim("pricing", PRICING_MISMATCH),
    Claim("caps", CAPS_MISMATCH),
    Claim("policy_digest", POLICY_MISMATCH),
    Claim("faults", FAULTS_MISMATCH),
    Claim("ops.client_retries", CLIENT_RETRIES_MISMATCH, absent=NO_CLIENT_RETRIES),
    Claim("snapshot", SNAPSHOT_MISMATCH, absent=[]),
    Claim("ops.cache", CACHE_MISMATCH, absent=NO_CACHE),
    Claim("replay_of", REPLAY_MISMATCH, absent=None, start_only=True),
    Claim("fleet", FLEET_MISMATCH, absent=None, start_only=True),
)


class VerifyInputError(InputError):
    """Verification could not start: an input is missing, unreadable or not what it claims."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{message} ({code})")
        self.code = code


# ---------------------------------------------------------------- the ledger


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
    stopped: bool = False  # `stop_at` lines were read and the file goes on


def _until(lines: Lines, verifier: ChainVerifier, stop_at: int | None):
    """The file's lines, up to `stop_at` of them: the line after is never read, so
    a line past the limit (or a torn one) there cannot fail the pass."""
    if verifier.count == stop_at:
        return
    for line in lines:
        yield line
        if verifier.count == stop_at:
            return


def scan_ledger(
    path: str | os.PathLike, *, mark: int | None = None, stop_at: int | None = None
) -> LedgerScan:
    """Check the chain over the whole file and fold every event, in one pass.

    Stops at the first chain failure; an event the tally cannot read is noted
    (the first one) and the pass goes on, because the chain outranks it.
    `stop_at`: read only that many lines (a receipt that discloses an
    unverified tail vouches for no more). Raises OSError if the file cannot be read.
    """
    scan = LedgerScan()
    verifier = ChainVerifier(exact=True)  # claims are compared by exact decimal value
    feed, add = verifier.feed, scan.tally.add
    lines = Lines(path)
    line = b""
    try:
        for line in _until(lines, verifier, stop_at):
            if verifier.count == mark:
                scan.mark_offset = verifier.offset
            offset = verifier.offset
            event = feed(line)
            try:
                add(event)
            except TallyError as exc:
                if scan.event_error is None:
                    scan.event_error = ChainError(MALFORMED_EVENT, event["seq"], offset, str(exc))
        # What follows `stop_at` lines is not read at all (spec section 8, step 5):
        # whole lines, a torn tail (the likeliest: a failed write) or a huge line.
        scan.stopped = verifier.count == stop_at and os.path.getsize(path) > verifier.offset
        if lines.tail and verifier.count != stop_at:
            raise ChainError(
                TORN_TAIL,
                verifier.count,
                verifier.offset,
                f"the last {len(lines.tail)} bytes are a line with no newline",
            )
    except LineTooLong as exc:
        scan.chain_error = ChainError(MALFORMED_LINE, verifier.count, exc.offset, str(exc))
    except ChainError as exc:
        scan.chain_error = exc
    scan.events, scan.head, scan.size = verifier.count, verifier.head, verifier.offset
    if scan.chain_error is None and verifier.count:
        scan.last_offset = verifier.offset - len(line) - 1  # `line` is the last one fed
    return scan


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
    # The re-derived claims, keyed by CLAIMS' paths in its order (UNBACKED where the ledger
    # cannot say): what `docket verify --json` prints as `claims`.
    claims: dict | None = None
    unbacked: tuple[str, ...] = ()
    complete: bool | None = None  # the receipt's ledger_complete, once checked
    tail_bytes: int = 0  # bytes past the record, disclosed as a failed write's (unverified_tail)

    def summary(self) -> str:
        if not self.ok:
            where = []
            if self.seq is not None:
                where.append(f"seq {self.seq}")
            if self.offset is not None:
                where.append(f"byte {self.offset}")
            at = f" at {', '.join(where)}" if where else ""
            return f"FAIL {self.code}{at}: {self.detail}"
        assert self.claims is not None  # an ok verdict carries what it re-derived
        t = self.claims["totals"]
        line = (
            f"ok: {self.events} events, head {self.head}, {self.bytes} bytes; "
            f"{t['model_calls']} model calls, {t['input_tokens']} input + "
            f"{t['output_tokens']} output tokens, ${t['usd']}; "
            + ("ledger complete" if self.complete else "ledger incomplete (disclosed)")
        )
        if self.tail_bytes:
            line += (
                f"; {self.tail_bytes} bytes past the record, from a write that failed and "
                "could not be cut back (disclosed, not verified)"
            )
        if self.unbacked:
            line += f"; not backed by the ledger: {', '.join(self.unbacked)}"
        return line


def _failed(code: str, **kw: Any) -> Verdict:
    return Verdict(ok=False, code=code, **kw)


def _show(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=plain_number)
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
            where = join_path(path, key)
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
            found = first_difference(c, d, join_path(path, i), unbacked)
            if found:
                return found
        if len(claimed) != len(derived):
            n = min(len(claimed), len(derived))
            return join_path(
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
    if complete and claimed.get("unverified_tail", False):
        return f"{path}.unverified_tail", "the receipt says true with ledger_complete true"
    by_type = claimed.get("unwritten_by_type")
    if by_type is not None and sum(by_type.values()) != unwritten:
        return (
            f"{path}.unwritten_by_type",
            f"the receipt's types add up to {sum(by_type.values())}, not its {unwritten} "
            "unwritten events",
        )
    unrecorded = claimed.get("unrecorded_calls", 0)
    if complete and unrecorded:
        return (
            f"{path}.unrecorded_calls",
            f"the receipt says {unrecorded} with ledger_complete true",
        )
    if unrecorded > unwritten:
        # Each such call lost at least its model.request.
        return (
            f"{path}.unrecorded_calls",
            f"the receipt says {unrecorded}, above its {unwritten} unwritten events",
        )
    if tally.end is not None:
        said = tally.end["evidence"]
        for key in (*EVIDENCE_FIELDS, *EVIDENCE_EXTRA):
            if key not in said and key in EVIDENCE_EXTRA:
                continue  # a session.end from before the field: nothing to hold it to
            if key not in claimed:
                return f"{path}.{key}", f"the receipt omits it; session.end says {_show(said[key])}"
            ours, theirs = claimed[key], said[key]
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


def open_calls_problem(receipt: dict, tally: Tally) -> tuple[int, str, str] | None:
    """A call left open in a ledger the receipt says is complete (spec section 7.5, rule 1),
    as (seq, path, what), or None. Rule 2 (ops.open_calls is the derived list) is the first
    comparison of CLAIMS.

    Every model.request gets exactly one closing event while the recorder runs; a
    call still open where the ledger ends is evidence lost (the closing event
    unwritten, or the run killed), which only an incomplete ledger may show.
    """
    derived = tally.open_calls()
    if derived and receipt["ops"]["evidence"]["ledger_complete"]:
        first = derived[0]
        return (
            first["seq"],
            "ops.open_calls",
            f"call {_show(first['call_id'])} (model.request at seq {first['seq']}) has no "
            "closing event, and the receipt says the ledger is complete",
        )
    return None


def derive_claims(tally: Tally) -> dict[str, Any]:
    """Each claim of CLAIMS as the ledger says it, keyed by its path, in CLAIMS' order
    (spec section 7); UNBACKED where the ledger cannot say. The optional claims of
    section 6.5 are all there, whether or not a receipt makes them."""
    derived = tally.to_claims() | {
        "ops.open_calls": tally.open_calls(),
        "ops.client_retries": tally.client_retries(),
        "snapshot": tally.snapshot.claims() or [],
        "ops.cache": tally.cache(),
        "replay_of": tally.replay_of(),
        "fleet": tally.fleet_claims(),
    }
    return {claim.path: derived[claim.path] for claim in CLAIMS}


def claim_problem(
    claim: Claim, receipt: dict, derived: object, unbacked: list[str]
) -> tuple[str, str] | None:
    """The first difference between what the receipt states for `claim` and `derived`,
    as (path, what), or None; unbacked paths skipped and appended to `unbacked`."""
    *parents, name = claim.path.split(".")
    holder = receipt
    for parent in parents:
        holder = holder[parent]  # the shape check saw every parent (ops) there
    if name in holder or claim.absent is REQUIRED:
        stated = holder[name]
    elif claim.start_only and derived is UNBACKED:
        return None  # no session.start, and the receipt claims nothing: nothing to hold
    else:
        stated = claim.absent
    return first_difference(stated, derived, claim.path, unbacked)


def load_receipt(path: str | os.PathLike) -> dict | Verdict:
    """The receipt as a JSON object, a receipt_malformed verdict, or VerifyInputError."""
    try:
        text = read_text(path, "receipt")
    except InputError as exc:
        raise VerifyInputError(RECEIPT_UNREADABLE, str(exc)) from None
    data = text.encode("utf-8")
    try:
        receipt = decode_json(data)
    except AmbiguousJSON as exc:
        # The reader stopped at a duplicate name or its depth limit, before the end:
        # whether the text is JSON is decided over all of it (section 8, step 2).
        problem = json_syntax_problem(data)
        if problem is not None:
            raise VerifyInputError(
                RECEIPT_NOT_JSON, f"receipt {path}: not JSON ({problem})"
            ) from None
        return _failed(RECEIPT_MALFORMED, detail=f"receipt: {exc}")  # JSON readers disagree on
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
    # A receipt that discloses an unverified tail vouches for its events only: the
    # lines after them (a failed write the writer could not cut back) are not read.
    tail = receipt["ops"]["evidence"].get("unverified_tail") is True
    try:
        scan = scan_ledger(
            ledger, mark=claimed["events"], stop_at=claimed["events"] if tail else None
        )
        tail_bytes = os.stat(ledger).st_size - scan.size if scan.stopped else 0
    except OSError as exc:
        raise VerifyInputError(
            LEDGER_UNREADABLE, f"ledger {ledger}: cannot read ({exc.strerror})"
        ) from None
    figures: dict[str, Any] = {"events": scan.events, "head": scan.head, "bytes": scan.size}

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
            seq=scan.events - 1 if scan.events else None,  # no line read: no line to name
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
    open_call = open_calls_problem(receipt, scan.tally)
    if open_call:
        seq, where, what = open_call
        return _failed(OPEN_CALL, seq=seq, field=where, detail=f"{where}: {what}", **figures)
    claims = derive_claims(scan.tally)
    compared = _as_claimed(receipt, claims)
    unbacked: list[str] = []
    for claim in CLAIMS:
        found = claim_problem(claim, receipt, compared[claim.path], unbacked)
        if found:
            return _failed(claim.code, field=found[0], detail=f"{found[0]}: {found[1]}", **figures)
    return Verdict(
        ok=True,
        claims=claims,
        unbacked=tuple(unbacked),
        complete=receipt["ops"]["evidence"]["ledger_complete"],
        tail_bytes=tail_bytes,
        **figures,
    )


def _as_claimed(receipt: dict, claims: dict) -> dict:
    """The derived claims less the optional ones the receipt does not make (spec section
    6.5: absent, such a claim is not made, and a receipt from before it still verifies)."""
    omitted = [(p, m) for p, m in OPTIONAL_CLAIMS if m not in receipt[p]]
    if not omitted:
        return claims
    out = dict(claims)
    for parent, member in omitted:
        if type(out[parent]) is dict:  # an unbacked parent is skipped whole
            out[parent] = {k: v for k, v in out[parent].items() if k != member}
    return out


def verify_command(receipt_path: str, ledger_path: str | None) -> int:
    """`docket verify`: one line on stdout, exit 0 if every claim holds, else 1."""
    verdict = verify(receipt_path, ledger_path)
    print(verdict.summary())
    return EXIT_OK if verdict.ok else EXIT_CHECK_FAILED
