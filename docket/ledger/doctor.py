"""`docket doctor`: say what state a ledger is in, without guessing, and repair a torn tail.

A ledger is one of: clean; a torn tail; a corrupt line, a chain break, a seq gap
or a mono_ms regression (each at a seq and a byte offset, with the codes verify
uses); and, whatever else is true, locked by a live writer.

A torn tail is the last line, without its newline, after a prefix that verifies,
whose bytes are a cut-short copy of the line the writer would write next: they
agree with its fixed start (`{"v":1,"seq":N,"ts":"`) as far as they go, and if
they happen to be a whole event, it verifies. A partial write can cut anywhere,
even just before the newline; such a line is still torn, because a line counts
only once its newline is on disk. An incomplete last line that fails those tests
is a corrupt line, not a torn one: it is not what this writer could have left.

`--quarantine-torn-tail` copies the torn bytes to `LEDGER.torn-<offset>` and the
verified prefix to `LEDGER.repaired`, each written to a temporary file, fsynced
and linked into place (link, unlike rename, refuses to replace an existing
file), then the folder is fsynced. The original is never changed. An output that
already exists with the same bytes is left alone, so a second run is a no-op; one
that exists with different bytes is never overwritten: the run refuses (exit 1)
and names it. Only a torn tail is quarantined, and never while a writer holds
the ledger.

Whatever the chain's state, doctor also says what it can know of the evidence:
from the file, the evidence.gap records (events lost while it was written),
evidence.low_disk records, and whether the run's session.end is there and calls
its record complete; from the receipt beside it (receipt.json naming this file),
the writer's own ops.evidence. A ledger whose chain is clean but whose run lost
evidence is never called "clean" in the summary, and doctor exits 1: the JSON
`verdict` stays the chain's, with `evidence.complete` (true, false, or null
when nothing says: a run killed before its end, or one whose end was lost
with its receipt) beside it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, CheckFailed, DocketError, InputError
from docket.inputs import existing_file
from docket.ledger.chain import (
    CHAIN_BREAK,
    FORMAT_VERSION,
    GENESIS,
    MALFORMED_LINE,
    MONO_REGRESSION,
    SEQ_GAP,
    TORN_TAIL,
    UNSUPPORTED_VERSION,
    ChainError,
    ChainVerifier,
)
from docket.ledger.evidence_facts import EvidenceFacts, evidence_lines, receipt_evidence
from docket.ledger.lock import holder_pid
from docket.ledger.reader import (
    CHUNK,
    LEDGER_MAGIC,
    Line,
    LineTooLong,
    iter_lines,
    starts_like_ledger,
)
from docket.ledger.strict_json import TOO_DEEP, text_nests_deeper

CLEAN = "clean"

LABELS = {
    CLEAN: "clean",
    TORN_TAIL: "torn tail",
    MALFORMED_LINE: "corrupt line",
    CHAIN_BREAK: "chain break",
    SEQ_GAP: "seq gap",
    MONO_REGRESSION: "mono_ms regression",
    UNSUPPORTED_VERSION: "unsupported version",
}


@dataclass(frozen=True)
class Tail:
    """The incomplete last line: bytes after the last newline."""

    offset: int
    length: int
    whole_event: bool  # the bytes are one whole event that verifies, missing only its newline


@dataclass(frozen=True)
class Scan:
    """What the lines of a ledger say, before the file's own facts are added."""

    state: str  # CLEAN or one of the chain's failure codes
    events: int  # lines that verify, from the first, before any problem
    head: str  # hash of the last of them (GENESIS if none)
    verified_bytes: int  # length of that verified prefix, newlines included
    lines: int  # complete lines in the file
    problem: ChainError | None  # the first thing that does not hold
    tail: Tail | None
    # (call_id, seq) of each model.request in the verified prefix that no closing
    # event follows: the calls in flight where the ledger ends (a killed run's).
    open_calls: tuple[tuple[str, int], ...] = ()
    evidence: dict[str, Any] | None = (
        None  # what the verified events say of the record's completeness
    )


