"""Connection pressure on docket.http.server, coalesced into episodes.

A flood of connections (idle ones past the cap, heads trickled byte by byte, an
accept that fails for want of file descriptors) must leave a trace without
becoming one itself: an event per refused connection would let any local process
fill the ledger. So each kind of pressure is counted into an episode, which
starts at its first occurrence and ends once `quiet` seconds pass without
another (or `longest` seconds after it began, for a flood that never pauses); the application (the boundary) records each ended episode once, with
its count and span. Pure: it is given the clock's readings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Kinds of pressure the server notes.
OVER_CAP = "over_cap"  # a connection past max_connections, none idle: closed at once
# At max_connections (or out of descriptors), the oldest connection without a whole
# request head (idle, or trickling one) closed to admit a new one.
IDLE_CLOSED = "idle_closed"
HEAD_TIMEOUT = "head_timeout"  # a request head not complete within its deadline: 408
ACCEPT_FAILED = "accept_failed"  # accept() failed for want of descriptors or memory


@dataclass
class Episode:
    kind: str
    count: int
    first: float  # clock readings (trio.current_time())
    last: float
    detail: str = ""  # the last occurrence's detail (an errno name)

    def as_fields(self) -> dict:
        return {
            "kind": self.kind,
            "count": self.count,
            "seconds": round(self.last - self.first, 3),
            **({"detail": self.detail} if self.detail else {}),
        }


@dataclass
class Pressure:
    quiet: float = 1.0
    longest: float = 60.0  # a flood that never pauses is still reported this often
    open: dict[str, Episode] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)

    def note(self, kind: str, now: float, detail: str = "") -> bool:
        """Count one occurrence; True when it starts a new episode."""
        self.totals[kind] = self.totals.get(kind, 0) + 1
        episode = self.open.get(kind)
        if episode is None:
            self.open[kind] = Episode(kind, 1, now, now, detail)
            return True
        episode.count += 1
        episode.last = now
        episode.detail = detail or episode.detail
        return False

    def due(self, now: float, *, all: bool = False) -> list[Episode]:
        """The episodes that have ended by `now` (every open one with `all`), removed."""
        ended = [
            e
            for e in self.open.values()
            if all or now - e.last >= self.quiet or now - e.first >= self.longest
        ]
        for episode in ended:
            del self.open[episode.kind]
        return ended

    def next_end(self) -> float | None:
        """When the earliest open episode ends if nothing more comes (None: none open)."""
        return min(
            (min(e.last + self.quiet, e.first + self.longest) for e in self.open.values()),
            default=None,
        )
