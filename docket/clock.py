"""Clocks. Durations and caps run on the monotonic clock; wall time is for readers.

A clock that steps backwards is clamped: `mono()` never decreases, so no
duration is negative and a step cannot manufacture (or hide) a breach. The
chaos harness steps a FakeClock through the recorder's clock hook.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


def rfc3339(epoch_seconds: float) -> str:
    """UTC, millisecond precision, `Z` suffix: 2026-11-29T21:52:28.123Z."""
    dt = datetime.fromtimestamp(epoch_seconds, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


class Clock:
    """The real clocks, with the monotonic reading clamped so it never goes back."""

    def __init__(self) -> None:
        self._last_mono = 0.0

    def _raw_mono(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        """Seconds since the epoch; may step. For `ts` fields only."""
        return time.time()

    def mono(self) -> float:
        """Monotonic seconds, never decreasing even if the source steps back."""
        now = self._raw_mono()
        if now > self._last_mono:
            self._last_mono = now
        return self._last_mono


class FakeClock(Clock):
    """A clock the test (or a chaos clock fault) moves by hand; steps may go backwards."""

    def __init__(self, mono: float = 1000.0, wall: float = 1_800_000_000.0) -> None:
        super().__init__()
        self._mono = mono
        self._wall = wall

    def _raw_mono(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        """Move both clocks; a negative step models an NTP jump backwards."""
        self._mono += seconds
        self._wall += seconds

    def step_wall(self, seconds: float) -> None:
        """Move only the wall clock (the monotonic one does not follow NTP)."""
        self._wall += seconds
