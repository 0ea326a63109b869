"""The one place a write failure can be injected into the ledger writer.

The chaos harness (and the tests) hand `open_ledger(..., faults=...)` an object
with a `before_write` method. While composing each batch the writer asks it
once about every event it is about to write; an `OSError` answer makes that
event's write fail exactly as a real one would (the event goes on the unwritten
list, the stats disclose it, the next write is preceded by an `evidence.gap`
record). `None` lets the real write go ahead: the I/O path is the same either way.

Why events are named by ordinal, not seq: after a loss the chain continues from
the last durable line, so seqs are reused and a hook keyed on "seq 40.." would
fail for ever. Why not per batch: batch boundaries depend on timing, so a fault
keyed on them would not replay. The ordinal is the event's place in the order
events were offered to the writer (the first event of a new ledger is ordinal
0, and until the first loss an event's ordinal equals its seq); a failed event
is never retried, so each ordinal is asked about exactly once.
"""

from __future__ import annotations

import errno as errno_module
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TornWrite:
    """The machine stops in the middle of this event's write.

    The writer puts the lines before it in the batch and the first `keep` bytes
    of its line (never the whole line: at most all but its newline) on disk,
    syncs them, and calls `crash()` — a harness's SIGKILL of its own process, as
    a power cut or a kernel panic would end it. A torn tail is what such a crash
    leaves and what `docket doctor` is for; a SIGKILL alone rarely produces one,
    as each batch is a single write. Should `crash()` return, the ledger is
    broken for good: nothing may be appended after a torn line.
    """

    keep: int
    crash: Callable[[], object]


class WriteFaults(Protocol):
    def before_write(self, ordinal: int, type: str) -> OSError | TornWrite | None:
        """An error to fail this event's write with, a torn write, or None to write it for real."""


def os_error(code: int) -> OSError:
    """The OSError the kernel would raise for errno `code`, e.g. os_error(errno.ENOSPC)."""
    return OSError(code, os.strerror(code))


class FailOrdinals:
    """Fail every event whose ordinal is in [start, stop); stop=None means for ever."""

    def __init__(self, code: int, start: int = 0, stop: int | None = None) -> None:
        self.code, self.start, self.stop = code, start, stop
        self.injected = 0

    def before_write(self, ordinal: int, type: str) -> OSError | None:
        if ordinal >= self.start and (self.stop is None or ordinal < self.stop):
            self.injected += 1
            return os_error(self.code)
        return None


class FailNext:
    """Fail the next `count` events offered, whatever their ordinal; then write for real."""

    def __init__(self, code: int, count: int = 1) -> None:
        self.code, self.remaining = code, count
        self.injected = 0

    def before_write(self, ordinal: int, type: str) -> OSError | None:
        if self.remaining <= 0:
            return None
        self.remaining -= 1
        self.injected += 1
        return os_error(self.code)


def fail_always(code: int = errno_module.EIO) -> FailOrdinals:
    """A disk that never takes another byte."""
    return FailOrdinals(code, 0, None)
