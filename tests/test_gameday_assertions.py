"""chaos.gameday.assertions: a JMESPath query and one comparison; unknown is never a pass."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.gameday.assertions import (
    FAIL,
    OPERATORS,
    PASS,
    UNKNOWN,
    Assertion,
    QueryError,
    compile_query,
    evaluate,
    json_equal,
    worst,
)

EVIDENCE = {
    "events": [
        {"seq": 0, "type": "session.start"},
        {"seq": 1, "type": "model.request", "provider": "openai"},
        {"seq": 2, "type": "model.error", "reason": "timeout", "duration_ms": 301},
        {"seq": 3, "type": "model.request", "provider": "openai"},
        {"seq": 4, "type": "model.response", "status": 200, "duration_ms": 12},
    ],
    "receipt": {"ops": {"evidence": {"ledger_complete": False}}, "totals": {"model_calls": 2}},
    "stub_calls": {"openai": 2},
    "name": "runaway",
}


def verdict(query: str, op: str, expected: object) -> str:
    return evaluate(Assertion("a", query, op, expected), EVIDENCE).verdict


@pytest.mark.parametrize(
    ("query", "op", "expected", "want"),
    [
        ("length(events[?type=='model.request'])", "equals", 2, PASS),
        ("length(events[?type=='model.request'])", "equals", 3, FAIL),
        ("receipt.totals.model_calls", "at_most", 2, PASS),
        ("receipt.totals.model_calls", "at_most", 1, FAIL),
        ("receipt.totals.model_calls", "at_least", 2, PASS),
        ("receipt.totals.model_calls", "greater_than", 2, FAIL),
        ("receipt.totals.model_calls", "less_than", 3, PASS),
        ("receipt.ops.evidence.ledger_complete", "is_false", True, PASS),
        ("receipt.ops.evidence.ledger_complete", "is_true", True, FAIL),
        ("events[].type", "contains", "model.error", PASS),
        ("events[].type", "not_contains", "cap.exceeded", PASS),
        ("events[].type", "not_contains", "model.error", FAIL),
        ("name", "contains", "away", PASS),
        ("name", "one_of", ["runaway", "hammer"], PASS),
        ("name", "matches", "^run", PASS),
        ("name", "matches", "^hammer", FAIL),
        ("stub_calls", "equals", {"openai": 2}, PASS),
        ("stub_calls.openai == receipt.totals.model_calls", "is_true", True, PASS),
        ("name", "not_equals", "hammer", PASS),
    ],
)
def test_operators(query, op, expected, want):
    assert verdict(query, op, expected) == want


@pytest.mark.parametrize(
    ("query", "op", "expected"),
    [
        ("receipt.no_such_field", "equals", 0),  # null where a value was needed
        ("receipt.no_such_field", "at_least", 0),
        ("receipt.no_such_field", "not_equals", 5),
        ("name", "at_least", 1),  # a string where a number was needed
        ("receipt.totals.model_calls", "is_true", True),  # a number is not a boolean
        ("receipt.totals.model_calls", "contains", 2),
        ("receipt.totals.model_calls", "matches", "2"),
        ("name < `1`", "is_true", True),  # jmespath's interpreter raises on str < int
        ("abs(name)", "equals", 1),  # a function given the wrong type
    ],
)
def test_what_cannot_be_evaluated_is_unknown_with_a_reason(query, op, expected):
    check = evaluate(Assertion("a", query, op, expected), EVIDENCE)
    assert check.verdict == UNKNOWN
    assert check.reason


def test_null_is_an_observation_only_where_null_was_written():
    assert verdict("receipt.no_such_field", "equals", None) == PASS


def test_json_comparisons_are_not_pythons():
    assert not json_equal(True, 1)
    assert not json_equal(0, False)
    assert json_equal(1, 1.0)
    assert not json_equal([1, 2], [2, 1])
    assert json_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]})
    # so a count of 1 is not "true", and true is not the number 1
    assert verdict("receipt.totals.model_calls", "equals", True) == FAIL
    assert verdict("receipt.ops.evidence.ledger_complete", "equals", 0) == FAIL


def test_a_failed_check_says_what_was_observed_and_expected():
    check = evaluate(Assertion("n", "receipt.totals.model_calls", "at_most", 1), EVIDENCE)
    assert (check.verdict, check.observed, check.expected) == (FAIL, 2, 1)
    assert check.reason == "observed 2, expected <= 1"
    assert check.to_json()["verdict"] == FAIL


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("", "non-empty"),
        ("events[?type==", "not a JMESPath query"),
        ("a - b", "not a JMESPath query"),
        ("nope(events)", "no function nope()"),
        ("length(events, receipt)", "length() takes 1 argument(s), not 2"),
        ("merge()", "merge() takes at least 1 argument(s), not 0"),
        ("[length(a)][?contains(@)]", "contains() takes 2 argument(s), not 1"),
    ],
)
def test_a_bad_query_is_refused_when_compiled(query, problem):
    with pytest.raises(QueryError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        compile_query(query)


@pytest.mark.parametrize(
    ("op", "value"),
    [("at_least", "3"), ("at_least", True), ("is_true", False), ("one_of", 3), ("matches", "(")],
)
def test_a_bad_operand_is_refused(op, value):
    with pytest.raises(ValueError):
        Assertion("a", "x", op, value)


def test_worst_rolls_up_fail_over_unknown_over_pass():
    assert worst([PASS, PASS]) == PASS
    assert worst([PASS, FAIL]) == FAIL
    # a contradicting observation is a regression found: one unjudged check cannot hide it
    assert worst([FAIL, UNKNOWN, PASS]) == FAIL
    assert worst([UNKNOWN, PASS]) == UNKNOWN
    assert worst([]) == UNKNOWN  # nothing was shown to hold


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-5, 5) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=8,
)
QUERIES = st.sampled_from(["a", "a.b", "a[0]", "length(a)", "a < b", "a == b", "max(a)", "b[?c]"])


def _operand(op: str, value: object) -> object:
    kind = OPERATORS[op].operand
    if kind == "number":
        return value if isinstance(value, int) and not isinstance(value, bool) else 1
    if kind == "true":
        return True
    if kind == "array":
        return [value]
    if kind == "regex":
        return "x"
    return value


@settings(deadline=None)
@given(
    st.dictionaries(st.sampled_from("abc"), JSON, max_size=3),
    QUERIES,
    st.sampled_from(sorted(OPERATORS)),
    JSON,
)
def test_evaluate_never_raises_and_null_never_passes(evidence, query, op, value):
    assertion = Assertion("h", query, op, _operand(op, value))
    check = evaluate(assertion, evidence)
    assert check.verdict in (PASS, FAIL, UNKNOWN)
    if check.observed is None and check.verdict == PASS:
        assert op == "equals" and assertion.expected is None


@settings(deadline=None)
@given(st.integers(-1000, 1000) | st.floats(-1e6, 1e6, allow_nan=False), st.integers(-1000, 1000))
def test_number_comparisons_agree_with_arithmetic(observed, bound):
    evidence = {"x": observed}
    for op, holds in (
        ("at_least", observed >= bound),
        ("at_most", observed <= bound),
        ("greater_than", observed > bound),
        ("less_than", observed < bound),
    ):
        got = evaluate(Assertion("n", "x", op, bound), evidence).verdict
        assert got == (PASS if holds else FAIL)
