"""The ledger's ceilings and what the book reports: limits, refusals, evidence stats.

`LedgerLimits` (the ceilings and the control reserve), the two refusals an
append can raise (`LedgerFull` at a ceiling, `EvidenceLost` once
fail_fast_evidence has tripped), `EvidenceStats` (what the receipt discloses
about events that never reached the disk), `describe_os_error`, and the
constants they rest on (CONTROL_RESERVE_BYTES, GAP_TYPE, EXEMPT_FROM_EVENT_CEILING).
No state and no I/O: the book (book.py) decides with them, and writer.py and
sync.py use them. Split from book.py, which still re-exports every name here.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

from docket.errors import DocketError
from docket.ledger.chain import CONTROL_TYPES

KiB = 1024
MiB = 1024 * KiB
GAP_TYPE = "evidence.gap"

# The reserve: bytes below max_ledger_bytes that only control events (and the
# writer's own evidence.gap record) may use, so the record of why a run stopped
# always fits. 64 KiB holds hundreds of session.end/process.exit lines; a small
# ceiling keeps three quarters of itself for ordinary events.
CONTROL_RESERVE_BYTES = 64 * KiB

LOW_DISK_TYPE = "evidence.low_disk"

# The disk reserve: real blocks allocated past the ledger's end (fallocate,
# FALLOC_FL_KEEP_SIZE) so the end of the record (an evidence.gap, process.exit,
# session.end, the closing events of calls whose request is on disk) can still
# be written when another process has filled the volume. 16 KiB holds dozens of
# those lines; the writer keeps it topped up, plus the bytes closing slots hold.
DISK_RESERVE_BYTES = 16 * KiB

# Written by the writer itself, never counted against max_events.
EXEMPT_FROM_EVENT_CEILING = CONTROL_TYPES | {GAP_TYPE, LOW_DISK_TYPE}


@dataclass(frozen=True)
class LedgerLimits:
    """The ledger's ceilings and what a failed write means.

    max_events counts non-control events accepted by the writer (written or
    lost) plus the closing slots held for them; max_ledger_bytes counts the
    bytes in the file plus the bytes reserved for events accepted but not yet
    written and held for closing events, so the file can never pass it.
    Non-control events may use up to max_ledger_bytes minus the reserve
    (control_reserve_bytes, default min(64 KiB, a quarter of the ceiling));
    control events and the evidence.gap record may use all of it, and so may
    a closing event's essential fields (see LedgerBook.admit_closing).
    """

    max_ledger_bytes: int = 256 * MiB
    max_events: int | None = None
    fail_fast_evidence: bool = False
    control_reserve_bytes: int | None = None
    # Blocks kept allocated past the file's end (None: min(16 KiB, the control
    # reserve); 0: none, as before there was one).
    disk_reserve_bytes: int | None = None
    # Below this many bytes free on the ledger's volume, the writer records
    # evidence.low_disk (0: never).
    min_free_bytes: int = 0

    def __post_init__(self) -> None:
        if type(self.max_ledger_bytes) is not int or self.max_ledger_bytes <= 0:
            raise ValueError("max_ledger_bytes must be a positive integer")
        if self.max_events is not None and (
            type(self.max_events) is not int or self.max_events < 1
        ):
            raise ValueError("max_events must be a positive integer or None")
        reserve = self.control_reserve_bytes
        if reserve is not None and (
            type(reserve) is not int or not 0 <= reserve < self.max_ledger_bytes
        ):
            raise ValueError("control_reserve_bytes must be at least 0 and below max_ledger_bytes")
        for name in ("disk_reserve_bytes", "min_free_bytes"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"{name} must be an integer >= 0")

    @property
    def reserve_bytes(self) -> int:
        if self.control_reserve_bytes is not None:
            return self.control_reserve_bytes
        return min(CONTROL_RESERVE_BYTES, self.max_ledger_bytes // 4)

    @property
    def disk_reserve(self) -> int:
        if self.disk_reserve_bytes is not None:
            return self.disk_reserve_bytes
        return min(DISK_RESERVE_BYTES, self.reserve_bytes)


class LedgerFull(DocketError):
    """An event refused at a ceiling, before anything was queued or forwarded.

    Control events are refused only when even the reserve cannot take them.

    `reason` is "max_events" or "max_ledger_bytes" (the boundary answers 503 with it).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"ledger full ({reason}): {detail}")
        self.reason = reason


class EvidenceLost(DocketError):
    """With fail_fast_evidence, a write failed: this event and every later one is refused."""


@dataclass(frozen=True)
class EvidenceStats:
    """What the receipt discloses about events that never reached the disk."""

    ledger_complete: bool
    unwritten_events: int
    first_failing_seq: int | None  # the seq the first lost event would have had
    write_failures: int  # failed write attempts (a failed batch, or one injected fault)
    unwritten_by_type: dict[str, int]
    last_error: str | None
    # Model calls forwarded upstream whose model.request never reached the disk
    # (fail-open: the call went on; its closing event, if written, follows no request).
    unrecorded_calls: int = 0
    # A failed write's bytes could not be cut back: the file may hold lines past
    # the durable record (the receipt's ledger.events), which are not part of it.
    unverified_tail: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "unrecorded_calls": self.unrecorded_calls,
            "unverified_tail": self.unverified_tail,
            "ledger_complete": self.ledger_complete,
            "unwritten_events": self.unwritten_events,
            "first_failing_seq": self.first_failing_seq,
            "write_failures": self.write_failures,
            "unwritten_by_type": dict(sorted(self.unwritten_by_type.items())),
            "last_error": self.last_error,
        }


def describe_os_error(exc: OSError) -> str:
    """`ENOSPC: No space left on device`: the errno's name, then the kernel's words."""
    name = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    text = exc.strerror or str(exc)
    return f"{name}: {text}" if name else text
