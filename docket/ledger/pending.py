"""What the ledger book holds between admission and verdict, and hands the shell.

`PendingEvent` (an admitted event waiting for its seq) and `ClosingSlot` (room
held for a call's closing event) live in the book's queue and counters;
`Batch`, `Torn` and `Loss` are the steps `LedgerBook.next_step` returns for
writer.py to carry out; `_Gap` counts the losses not yet recorded in the file.
Plain values: the book (book.py) changes them, nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from docket.ledger.limits import EXEMPT_FROM_EVENT_CEILING

_UNASKED = object()


class PendingEvent:
    """One admitted event, encoded and stamped, waiting for a seq."""

    __slots__ = (
        "type",
        "ts",
        "mono_ms",
        "body",
        "reserved",
        "control",
        "essential",
        "ordinal",
        "fault",
        "seq",
        "settled",
        "waiter",
    )

    def __init__(
        self, type: str, ts: str, mono_ms: int, body: bytes, reserved: int, ordinal: int
    ) -> None:
        self.type = type
        self.ts = ts
        self.mono_ms = mono_ms
        self.body = body
        self.reserved = reserved  # an upper bound on its line's size, newline included
        self.control = type in EXEMPT_FROM_EVENT_CEILING
        # May use the disk reserve: the run's own record, and a call's closing event
        # whose request is on disk (LedgerBook.admit_closing says which).
        self.essential = self.control
        self.ordinal = ordinal
        self.fault: object = _UNASKED  # the fault hook's answer, asked once
        self.seq: int | None = None
        self.settled = False  # durable (seq set) or lost (seq None)
        # The shell's: the trio task parked on this event (Any: the pure book never
        # looks inside it and imports no trio).
        self.waiter: Any = None


class ClosingSlot:
    """Room held, at an opening's admission, for the one event that will close it.

    It stands for one event under max_events and `bytes` (a line, newline
    included) under max_ledger_bytes until its closing event takes it or it is
    released; either happens once.
    """

    __slots__ = ("book", "bytes", "held", "opening")

    def __init__(self, book: object, nbytes: int, opening: PendingEvent | None = None) -> None:
        # the LedgerBook that holds the room (only compared, never called: book.py
        # imports this module, so this one names no type of it)
        self.book = book
        self.bytes = nbytes
        self.held = True
        self.opening = opening  # whether it reached the disk decides its closing's standing

    def __repr__(self) -> str:
        return f"<ClosingSlot {self.bytes} bytes {'held' if self.held else 'settled'}>"


@dataclass
class Batch:
    """Lines composed from the durable head, to be written and synced as one."""

    items: list[PendingEvent]
    lines: list[bytes]  # without newlines; lines[0] is the evidence.gap record if has_gap
    data: bytes
    head_after: str
    mono_after: int  # mono_ms of the last line
    has_gap: bool
    # The disk reserve (sync.write_durably): allocate the file's blocks up to
    # `extend_to` before writing; if that fails and `must_extend`, write nothing.
    extend_to: int | None = None
    must_extend: bool = False
    has_low_disk: bool = False


@dataclass
class Torn:
    """A write the fault hook tears: `data` (the lines before it and part of its
    own) goes to the disk, then `crash()` runs (docket.ledger.faults.TornWrite)."""

    items: list[PendingEvent]
    data: bytes
    crash: Callable[[], object]

    TORN = "a torn write: the process was to die mid-line (fault hook)"


@dataclass
class Loss:
    """Events that will not be written: an injected fault, or a broken ledger."""

    items: list[PendingEvent]
    error: str
    attempted: bool  # a write was tried (and failed); False when the ledger is broken


class _Gap:
    """Losses since the last evidence.gap record: counters, never the events."""

    __slots__ = ("first_seq", "lost", "by_type", "failures", "error")

    def __init__(self, first_seq: int, error: str) -> None:
        self.first_seq = first_seq
        self.lost = 0
        self.by_type: dict[str, int] = {}
        self.failures = 0
        self.error = error

    def fields(self) -> dict[str, Any]:
        return {
            "lost": self.lost,
            "first_failing_seq": self.first_seq,
            "lost_by_type": dict(sorted(self.by_type.items())),
            "write_failures": self.failures,
            "error": self.error,
        }
