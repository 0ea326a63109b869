"""The per-attempt deadline: what a caller's remaining budget leaves for the upstream.

Pure, like the other guards: readings are seconds on one monotonic clock (the
boundary uses trio's, the clock its cancel scopes and sleeps run on), passed in.

A caller states its deadline as the time it has left, in a header:

    x-docket-deadline-ms: 2500

Relative, in whole milliseconds, counted from when the boundary starts on the
request. Relative on purpose: an absolute instant would compare the caller's
wall clock with ours, and a skew between the two would move every deadline.
The header is for the boundary only (outgoing_headers drops every x-docket-*
header), so the provider never sees it.

The attempt gets the remaining budget less `reserve_s`, the boundary's own work
after the upstream answers (the closing event's fsync, the relay). A budget
with nothing left after the reserve is spent: the call is refused without
being forwarded. Otherwise the whole attempt (connect, send, answer, stream)
ends at `cut`, which the trio layer makes a cancel scope's deadline; inside
it the policy's connect and read timeouts (boundary.connect_timeout,
boundary.upstream_timeout) still apply apart, and whichever comes first ends
the attempt. Capping those two per request would add nothing the scope does
not already do.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

HEADER = b"x-docket-deadline-ms"
# A day: a longer deadline is no deadline the boundary could act on, and an
# absurd value is more likely a caller sending an absolute time by mistake.
MAX_DEADLINE_MS = 86_400_000
_DIGITS = re.compile(rb"[0-9]+")  # ASCII digits only; a sign or a fraction is refused


class BadDeadline(ValueError):
    """The deadline header cannot be read; the message names it and says why."""


def parse_deadline_ms(value: bytes) -> int:
    """The milliseconds a header value grants; BadDeadline when it is not 0..MAX_DEADLINE_MS."""
    text = value.strip()
    if not _DIGITS.fullmatch(text):
        shown = text[:40].decode("latin-1")
        raise BadDeadline(
            f"{HEADER.decode()}: expected the milliseconds the caller has left "
            f"(a whole number 0..{MAX_DEADLINE_MS}), got {shown!r}"
        )
    digits = text.lstrip(b"0") or b"0"
    # Compared as text first: int() of a very long string is slow, then refused.
    if len(digits) > len(str(MAX_DEADLINE_MS)) or int(digits) > MAX_DEADLINE_MS:
        shown = digits[:20].decode() + ("..." if len(digits) > 20 else "")
        raise BadDeadline(
            f"{HEADER.decode()}: {shown} ms is over the limit of {MAX_DEADLINE_MS} ms"
        )
    return int(digits)


def caller_budget(headers, arrived: float) -> tuple[int, float] | None:
    """(milliseconds granted, the deadline as a reading) from a request's headers, or
    None without the header. Sent twice, it is refused: which one would count?"""
    found: list[bytes] = []
    for name, value in headers:
        key = name if isinstance(name, bytes) else name.encode("latin-1")
        if key.lower() == HEADER:
            found.append(value if isinstance(value, bytes) else value.encode("latin-1"))
    if not found:
        return None
    if len(found) > 1:
        raise BadDeadline(f"{HEADER.decode()}: sent {len(found)} times; send it once")
    ms = parse_deadline_ms(found[0])
    return ms, _reading("arrived", arrived) + ms / 1000


@dataclass(frozen=True)
class Attempt:
    """The limit one upstream attempt runs under."""

    cut: float  # the reading at which the whole attempt is cancelled (inf: no caller deadline)
    budget_s: float | None  # what the attempt was given (None: no caller deadline)
    deadline_ms: int | None = None  # what the caller granted (None: no caller deadline)


_NO_DEADLINE = Attempt(math.inf, None)  # frozen, so one serves every call without a deadline


@dataclass(frozen=True)
class Spent:
    """A caller's budget with nothing left for an attempt: refused, never forwarded."""

    deadline_ms: int  # what the caller granted
    remaining_s: float  # left when the boundary came to forward (may be below zero)
    reserve_s: float

    rule = "deadline"

    @property
    def reason(self) -> str:
        left = max(self.remaining_s, 0.0) * 1000
        return (
            f"the caller's deadline ({self.deadline_ms} ms) leaves {left:.0f} ms, "
            f"not enough for an upstream attempt (the boundary keeps {self.reserve_s * 1000:.0f} ms "
            "for its own work); not forwarded"
        )

    def fields(self) -> dict:
        return {
            "deadline_ms": self.deadline_ms,
            "remaining_ms": round(self.remaining_s * 1000, 3),
            "reserve_ms": round(self.reserve_s * 1000, 3),
        }


def plan_attempt(
    now: float, budget: tuple[int, float] | None, *, reserve_s: float
) -> Attempt | Spent:
    """The attempt's limit at `now`, or Spent when the caller's budget leaves nothing."""
    now = _reading("now", now)
    if _reading("reserve_s", reserve_s) < 0:
        raise ValueError(f"reserve_s must be at least 0, got {reserve_s!r}")
    if budget is None:
        return _NO_DEADLINE
    deadline_ms, deadline = budget
    cut = _reading("deadline", deadline) - reserve_s
    left = cut - now
    if left <= 0:
        return Spent(deadline_ms, deadline - now, reserve_s)
    return Attempt(cut, left, deadline_ms)


def _reading(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)
