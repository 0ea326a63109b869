"""A regression reads as FAIL: fail outranks unknown, "nothing happened" is an observation
(a breaker that never moved is `closed`, an event type never written counts 0), and a check
that means something only once a state was reached names that precondition (`requires:`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.gameday.assertions import (
    FAIL,
    PASS,
    UNKNOWN,
    VERDICTS,
    Check,
    with_preconditions,
    worst,
)
from chaos.gameday.derive import breaker, counts, derive
from chaos.gameday.phase import loads_phase
from chaos.gameday.runner import Outcome, judge
from chaos.yamldoc import YamlError

PHASE = """\
name: demo
title: A demo phase
fmea: [F03]
seed: 7
budget: 10s
run:
  agents: [{name: a, mode: loop, calls: 3}]
  max_wall_clock: 5s
expect:
  - name: the breaker opened
    query: "breaker.opens.openai"
    at_least: 1
  - name: nothing was forwarded while it was open
    query: "breaker.requests_while_open"
    equals: 0
    requires: the breaker opened
  - name: the cycle
    query: "breaker.sequence.openai"
    equals: closed>open>half_open>closed
    requires: [the breaker opened]
"""


def check(name: str, verdict: str) -> Check:
    return Check(name, "q", "equals", 1, 1, verdict, "" if verdict == PASS else "why")


def test_a_breaker_that_never_moved_is_closed_not_missing():
    out = breaker([], {"openai": []}, ["openai", "anthropic"])
    assert out["sequence"] == {"anthropic": "closed", "openai": "closed"}
    assert out["opens"] == {"anthropic": 0, "openai": 0}
    assert (out["opened"], out["requests_while_open"], out["stub_calls_while_open"]) == (0, 0, 0)
    # and one that moved starts from the state the ledger names
    moved = [
        {"seq": 1, "type": "breaker.state", "upstream": "openai", "from": "closed", "to": "open"}
    ]
    out = breaker(moved, {}, ["openai"])
    assert out["sequence"] == {"openai": "closed>open"} and out["opens"] == {"openai": 1}


def test_every_configured_upstream_has_latency_facts():
    out = derive({"events": [], "stubs": {}}, ["openai"])["latency"]["by_provider"]
    assert out == {
        "openai": {"count": 0, "p50_ms": None, "p90_ms": None, "p95_ms": None,
                   "p99_ms": None, "p999_ms": None, "max_ms": None}
    }  # fmt: skip


def test_counts_name_every_ledger_event_type_with_zero():
    from docket.ledger.chain import EVENT_TYPES

    out = counts([{"type": "model.request"}], EVENT_TYPES)
    assert out["model.request"] == 1 and out["cap.exceeded"] == 0
    assert derive({"events": []})["counts"]["breaker.state"] == 0


def test_a_failed_precondition_fails_the_check_that_would_pass_vacuously():
    judged = with_preconditions(
        [check("opened", FAIL), check("none while open", PASS), check("free", PASS)],
        [(), ("opened",), ()],
    )
    assert [c.verdict for c in judged] == [FAIL, FAIL, PASS]
    assert "precondition not met: «opened» failed" in judged[1].reason


def test_an_unjudged_precondition_leaves_its_check_unknown_but_not_a_fail():
    judged = with_preconditions(
        [check("p", UNKNOWN), check("a", PASS), check("b", FAIL)], [(), ("p",), ("p",)]
    )
    assert [c.verdict for c in judged] == [UNKNOWN, UNKNOWN, FAIL]


@given(st.lists(st.sampled_from(VERDICTS), min_size=1, max_size=6), st.data())
def test_preconditions_never_turn_a_check_into_a_pass(verdicts, data):
    checks = [check(f"c{i}", v) for i, v in enumerate(verdicts)]
    requires = [
        tuple(data.draw(st.sets(st.sampled_from([f"c{j}" for j in range(i)]))) if i else ())
        for i in range(len(checks))
    ]
    judged = with_preconditions(checks, requires)
    for before, after, needs in zip(checks, judged, requires, strict=True):
        if after.verdict == PASS:
            assert before.verdict == PASS
            assert all(judged[int(n[1:])].verdict == PASS for n in needs)
    # a fail anywhere fails the group, whatever else is unknown
    if FAIL in verdicts:
        assert worst(c.verdict for c in judged) == FAIL


def test_requires_is_read_from_the_phase_file_and_judged():
    phase = loads_phase(PHASE, "gamedays/demo.yaml")
    assert [e.requires for e in phase.expect] == [
        (),
        ("the breaker opened",),
        ("the breaker opened",),
    ]
    evidence = {"events": [], "stubs": {"openai": []}}
    from chaos.gameday.runner import complete_evidence

    evidence = complete_evidence(evidence, phase.run)
    result = judge(phase, {"run": Outcome(evidence, None)}, seed=7, duration_s=1.0)
    verdicts = {c.check.name: c.verdict for c in result.checks}
    # the breaker never opened: that is a fail, and so are the claims that needed it;
    # the sequence is an observation (closed), not a missing value
    assert verdicts == {
        "the breaker opened": FAIL,
        "nothing was forwarded while it was open": FAIL,
        "the cycle": FAIL,
    }
    assert result.verdict == FAIL
    assert result.checks[1].to_json()["requires"] == ["the breaker opened"]


@pytest.mark.parametrize(
    ("requires", "problem"),
    [
        ("no such check", "no check of that name written before it"),
        ("the cycle", "no check of that name written before it"),  # written after: no cycle
        ("[]", "requires names an earlier check"),
        ("3", "requires names an earlier check"),
        ("[the breaker opened, the breaker opened]", "names a check twice"),
    ],
)
def test_a_bad_requires_is_one_line_with_its_place(requires, problem):
    text = PHASE.replace("requires: the breaker opened", f"requires: {requires}")
    with pytest.raises(YamlError) as caught:
        loads_phase(text, "gamedays/demo.yaml")
    assert problem in str(caught.value) and "gamedays/demo.yaml:" in str(caught.value)


TWO_RUNS = """\
name: pair
title: Two runs
fmea: [F03]
seed: 7
budget: 20s
runs:
  - name: first
    run: {agents: [{name: a, mode: loop, calls: 1}], max_wall_clock: 5s}
  - name: second
    run: {agents: [{name: a, mode: loop, calls: 1}], max_wall_clock: 5s}
expect:
  - name: one call
    run: first
    query: "counts.\\"model.request\\""
    equals: 1
  - name: another call
    run: second
    query: "counts.\\"model.request\\""
    equals: 1
    requires: one call
"""


def test_a_precondition_reads_the_same_run():
    with pytest.raises(YamlError) as caught:
        loads_phase(TWO_RUNS, "gamedays/pair.yaml")
    assert "requires 'one call', which reads run 'first', not 'second'" in str(caught.value)
    phase = loads_phase(TWO_RUNS.replace("    requires: one call\n", ""), "gamedays/pair.yaml")
    assert phase.only("second").expect[0].requires == ()
