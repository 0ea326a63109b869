"""The rate limiter: burst, exact minute window, true Retry-After, clock steps; stateful."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from docket.boundary.wiring import limiter_for
from docket.guards.limiter import PER_MINUTE, PER_SECOND, Admit, RateLimiter, Refuse, _delay_until
from docket.policy import ResiliencePolicy, policy_from_dict

T0 = 5000.0


def admitted(limiter: RateLimiter, now: float, n: int) -> int:
    return sum(isinstance(limiter.admit(now), Admit) for _ in range(n))


def test_burst_is_one_second_of_steady_traffic_then_the_steady_rate():
    limiter = RateLimiter(per_second=10)
    assert admitted(limiter, T0, 25) == 10
    refusal = limiter.admit(T0)
    assert isinstance(refusal, Refuse)
    assert refusal.limit == PER_SECOND
    assert refusal.retry_after_s == pytest.approx(0.1)
    assert refusal.tokens == 0.0
    # One token back every 0.1 s.
    assert admitted(limiter, T0 + 0.1, 5) == 1
    assert admitted(limiter, T0 + 0.55, 5) == 4
    # The bucket never holds more than its capacity, however long it idles.
    assert admitted(limiter, T0 + 3600, 30) == 10


def test_a_rate_below_one_per_second_still_admits_one_call():
    limiter = RateLimiter(per_second=0.5)
    assert admitted(limiter, T0, 3) == 1
    refusal = limiter.admit(T0 + 1)
    assert refusal.retry_after_s == pytest.approx(1.0, abs=1e-9)
    assert isinstance(limiter.admit(T0 + 2), Admit)


def test_the_minute_window_is_exact_and_names_itself():
    limiter = RateLimiter(per_minute=3)
    for t in (0.0, 10.0, 20.0):
        assert isinstance(limiter.admit(T0 + t), Admit)
    refusal = limiter.admit(T0 + 59.5)
    assert refusal.limit == PER_MINUTE
    # the call at T0 leaves the window at T0 + 60 (the least float delay reaching it)
    assert refusal.retry_after_s == pytest.approx(0.5, abs=1e-9)
    assert refusal.window_count == 3 and refusal.tokens is None
    assert refusal.type == "x-docket.rate-limited"
    assert refusal.fields() == {
        "limit": "max_calls_per_minute",
        "retry_after_s": refusal.retry_after_s,
        "tokens": None,
        "window_count": 3,
        "per_second": None,
        "per_minute": 3,
    }
    assert "3 calls per minute" in refusal.reason
    assert isinstance(limiter.admit(T0 + 60), Admit)
    assert isinstance(limiter.admit(T0 + 60), Refuse)  # the T0+10 call still counts
    assert limiter.status(T0 + 70).window_count == 2  # expired by 70: T0 and T0+10


def test_when_both_limits_refuse_the_later_one_binds_the_retry():
    limiter = RateLimiter(per_second=1, per_minute=2)
    assert admitted(limiter, T0, 1) == 1
    assert admitted(limiter, T0 + 1, 1) == 1
    refusal = limiter.admit(T0 + 1)
    assert refusal.limit == PER_MINUTE
    assert refusal.retry_after_s == pytest.approx(59.0, abs=1e-9)
    assert isinstance(limiter.admit(T0 + 59.999), Refuse)
    assert isinstance(limiter.admit(T0 + 60), Admit)


def test_no_limits_admits_everything_and_policy_wiring():
    open_limiter = limiter_for(ResiliencePolicy())
    assert not open_limiter.enabled
    assert admitted(open_limiter, T0, 1000) == 1000
    policy = policy_from_dict(
        {"resilience": {"max_calls_per_second": 2.5, "max_calls_per_minute": 100}}, "test"
    )
    limiter = limiter_for(policy.resilience)
    assert (limiter.per_second, limiter.per_minute, limiter.capacity) == (2.5, 100, 2.5)
    assert admitted(limiter, T0, 10) == 2  # 2.5 tokens: two whole calls


def test_bad_arguments_are_errors():
    for kwargs in ({"per_second": 0}, {"per_second": math.inf}, {"per_minute": 0}):
        with pytest.raises(ValueError):
            RateLimiter(**kwargs)
    with pytest.raises(ValueError, match="now must be"):
        RateLimiter(per_second=1).admit(math.nan)


# ---------------------------------------------------------------- properties

rates = st.one_of(
    st.sampled_from([0.2, 0.5, 1.0, 3.0, 10.0, 1000.0]),
    st.floats(0.01, 5000, allow_nan=False, allow_infinity=False),
)
steps = st.lists(st.floats(0, 2.0, allow_nan=False), min_size=1, max_size=60)


@settings(deadline=None)
@given(
    per_second=st.one_of(st.none(), rates),
    per_minute=st.one_of(st.none(), st.integers(1, 40)),
    start=st.floats(0, 1e7, allow_nan=False),
    gaps=steps,
    probe=st.floats(0, 1, allow_nan=False),
)
def test_retry_after_is_the_true_earliest_success(per_second, per_minute, start, gaps, probe):
    """At now + retry_after_s a retry is admitted (nothing intervened); before it, refused."""
    limiter = RateLimiter(per_second, per_minute)
    now = start
    for gap in gaps:
        now += gap
        limiter.admit(now)
    # Drive it to a refusal if it is not there yet.
    enough = math.ceil(max(per_second or 0, 1)) + (per_minute or 0) + 2
    for _ in range(enough):
        refusal = limiter.admit(now)
        if isinstance(refusal, Refuse):
            break
    else:
        assert per_second is None and per_minute is None
        return
    ra = refusal.retry_after_s
    assert ra > 0
    before = limiter.status(now + ra)  # a reading moves nothing
    # A retry after any shorter delay is refused, and refusing consumes nothing.
    shorter = math.nextafter(ra, -math.inf)
    assert isinstance(limiter.admit(now + shorter), Refuse)
    if ra * probe < ra:
        assert isinstance(limiter.admit(now + ra * probe), Refuse)
    after = limiter.status(now + ra)
    assert (after.tokens, after.window_count, after.admitted) == (
        before.tokens,
        before.window_count,
        before.admitted,
    )
    assert isinstance(limiter.admit(now + ra), Admit)


class LimiterMachine(RuleBasedStateMachine):
    """Calls at random times (steps back too), checked against an exact model.

    The model counts tokens, refilled by elapsed time, in exact fractions; the
    limiter keeps the instant its bucket is full again instead. The model allows
    a hair of slack at the boundary and nowhere else. A second
    limiter fed the clamped readings must answer the same, so a step back
    cannot refill the bucket or empty the window.
    """

    @initialize(
        per_second=st.one_of(st.none(), rates),
        per_minute=st.one_of(st.none(), st.integers(1, 30)),
    )
    def setup(self, per_second, per_minute):
        self.limiter = RateLimiter(per_second, per_minute)
        self.twin = RateLimiter(per_second, per_minute)
        self.raw = T0
        self.clamped = -math.inf
        self.admitted_at: list[float] = []
        self.refusals = 0
        if per_second is not None:
            self.rate = Fraction(per_second)
            self.cap = max(self.rate, Fraction(1))
            self.tokens = self.cap
            self.filled_at: float | None = None

    @rule(dt=st.floats(-5, 5, allow_nan=False))
    def step(self, dt):
        self.raw += dt

    @rule(n=st.integers(1, 5))
    def call(self, n):
        for _ in range(n):
            self.one_call()

    @rule()
    def retry_when_told(self):
        """A refused caller that comes back exactly at now + retry_after_s gets in."""
        got = self.one_call()
        if isinstance(got, Refuse):
            self.raw = self.clamped + got.retry_after_s
            assert isinstance(self.one_call(), Admit)

    def one_call(self):
        self.clamped = max(self.clamped, self.raw)
        now = self.clamped
        got = self.limiter.admit(self.raw)
        assert got == self.twin.admit(now)
        lim = self.limiter
        if lim.per_second is not None:
            if self.filled_at is not None:
                elapsed = Fraction(now) - Fraction(self.filled_at)
                self.tokens = min(self.cap, self.tokens + elapsed * self.rate)
            self.filled_at = now
        in_window = sum(1 for t in self.admitted_at if t + 60.0 > now)
        slack = Fraction(1, 10**6)
        if isinstance(got, Admit):
            self.admitted_at.append(now)
            if lim.per_minute is not None:
                assert in_window < lim.per_minute
                assert got.window_count == in_window + 1
            if lim.per_second is not None:
                assert self.tokens >= 1 - slack
                self.tokens -= 1
        else:
            self.refusals += 1
            minute_full = lim.per_minute is not None and in_window >= lim.per_minute
            bucket_low = lim.per_second is not None and self.tokens < 1 + slack
            assert minute_full or bucket_low
            if got.limit == PER_MINUTE:
                assert minute_full
            assert got.retry_after_s > 0
        return got

    @invariant()
    def bounded(self):
        s = self.limiter.status(self.raw)
        assert s == self.twin.status(max(self.clamped, self.raw))
        assert s.admitted == len(self.admitted_at)
        assert s.refused == self.refusals
        if self.limiter.per_minute is not None:
            assert len(self.limiter._expiries) <= self.limiter.per_minute
        if self.limiter.per_second is not None:
            assert 0 <= s.tokens <= self.limiter.capacity


TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = settings(stateful_step_count=40, deadline=None)


@settings(deadline=None)
@given(per_second=rates, times=st.lists(st.floats(0, 30, allow_nan=False), max_size=120))
def test_no_interval_admits_more_than_burst_plus_rate(per_second, times):
    limiter = RateLimiter(per_second=per_second)
    now = T0
    admitted_at = []
    for t in sorted(times):
        now = T0 + t
        if isinstance(limiter.admit(now), Admit):
            admitted_at.append(now)
    cap = max(per_second, 1.0)
    for i, a in enumerate(admitted_at):
        for j in range(i, len(admitted_at)):
            span = admitted_at[j] - a
            assert j - i + 1 <= cap + span * per_second + 1e-6


# ------------------------------------------------- the integer representation


def test_absurd_readings_are_refused_as_bad_input_not_overflowed():
    limiter = RateLimiter(per_second=3)
    for bad in (2.0**900, -(2.0**900), 1e300, math.inf, -math.inf):
        with pytest.raises(ValueError, match="now must be"):
            limiter.admit(bad)
    assert isinstance(limiter.admit(2.0**899), Admit)  # the largest readings still work


class FractionBucket:
    """The per-second bucket as it was kept before: exact fractions of the readings."""

    def __init__(self, rate: float):
        self.rate = Fraction(rate)
        self.cap = max(self.rate, Fraction(1))
        self.interval = 1 / self.rate
        self.tolerance = (self.cap - 1) * self.interval
        self.full_at: Fraction | None = None
        self.last = -math.inf

    def admit(self, now: float) -> tuple[bool, float, Fraction | None]:
        self.last = max(self.last, now)
        exact = Fraction(self.last)
        ready = None if self.full_at is None else self.full_at - self.tolerance
        ok = ready is None or ready <= exact
        if ok:
            start = exact if self.full_at is None else max(self.full_at, exact)
            self.full_at = start + self.interval
        if self.full_at is None or self.full_at <= exact:
            tokens = float(self.cap)
        else:
            tokens = float(max(Fraction(0), self.cap - self.rate * (self.full_at - exact)))
        return ok, tokens, ready


@settings(deadline=None)
@given(
    per_second=rates,
    start=st.one_of(st.floats(2.0**-12, 1.0), st.floats(1.0, 1e12)),
    gaps=st.lists(
        st.one_of(st.just(0.0), st.floats(-1.0, 3.0, allow_nan=False)), min_size=1, max_size=80
    ),
)
def test_integer_bucket_answers_exactly_as_the_fraction_bucket(per_second, start, gaps):
    """Same decision, same tokens to the last bit, Retry-After reaching the exact instant."""
    limiter = RateLimiter(per_second=per_second)
    reference = FractionBucket(per_second)
    now = start
    for gap in gaps:
        now = max(now + gap, 2.0**-12)  # the grid is exact from 2**-12 s up
        got = limiter.admit(now)
        ok, tokens, ready = reference.admit(now)
        clamped = reference.last
        assert isinstance(got, Admit) == ok
        if ok:
            assert got.tokens_left == tokens
        else:
            assert got.tokens == tokens
            ra = got.retry_after_s
            assert Fraction(clamped + ra) >= ready
            assert Fraction(clamped + math.nextafter(ra, -math.inf)) < ready


@settings(deadline=None)
@given(
    now=st.floats(-1e9, 1e12, allow_nan=False),
    ahead=st.one_of(
        st.floats(1e-300, 1e-9), st.floats(1e-9, 100.0), st.floats(100.0, 1e12, allow_nan=False)
    ),
)
def test_delay_until_is_the_least_float_delay_reaching_the_target(now, ahead):
    target = now + ahead
    if not target > now:  # the refusal path only ever asks for a later target
        target = math.nextafter(now, math.inf)
    delay = _delay_until(now, target)
    assert delay > 0 and now + delay >= target
    assert now + math.nextafter(delay, -math.inf) < target
