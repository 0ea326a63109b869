"""When a fault acting inside the run fires: on the ledger's events, or at a time.

The clock and process families act on the run as a whole, not on one request,
so their ordinals are read off the run's durable events as they go by: `seq`
is the event's own seq, `call` the model.request count (the first request is
call 1). Pure: feed it events and elapsed seconds, it answers which faults fire.

- A fault whose trigger is only a time (`@t 2s`, `@t 1s..3s`) fires once, at
  the instant or at the window's start: `timers()` lists them for a timer task.
- Any other fault is asked at every ordinal of its counter; `once` faults (a
  signal: a killed process cannot be killed again) fire at the first ordinal
  that fires and never after.
- The records these families write themselves (`fault.injected` of a clock or
  process fault) are not asked: a clock fault at every seq would otherwise
  trigger itself for ever. A `@seq N` whose N is such a record does not fire.
"""

from __future__ import annotations

from chaos.faults.grammar import Fault
from chaos.faults.schedule import FaultSchedule
from chaos.faults.values import Instant, Window

INSIDE_TARGETS = ("clock", "process")


def timer_only(fault: Fault) -> bool:
    t = fault.trigger
    return t.timed is not None and t.ordinals is None and t.chance is None


def fire_time(fault: Fault) -> float:
    timed = fault.trigger.timed
    if isinstance(timed, Instant):
        return timed.at_ms / 1000
    assert isinstance(timed, Window)
    return timed.start_ms / 1000


class EventTriggers:
    def __init__(self, schedule: FaultSchedule, faults: list[Fault], *, once: bool) -> None:
        self.schedule = schedule
        self.once = once
        self.calls = 0
        self._timers = [f for f in faults if timer_only(f)]
        self._watched = [f for f in faults if not timer_only(f)]
        self._done: set[str] = set()

    def timers(self) -> list[tuple[float, Fault]]:
        """(seconds after its origin, fault) per time-only fault, in time order; the
        origin is the run's start, or call N's record for `after call N`."""
        return sorted(((fire_time(f), f) for f in self._timers), key=lambda x: x[0])

    def on_event(self, event: dict, elapsed_s: float) -> list[tuple[Fault, int]]:
        """The faults that fire at this durable event, with the ordinal each fired at."""
        if event["type"] == "fault.injected" and event.get("target") in INSIDE_TARGETS:
            return []
        is_call = event["type"] == "model.request"
        if is_call:
            self.calls += 1
        fired = []
        for fault in self._watched:
            if self.once and fault.text in self._done:
                continue
            if fault.counter == "seq":
                ordinal = event["seq"]
            elif is_call:
                ordinal = self.calls
            else:
                continue
            if self.schedule.decide(fault, ordinal, elapsed_s=elapsed_s):
                fired.append((fault, ordinal))
                self._done.add(fault.text)
        return fired


def injection_fields(
    schedule: FaultSchedule, fault: Fault, ordinal: int | None, **extra: object
) -> dict:
    """The `fault.injected` fields; a timer-fired fault has no ordinal (null) but its time."""
    if ordinal is not None:
        return schedule.injection_event(fault, ordinal) | extra
    return {
        "fault": fault.text,
        "seed": schedule.seed,
        "ordinal": None,
        "counter": fault.counter,
        "target": fault.target,
        "kind": fault.kind,
    } | extra
