"""admission.admit: the boundary's admission of a call as a pure function of its facts.

No sockets: facts are built by hand, each rule's fact drawn as unknown, letting the
call through, or refusing it; the answer must be the first rule (in RULES order)
that is unknown (Ask) or refuses (its Refusal), and Admitted only when every rule
let the call through.
"""

from __future__ import annotations

import copy
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from docket.boundary.admission import RULE_NAMES, RULES, Admitted, Ask, admit
from docket.boundary.calls import UNKNOWN, CallFacts
from docket.boundary.providers import DOCKET_ERRORS, RequestFacts
from docket.boundary.rules import body, bulkhead, caps, limiter, request
from docket.boundary.rules.base import Refusal
from docket.boundary.rules.body import BodyProblem
from docket.boundary.rules.budget import BadBudget
from docket.boundary.rules.bulkhead import Waited
from docket.boundary.rules.fleet import Uncovered
from docket.boundary.rules.request import Unparsed
from docket.fleet.lease import RETRY_AFTER_S
from docket.guards import breaker as brk
from docket.guards import caps as cp
from docket.guards.bulkhead import DEADLINE, QUEUE_FULL, Shed
from docket.guards.bulkhead import Ticket as SlotTicket
from docket.guards.bulkhead_trio import Entered
from docket.guards.deadline import Attempt, Spent
from docket.guards.limiter import Admit, Refuse

# The precedence the boundary has always applied (app.py before admission.py), written
# out here rather than read from admission.RULES, so that a change of order fails.
ORDER = (
    "auth",
    "body",
    "request",
    "endpoint",
    "budget",
    "caps",
    "fleet",
    "deadline",
    "limiter",
    "breaker",
    "bulkhead",
    "attempt",
)
MODEL = "gpt-4o-mini"
CHAT = RequestFacts("openai", "chat.completions", MODEL, False, 100)
OTHER = RequestFacts("openai", "other", MODEL, False, None)
RESERVATION = cp.Reservation(7, MODEL, None, 0, 10, 5, 5, True)
ADMITTED_CAPS = cp.Decision(allowed=True, reservation=RESERVATION, refusal=None)
ATTEMPT = Attempt(math.inf, None)
SPENT = Spent(deadline_ms=50, remaining_s=0.001, reserve_s=0.02)
TICKET = brk.Permit(1, 0, probe=False)
ENTERED = Entered(SlotTicket(3), started=1.0, waited_s=0.0, position=0)


def caps_refusal(*, deferred: bool) -> cp.Decision:
    refusal = cp.CapRefusal(
        rule="caps.max_usd",
        cap="max_usd",
        reason="max_usd: ...",
        limit=100,
        committed=10,
        reserved=80,
        requested=50,
        unit="nusd",
        would_fit_after_settle=deferred,
        deferred=deferred,
    )
    return cp.Decision(allowed=False, reservation=None, refusal=refusal)


REFUSE = Refuse("max_calls_per_second", 0.25, 0.0, None, 2.0, None)
OPEN = brk.Verdict(ticket=None, refusal=brk.BreakerRefusal("openai", brk.OPEN, 3.0, "breaker open"))
SHED = Shed("openai", QUEUE_FULL, 0.5, queue=4, in_flight=8, expected_wait_s=None)

# Per rule: (a fact that lets the call through, one that refuses it); endpoint's fact
# is the request's (a parsed request for an endpoint the boundary does not record).
FACTS = {
    "auth": (True, False),
    "body": (b"{}", BodyProblem(True, "request body over 10 bytes", "body_too_large", 413)),
    "request": (CHAT, Unparsed("not JSON", param=None, code="bad_json")),
    "endpoint": (CHAT, OTHER),
    "budget": (None, BadBudget("x-docket-deadline-ms: not a number")),
    "caps": (ADMITTED_CAPS, caps_refusal(deferred=False)),
    "fleet": (None, Uncovered("no_lease", "fleet budget 'b': no slice of it is held")),
    "deadline": (ATTEMPT, SPENT),
    "limiter": (Admit(tokens_left=1.0, window_count=None), REFUSE),
    "breaker": (brk.Verdict(ticket=TICKET, refusal=None), OPEN),
    "bulkhead": (ENTERED, Waited(SHED)),
    "attempt": (ATTEMPT, SPENT),
}
SPENT_AFTER_WAIT = Spent(deadline_ms=60, remaining_s=0.0, reserve_s=0.02)
FACTS["attempt"] = (ATTEMPT, SPENT_AFTER_WAIT)  # told apart from the deadline's by its figures

