"""The circuit breaker: transitions, refusals, probes, stale outcomes, clock steps; stateful."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from docket.boundary.wiring import breaker_for
from docket.guards.breaker import (
    CLOSED,
    CONSECUTIVE_FAILURES,
    COOLDOWN_ELAPSED,
    FAILURE,
    FAILURE_RATE,
    HALF_OPEN,
    IGNORED,
    OPEN,
    PROBE_FAILED,
    PROBE_PENDING_RETRY_S,
    PROBE_SLOW,
    PROBE_SUCCEEDED,
    SLOW_CALL_RATE,
    SUCCESS,
    CircuitBreaker,
    Permit,
)
from docket.policy import ResiliencePolicy, policy_from_dict

T0 = 1000.0


def call(b: CircuitBreaker, now: float) -> Permit:
    verdict = b.before_call(now)
    assert verdict.allowed, verdict.refusal
    return verdict.ticket


def fail_n(b: CircuitBreaker, n: int, now: float) -> tuple:
    events = ()
    for _ in range(n):
        events += b.record(call(b, now), FAILURE, now)
    return events


def trip(b: CircuitBreaker, now: float) -> None:
    fail_n(b, b.threshold, now)
    assert b.state == OPEN


# ---------------------------------------------------------------- closed -> open


def test_opens_after_threshold_consecutive_failures_and_says_why():
    b = CircuitBreaker("openai", threshold=3, cooldown=30, min_calls=100)
    assert fail_n(b, 2, T0) == ()
    assert b.state == CLOSED
    (change,) = fail_n(b, 1, T0 + 1)
    assert change.type == "breaker.state"
    assert change.fields() == {
        "upstream": "openai",
        "from": "closed",
        "to": "open",
        "reason": "consecutive_failures",
        "cooldown_s": 30.0,
        "failures": 3,
        "window_failures": 3,
        "window_calls": 3,
        "rate": 1.0,
        "window_slow": 0,
    }


def test_a_success_breaks_the_run_of_failures_and_4xx_neither_counts_nor_breaks_it():
    b = CircuitBreaker("u", threshold=3, min_calls=100)
    fail_n(b, 2, T0)
    b.record(call(b, T0), SUCCESS, T0)
    fail_n(b, 2, T0)
    assert b.state == CLOSED
    for _ in range(10):
        assert b.record(call(b, T0), IGNORED, T0) == ()
    assert b.status(T0).window_calls == 5  # ignored calls are not in the window
    (change,) = fail_n(b, 1, T0)
    assert (change.to_state, change.reason, change.failures) == (OPEN, "consecutive_failures", 3)


def test_opens_on_failure_rate_over_the_last_min_calls_calls():
    b = CircuitBreaker("u", threshold=5, failure_rate=0.5, min_calls=20)
    # Alternate failure, success: never two failures in a row, half of them failures.
    for i in range(19):
        outcome = FAILURE if i % 2 == 0 else SUCCESS
        assert b.record(call(b, T0), outcome, T0) == ()
    status = b.status(T0)
    assert (status.window_calls, status.window_failures) == (19, 10)  # 10/19 > 0.5 but < 20 calls
    (change,) = b.record(call(b, T0), SUCCESS, T0) + b.record(call(b, T0), FAILURE, T0)
    assert change.reason == FAILURE_RATE
    assert (change.window_calls, change.window_failures, change.rate) == (20, 10, 0.5)


def test_the_window_slides_old_failures_out():
    b = CircuitBreaker("u", threshold=100, failure_rate=0.5, min_calls=4)
    for outcome in (FAILURE, SUCCESS, SUCCESS, SUCCESS, SUCCESS, SUCCESS):
        b.record(call(b, T0), outcome, T0)
    assert (b.status(T0).window_calls, b.status(T0).window_failures) == (4, 0)
    b.record(call(b, T0), FAILURE, T0)
    assert b.state == CLOSED  # 1 of 4
    (change,) = b.record(call(b, T0), FAILURE, T0)
    assert (change.reason, change.window_failures, change.window_calls) == (FAILURE_RATE, 2, 4)


# ---------------------------------------------------------------- open, half-open, probes


def test_open_refuses_at_once_with_the_time_left_until_the_probe():
    b = CircuitBreaker("anthropic", threshold=1, cooldown=30)
    trip(b, T0)
    verdict = b.before_call(T0 + 12.5)
    assert not verdict.allowed and verdict.events == ()
    r = verdict.refusal
    assert r.type == "x-docket.breaker-open"
    assert r.fields() == {"upstream": "anthropic", "state": "open", "retry_after_s": 17.5}
    assert "anthropic" in r.reason and "open" in r.reason
    status = b.status(T0 + 12.5)
    assert (status.state_code, status.refusals, status.retry_after_s) == (2, 1, 17.5)
    assert "open" in status.ready_reason


def test_the_time_left_is_never_more_than_the_cooldown_whatever_the_rounding():
    # Found by the state machine (2026-12-02: retry_after_s 30.000000000000114 with a
    # 30 s cooldown): the probe's time less the clock can exceed the cooldown by a
    # rounding, as (4.954350870919409 + 30) - 4.954350870919409 does.
    now = 4.954350870919409
    b = CircuitBreaker("u", threshold=1, cooldown=30.0, max_cooldown=30.0)
    trip(b, now)
    assert (now + 30.0) - now > 30.0  # the rounding this guards against
    refusal = b.before_call(now).refusal
    assert refusal is not None and refusal.retry_after_s == 30.0
    assert b.status(now).retry_after_s == 30.0


def test_half_open_lets_exactly_one_probe_through():
    b = CircuitBreaker("u", threshold=1, cooldown=30)
    trip(b, T0)
    assert not b.before_call(T0 + 29.999).allowed
    probe = b.before_call(T0 + 30)
    assert probe.allowed and probe.ticket.probe
    (change,) = probe.events
    assert (change.from_state, change.to_state, change.reason) == (
        OPEN,
        HALF_OPEN,
        COOLDOWN_ELAPSED,
    )
    for _ in range(3):
        refused = b.before_call(T0 + 31)
        assert refused.refusal.fields()["state"] == "half_open"
        assert refused.refusal.retry_after_s == PROBE_PENDING_RETRY_S
    assert b.status(T0 + 31).state_code == 1
    assert b.status(T0 + 31).ready_reason == "breaker for u is half-open (probing)"


def test_failed_probes_double_the_cooldown_up_to_the_ceiling_and_success_resets_it():
    b = CircuitBreaker("u", threshold=1, cooldown=30, max_cooldown=100)
    now = T0
    trip(b, now)
    seen = []
    for _ in range(4):
        now += b.status(now).retry_after_s
        probe = call(b, now)
        (change,) = b.record(probe, FAILURE, now)
        assert (change.to_state, change.reason) == (OPEN, PROBE_FAILED)
        seen.append(change.cooldown_s)
        assert b.before_call(now).refusal.retry_after_s == change.cooldown_s
    assert seen == [60.0, 100.0, 100.0, 100.0]
    now += 100
    probe = call(b, now)
    (change,) = b.record(probe, SUCCESS, now)
    assert (change.from_state, change.to_state, change.reason) == (
        HALF_OPEN,
        CLOSED,
        PROBE_SUCCEEDED,
    )
    assert change.cooldown_s == 30.0  # the next opening starts from the base again
    assert b.status(now).ready_reason is None
    assert b.status(now).window_calls == 0  # pre-outage failures cannot re-trip it at once
    (reopen,) = fail_n(b, 1, now)
    assert reopen.cooldown_s == 30.0


def test_an_abandoned_or_ignored_probe_frees_the_slot_for_the_next_caller():
    b = CircuitBreaker("u", threshold=1, cooldown=5)
    trip(b, T0)
    probe = call(b, T0 + 5)
    assert not b.before_call(T0 + 6).allowed
    assert b.abandon(probe, T0 + 7) == ()
    assert b.state == HALF_OPEN
    second = call(b, T0 + 7)
    assert second.probe
    assert b.record(second, IGNORED, T0 + 8) == ()
    third = call(b, T0 + 8)
    (change,) = b.record(third, SUCCESS, T0 + 9)
    assert change.to_state == CLOSED


def test_outcomes_of_calls_let_through_before_a_transition_are_stale():
    b = CircuitBreaker("u", threshold=2, cooldown=10)
    early = [call(b, T0) for _ in range(3)]
    trip(b, T0)
    # A late failure of a call admitted while closed must not stretch the cooldown...
    assert b.record(early[0], FAILURE, T0 + 5) == ()
    assert b.status(T0 + 5).retry_after_s == 5.0
    probe = call(b, T0 + 10)
    # ...and a late success must not close the breaker in place of the probe.
    assert b.record(early[1], SUCCESS, T0 + 11) == ()
    assert b.state == HALF_OPEN
    (change,) = b.record(probe, FAILURE, T0 + 11)
    assert change.cooldown_s == 20.0
    assert b.status(T0 + 11).stale_outcomes == 2
    assert b.abandon(early[2], T0 + 11) == ()


def test_misuse_is_an_error_not_a_silent_miscount():
    b = CircuitBreaker("u")
    t = call(b, T0)
    with pytest.raises(ValueError, match="outcome must be one of"):
        b.record(t, "timeout", T0)
    b.record(t, SUCCESS, T0)
    with pytest.raises(ValueError, match="not outstanding"):
        b.record(t, SUCCESS, T0)
    with pytest.raises(ValueError, match="not outstanding"):
        b.record(Permit(id=99, epoch=0, probe=False), FAILURE, T0)
    for bad in (math.nan, math.inf, "1"):
        with pytest.raises(ValueError, match="now must be"):
            b.before_call(bad)
    with pytest.raises(ValueError):
        CircuitBreaker("u", cooldown=30, max_cooldown=10)
    with pytest.raises(ValueError):
        CircuitBreaker("u", min_calls=20, window_calls=10)
    with pytest.raises(ValueError):
        CircuitBreaker("u", failure_rate=0)


def test_from_policy_uses_the_resilience_keys():
    b = breaker_for("openai", ResiliencePolicy())
    assert (b.threshold, b.base_cooldown, b.max_cooldown, b.failure_rate, b.min_calls) == (
        5,
        30.0,
        300.0,
        0.5,
        20,
    )
    policy = policy_from_dict(
        {
            "resilience": {
                "breaker_threshold": 2,
                "breaker_cooldown_seconds": "2s",
                "breaker_max_cooldown_seconds": "1m",
                "breaker_failure_rate": 0.25,
                "breaker_min_calls": 8,
            }
        },
        source="test",
    )
    b = breaker_for("x", policy.resilience)
    assert (b.threshold, b.base_cooldown, b.max_cooldown, b.failure_rate, b.min_calls) == (
        2,
        2.0,
        60.0,
        0.25,
        8,
    )
    # The newer keys: today's behaviour by default, each carried through when set.
    d = breaker_for("openai", ResiliencePolicy())
    assert (
        d.window_calls, d.consecutive_min_calls, d.slow_call_s, d.slow_call_rate,
        d.half_open_probes,
    ) == (20, 1, None, 1.0, 1)  # fmt: skip
    policy = policy_from_dict(
        {
            "resilience": {
                "breaker_min_calls": 4,
                "breaker_window_calls": 10,
                "breaker_consecutive_min_calls": 3,
                "breaker_slow_call_ms": 1500,
                "breaker_slow_call_rate": "80%",
                "breaker_half_open_probes": 3,
            }
        },
        source="test",
    )
    b = breaker_for("x", policy.resilience)
    assert (
        b.window_calls, b.consecutive_min_calls, b.slow_call_s, b.slow_call_rate,
        b.half_open_probes,
    ) == (10, 3, 1.5, 0.8, 3)  # fmt: skip


def test_slow_answers_open_it_on_the_slow_call_rate_failed_or_not():
    b = CircuitBreaker(
        "u", threshold=10, min_calls=4, window_calls=5, slow_call_s=1.0, slow_call_rate=0.6
    )
    assert b.record(call(b, T0), SUCCESS, T0, 1.5) == ()
    assert b.record(call(b, T0), SUCCESS, T0, 0.2) == ()  # fast: not slow
    assert b.record(call(b, T0), FAILURE, T0, 3.0) == ()  # a slow failure is slow too
    assert b.record(call(b, T0), IGNORED, T0, 9.0) == ()  # a 4xx counts for nothing
    assert b.record(call(b, T0), SUCCESS, T0, 1.0) == ()  # exactly the threshold: not slow
    assert b.status(T0).window_slow == 2
    (change,) = b.record(call(b, T0), SUCCESS, T0, 2.0)  # 3 slow of the last 5 = 0.6
    assert (change.to_state, change.reason) == (OPEN, SLOW_CALL_RATE)
    assert (change.window_slow, change.window_calls, change.window_failures) == (3, 5, 1)


def test_without_a_slow_call_threshold_no_call_is_slow():
    b = CircuitBreaker("u", min_calls=2, slow_call_rate=0.5)
    for _ in range(10):
        assert b.record(call(b, T0), SUCCESS, T0, 3600.0) == ()
    assert b.status(T0).window_slow == 0 and b.state == CLOSED


def test_the_window_can_be_longer_than_min_calls():
    b = CircuitBreaker("u", threshold=100, failure_rate=0.5, min_calls=2, window_calls=6)
    for _ in range(4):
        b.record(call(b, T0), SUCCESS, T0)
    assert b.record(call(b, T0), FAILURE, T0) == ()  # 1 of 5
    assert b.record(call(b, T0), FAILURE, T0) == ()  # 2 of 6
    assert b.record(call(b, T0), FAILURE, T0) != ()  # 3 of the last 6: 0.5
    assert b.status(T0).window_calls == 6


def test_a_run_of_failures_trips_only_once_the_window_holds_consecutive_min_calls():
    b = CircuitBreaker("u", threshold=2, min_calls=10, consecutive_min_calls=4)
    assert fail_n(b, 3, T0) == ()  # three in a row, but only three calls seen
    assert b.state == CLOSED
    (change,) = fail_n(b, 1, T0)
    assert (change.reason, change.failures, change.window_calls) == (CONSECUTIVE_FAILURES, 4, 4)


def test_half_open_lets_n_probes_through_and_n_successes_close_it():
    b = CircuitBreaker("u", threshold=1, cooldown=1, min_calls=5, half_open_probes=3)
    trip(b, T0)
    t = T0 + 1
    probes = [call(b, t) for _ in range(3)]
    assert all(p.probe for p in probes)
    assert b.before_call(t).refusal.state == HALF_OPEN  # the fourth waits
    assert b.record(probes[0], SUCCESS, t) == ()
    assert b.before_call(t).refusal is not None  # a finished probe's place is not reissued
    assert b.record(probes[1], SUCCESS, t) == ()
    (change,) = b.record(probes[2], SUCCESS, t)
    assert (change.to_state, change.reason) == (CLOSED, PROBE_SUCCEEDED)


def test_one_failed_or_slow_probe_of_n_reopens_and_the_others_are_stale():
    for outcome, duration, reason in [(FAILURE, None, PROBE_FAILED), (SUCCESS, 5.0, PROBE_SLOW)]:
        b = CircuitBreaker(
            "u", threshold=1, cooldown=1, max_cooldown=8, min_calls=5, half_open_probes=2,
            slow_call_s=1.0,
        )  # fmt: skip
        trip(b, T0)
        first, second = call(b, T0 + 1), call(b, T0 + 1)
        (change,) = b.record(first, outcome, T0 + 1, duration)
        assert (change.to_state, change.reason, change.cooldown_s) == (OPEN, reason, 2.0)
        assert b.record(second, SUCCESS, T0 + 1, 0.1) == ()  # stale: cannot close it
        assert b.state == OPEN and b.status(T0 + 1).stale_outcomes == 1


def test_an_ignored_probe_of_n_gives_its_place_to_the_next_caller():
    b = CircuitBreaker("u", threshold=1, cooldown=1, min_calls=5, half_open_probes=2)
    trip(b, T0)
    first, second = call(b, T0 + 1), call(b, T0 + 1)
    assert b.abandon(first, T0 + 1) == ()
    third = call(b, T0 + 1)  # the abandoned probe's place
    assert third.probe and b.before_call(T0 + 1).refusal is not None
    assert b.record(second, SUCCESS, T0 + 1) == ()
    assert [c.to_state for c in b.record(third, SUCCESS, T0 + 1)] == [CLOSED]


def test_new_settings_refuse_values_that_cannot_work():
    for kw in (
        dict(half_open_probes=0),
        dict(consecutive_min_calls=0),
        dict(min_calls=4, consecutive_min_calls=5),
        dict(slow_call_s=0),
        dict(slow_call_s=math.inf),
        dict(slow_call_rate=0),
        dict(slow_call_rate=1.5),
    ):
        with pytest.raises(ValueError):
            CircuitBreaker("u", **kw)
    b = CircuitBreaker("u")
    with pytest.raises(ValueError, match="duration"):
        b.record(call(b, T0), SUCCESS, T0, -1.0)


# ---------------------------------------------------------------- properties


def first_trip(outcomes, threshold, rate, min_calls):
    """Reference: the index of the outcome that opens a closed breaker, or None."""
    counted = []
    run = 0
    for i, outcome in enumerate(outcomes):
        if outcome == IGNORED:
            continue
        counted.append(outcome == FAILURE)
        run = run + 1 if outcome == FAILURE else 0
        if outcome != FAILURE:
            continue
        last = counted[-min_calls:]
        if run >= threshold or (len(last) >= min_calls and sum(last) / len(last) >= rate):
            return i
    return None


@settings(deadline=None)
@given(
    outcomes=st.lists(st.sampled_from([SUCCESS, FAILURE, IGNORED]), max_size=80),
    threshold=st.integers(1, 8),
    rate=st.sampled_from([0.1, 0.25, 0.5, 0.75, 1.0]),
    min_calls=st.integers(1, 12),
)
def test_closed_opens_exactly_when_the_reference_says(outcomes, threshold, rate, min_calls):
    b = CircuitBreaker("u", threshold=threshold, failure_rate=rate, min_calls=min_calls)
    expected = first_trip(outcomes, threshold, rate, min_calls)
    for i, outcome in enumerate(outcomes):
        changes = b.record(call(b, T0), outcome, T0)
        if i == expected:
            assert [c.to_state for c in changes] == [OPEN]
            break
        assert changes == ()
    else:
        assert expected is None and b.state == CLOSED


def first_trip_with(calls, threshold, rate, min_calls, window, run_min, slow_s, slow_rate):
    """Reference for the fuller closed state: (index, reason) of the (outcome, duration)
    that opens it, or None. Written from the docstring, not from the code."""
    counted: list[tuple[bool, bool]] = []
    run = 0
    for i, (outcome, duration) in enumerate(calls):
        if outcome == IGNORED:
            continue
        failed = outcome == FAILURE
        slow = slow_s is not None and duration > slow_s
        counted.append((failed, slow))
        run = run + 1 if failed else 0
        last = counted[-window:]
        n = len(last)
        if failed and run >= threshold and n >= run_min:
            return i, CONSECUTIVE_FAILURES
        if failed and n >= min_calls and sum(f for f, _ in last) / n >= rate:
            return i, FAILURE_RATE
        if slow and n >= min_calls and sum(s for _, s in last) / n >= slow_rate:
            return i, SLOW_CALL_RATE
    return None


@settings(deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from([SUCCESS, FAILURE, IGNORED]), st.sampled_from([0.1, 0.9, 3.0])),
        max_size=80,
    ),
    threshold=st.integers(1, 8),
    rate=st.sampled_from([0.25, 0.5, 1.0]),
    min_calls=st.integers(1, 8),
    extra=st.integers(0, 6),
    run_min=st.integers(1, 14),
    slow_s=st.sampled_from([None, 0.5, 1.0]),
    slow_rate=st.sampled_from([0.25, 0.5, 1.0]),
)
def test_closed_opens_with_the_reason_the_reference_gives(
    calls, threshold, rate, min_calls, extra, run_min, slow_s, slow_rate
):
    window = min_calls + extra
    run_min = min(run_min, window)
    b = CircuitBreaker(
        "u", threshold=threshold, failure_rate=rate, min_calls=min_calls, window_calls=window,
        consecutive_min_calls=run_min, slow_call_s=slow_s, slow_call_rate=slow_rate,
    )  # fmt: skip
    expected = first_trip_with(
        calls, threshold, rate, min_calls, window, run_min, slow_s, slow_rate
    )
    for i, (outcome, duration) in enumerate(calls):
        changes = b.record(call(b, T0), outcome, T0, duration)
        if expected is not None and i == expected[0]:
            assert [(c.to_state, c.reason) for c in changes] == [(OPEN, expected[1])]
            break
        assert changes == ()
    else:
        assert expected is None and b.state == CLOSED


@settings(deadline=None)
@given(
    n=st.integers(1, 4),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["call", "finish"]),
            st.sampled_from([SUCCESS, FAILURE, IGNORED, "slow"]),
            st.integers(0, 10),
        ),
        max_size=30,
    ),
)
def test_half_open_decides_by_the_rule(n, steps):
    """Half-open with N probes: at most N in flight and let through (less the ignored);
    the first failed or slow probe reopens; the N-th success closes; nothing else moves it."""
    b = CircuitBreaker(
        "u", threshold=1, cooldown=1, min_calls=5, half_open_probes=n, slow_call_s=1.0
    )
    trip(b, T0)
    now = T0 + 1
    out: list[Permit] = []
    issued = passed = 0
    for action, outcome, pick in steps:
        if b.state != HALF_OPEN and issued:
            break  # the episode is decided
        if action == "call" or not out:
            verdict = b.before_call(now)
            assert verdict.allowed == (issued < n), (issued, n)
            if verdict.allowed:
                assert verdict.ticket.probe
                out.append(verdict.ticket)
                issued += 1
            continue
        ticket = out.pop(pick % len(out))
        duration = 5.0 if outcome == "slow" else 0.1
        changes = b.record(ticket, SUCCESS if outcome == "slow" else outcome, now, duration)
        if outcome == IGNORED:
            issued -= 1
            assert changes == ()
        elif outcome in (FAILURE, "slow"):
            reason = PROBE_FAILED if outcome == FAILURE else PROBE_SLOW
            assert [(c.to_state, c.reason) for c in changes] == [(OPEN, reason)]
        else:
            passed += 1
            expected = [(CLOSED, PROBE_SUCCEEDED)] if passed == n else []
            assert [(c.to_state, c.reason) for c in changes] == expected
        assert b.status(now).probes_in_flight == (len(out) if b.state == HALF_OPEN else 0)


class BreakerMachine(RuleBasedStateMachine):
    """Random calls, outcomes, abandons and clock steps (backwards too).

    Two breakers get the same operations: `b` the raw readings, `twin` the
    readings clamped by hand. Every answer must be the same, so a step back
    can neither lengthen nor shorten a cooldown.
    """

    @initialize(
        threshold=st.integers(1, 4),
        min_calls=st.integers(1, 6),
        cooldown=st.sampled_from([1.0, 2.5, 30.0]),
        factor=st.sampled_from([1, 2, 3, 10]),
        probes=st.integers(1, 3),
        slow_call_s=st.sampled_from([None, 0.5]),
    )
    def setup(self, threshold, min_calls, cooldown, factor, probes, slow_call_s):
        kw = dict(
            threshold=threshold,
            cooldown=cooldown,
            max_cooldown=cooldown * factor,
            failure_rate=0.5,
            min_calls=min_calls,
            half_open_probes=probes,
            slow_call_s=slow_call_s,
        )
        self.b = CircuitBreaker("u", **kw)
        self.twin = CircuitBreaker("u", **kw)
        self.raw = T0
        self.clamped = -math.inf  # nothing handed over yet
        self.outstanding: list[Permit] = []
        self.opened_at: float | None = None
        self.refusals = 0

    def both(self, method, *args):
        # The clamp a caller would apply: the furthest reading handed over so far.
        self.clamped = max(self.clamped, self.raw)
        a = getattr(self.b, method)(*args, self.raw)
        b = getattr(self.twin, method)(*args, self.clamped)
        assert a == b
        return a

    def note_changes(self, changes):
        for change in changes:
            assert change.from_state != change.to_state
            if change.to_state == OPEN:
                self.opened_at = self.clamped
                assert self.b.base_cooldown <= change.cooldown_s <= self.b.max_cooldown

    @rule(dt=st.floats(-40, 40, allow_nan=False))
    def step_clock(self, dt):
        self.raw += dt

    @rule()
    def before_call(self):
        was = self.b.state
        verdict = self.both("before_call")
        self.note_changes(verdict.events)
        if verdict.allowed:
            self.outstanding.append(verdict.ticket)
            assert verdict.ticket.probe == (self.b.state == HALF_OPEN)
            if was == OPEN:
                assert self.clamped >= self.opened_at + self.b.status(self.clamped).cooldown_s
        else:
            self.refusals += 1
            r = verdict.refusal
            if r.state == OPEN:
                # exactly the time left until opened_at + cooldown, never more or less
                left = self.opened_at + self.b.status(self.clamped).cooldown_s - self.clamped
                assert r.retry_after_s == pytest.approx(left, abs=1e-9)
                assert 0 < r.retry_after_s <= self.b.max_cooldown
            else:
                # half-open refuses only once all its probes are out
                s = self.b.status(self.clamped)
                assert s.probe_in_flight and s.probes_in_flight <= self.b.half_open_probes

    @precondition(lambda self: self.outstanding)
    @rule(
        data=st.data(),
        outcome=st.sampled_from([SUCCESS, FAILURE, IGNORED, "abandon"]),
        duration=st.sampled_from([None, 0.0, 0.1, 2.0]),
    )
    def finish(self, data, outcome, duration):
        ticket = data.draw(st.sampled_from(self.outstanding))
        self.outstanding.remove(ticket)
        if outcome == "abandon":
            changes = self.both("abandon", ticket)
        else:
            # both() passes the reading last; the duration goes by name
            a = self.b.record(ticket, outcome, self.raw, duration)
            self.clamped = max(self.clamped, self.raw)
            b = self.twin.record(ticket, outcome, self.clamped, duration)
            assert a == b
            changes = a
        self.note_changes(changes)
        if changes and ticket.probe:
            slow = self.b.slow_call_s is not None and duration is not None and duration > 0.5
            expected = OPEN if outcome == FAILURE or slow else CLOSED
            assert [c.to_state for c in changes] == [expected]

    @rule()
    def no_wedge(self):
        """Whatever the state: once every call has reported or been abandoned and
        the longest cooldown has passed, a call is let through."""
        for ticket in self.outstanding:
            self.note_changes(self.both("abandon", ticket))
        self.outstanding = []
        self.raw = max(self.clamped, self.raw) + self.b.max_cooldown
        verdict = self.both("before_call")
        self.note_changes(verdict.events)
        assert verdict.allowed
        self.outstanding.append(verdict.ticket)

    @invariant()
    def consistent(self):
        s = self.b.status(self.raw)
        assert s == self.twin.status(max(self.clamped, self.raw))
        assert s.refusals == self.refusals
        assert s.in_flight == len(self.outstanding)
        probes = [t for t in self.outstanding if t.probe and t.epoch == s.transitions]
        assert len(probes) == s.probes_in_flight <= self.b.half_open_probes
        assert s.probe_in_flight == bool(probes)
        assert sum(s.transitions_to.values()) == s.transitions
        assert s.probe_in_flight <= (s.state == HALF_OPEN)
        assert (s.ready_reason is None) == (s.state == CLOSED)
        assert self.b.base_cooldown <= s.cooldown_s <= self.b.max_cooldown
        if s.state == CLOSED:
            assert s.cooldown_s == self.b.base_cooldown


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = settings(stateful_step_count=40, deadline=None)
