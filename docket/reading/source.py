"""A ledger as a stream of decoded, checked events, for the reading commands.

Every line goes through the one chain verifier (spec section 4) and the receipt
tally's event checks (section 5), so `show`, `explain` and `diff` read exactly
what `docket verify` accepts, and refuse the rest as one line naming the
problem (exit 2): a missing, empty or binary file, a line that is not JSON, a
broken chain (a tampered byte), an event the tally cannot read, a torn tail.
Memory is bounded by the longest line (docket.ledger.reader), never the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from docket.errors import InputError
from docket.inputs import existing_file
from docket.ledger.chain import ChainError, ChainVerifier
from docket.ledger.lock import holder_pid
from docket.ledger.reader import LEDGER_MAGIC, Lines, LineTooLong
from docket.reading.run_paths import LEDGER_NAME
from docket.receipts.tally import Tally, TallyError


def ledger_path(target: str | os.PathLike) -> Path:
    """The ledger a user named: a ledger file, or a run's folder holding ledger.jsonl."""
    p = Path(target)
    if "\x00" not in str(p) and p.is_dir():
        inner = p / LEDGER_NAME
        if not inner.exists():
            raise InputError(f"run {p}: no {LEDGER_NAME} in this folder")
        p = inner
    existing_file(p, "ledger")
    try:
        with open(p, "rb") as f:
            head = f.read(len(LEDGER_MAGIC))
    except OSError as exc:
        raise InputError(f"ledger {p}: cannot read ({exc.strerror})") from None
    if head != LEDGER_MAGIC:
        raise InputError(
            f"ledger {p}: not a docket ledger (it does not begin with {LEDGER_MAGIC.decode()})"
        )
    return p


def _chain_problem(path: Path, exc: ChainError) -> InputError:
    return InputError(f"ledger {path}: {exc} (docket doctor {path} says more)")


class EventReader:
    """Feed complete lines in file order; each comes back as a checked event.

    The chain verifier and the tally are both incremental, so the same reader
    serves a whole file (`read_events`) and a file still being written (show
    --follow). `raw` keeps the line's bytes for callers that print them as is.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.chain = ChainVerifier()
        self.tally = Tally()

    def feed(self, line: bytes) -> dict:
        try:
            event = self.chain.feed(line)
        except ChainError as exc:
            raise _chain_problem(self.path, exc) from None
        try:
            self.tally.add(event)
        except TallyError as exc:
            raise InputError(
                f"ledger {self.path}: malformed event at seq {event['seq']}: {exc}"
            ) from None
        return event


def read_lines(path: Path, live: list[int] | None = None) -> Iterator[tuple[bytes, dict]]:
    """Each line of a whole ledger, as its bytes and its checked event; then the torn
    tail, if any, as an InputError (the events before it are yielded first).

    A tail while a writer holds the ledger's lock is a line being written, not a tear:
    the lines before it are the run so far, and the writer's pid is appended to `live`.
    """
    reader = EventReader(path)
    lines = Lines(path)
    try:
        for line in lines:
            yield line, reader.feed(line)
    except LineTooLong as exc:
        raise InputError(f"ledger {path}: malformed_line: {exc}") from None
    except OSError as exc:
        raise InputError(f"ledger {path}: cannot read ({exc.strerror})") from None
    if lines.tail:
        writer = holder_pid(path)
        if writer is not None:
            if live is not None:
                live.append(writer)
            return
        raise InputError(
            f"ledger {path}: torn tail: the last {len(lines.tail)} bytes (from byte "
            f"{reader.chain.offset}) are a line with no newline; "
            f"`docket doctor --quarantine-torn-tail {path}` keeps the readable prefix"
        )


def read_events(path: Path, live: list[int] | None = None) -> Iterator[dict]:
    """Every checked event of a whole ledger, in seq order (see read_lines)."""
    for _, event in read_lines(path, live):
        yield event
