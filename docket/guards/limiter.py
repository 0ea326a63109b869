"""The rate limiter: a token bucket per second and an exact sliding window per minute.

Pure and clock-injected: `admit(now)` takes a monotonic reading in seconds and
answers Admit or Refuse; only an admitted call consumes anything. A reading
that steps backwards is taken as the last one seen, so a clock step cannot
refill the bucket or age calls out of the window.

- max_calls_per_second: a token bucket of capacity max(rate, 1) (burst = one
  second of steady traffic; at least one token, or a rate below 1/s could never
  admit anything), refilled continuously at `rate`. It is kept as the instant
  the bucket will be full again (the GCRA form), so the admission test is a
  comparison of two times and Retry-After is a difference of the same two:
  a retry at exactly now + retry_after_s is admitted.
- max_calls_per_minute: exact, not approximated. The window holds the expiry
  (admission + 60 s) of each call admitted in the last minute; it can never
  hold more than the limit, so memory is bounded by the limit itself. A call is
  admitted while fewer than `limit` admissions are younger than 60 s.

Retry-After is the true earliest instant a retry can succeed if no other call
is admitted meanwhile: the later of the instants at which each limit would
next admit (both only improve with time), as the least float delay that
reaches it: a retry at now + retry_after_s is admitted, after any shorter
delay refused.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

from docket.policy import ResiliencePolicy

PER_SECOND = "max_calls_per_second"
PER_MINUTE = "max_calls_per_minute"
WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Admit:
    tokens_left: float | None  # after this call; None without a per-second limit
    window_count: int | None  # admissions in the last minute, this one included


@dataclass(frozen=True)
class Refuse:
    """An `x-docket.rate-limited` event value; the boundary answers 429 + Retry-After."""

    limit: str  # the limit that binds the retry: max_calls_per_second | max_calls_per_minute
    retry_after_s: float
    tokens: float | None  # tokens in the bucket now (below 1 if it refused)
    window_count: int | None  # admissions in the last minute
    per_second: float | None
    per_minute: int | None

    type = "x-docket.rate-limited"

    @property
    def reason(self) -> str:
        if self.limit == PER_SECOND:
            what = f"{self.per_second:g} calls per second (burst {max(self.per_second, 1):g})"
        else:
            what = f"{self.per_minute} calls per minute"
        return f"rate limit of {what} reached; retry in {self.retry_after_s:.3g} s"

    def fields(self) -> dict:
        return {
            "limit": self.limit,
            "retry_after_s": self.retry_after_s,
            "tokens": self.tokens,
            "window_count": self.window_count,
            "per_second": self.per_second,
            "per_minute": self.per_minute,
        }


@dataclass(frozen=True)
class LimiterStatus:
    tokens: float | None
    window_count: int | None
    admitted: int
    refused: int  # docket_rate_limited_total


class RateLimiter:
    def __init__(self, per_second: float | None = None, per_minute: int | None = None) -> None:
        if per_second is not None and not (
            isinstance(per_second, int | float) and math.isfinite(per_second) and per_second > 0
        ):
            raise ValueError(f"per_second must be a positive number, got {per_second!r}")
        if per_minute is not None and (
            not isinstance(per_minute, int) or isinstance(per_minute, bool) or per_minute < 1
        ):
            raise ValueError(f"per_minute must be a whole number of at least 1, got {per_minute!r}")
        self.per_second = None if per_second is None else float(per_second)
        self.per_minute = per_minute
        # The bucket is kept in exact fractions of the float readings: in floats,
        # ten calls at one instant against a burst of ten could find 0.1 * 10
        # a hair short of 1.0 and refuse the tenth.
        if self.per_second is not None:
            rate = Fraction(self.per_second)
            self.capacity = max(self.per_second, 1.0)
            self._rate = rate
            self._capacity = max(rate, Fraction(1))
            self._interval = 1 / rate  # the time one token takes to refill
            # How far ahead of now the bucket's full-again instant may be while a
            # token is left: capacity - 1 tokens' worth of refill.
            self._tolerance = (self._capacity - 1) * self._interval
        self._full_at: Fraction | None = None  # when the bucket is full again; None: full
        self._expiries: deque[float] = deque(maxlen=per_minute)
        self._last_now = -math.inf
        self._admitted = 0
        self._refused = 0

    @classmethod
    def from_policy(cls, policy: ResiliencePolicy) -> RateLimiter:
        return cls(policy.max_calls_per_second, policy.max_calls_per_minute)

    @property
    def enabled(self) -> bool:
        return self.per_second is not None or self.per_minute is not None

    def admit(self, now: float) -> Admit | Refuse:
        now = self._clamp(now)
        self._expire(now)
        exact = Fraction(now)
        ready: dict[str, Fraction] = {}
        if self.per_second is not None and self._full_at is not None:
            ready[PER_SECOND] = self._full_at - self._tolerance
        if self.per_minute is not None and len(self._expiries) >= self.per_minute:
            ready[PER_MINUTE] = Fraction(self._expiries[0])  # the oldest leaves the window
        binding = max(ready, key=ready.__getitem__, default=None)
        if binding is not None and ready[binding] > exact:
            self._refused += 1
            return Refuse(
                limit=binding,
                retry_after_s=_delay_until(now, ready[binding]),
                tokens=self._tokens(exact),
                window_count=self._window_count(),
                per_second=self.per_second,
                per_minute=self.per_minute,
            )
        if self.per_second is not None:
            start = exact if self._full_at is None else max(self._full_at, exact)
            self._full_at = start + self._interval
        if self.per_minute is not None:
            self._expiries.append(now + WINDOW_SECONDS)
        self._admitted += 1
        return Admit(tokens_left=self._tokens(exact), window_count=self._window_count())

    def status(self, now: float) -> LimiterStatus:
        """A reading for metrics; it moves nothing."""
        now = max(_check_now(now), self._last_now)
        count = None
        if self.per_minute is not None:
            count = sum(1 for e in self._expiries if e > now)
        return LimiterStatus(
            tokens=self._tokens(Fraction(now)),
            window_count=count,
            admitted=self._admitted,
            refused=self._refused,
        )

    # ------------------------------------------------------------ inside

    def _clamp(self, now: float) -> float:
        now = _check_now(now)
        if now > self._last_now:
            self._last_now = now
        return self._last_now

    def _expire(self, now: float) -> None:
        while self._expiries and self._expiries[0] <= now:
            self._expiries.popleft()

    def _tokens(self, now: Fraction) -> float | None:
        if self.per_second is None:
            return None
        if self._full_at is None or self._full_at <= now:
            return self.capacity
        return float(max(Fraction(0), self._capacity - self._rate * (self._full_at - now)))

    def _window_count(self) -> int | None:
        return None if self.per_minute is None else len(self._expiries)


def _delay_until(now: float, instant: Fraction) -> float:
    """The least float delay for which the float now + delay is at or after instant.

    Least, so that a retry after any shorter delay is refused. With a large
    `now` that can be a hair under the round figure (0.9999999999995 for 1 s at
    now = 5000), since the sum rounds up onto the instant.
    """
    target = float(instant)
    if Fraction(target) < instant:
        target = math.nextafter(target, math.inf)
    enough = max(target - now, math.ulp(0.0))
    while now + enough < target:
        enough *= 2
    # Non-negative floats sort as their bit patterns: bisect those, 64 steps at most.
    lo, hi = 0, _bits(enough)
    while lo < hi:
        mid = (lo + hi) // 2
        if now + _float(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return _float(hi)


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _check_now(now: float) -> float:
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise ValueError(f"now must be a finite monotonic reading in seconds, got {now!r}")
    return float(now)