# Which rule a refusal came from, read off the refusal alone.
SIGNATURE = {
    "auth": lambda r: (r.rule, r.error_type) == ("auth", "docket_unauthorized"),
    "body": lambda r: r.rule == "max_request_bytes",
    "request": lambda r: r.rule == "bad_request" and r.extra == {"code": "bad_json"},
    "endpoint": lambda r: r.rule == "endpoint",
    "budget": lambda r: r.rule == "bad_request" and r.extra == {"param": "x-docket-deadline-ms"},
    "caps": lambda r: (r.rule, r.error_type) == ("caps.max_usd", "docket_policy_denied"),
    "fleet": lambda r: r.error_type == "docket_fleet_unavailable",
    "deadline": lambda r: r.rule == "deadline" and r.fields.get("deadline_ms") == 50,
    "limiter": lambda r: r.error_type == "docket_rate_limited",
    "breaker": lambda r: r.error_type == "docket_breaker_open",
    "bulkhead": lambda r: r.error_type == "docket_load_shed",
    "attempt": lambda r: r.rule == "deadline" and r.fields.get("deadline_ms") == 60,
}


def facts_for(verdicts: dict[str, str], *, body_complete: bool = True) -> CallFacts:
    """CallFacts with each rule's fact "pass", "refuse" or "unknown"."""
    f = CallFacts("openai", "POST", "v1/chat/completions", body_complete)
    for rule in RULES:
        verdict = verdicts.get(rule.name, "pass")
        if rule.name == "endpoint":
            if f[rule.fact] is CHAT and verdict == "refuse":
                f[request.FACT] = OTHER
            continue
        if verdict != "unknown":
            f[rule.fact] = FACTS[rule.name][verdict == "refuse"]
    parsed = f[request.FACT]
    if isinstance(parsed, RequestFacts):
        f.model = parsed.model  # as the request rule's learner sets it
    return f


def expected(verdicts: dict[str, str]) -> str:
    """The reference: the first rule not passed, or "admitted"."""
    for rule in ORDER:
        verdict = verdicts.get(rule, "pass")
        if rule == "endpoint" and verdicts.get("request", "pass") != "pass":
            continue  # no parsed request to judge (the request rule answers first)
        if verdict != "pass":
            return f"{verdict}:{rule}"
    return "admitted"


def observed(step: Ask | Refusal | Admitted) -> str:
    if isinstance(step, Ask):
        return f"unknown:{step.rule}"
    if isinstance(step, Admitted):
        return "admitted"
    (rule,) = [rule for rule, looks in SIGNATURE.items() if looks(step)]
    return f"refuse:{rule}"


# Mostly "pass", so that the calls drawn get deep into the rules and two later rules
# often both refuse or go unknown (where an order swapped between them would show).
VERDICTS = st.fixed_dictionaries(
    {
        rule: st.sampled_from(
            ["pass"] * 5 + (["refuse"] if rule == "endpoint" else ["refuse", "unknown"])
        )
        for rule in ORDER
    }
)


@settings(deadline=None)
@given(verdicts=VERDICTS)
def test_the_answer_is_the_first_rule_not_passed_in_precedence_order(verdicts):
    facts = facts_for(verdicts)
    before, line = facts.known(), copy.copy([getattr(facts, s) for s in CallFacts.__slots__])
    assert observed(admit(facts)) == expected(verdicts)
    after = facts.known()
    assert after.keys() == before.keys() and all(after[k] is v for k, v in before.items())
    assert [getattr(facts, s) for s in CallFacts.__slots__ if s != "_known"] == [
        v for s, v in zip(CallFacts.__slots__, line, strict=True) if s != "_known"
    ]  # unchanged


@settings(deadline=None)
@given(verdicts=VERDICTS)
def test_admitted_only_when_every_rule_let_the_call_through(verdicts):
    step = admit(facts_for(verdicts))
    everything_passed = all(v == "pass" for v in verdicts.values())
    assert isinstance(step, Admitted) == everything_passed
    if isinstance(step, Admitted):
        assert step.reservation is RESERVATION and step.attempt is ATTEMPT and step.body == b"{}"