@dataclass(frozen=True)
class Diagnosis:
    """doctor's verdict on one ledger file (the API game-day assertions read)."""

    path: str
    size: int
    state: str
    events: int
    head: str
    verified_bytes: int
    lines: int
    problem: ChainError | None
    tail: Tail | None
    locked: bool  # a live writer holds the ledger's lock
    locked_by: int | None  # its pid, when it has written one
    open_calls: tuple[tuple[str, int], ...] = ()  # see Scan
    evidence: dict[str, Any] | None = None  # EvidenceFacts.as_dict(), with the receipt's word

    @property
    def verdict(self) -> str:
        return "locked" if self.locked else self.state

    @property
    def evidence_lost(self) -> bool:
        return self.evidence is not None and self.evidence["complete"] is False

    @property
    def exit_code(self) -> int:
        ok = self.verdict == CLEAN and not self.evidence_lost
        return EXIT_OK if ok else EXIT_CHECK_FAILED

    def to_json(self) -> dict[str, Any]:
        problem = self.problem
        return {
            "path": self.path,
            "verdict": self.verdict,
            "state": self.state,
            "size": self.size,
            "events": self.events,
            "head": self.head,
            "verified_bytes": self.verified_bytes,
            "lines": self.lines,
            "problem": None
            if problem is None
            else {
                "code": problem.code,
                "seq": problem.seq,
                "offset": problem.offset,
                "detail": problem.detail,
            },
            "tail": None
            if self.tail is None
            else {
                "offset": self.tail.offset,
                "length": self.tail.length,
                "whole_event": self.tail.whole_event,
            },
            "locked": self.locked,
            "locked_by": self.locked_by,
            "open_calls": [{"call_id": c, "seq": seq} for c, seq in self.open_calls],
            "evidence": self.evidence,
            "exit_code": self.exit_code,
        }


def scan_lines(lines: Iterable[Line]) -> Scan:
    """Classify a ledger from its lines (reader.iter_lines' contract); no I/O of its own."""
    verifier = ChainVerifier()
    facts = EvidenceFacts()
    problem: ChainError | None = None
    tail: Tail | None = None
    complete = 0
    open_calls: dict[str, int] = {}
    try:
        for line in lines:
            if not line.complete:
                tail, tail_problem = _judge_tail(verifier, line)
                problem = problem or tail_problem
                break
            complete += 1
            if problem is None:
                try:
                    event = verifier.feed(line.data)
                    _pair(event, open_calls)
                    facts.add(event)
                except ChainError as exc:
                    # Keep reading: the line count and the tail are still worth reporting.
                    problem = exc
            else:
                facts.past_the_break(line.data)
    except LineTooLong as exc:
        problem = problem or ChainError(MALFORMED_LINE, verifier.count, exc.offset, str(exc))
    return Scan(
        state=problem.code if problem else CLEAN,
        events=verifier.count,
        head=verifier.head,
        verified_bytes=verifier.offset,
        lines=complete,
        problem=problem,
        tail=tail,
        open_calls=tuple(open_calls.items()),
        evidence=facts.as_dict(),
    )


def _pair(event: dict[str, Any], open_calls: dict[str, int]) -> None:
    """Follow which calls are open: a model.request opens its call_id, its
    model.response or model.error closes it (spec section 7.5)."""
    kind, call_id = event["type"], event.get("call_id")
    if type(call_id) is not str:
        return
    if kind == "model.request":
        open_calls.setdefault(call_id, event["seq"])
    elif kind in ("model.response", "model.error"):
        open_calls.pop(call_id, None)


