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
  call_probe(point)
                  for tests: called, in the run's trio thread, with the name of
                  each await point a model call passes (CALL_POINTS, in path
                  order) just before it awaits there. It may raise, to prove
                  that whatever raises on a call's path, the call still gets
                  exactly one closing event (model.error reason internal_error)
                  and the agent a 5xx in the provider's shape. It must not block.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from docket.clock import Clock
from docket.ledger.faults import WriteFaults

Observer = Callable[[dict], object]

# The await points of one model call, in the order a call passes them (app.py, then
# forward.ModelCall). A call passes those its path has: a streamed answer the
# relay.start/send/end points, a whole one upstream.read and relay.answer;
# close.write and close.after on every path that reaches an answer or an error.
CALL_POINTS = (
    "request.read",  # reading the request body (before any reservation)
    "caps.record",  # recording the caps' events (a reservation is held)
    "guards.enter",  # limiter, breaker, bulkhead
    "request.record",  # writing the model.request
    "call.forward",  # the model.request is durable; forwarding begins
    "upstream.request",  # connecting and sending upstream
    "upstream.read",  # reading a whole answer
    "relay.start",  # sending a streamed answer's head
    "relay.send",  # relaying a streamed batch (only when one arrives after the head)
    "close.write",  # writing the closing event
    "close.after",  # recording what the close caused (caps, breaker)
    "relay.answer",  # sending a whole answer
    "relay.end",  # sending a stream's held end
)


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
    call_probe: Callable[[str], object] | None = None