@settings(deadline=None)
@given(verdicts=VERDICTS)
def test_lost_evidence_refuses_ahead_of_everything(verdicts):
    facts = facts_for(verdicts)
    facts.evidence_lost = True
    step = admit(facts)
    assert isinstance(step, Refusal) and step.error_type == "docket_evidence_lost"
    assert step.event is None  # the ledger is what failed: not recorded


def test_the_shell_is_asked_for_each_fact_in_order():
    facts = CallFacts("openai", "POST", "v1/chat/completions", True)
    asked = []
    while isinstance(step := admit(facts), Ask):
        asked.append(step.rule)
        facts[RULES[step.at].fact] = FACTS[step.rule][0]
    assert isinstance(step, Admitted)
    assert asked == [rule for rule in ORDER if rule != "endpoint"]


# ---------------------------------------------------------------- what a refusal carries


def test_caps_deferred_is_a_429_with_retry_after_and_says_it_would_fit():
    facts = facts_for({})
    facts[caps.FACT] = caps_refusal(deferred=True)
    step = admit(facts)
    assert isinstance(step, Refusal)
    assert step.error_type == "docket_caps_pending" and DOCKET_ERRORS[step.error_type].status == 429
    assert DOCKET_ERRORS[step.error_type].retryable
    assert step.retry_after_s == caps.CAPS_PENDING_RETRY_S > 0
    assert step.event == "policy.denied" and step.fields["would_fit_after_settle"] is True
    assert step.extra == {"cap": "max_usd", "would_fit_after_settle": True}
    facts[caps.FACT] = caps_refusal(deferred=False)
    final = admit(facts)
    assert isinstance(final, Refusal) and final.error_type == "docket_policy_denied"
    assert DOCKET_ERRORS[final.error_type].status == 403 and final.retry_after_s is None
    assert final.fields["would_fit_after_settle"] is False


def test_a_fleet_refusal_is_a_503_with_retry_after_and_names_its_code():
    step = admit(facts_for({"fleet": "refuse"}))
    assert isinstance(step, Refusal) and step.rule == "fleet.no_lease"
    assert DOCKET_ERRORS[step.error_type].status == 503 and DOCKET_ERRORS[step.error_type].retryable
    assert step.retry_after_s == RETRY_AFTER_S > 0
    assert step.event == "policy.denied" and step.fields["code"] == "no_lease"
    assert "no slice of it is held" in step.fields["reason"]


def test_a_caps_refusal_not_about_room_has_no_would_fit_field():
    facts = facts_for({})
    unpriced = cp.CapRefusal(rule="caps.on_unpriced", cap="max_usd", reason="unpriced")
    facts[caps.FACT] = cp.Decision(allowed=False, reservation=None, refusal=unpriced)
    step = admit(facts)
    assert isinstance(step, Refusal) and step.extra == {"cap": "max_usd"}
    assert list(step.fields) == ["reason", "cap"]


def test_policy_denied_fields_are_the_reason_then_the_extra_fields():
    facts = facts_for({"budget": "refuse"})
    step = admit(facts)
    assert isinstance(step, Refusal) and step.event == "policy.denied"
    assert dict(step.fields) == {
        "reason": "x-docket-deadline-ms: not a number",
        "param": "x-docket-deadline-ms",
    }
    assert step.model == MODEL  # the request named it


def test_refusals_before_the_request_is_parsed_name_no_model_and_the_endpoint_neither():
    assert admit(facts_for({"auth": "refuse"})).model is None
    endpoint = admit(facts_for({"endpoint": "refuse"}))
    assert isinstance(endpoint, Refusal) and endpoint.model is None  # as recorded before
    assert endpoint.message == "POST /v1/chat/completions is not a model call this boundary records"


def test_an_unread_body_closes_the_connection():
    assert admit(facts_for({"auth": "refuse"}, body_complete=False)).close
    assert not admit(facts_for({"auth": "refuse"}, body_complete=True)).close
    assert admit(facts_for({"body": "refuse"})).close  # the body was not read to its end


def test_broken_framing_keeps_the_http_layers_status_and_code():
    facts = facts_for({})
    facts[body.FACT] = BodyProblem(False, "bad chunk", "bad_chunk", 400)
    stalled = facts_for({})
    stalled[body.FACT] = BodyProblem(False, "stalled", "request_timeout", 408)
    got = admit(facts)
    assert isinstance(got, Refusal) and (got.rule, got.extra, got.status) == (
        "bad_request",
        {"code": "bad_chunk"},
        400,
    )
    assert admit(stalled).status == 408