def _judge_tail(verifier: ChainVerifier, line: Line) -> tuple[Tail, ChainError]:
    """Is this incomplete last line a torn copy of the next event, or something else?"""
    seq, data = verifier.count, line.data
    expected = f'{{"v":{FORMAT_VERSION},"seq":{seq},"ts":"'.encode()
    n = min(len(data), len(expected))
    if data[:n] != expected[:n]:
        return Tail(line.offset, len(data), False), ChainError(
            MALFORMED_LINE,
            seq,
            line.offset,
            f"the last line has no newline and is not the start of event {seq} "
            f"(it should begin {expected.decode()})",
        )
    if text_nests_deeper(data):
        return Tail(line.offset, len(data), False), ChainError(
            MALFORMED_LINE,
            seq,
            line.offset,
            f"the last line has no newline, and is {TOO_DEEP}: not a line the writer makes",
        )
    # No proper prefix of a JSON object is JSON (its closing brace comes last), so
    # bytes that parse are the whole line, cut just before its newline: then the
    # event must verify, or this is not the line the writer was writing. Whether
    # the bytes are whole is asked leniently (json.loads takes NaN or a key twice,
    # and nesting is bounded above, so its stack is safe); whether the event is
    # strict JSON is the verifier's question.
    try:
        json.loads(data)
        whole_event = True
    except ValueError:
        whole_event = False
    if whole_event:
        try:
            verifier.copy().feed(data)
        except ChainError as exc:
            return Tail(line.offset, len(data), False), ChainError(
                exc.code, seq, line.offset, f"the last line has no newline, and {exc.detail}"
            )
        detail = (
            f"the last {len(data)} bytes are a whole event that verifies but has no "
            "newline: a line counts only once its newline is on disk"
        )
    else:
        detail = f"the last {len(data)} bytes have no newline: a write cut short"
    return Tail(line.offset, len(data), whole_event), ChainError(
        TORN_TAIL, seq, line.offset, detail
    )


def classify(path: str | os.PathLike[str]) -> Diagnosis:
    """Read a ledger and say what state it is in. InputError if it is not a ledger at all.

    Safe beside a live writer: it only reads, and the writer only appends whole
    lines, so what is read is a prefix of the ledger as it grows.
    """
    p = existing_file(path, "ledger")
    if not starts_like_ledger(p):
        raise InputError(
            f"ledger {p}: not a docket ledger (it does not begin with {LEDGER_MAGIC.decode()})"
        )
    pid_before = holder_pid(p)
    scan = scan_lines(iter_lines(p))
    size = p.stat().st_size
    # A writer that started while we read counts too: report the lock either way.
    pid = pid_before if pid_before is not None else holder_pid(p)
    problem = scan.problem
    if (
        problem is not None
        and problem.offset == 0
        and problem.code in (MALFORMED_LINE, UNSUPPORTED_VERSION)
    ):
        raise InputError(
            f"ledger {p}: not a docket ledger: its first line is not a ledger line ({problem.detail})"
        )
    evidence = dict(scan.evidence) if scan.evidence is not None else None
    if evidence is not None:
        said = receipt_evidence(p)
        evidence["receipt"] = said
        if said is not None and said.get("ledger_complete") is False:
            evidence["complete"] = False
    return Diagnosis(
        path=str(p),
        size=size,
        state=scan.state,
        events=scan.events,
        head=scan.head,
        verified_bytes=scan.verified_bytes,
        lines=scan.lines,
        problem=problem,
        tail=scan.tail,
        locked=pid is not None,
        locked_by=pid if pid is not None and pid > 0 else None,
        open_calls=scan.open_calls,
        evidence=evidence,
    )


# --- quarantine ---------------------------------------------------------------


@dataclass(frozen=True)
class Quarantine:
    torn_path: Path
    repaired_path: Path
    torn_written: bool  # False: it was already there, byte for byte
    repaired_written: bool
    repaired: Diagnosis  # the repaired ledger, read back from disk


def torn_sidecar(ledger: str | os.PathLike[str], offset: int) -> Path:
    return Path(f"{os.fspath(ledger)}.torn-{offset}")


def repaired_path(ledger: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(ledger)}.repaired")


