"""The retry budget (docket.agent.budget) and the backoff policy's deadline: pure, so
property-tested without sockets."""

from __future__ import annotations

import math
from fractions import Fraction
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.agent.backoff import BackoffPolicy, GiveUp, Wait, retryable
from docket.agent.budget import RetryBudget, allowance, ratio_from

ratios = st.integers(min_value=0, max_value=1000).map(lambda n: Fraction(n, 1000))
floors = st.integers(min_value=0, max_value=20)
# True: a first attempt; False: a retry the agent wants to make
wants = st.lists(st.booleans(), max_size=400)


@settings()
@given(ratios, floors, wants)
def test_retries_never_exceed_the_share_of_first_attempts_plus_the_floor(ratio, floor, steps):
    budget = RetryBudget(ratio, floor)
    for first in steps:
        if first:
            budget.deposit()
        else:
            budget.withdraw()
        assert budget.retries <= ratio * budget.first_attempts + floor
    assert budget.retries + budget.refused == steps.count(False)


@settings()
@given(ratios, floors, wants)
def test_a_retry_is_refused_only_when_less_than_a_token_is_left(ratio, floor, steps):
    budget = RetryBudget(ratio, floor)
    for first in steps:
        if first:
            budget.deposit()
            continue
        before = budget.balance
        assert budget.allows() == (before >= 1)
        granted = budget.withdraw()
        assert granted == (before >= 1)
        assert budget.balance == (before - 1 if granted else before)


@settings()
@given(floors, st.integers(min_value=0, max_value=10))
def test_the_floor_lets_the_first_failures_retry_before_any_deposit(floor, extra):
    budget = RetryBudget(Fraction(1, 10), floor)
    granted = [budget.withdraw() for _ in range(floor + extra)]
    assert granted == [True] * floor + [False] * extra


def test_the_default_is_a_tenth_plus_three():
    budget = RetryBudget()
    for _ in range(20):
        budget.deposit()
    assert [budget.withdraw() for _ in range(6)] == [True] * 5 + [False]
    assert allowance(20) == 5
    assert budget.summary() == {
        "ratio": 0.1, "floor": 3, "first_attempts": 20, "retries": 5, "refused": 1,
    }  # fmt: skip


def test_a_float_ratio_is_held_exactly_to_three_decimals():
    assert ratio_from(0.1) == Fraction(1, 10)
    assert ratio_from(0.125) == Fraction(1, 8)
    with pytest.raises(ValueError, match="from 0 to 1"):
        RetryBudget(Fraction(3, 2))
    with pytest.raises(ValueError, match="at least 0"):
        RetryBudget(Fraction(1, 10), -1)


@pytest.mark.parametrize(
    "kind, status, reason, expected",
    [
        ("refused", 429, None, True),
        ("refused", 502, None, True),
        ("refused", 503, None, True),
        ("refused", 504, None, True),
        ("refused", 529, None, True),
        ("refused", 400, None, False),
        ("refused", 401, None, False),
        ("refused", 403, None, False),
        ("refused", 404, None, False),
        ("refused", 409, None, False),
        ("refused", 500, None, False),
        ("error", None, "ConnectError", True),
        ("error", None, "ConnectTimeout", True),
        ("error", None, "ReadTimeout", False),  # the request may have been taken: not resent
        ("error", 200, "malformed_body", False),
        ("ok", 200, None, False),
    ],
)
def test_what_is_retried(kind, status, reason, expected):
    assert retryable(kind, status, reason) is expected


@settings()
@given(st.integers(min_value=400, max_value=499))
def test_no_other_4xx_is_retried(status):
    assert retryable("refused", status, None) is (status == 429)


policies = st.builds(
    BackoffPolicy,
    base=st.floats(min_value=1e-4, max_value=10.0),
    cap=st.floats(min_value=1e-3, max_value=600.0),
    max_attempts=st.integers(min_value=1, max_value=50),
    max_hint=st.floats(min_value=1e-3, max_value=3600.0),
)


@settings()
@given(
    policies,
    st.integers(min_value=0, max_value=60),
    st.none() | st.floats(min_value=0.0, max_value=100.0),
    st.floats(min_value=-1.0, max_value=100.0),
    st.integers(min_value=0, max_value=2**32),
)
def test_no_wait_runs_past_the_deadline(policy, attempt, hint, left, seed):
    decision = policy.decide(attempt, hint, Random(seed), left)
    if isinstance(decision, Wait):
        assert 0 <= decision.seconds < left
        assert decision.seconds >= (hint or 0.0)  # the hint is still a floor
    else:
        assert decision.reason in ("max_attempts", "retry_after_too_long", "deadline")
    if left <= 0:
        assert isinstance(decision, GiveUp)
    # without a deadline the answer is the policy's as it always was
    unlimited = policy.decide(attempt, hint, Random(seed))
    assert unlimited == policy.decide(attempt, hint, Random(seed), math.inf)
