"""The reference agent's retry policy: full-jitter exponential backoff under a cap.

Pure, like h11: the policy takes the facts (which attempt was refused, the
Retry-After hint, a random source) and returns a decision; the agent does the
waiting. Full jitter (a uniform wait between zero and an envelope that doubles
per refusal) is the variant Marc Brooker's "Exponential Backoff And Jitter"
(AWS Architecture Blog, 2015) measured as finishing the work with the fewest
calls, and the one the AWS SDKs made their default.

Retry-After is a floor, not a replacement for the jitter. A server that names
a wait has said a retry sooner will be refused again, so waiting less only
manufactures a second refusal; but when the doubling envelope is already longer
than the hint, keeping the jitter keeps the clients that were refused together
from coming back together. Hence `max(hint, uniform(0, envelope))`, which is
also never longer than `max(cap, hint)`.

What is retried: the refusals that say "not now" (429, 503, 529) and the gateway
failures that say the upstream did not answer (502, 504), and a connection that
could not be made (the request never left, so resending it cannot do anything
twice). Any other 4xx is final: the request itself is wrong, or a cap said no.

A logical call has one deadline across all its attempts (`left_s`, the time it has
left): no retry starts after it, and a wait that would reach it gives the call up
at once instead of sleeping to no purpose (the sleep is never longer than the time
left). The agent sends what is left on each attempt as x-docket-deadline-ms.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

# rate limited, bad gateway, unavailable/shed, gateway timeout, overloaded
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504, 529})
# httpx's names for a connection that was never made: nothing was sent
RETRYABLE_ERRORS = frozenset({"ConnectError", "ConnectTimeout"})

# RFC 9110 delta-seconds is digits only; a fractional value is accepted because
# stubs and limiters send them (Retry-After: 0.25), and a sign or exponent is not.
_DELTA_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")  # ASCII digits only
_MAX_EXPONENT = 1000  # 2.0**1000 is still a finite float; the cap wins long before


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header, or None when there is no usable hint.

    An HTTP-date is ignored on purpose: turning it into a wait means subtracting
    our wall clock from the server's, and a local clock that is behind would make
    the wait longer than asked, one that is ahead would make it negative (a busy
    retry loop). A negative, non-numeric or infinite value is no hint at all.
    """
    if value is None:
        return None
    text = value.strip()
    if not _DELTA_SECONDS.fullmatch(text):
        return None
    seconds = float(text)
    return seconds if math.isfinite(seconds) else None


@dataclass(frozen=True)
class Wait:
    """Retry after this many seconds."""

    seconds: float


@dataclass(frozen=True)
class GiveUp:
    """Stop retrying this call; `reason` says which limit ended it."""

    reason: str  # "max_attempts" | "retry_after_too_long" | "deadline" | "retry_budget"


def retryable(kind: str, status: int | None, reason: str | None) -> bool:
    """Whether an attempt's outcome (docket.agent.calls.Outcome's fields) is worth a retry."""
    if kind == "refused":
        return status in RETRYABLE_STATUSES
    return kind == "error" and status is None and reason in RETRYABLE_ERRORS


@dataclass(frozen=True)
class BackoffPolicy:
    """Full jitter: attempt n waits uniform(0, min(cap, base * 2**n)), floored by Retry-After.

    `max_attempts` counts every attempt of one call, the first included (so 1
    means never retry). `max_hint` bounds how long a Retry-After may ask us to
    wait: a longer hint gives the call up rather than hanging the agent on a
    server's say-so or retrying before the server said it would listen.
    """

    base: float = 0.1
    cap: float = 5.0
    max_attempts: int = 8
    max_hint: float = 60.0

    def __post_init__(self) -> None:
        for name in ("base", "cap", "max_hint"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts!r}")

    def envelope(self, attempt: int) -> float:
        """The longest jittered wait after refusal number `attempt` (0-based)."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, not {attempt}")
        return min(self.cap, self.base * 2.0 ** min(attempt, _MAX_EXPONENT))

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """The wait after refusal `attempt` (0-based): max(hint, uniform(0, envelope))."""
        jitter = rng.uniform(0.0, self.envelope(attempt))
        return max(retry_after or 0.0, jitter)

    def decide(
        self,
        attempt: int,
        retry_after: float | None,
        rng: random.Random,
        left_s: float = math.inf,
    ) -> Wait | GiveUp:
        """After refusal `attempt` (0-based) of one call with `left_s` seconds left before
        its deadline: how long to wait, or give up.

        The random source is drawn from only once the attempt and hint limits allow
        a retry, so a seeded run draws the same sequence whatever calls were given
        up by them. The retry budget is the agent's to ask after a Wait: it is
        spent only on a retry that is actually made.
        """
        if attempt + 1 >= self.max_attempts:
            return GiveUp("max_attempts")
        if retry_after is not None and retry_after > self.max_hint:
            return GiveUp("retry_after_too_long")
        if retry_after is not None and retry_after >= left_s:
            return GiveUp("deadline")  # the server will not listen before the deadline
        wait = self.delay(attempt, retry_after, rng)
        if wait >= left_s:
            return GiveUp("deadline")  # a retry after this wait would start past it
        return Wait(wait)