def quarantine_torn_tail(diag: Diagnosis) -> Quarantine:
    """Set a torn tail aside and write the verified prefix beside the original.

    Raises CheckFailed, naming the reason, for anything but an unlocked torn tail
    after at least one whole event, and if an output exists with other bytes.
    """
    ledger = Path(diag.path)
    if diag.locked:
        who = f"pid {diag.locked_by}" if diag.locked_by else "a live writer"
        raise CheckFailed(
            f"refusing to quarantine {ledger}: it is locked by {who}, so a short last line "
            "may be a write in progress; stop the writer first"
        )
    if diag.state != TORN_TAIL or diag.tail is None or diag.problem is None:
        raise CheckFailed(
            f"refusing to quarantine {ledger}: it has a {_where(diag.problem)}, not a torn "
            "tail; only a torn tail is set aside, other damage is evidence to keep as it is"
        )
    if diag.events == 0:
        raise CheckFailed(
            f"refusing to quarantine {ledger}: the torn line is its only line, "
            "so there is no readable prefix to keep"
        )
    tail = diag.tail
    fd = os.open(ledger, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pid = holder_pid(ledger)
        if pid is not None:
            raise CheckFailed(
                f"refusing to quarantine {ledger}: a writer (pid {pid}) took it while doctor "
                "read it"
            )
        st = os.fstat(fd)
        now, mode = st.st_size, st.st_mode & 0o777
        if now != diag.size or tail.offset + tail.length != now:
            raise CheckFailed(
                f"refusing to quarantine {ledger}: it changed while doctor read it "
                f"({diag.size} bytes, now {now}); is a writer running?"
            )
        torn = os.pread(fd, tail.length, tail.offset)
        torn_path, fixed = torn_sidecar(ledger, tail.offset), repaired_path(ledger)
        same_torn = _same_bytes(torn)
        same_prefix = lambda existing: _same_prefix(existing, fd, tail.offset)  # noqa: E731
        # Refuse before writing anything, so a refusal leaves the folder as it was.
        for path, same in ((torn_path, same_torn), (fixed, same_prefix)):
            if path.exists():
                _keep_existing(path, same)
        torn_written = _publish(torn_path, mode, lambda out: _write_all(out, torn), same_torn)
        repaired_written = _publish(
            fixed, mode, lambda out: _copy_range(fd, out, tail.offset), same_prefix
        )
    finally:
        os.close(fd)
    repaired = classify(fixed)
    if repaired.verdict != CLEAN or (repaired.events, repaired.head) != (diag.events, diag.head):
        raise CheckFailed(
            f"{fixed} does not read back as the verified prefix "
            f"({repaired.verdict}, {repaired.events} events, head {repaired.head})"
        )
    return Quarantine(torn_path, fixed, torn_written, repaired_written, repaired)


def _publish(
    final: Path, mode: int, write: Callable[[int], None], same: Callable[[Path], bool]
) -> bool:
    """Create `final` (with the ledger's `mode`) durably with what `write(fd)` writes,
    unless it exists with the same bytes (`same(path)`): True if written, False if
    already there."""
    if final.exists():
        return _keep_existing(final, same)
    try:
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f"{final.name}.tmp-")
    except OSError as exc:
        raise DocketError(f"cannot write {final}: {exc.strerror or exc}") from None
    try:
        try:
            os.fchmod(fd, mode)
            write(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        # link, not rename: it fails instead of replacing a file that appeared meanwhile.
        os.link(tmp, final)
        _fsync_dir(final.parent)
    except FileExistsError:
        return _keep_existing(final, same)
    except OSError as exc:
        raise DocketError(f"cannot write {final}: {exc.strerror or exc}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return True


def _keep_existing(final: Path, same: Callable[[Path], bool]) -> bool:
    if not same(final):
        raise CheckFailed(
            f"{final} already exists with different content; doctor never overwrites: "
            "move it away and run again"
        )
    return False


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_range(src: int, dst: int, length: int) -> None:
    done = 0
    while done < length:
        block = os.pread(src, min(CHUNK, length - done), done)
        if not block:
            raise CheckFailed(f"the ledger ended at byte {done}, before byte {length}")
        _write_all(dst, block)
        done += len(block)


def _same_bytes(data: bytes) -> Callable[[Path], bool]:
    return lambda path: path.stat().st_size == len(data) and path.read_bytes() == data


def _same_prefix(path: Path, src: int, length: int) -> bool:
    if path.stat().st_size != length:
        return False
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < length:
            mine = f.read(min(CHUNK, length - done))
            if not mine or mine != os.pread(src, len(mine), done):
                return False
            done += len(mine)
    return True


# --- the command ----------------------------------------------------------------


def _where(problem: ChainError | None) -> str:
    if problem is None:
        return "clean ledger"
    return (
        f"{LABELS[problem.code]} at seq {problem.seq}, byte {problem.offset} "
        f"({problem.code}: {problem.detail})"
    )


def describe(diag: Diagnosis, *, hint: bool = True) -> list[str]:
    """The human summary: verdict, events, head, and where the problem is."""
    label = LABELS[diag.state]
    if diag.state == CLEAN and diag.evidence_lost:
        label = "whole chain, evidence incomplete"  # never "clean": the run lost evidence
    out = [
        f"ledger   {diag.path} ({diag.size} bytes)",
        f"verdict  {'locked, ' if diag.locked else ''}{label}",
    ]
    head = diag.head if diag.events else f"{GENESIS} (no events)"
    out.append(f"events   {diag.events} verified (bytes 0..{diag.verified_bytes}), head {head}")
    problem, tail = diag.problem, diag.tail
    if problem is not None:
        if problem.code == TORN_TAIL and tail is not None:
            out.append(
                f"problem  torn tail at byte {tail.offset} (seq {problem.seq} cut short): "
                f"{problem.detail}"
            )
        else:
            out.append(f"problem  {_where(problem)}")
            unchecked = diag.lines - diag.events - (0 if problem.code == TORN_TAIL else 1)
            if unchecked > 0:
                lines = "line" if unchecked == 1 else "lines"
                out.append(f"         {unchecked} whole {lines} after it not checked")
            if tail is not None and problem.offset != tail.offset:
                out.append(
                    f"         also: the last line (byte {tail.offset}, {tail.length} bytes) "
                    "has no newline"
                )
    if diag.open_calls:
        shown = ", ".join(f"{json.dumps(c)[:40]} at seq {seq}" for c, seq in diag.open_calls[:5])
        more = f" and {len(diag.open_calls) - 5} more" if len(diag.open_calls) > 5 else ""
        out.append(
            f"open     {len(diag.open_calls)} model.request with no closing event "
            f"(in flight where the ledger ends): {shown}{more}"
        )
    if diag.locked:
        who = (
            f"pid {diag.locked_by}" if diag.locked_by else "a process that has not written its pid"
        )
        out.append(
            f"lock     held by a live writer, {who}; read as of now"
            + (": the short last line may be a write in progress" if tail else "")
        )
    else:
        out.append("lock     none")
    out.extend(evidence_lines(diag.evidence))
    if hint and diag.state == TORN_TAIL and not diag.locked and diag.events:
        out.append(
            f"repair   docket doctor {diag.path} --quarantine-torn-tail "
            f"(keeps the {diag.events} events; never changes the original)"
        )
    return out


def doctor_command(ledger: str, *, quarantine: bool, as_json: bool = False) -> int:
    diag = classify(ledger)
    if not quarantine or (diag.verdict == CLEAN):
        if as_json:
            print(json.dumps(diag.to_json()))
        else:
            print("\n".join(describe(diag)))
            if quarantine:
                print("quarantine: nothing to do, the ledger is clean")
        return diag.exit_code
    try:
        q = quarantine_torn_tail(diag)
    except CheckFailed as exc:
        if not as_json:
            print("\n".join(describe(diag)))
            raise
        print(json.dumps({**diag.to_json(), "quarantine": {"refused": str(exc)}}))
        return exc.exit_code
    if as_json:
        report = {
            "torn_path": str(q.torn_path),
            "repaired_path": str(q.repaired_path),
            "torn_written": q.torn_written,
            "repaired_written": q.repaired_written,
            "repaired": q.repaired.to_json(),
        }
        print(json.dumps({**diag.to_json(), "quarantine": report}))
        return EXIT_OK
    status = {True: "written", False: "already there, same bytes"}
    assert diag.tail is not None  # quarantine_torn_tail refuses a ledger without a torn tail
    lines = describe(diag, hint=False) + [
        f"torn     {diag.tail.length} bytes -> {q.torn_path} ({status[q.torn_written]})",
        f"repaired {q.repaired.events} events, {q.repaired.size} bytes -> {q.repaired_path} "
        f"({status[q.repaired_written]}; verifies clean, head {q.repaired.head})",
        f"original {diag.path} unchanged",
    ]
    print("\n".join(lines))
    sys.stdout.flush()
    return EXIT_OK
