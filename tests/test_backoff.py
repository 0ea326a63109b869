"""The backoff policy and the Retry-After parser: pure, so tested without sockets."""

from __future__ import annotations

import math
from email.utils import formatdate
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.agent.backoff import BackoffPolicy, GiveUp, Wait, parse_retry_after

policies = st.builds(
    BackoffPolicy,
    base=st.floats(min_value=1e-4, max_value=10.0),
    cap=st.floats(min_value=1e-3, max_value=600.0),
    max_attempts=st.integers(min_value=1, max_value=50),
    max_hint=st.floats(min_value=1e-3, max_value=3600.0),
)
attempts = st.integers(min_value=0, max_value=5000)
hints = st.none() | st.floats(min_value=0.0, max_value=1e6)
seeds = st.integers(min_value=0, max_value=2**64)


@settings()
@given(policies, attempts, hints, seeds)
def test_delay_is_bounded_below_by_the_hint_and_above_by_cap_or_hint(policy, attempt, hint, seed):
    wait = policy.delay(attempt, hint, Random(seed))
    assert math.isfinite(wait)
    assert wait >= 0.0
    assert wait >= (hint or 0.0)
    assert wait <= max(policy.cap, hint or 0.0)


@settings()
@given(policies, attempts, seeds)
def test_without_a_hint_the_wait_stays_inside_a_doubling_envelope(policy, attempt, seed):
    wait = policy.delay(attempt, None, Random(seed))
    assert wait <= policy.envelope(attempt)
    nxt = policy.envelope(attempt + 1)
    assert nxt == min(policy.cap, 2 * policy.envelope(attempt)) or nxt == policy.cap
    assert policy.envelope(0) == min(policy.cap, policy.base)


@settings()
@given(policies, st.lists(hints, min_size=1, max_size=20), seeds)
def test_a_seeded_rng_gives_the_same_waits(policy, hint_list, seed):
    first, second = Random(seed), Random(seed)
    a = [policy.delay(i, h, first) for i, h in enumerate(hint_list)]
    b = [policy.delay(i, h, second) for i, h in enumerate(hint_list)]
    assert a == b


def test_full_jitter_spreads_over_the_whole_envelope():
    # Full jitter, not "equal jitter" or a fixed wait: draws reach both ends.
    policy = BackoffPolicy(base=1.0, cap=8.0)
    rng = Random(20150304)
    for attempt, envelope in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (9, 8.0)]:
        waits = [policy.delay(attempt, None, rng) for _ in range(400)]
        assert min(waits) < 0.05 * envelope
        assert max(waits) > 0.95 * envelope
        assert max(waits) <= envelope


def test_a_hint_longer_than_the_jitter_is_the_wait_exactly():
    policy = BackoffPolicy(base=0.05, cap=0.2)
    rng = Random(1)
    assert [policy.delay(a, 0.3, rng) for a in range(6)] == [0.3] * 6


@settings()
@given(policies, attempts, hints, seeds)
def test_decide_gives_up_exactly_at_the_limits(policy, attempt, hint, seed):
    rng = Random(seed)
    decision = policy.decide(attempt, hint, rng)
    if attempt + 1 >= policy.max_attempts:
        assert decision == GiveUp("max_attempts")
    elif hint is not None and hint > policy.max_hint:
        assert decision == GiveUp("retry_after_too_long")
    else:
        assert isinstance(decision, Wait)
        assert decision.seconds == policy.delay(attempt, hint, Random(seed))


def test_giving_up_does_not_draw_from_the_rng():
    policy = BackoffPolicy(max_attempts=2)
    rng = Random(5)
    assert policy.decide(1, None, rng) == GiveUp("max_attempts")
    assert rng.random() == Random(5).random()


def test_max_attempts_counts_the_first_attempt():
    policy = BackoffPolicy(max_attempts=3)
    rng = Random(0)
    decisions = [policy.decide(a, None, rng) for a in range(3)]
    assert [type(d) for d in decisions] == [Wait, Wait, GiveUp]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": 0.0},
        {"base": -1.0},
        {"cap": math.inf},
        {"cap": math.nan},
        {"max_attempts": 0},
        {"max_hint": -5.0},
    ],
)
def test_a_nonsense_policy_is_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        BackoffPolicy(**kwargs)


def test_negative_attempt_is_refused():
    with pytest.raises(ValueError, match="attempt"):
        BackoffPolicy().envelope(-1)


@pytest.mark.parametrize(
    "header, seconds",
    [
        ("0", 0.0),
        ("2", 2.0),
        ("120", 120.0),
        (" 3 ", 3.0),
        ("0.25", 0.25),
        ("1.", 1.0),
        (".5", 0.5),
    ],
)
def test_delta_seconds_parse(header, seconds):
    assert parse_retry_after(header) == seconds


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "   ",
        "-1",
        "+1",
        "1e3",
        "nan",
        "inf",
        "abc",
        "1,5",
        "1 2",
        "0x10",
        "\u0663",  # an Arabic-Indic three: float() takes it, RFC 9110 does not
        "9" * 400,  # finite digits, infinite float
        "Wed, 21 Oct 2015 07:28:00 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
    ],
)
def test_no_usable_hint_is_none(header):
    assert parse_retry_after(header) is None


@settings()
@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_formatted_seconds_round_trip(seconds):
    text = f"{seconds:.6f}"
    assert parse_retry_after(text) == float(text)


@settings()
@given(st.integers(min_value=0, max_value=2**33))
def test_http_dates_are_ignored(epoch):
    assert parse_retry_after(formatdate(epoch, usegmt=True)) is None


@settings()
@given(st.text(max_size=40))
def test_any_header_is_none_or_a_finite_non_negative_wait(text):
    value = parse_retry_after(text)
    assert value is None or (math.isfinite(value) and value >= 0)
