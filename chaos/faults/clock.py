"""The clock fault family: the recorder's clock steps forward or back, or pauses.

Performed through the recorder's clock hook (docket.run.hooks.RunHooks.clock): the
engine hands the supervisor a `ChaosClock` and moves it when a fault fires.
Only what the clock stamps is affected, the ledger's `ts` and `mono_ms`: every
duration the recorder acts on (the wall-clock cap, timeouts) runs on trio's own
monotonic clock, which no fault touches. The ledger's monotonic reading is
clamped (docket.clock.Clock.mono never decreases), so a step back leaves
`mono_ms` flat until real time catches up, and a step forward makes it jump.

- `clock:step(D)`: both readings move by D (negative: back), from then on.
- `clock:pause(D)`: both readings stand still for D of real time, then go on
  from real time (as a stalled clock source does: a jump forward at the end).

Fired on the run's events or at a time (chaos.faults.triggers); the
`fault.injected` record is durable before the clock moves.
"""

from __future__ import annotations

import time

from chaos.faults.grammar import Fault
from chaos.faults.values import Duration
from docket.clock import Clock

TARGET = "clock"


def effect(fault: Fault) -> tuple[str, float]:
    """("step", seconds) or ("pause", seconds) for a clock fault."""
    if fault.target != TARGET:
        raise ValueError(f"{fault.text} is not a clock fault")
    arg = fault.arg("by" if fault.kind == "step" else "for")
    assert isinstance(arg, Duration)
    return fault.kind, arg.ms / 1000


class ChaosClock(Clock):
    """The real clocks, moved by clock faults; `mono()` keeps docket's clamp."""

    def __init__(self, source=time.monotonic, wall_source=time.time) -> None:
        super().__init__()
        self._source = source
        self._wall_source = wall_source
        self.offset = 0.0
        self._frozen: tuple[float, float] | None = None  # (mono, wall) readings held
        self._frozen_until = 0.0  # on the real monotonic source

    def _held(self) -> tuple[float, float] | None:
        if self._frozen is not None and self._source() < self._frozen_until:
            return self._frozen
        self._frozen = None
        return None

    def _raw_mono(self) -> float:
        held = self._held()
        return held[0] if held else self._source() + self.offset

    def wall(self) -> float:
        held = self._held()
        return held[1] if held else self._wall_source() + self.offset

    def step(self, seconds: float) -> None:
        self.offset += seconds

    def pause(self, seconds: float) -> None:
        readings = (self._raw_mono(), self.wall())
        self._frozen_until = self._source() + seconds
        self._frozen = readings

    def apply(self, fault: Fault) -> None:
        kind, seconds = effect(fault)
        if kind == "step":
            self.step(seconds)
        else:
            self.pause(seconds)
