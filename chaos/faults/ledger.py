"""The ledger fault family: a write that fails with ENOSPC, EIO or EBADF, or is torn.

Performed through the recorder's write-fault hook (docket.ledger.faults): the
writer asks `before_write(ordinal, type)` once per event, and an OSError answer
fails that event's write exactly as the kernel's would (the event goes on the
unwritten list, the next durable line is an evidence.gap, the receipt says
`ledger_complete: false`). `ebadf` stands for a closed descriptor: the hook
answers with the error a write on one gets, without closing the writer's real
descriptor (which would also break the run's clean close).

`torn(keep)` is a crash in the middle of a write: the first `keep` bytes of the
event's line reach the disk, then the process the recorder runs in is
SIGKILLed (docket.ledger.faults.TornWrite). It ends the run with no receipt and
a torn tail, which is what `docket doctor` classifies and quarantines; the
engine runs such a scenario in a worker process (like sigkill(supervisor)).

Ordinals are the writer's: the event's place in the order events were offered,
from 0, which equals its seq until the first loss (after a loss the chain goes
on from the last durable line, so seqs are reused; ordinals never are).

Honest limit: the record of a ledger fault cannot be in the ledger it breaks.
Each injection is kept by the harness (`on_inject`, the engine's `injected`
list and injected.jsonl); in the chain, evidence.gap is its trace.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable, Iterable

from chaos.faults.grammar import Fault
from chaos.faults.schedule import FaultSchedule
from chaos.faults.values import Size
from docket.ledger.faults import TornWrite, os_error

TARGET = "ledger"
ERRNOS = {"enospc": errno.ENOSPC, "eio": errno.EIO, "ebadf": errno.EBADF}


def crashes(faults: Iterable[Fault]) -> bool:
    """Whether these faults end the recorder's process (a torn write does)."""
    return any(f.target == TARGET and f.kind == "torn" for f in faults)


def crash_this_process() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def choose(
    schedule: FaultSchedule, ordinal: int, *, elapsed_s: float | None = None
) -> Fault | None:
    """The ledger fault that fails the write at `ordinal`: the first in schedule order that fires."""
    for fault in schedule.faults:
        if fault.target != TARGET:
            continue
        seconds = elapsed_s if fault.trigger.timed is not None else None
        if schedule.decide(fault, ordinal, elapsed_s=seconds):
            return fault
    return None


class LedgerFaults:
    """A docket.ledger.faults.WriteFaults performing a schedule's ledger faults."""

    def __init__(
        self,
        schedule: FaultSchedule,
        *,
        elapsed: Callable[[], float] | None = None,
        on_inject: Callable[[dict], object] | None = None,
        crash: Callable[[], object] = crash_this_process,
    ) -> None:
        timed = [f.text for f in schedule.faults if f.target == TARGET and f.trigger.timed]
        if timed and elapsed is None:
            raise ValueError(f"{timed[0]} is time-triggered: LedgerFaults needs elapsed")
        self.schedule = schedule
        self.elapsed = elapsed
        self.on_inject = on_inject
        self.crash = crash
        self.active = any(f.target == TARGET for f in schedule.faults)
        self.injected = 0

    def before_write(self, ordinal: int, type: str) -> OSError | TornWrite | None:
        if not self.active:
            return None
        fault = choose(self.schedule, ordinal, elapsed_s=self.elapsed() if self.elapsed else None)
        if fault is None:
            return None
        self.injected += 1
        if self.on_inject is not None:
            self.on_inject(self.schedule.injection_event(fault, ordinal) | {"event_type": type})
        if fault.kind == "torn":
            keep = fault.arg("keep")
            assert isinstance(keep, Size)
            return TornWrite(keep.bytes, self.crash)
        return os_error(ERRNOS[fault.kind])
