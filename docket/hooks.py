"""The recorder's documented fault hook: what a harness may hand a supervised run.

docket never imports the chaos harness. A harness that needs to act inside the
recorder (fail a ledger write, step the clock, signal a process at a given seq,
put the evidence of a fault in the chain) builds one `RunHooks` and gives it to
`Supervisor(options, hooks=...)`. Everything else it does from outside, through
the doors a user has (HTTP, files, signals).

The supervisor calls the hooks at fixed points of a run:

  clock           stamps every ledger line (ts, mono_ms); a harness's clock may
                  step or pause, and the ledger's mono clamp still holds
  write_faults    asked once per event before its write (docket.ledger.faults)
  chaos           put verbatim into session.start as its `chaos` member
                  ({"seed": int | None, "faults": [texts], ...}: JSON values)
  observers       called with each durable event, parsed, in seq order, in the
                  run's trio thread; they must not raise and must not block
  before_spawn(handle)
                  awaited once the boundary listens and before the child is
                  spawned (child_pid is None): a harness records and arms what
                  must be in place before the agent's first call
  started(handle) run in the supervisor's nursery once the child is spawned
                  (and its process.spawn written); cancelled once the child is
                  reaped, so a fault task never outlives the run's child
  before_stop(handle)
                  awaited after the child is reaped and process.exit written,
                  while the boundary still serves (for a last metrics scrape);
                  its caller bounds it, the supervisor does not
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from docket.clock import Clock
from docket.ledger.faults import WriteFaults

Observer = Callable[[dict], object]


class RunHandle(Protocol):
    """What a hook may see of, and do to, a run in progress."""

    @property
    def boundary_url(self) -> str:
        """The boundary's root URL (http://127.0.0.1:PORT)."""

    @property
    def child_pid(self) -> int | None:
        """The supervised child's pid, which is also its process group's id."""

    @property
    def supervisor_pid(self) -> int:
        """The process the supervisor (and the ledger writer) runs in."""

    async def record_fault(self, fields: Mapping[str, object]) -> int | None:
        """Append a `fault.injected` event; its seq once durable, or None if the
        write failed (it is then on the unwritten list) or a ceiling refused it."""

    def request_stop(self, reason: str, *, exit_status: int) -> None:
        """End the run early and legibly: SIGTERM to the child, then SIGKILL after
        the grace period; session.end carries `reason`."""


@dataclass(frozen=True)
class RunHooks:
    clock: Clock | None = None
    write_faults: WriteFaults | None = None
    chaos: Mapping[str, object] | None = None
    observers: tuple[Observer, ...] = ()
    before_spawn: Callable[[RunHandle], Awaitable[object]] | None = None
    started: Callable[[RunHandle], Awaitable[object]] | None = None
    before_stop: Callable[[RunHandle], Awaitable[object]] | None = None
