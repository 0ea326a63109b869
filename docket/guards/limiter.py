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
  a retry at exactly now + retry_after_s is admitted. All of it is integer
  arithmetic, exact (see "units" below) and cheap on the hot path.
- max_calls_per_minute: exact, not approximated. The window holds the expiry
  (admission + 60 s) of each call admitted in the last minute; it can never
  hold more than the limit, so memory is bounded by the limit itself. A call is
  admitted while fewer than `limit` admissions are younger than 60 s.

Retry-After is the true earliest instant a retry can succeed if no other call
is admitted meanwhile: the later of the instants at which each limit would
next admit (both only improve with time), as the least float delay that
reaches it: a retry at now + retry_after_s is admitted, after any shorter
delay refused.

Units: a reading is taken on a grid of 2**-64 s, floor(now * 2**64) ticks,
which is exact for every float reading of at least 2**-12 s in magnitude (their
last bit is coarser than the grid). With the rate the float p/q, the bucket
counts time in units of 1/p ticks: the refill interval is q * 2**64 units, the
burst tolerance (p - q) * 2**64, a reading floor(now * 2**64) * p, so every
admission test is an exact integer comparison, as exact as the fractions the
limiter used before and far cheaper. Readings of 2**900 s or more
are refused as bad input, so that now * 2**64 cannot overflow.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from dataclasses import dataclass