def test_guard_refusals_carry_the_guards_event_and_retry_after():
    limited = admit(facts_for({"limiter": "refuse"}))
    assert (limited.event, limited.retry_after_s) == ("x-docket.rate-limited", 0.25)
    assert dict(limited.fields) == REFUSE.fields()
    opened = admit(facts_for({"breaker": "refuse"}))
    assert (opened.event, opened.retry_after_s) == ("x-docket.breaker-open", 3.0)
    shed = admit(facts_for({"bulkhead": "refuse"}))
    assert (shed.event, shed.shed, shed.rule) == ("load.shed", True, "resilience.max_queue")
    assert "waited_s" not in shed.fields  # shed on arrival


def test_a_shed_in_the_queue_says_how_long_it_waited_and_a_deadline_shed_names_the_deadline():
    facts = facts_for({})
    facts[bulkhead.FACT] = Waited(
        Shed("openai", DEADLINE, 0.5, queue=1, in_flight=8, expected_wait_s=None), 0.1234567
    )
    step = admit(facts)
    assert isinstance(step, Refusal) and step.rule == "deadline"
    assert step.fields["waited_s"] == 0.123457


def test_spent_is_recorded_with_its_reason_and_figures():
    step = admit(facts_for({"deadline": "refuse"}))
    assert isinstance(step, Refusal) and step.event == "policy.denied"
    assert dict(step.fields) == {"reason": SPENT.reason, **SPENT.fields()}


def test_unknown_is_not_none():
    # None is a fact (no deadline header, no limiter, no bulkhead); UNKNOWN is not.
    facts = facts_for({})
    facts[limiter.FACT] = None
    facts[bulkhead.FACT] = None
    assert isinstance(admit(facts), Admitted)
    facts[limiter.FACT] = UNKNOWN
    assert admit(facts) == Ask("limiter", RULE_NAMES.index("limiter"))


@settings(deadline=None)
@given(verdicts=VERDICTS, data=st.data())
def test_resuming_where_the_last_ask_was_gives_the_same_answer(verdicts, data):
    # The shell resumes at Ask.at: from any place up to the first rule not passed,
    # the walk must come to the same answer as one from the start.
    facts = facts_for(verdicts)
    whole = admit(facts)
    first = next(
        (
            at
            for at, rule in enumerate(ORDER)
            if verdicts[rule] != "pass"
            and not (rule == "endpoint" and verdicts["request"] != "pass")
        ),
        len(ORDER),
    )
    start = data.draw(st.integers(0, first))
    assert admit(facts, start) == whole
    if isinstance(whole, Ask):
        assert RULE_NAMES[whole.at] == whole.rule


# ---------------------------------------------------------------- one file per rule


def test_every_rule_file_is_registered_once_and_has_every_piece():
    """Adding a rule is one file in docket/boundary/rules/ and one line in RULES: a
    file left unregistered, a rule registered twice, or a rule missing its fact,
    check or learner fails here."""
    import inspect
    from pathlib import Path

    import docket.boundary.rules as package
    from docket.boundary.rules.base import Fact, Rule

    files = {path.stem for path in Path(package.__file__).parent.glob("*.py")} - {
        "__init__",
        "base",
    }
    registered = [inspect.getmodule(rule.check) for rule in RULES]
    assert sorted(RULE_NAMES) == sorted(set(RULE_NAMES)), "a rule registered twice"
    by_file = {rule.name: rule for rule in RULES}
    for name in files:
        module = __import__(f"docket.boundary.rules.{name}", fromlist=["RULE"])
        assert isinstance(module.RULE, Rule), f"rules/{name}.py has no RULE"
        assert by_file.get(module.RULE.name) is module.RULE, f"rules/{name}.py not in RULES"
    assert len(files) == len(RULES)
    facts_learned: set[str] = set()
    for rule in RULES:
        assert isinstance(rule.fact, Fact) and callable(rule.check)
        if rule.learn is None:  # reads a fact an earlier rule learns
            assert rule.fact.name in facts_learned, f"{rule.name}: nobody learns its fact"
        else:
            assert inspect.iscoroutinefunction(rule.learn)
            facts_learned.add(rule.fact.name)
    assert None not in registered
    assert ORDER == RULE_NAMES