PER_SECOND = "max_calls_per_second"
PER_MINUTE = "max_calls_per_minute"
WINDOW_SECONDS = 60.0
_GRID_BITS = 64  # a reading is floor(now * 2**64) ticks
_TICKS_PER_SECOND = 2**_GRID_BITS
_TICKS_PER_SECOND_F = float(_TICKS_PER_SECOND)
_MAX_READING = 2.0**900  # below it now * 2**64 is finite


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
        if self.limit == PER_SECOND and self.per_second is not None:
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
        # Integers, not floats: in floats ten calls at one instant against a
        # burst of ten could find 0.1 * 10 a hair short of 1.0 and refuse the
        # tenth. Units of time: 1/p ticks (module docstring).
        if self.per_second is not None:
            p, q = self.per_second.as_integer_ratio()
            self.capacity = max(self.per_second, 1.0)
            self._p = p
            self._interval = q << _GRID_BITS  # the time one token takes to refill
            # How far ahead of now the bucket's full-again instant may be while a
            # token is left: capacity - 1 tokens' worth of refill.
            self._tolerance = (p - q) << _GRID_BITS if p > q else 0
            # tokens = (capacity_units - (full_at - now)) / token_units
            self._token_units = q << _GRID_BITS
            self._capacity_units = max(p, q) << _GRID_BITS
        self._full_at: int | None = None  # when the bucket is full again; None: full
        self._expiries: deque[float] = deque(maxlen=per_minute)
        self._last_now = -math.inf
        self._admitted = 0
        self._refused = 0

    @property
    def enabled(self) -> bool:
        return self.per_second is not None or self.per_minute is not None

    def admit(self, now: float) -> Admit | Refuse:
        now = self._clamp(now)
        expiries = self._expiries
        while expiries and expiries[0] <= now:
            expiries.popleft()
        per_second = self.per_second is not None
        at: int | None
        full_at: int | None
        if per_second:
            at = math.floor(now * _TICKS_PER_SECOND_F) * self._p
            full_at = self._full_at
            bucket_low = full_at is not None and full_at - self._tolerance > at
        else:
            at = full_at = None
            bucket_low = False
        # Whatever is left in the window expires after now.
        minute_full = self.per_minute is not None and len(expiries) >= self.per_minute
        if bucket_low or minute_full:
            return self._refuse(now, at, bucket_low, minute_full)
        if at is not None:  # a per-second limit
            self._full_at = (at if full_at is None or full_at < at else full_at) + self._interval
        if self.per_minute is not None:
            expiries.append(now + WINDOW_SECONDS)
        self._admitted += 1
        return Admit(tokens_left=self._tokens(at), window_count=self._window_count())

    def status(self, now: float) -> LimiterStatus:
        """A reading for metrics; it moves nothing."""
        now = max(_check_now(now), self._last_now)
        count = None
        if self.per_minute is not None:
            count = sum(1 for e in self._expiries if e > now)
        return LimiterStatus(
            tokens=self._tokens(self._units(now)),
            window_count=count,
            admitted=self._admitted,
            refused=self._refused,
        )

    # ------------------------------------------------------------ inside

    def _refuse(self, now: float, at: int | None, bucket_low: bool, minute_full: bool) -> Refuse:
        self._refused += 1
        # The later of the instants each refusing limit next admits binds the
        # retry; on a tie the per-second limit is named.
        limit = PER_SECOND if bucket_low else PER_MINUTE
        bucket_ready: int | None = None
        if bucket_low:
            assert self._full_at is not None  # a bucket that is low is not full
            bucket_ready = self._full_at - self._tolerance
            oldest_units = self._units(self._expiries[0]) if minute_full else None
            if oldest_units is not None and oldest_units > bucket_ready:
                limit = PER_MINUTE
        if limit == PER_SECOND:
            assert bucket_ready is not None
            target = self._earliest_reading(bucket_ready)
        else:
            # On the minute, the oldest admission leaving the window lets the next in
            # (the minute refused: per_second did not, or it binds later).
            target = self._expiries[0]
        return Refuse(
            limit=limit,
            retry_after_s=_delay_until(now, target),
            tokens=self._tokens(at),
            window_count=self._window_count(),
            per_second=self.per_second,
            per_minute=self.per_minute,
        )

    def _units(self, reading: float) -> int | None:
        if self.per_second is None:
            return None
        return math.floor(reading * _TICKS_PER_SECOND_F) * self._p

    def _earliest_reading(self, units: int) -> float:
        """The least float reading r with _units(r) >= units."""
        ticks = -(-units // self._p)  # floor(r * 2**64) >= ticks  <=>  r >= ticks / 2**64
        reading = ticks / _TICKS_PER_SECOND  # correctly rounded
        if math.floor(reading * _TICKS_PER_SECOND_F) < ticks:
            reading = math.nextafter(reading, math.inf)
        return reading

    def _clamp(self, now: float) -> float:
        now = _check_now(now)
        if now > self._last_now:
            self._last_now = now
        return self._last_now

    def _tokens(self, at: int | None) -> float | None:
        if at is None:
            return None
        full_at = self._full_at
        if full_at is None or full_at <= at:
            return self.capacity
        return max(0, self._capacity_units - (full_at - at)) / self._token_units

    def _window_count(self) -> int | None:
        return None if self.per_minute is None else len(self._expiries)


def _delay_until(now: float, target: float) -> float:
    """The least float delay for which the float now + delay is at or after target.

    Least, so that a retry after any shorter delay is refused. With a large
    `now` that can be a hair under the round figure (0.9999999999995 for 1 s at
    now = 5000), since the sum rounds up onto the target.
    """
    # target - now and the float sum are each off by at most an ulp of the
    # larger operand, so the answer is a few such steps from target - now:
    # bracket it there (each move strictly, so the loops end), then bisect.
    step = max(math.ulp(target), math.ulp(now))
    enough = max(target - now, math.ulp(0.0))
    while now + enough < target:
        enough = math.nextafter(enough + step, math.inf)
    short = enough
    while short > 0.0 and now + short >= target:
        short = max(math.nextafter(short - step, -math.inf), 0.0)
    # Non-negative floats sort as their bit patterns: bisect those, 64 steps at most.
    lo, hi = _bits(short), _bits(enough)
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
    # `not abs(now) < ...` also refuses nan and the infinities.
    if isinstance(now, bool) or not isinstance(now, int | float) or not abs(now) < _MAX_READING:
        raise ValueError(f"now must be a finite monotonic reading in seconds, got {now!r}")
    return float(now)
