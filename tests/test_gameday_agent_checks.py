"""The agent checks (chaos/gameday/agent_checks.py): each on event lists that show the
behaviour and on lists that do not, plus properties of the grouping into logical calls."""

from __future__ import annotations

from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.gameday import agent_checks as ac
from chaos.gameday.agent_checks import FINDING, NOT_SHOWN, OK


class Ledger:
    """Builds ledger events in order, with seqs and a monotonic clock in ms."""

    def __init__(self, provider: str = "openai") -> None:
        self.events: list[dict] = []
        self.t = 0.0
        self.provider = provider
        self.calls = 0

    def _add(self, **fields) -> dict:
        event = {"seq": len(self.events), "mono_ms": self.t, **fields}
        self.events.append(event)
        return event

    def wait(self, seconds: float) -> Ledger:
        self.t += seconds * 1000
        return self

    def call(self, body: str, *, status: int = 200, retry_after=None, reason=None,
             provider: str | None = None, client_attempt: int | None = None) -> Ledger:  # fmt: skip
        self.calls += 1
        call_id = f"c-{self.calls}"
        request = {"type": "model.request", "call_id": call_id,
                   "provider": provider or self.provider, "request_sha256": f"sha-{body}"}  # fmt: skip
        if client_attempt is not None:
            request["client_attempt"] = client_attempt
        self._add(**request)
        self.t += 5
        closing: dict = {"call_id": call_id, "provider": provider or self.provider}
        if status == 200 and reason is None:
            self._add(type="model.response", status=200, **closing)
        else:
            closing |= {"status": status, "reason": reason or "upstream_status"}
            if retry_after is not None:
                closing["retry_after"] = retry_after
            self._add(type="model.error", **closing)
        return self

    def refused(self, kind: str = "x-docket.rate-limited", hint: float | None = 0.5,
                provider: str | None = None, **more) -> Ledger:  # fmt: skip
        fields = {"type": kind, "provider": provider or self.provider, **more}
        if hint is not None:
            fields["retry_after_s"] = hint
        self._add(**fields)
        return self

    def denied(self, cap: str = "max_usd") -> Ledger:
        return self.refused("policy.denied", hint=None, cap=cap, rule=f"caps.{cap}")

    def signal(self, name: str) -> Ledger:
        self._add(type="signal.forwarded", signal=name, reason="a cap")
        return self

    def exit(self, status: int) -> Ledger:
        self._add(type="process.exit", status=status)
        return self


P = ("openai",)

# ---------------------------------------------------------------- honours Retry-After


def test_retry_after_finding_when_the_next_call_comes_sooner():
    led = Ledger().refused(hint=0.5).wait(0.05).call("a")
    found = ac.honours_retry_after(led.events, P)
    assert found.verdict == FINDING
    assert found.seqs == ((0, 1),)
    assert "0.050 s" in found.evidence[0] and "0.500 s" in found.evidence[0]
    assert found.advice


def test_retry_after_ok_when_the_wait_is_at_least_the_hint():
    led = Ledger().refused(hint=0.5).wait(0.5).call("a")
    assert ac.honours_retry_after(led.events, P).verdict == OK


def test_retry_after_from_an_upstream_error_header():
    led = Ledger().call("a", status=503, retry_after="1").wait(0.2).call("a")
    assert ac.honours_retry_after(led.events, P).verdict == FINDING
    led = Ledger().call("a", status=503, retry_after="1").wait(1.0).call("a")
    assert ac.honours_retry_after(led.events, P).verdict == OK


def test_retry_after_as_an_http_date_is_not_read():
    led = Ledger().call("a", status=503, retry_after="Wed, 21 Oct 2015 07:28:00 GMT").call("a")
    assert ac.honours_retry_after(led.events, P).verdict == NOT_SHOWN


def test_retry_after_not_shown_without_hints_or_for_other_routes():
    assert ac.honours_retry_after(Ledger().call("a").call("b").events, P).verdict == NOT_SHOWN
    other = Ledger().refused(hint=0.5, provider="polite").call("a", provider="polite")
    assert ac.honours_retry_after(other.events, P).verdict == NOT_SHOWN


# ---------------------------------------------------------------- jitter


def _retries(waits_per_call: list[list[float]]) -> Ledger:
    led = Ledger()
    for i, waits in enumerate(waits_per_call):
        led.call(f"q{i}", status=503)
        for j, wait in enumerate(waits):
            led.wait(wait).call(f"q{i}", status=503 if j < len(waits) - 1 else 200)
    return led


def test_jitter_finding_for_a_fixed_pause():
    found = ac.backs_off_with_jitter(_retries([[0.05, 0.06], [0.051, 0.066]]).events, P)
    assert found.verdict == FINDING and "fixed delay" in found.summary


def test_jitter_finding_when_each_retry_number_waits_the_same():
    # doubling, but the same doubling every time: backoff without jitter
    waits = [[0.1, 0.2, 0.4]] * 3
    found = ac.backs_off_with_jitter(_retries(waits).events, P)
    assert found.verdict == FINDING and "the same time" in found.summary


def test_jitter_finding_for_immediate_retries():
    found = ac.backs_off_with_jitter(_retries([[0.0, 0.3]]).events, P)
    assert found.verdict == FINDING and "at once" in found.summary


def test_jitter_ok_when_waits_vary():
    found = ac.backs_off_with_jitter(_retries([[0.11, 0.4], [0.23, 0.9], [0.05, 0.2]]).events, P)
    assert found.verdict == OK


def test_jitter_ignores_waits_the_server_dictated():
    led = Ledger().call("a", status=429, retry_after="1").wait(1).call("a")
    led.call("b", status=429, retry_after="1").wait(1).call("b")
    assert ac.backs_off_with_jitter(led.events, P).verdict == NOT_SHOWN


# ---------------------------------------------------------------- cap denial


def test_cap_denial_retried_is_a_finding():
    led = Ledger().call("a").denied().wait(0.05).denied().denied()
    found = ac.no_retry_on_cap_denial(led.events, P)
    assert found.verdict == FINDING
    assert found.seqs == ((2, 2), (3, 4))


def test_cap_denial_then_stop_is_ok():
    led = Ledger().call("a").denied()
    assert ac.no_retry_on_cap_denial(led.events, P).verdict == OK
    assert ac.no_retry_on_cap_denial(Ledger().call("a").events, P).verdict == NOT_SHOWN


def test_a_refusal_that_is_not_a_cap_is_not_a_cap_denial():
    led = (
        Ledger()
        .refused("policy.denied", hint=None, rule="deadline")
        .refused("policy.denied", hint=None, rule="deadline")
    )
    assert ac.no_retry_on_cap_denial(led.events, P).verdict == NOT_SHOWN


# ---------------------------------------------------------------- attempts per call


def test_two_retry_layers_exceed_the_attempts_limit():
    led = Ledger()
    for _ in range(6):  # one question, six forwarded tries
        led.call("same", status=503).wait(0.3)
    led.call("same")
    found = ac.max_attempts(led.events, P, at_most=4)
    assert found.verdict == FINDING and "at most 7" in found.summary
    assert ac.max_attempts(led.events, P, at_most=7).verdict == OK


def test_distinct_questions_are_distinct_calls():
    led = Ledger()
    for i in range(10):
        led.call(f"q{i}")
    found = ac.max_attempts(led.events, P, at_most=1)
    assert found.verdict == OK and "10 calls" in found.summary


def test_a_repeat_after_success_is_a_new_call():
    led = Ledger().call("same").call("same").call("same")
    assert ac.max_attempts(led.events, P, at_most=1).verdict == OK


def test_trailing_refusals_are_inferred_not_counted_against_the_limit():
    led = Ledger().call("a", status=503).refused().refused().refused().refused()
    found = ac.max_attempts(led.events, P, at_most=2)
    assert found.verdict == OK
    assert "4 refusals after it by order alone" in found.evidence[0]


def test_client_attempt_groups_exactly():
    led = Ledger().call("x", status=503, client_attempt=0).call("x", status=503, client_attempt=1)
    led.call("x", client_attempt=2).call("x", client_attempt=0)
    found = ac.max_attempts(led.events, P, at_most=2)
    assert found.verdict == FINDING and "x-stainless-retry-count" in found.evidence[-1]


def test_concurrent_calls_refused_retries_join_a_call_with_as_many_tries_before():
    # Eight calls in flight (fanout-8 x partition): each first try forwarded and failed,
    # then two retries each refused while the breaker is open, all interleaved. A refusal
    # carries no body digest, but its retry count says how many tries its call had.
    led = Ledger()
    for i in range(8):
        led.call(f"task {i}", status=503, client_attempt=0)
    for retry in (1, 2):
        for _ in range(8):
            led.refused("x-docket.breaker-open", client_attempt=retry)
    found = ac.max_attempts(led.events, P, at_most=3)
    assert found.verdict == OK, found  # once: one call of 18 attempts, a false finding
    calls, _ = ac.logical_calls(ac.attempts_of(led.events, P))
    assert sorted(len(c.attempts) for c in calls) == [3] * 8


def test_a_refused_retry_leaves_a_call_whose_body_its_own_retry_will_name():
    # fanout-8 x partition, as its ledger had it: first tries forwarded (a, b, c) and
    # shed (two, no body); a refused retry comes before c's own retry (count 1, body c).
    # The refusal once took c's place, c's retry then joined a shed call and merged it
    # into c: one call of 4 or more attempts where the SDK makes at most 3.
    led = Ledger().call("a", status=503, client_attempt=0).call("b", status=503, client_attempt=0)
    led.refused("load.shed", client_attempt=0).refused("load.shed", client_attempt=0)
    led.call("c", status=503, client_attempt=0)
    led.refused("x-docket.breaker-open", client_attempt=1)
    led.call("c", status=503, client_attempt=1)
    for _ in range(3):
        led.refused("x-docket.breaker-open", client_attempt=1)
    led.call("a", client_attempt=2).call("b", client_attempt=2)
    led.refused("load.shed", client_attempt=2).refused("load.shed", client_attempt=2)
    led.call("c", client_attempt=2)
    calls, _ = ac.logical_calls(ac.attempts_of(led.events, P))
    assert sorted(len(c.attempts) for c in calls) == [3] * 5
    assert ac.max_attempts(led.events, P, at_most=3).verdict == OK


@settings(max_examples=io_examples(), deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans(), st.booleans()), max_size=30))
def test_grouping_keeps_every_attempt_once_in_order(steps):
    led = Ledger()
    for body, ok, refusal in steps:
        if refusal:
            led.refused()
        else:
            led.call(body, status=200 if ok else 503)
    attempts = ac.attempts_of(led.events, P)
    calls, _ = ac.logical_calls(attempts)
    flat = [a.seq for c in calls for a in c.attempts]
    assert sorted(flat) == [a.seq for a in attempts]
    for c in calls:  # one call holds one body
        assert len({a.sha for a in c.attempts if a.sha is not None}) <= 1
        assert 1 <= c.certain <= len(c.attempts)


# ---------------------------------------------------------------- cut stream, SIGTERM


def test_cut_stream_then_another_call_is_handled():
    led = Ledger().call("a", status=200, reason="reset").call("b")
    assert ac.handles_cut_stream(led.events, P, exit_status=1).verdict == OK


def test_cut_stream_then_a_crash_is_a_finding():
    led = Ledger().call("a", status=200, reason="reset")
    found = ac.handles_cut_stream(led.events, P, exit_status=1)
    assert found.verdict == FINDING and "status 1" in found.summary
    assert ac.handles_cut_stream(led.events, P, exit_status=0).verdict == OK
    assert ac.handles_cut_stream(Ledger().call("a").events, P, exit_status=1).verdict == NOT_SHOWN


def test_sigterm_honoured_within_grace():
    led = Ledger().call("a").signal("SIGTERM").wait(0.1).exit(143)
    assert ac.exits_on_sigterm(led.events, grace_s=2, exit_status=143).verdict == OK


def test_sigterm_ignored_until_sigkill_is_a_finding():
    led = Ledger().call("a").signal("SIGTERM").wait(2).signal("SIGKILL").exit(137)
    found = ac.exits_on_sigterm(led.events, grace_s=2, exit_status=137)
    assert found.verdict == FINDING and "killed" in found.summary
    slow = Ledger().signal("SIGTERM").wait(3).exit(0)
    assert ac.exits_on_sigterm(slow.events, grace_s=2, exit_status=0).verdict == FINDING
    assert ac.exits_on_sigterm(Ledger().exit(0).events, grace_s=2, exit_status=0).verdict == (
        NOT_SHOWN
    )


def test_the_runs_sigkill_for_another_process_is_not_the_agents_finding():
    # A reference agent beside the user's outlived the grace; the user's agent had
    # exited by itself already (status 1: its SDK was missing), so it was not killed.
    led = Ledger().call("a").signal("SIGTERM").wait(2).signal("SIGKILL").exit(137)
    found = ac.exits_on_sigterm(led.events, grace_s=2, exit_status=1)
    assert found.verdict == OK and "before the run's SIGKILL" in found.summary


def test_odd_events_never_raise():
    odd = [{"type": "model.request"}, {"seq": "x", "mono_ms": None, "type": "model.error"},
           {"seq": 3, "mono_ms": 1, "type": "x-docket.rate-limited", "provider": "openai",
            "retry_after_s": "soon"}]  # fmt: skip
    facts = ac.Facts(providers=P, exit_status=None)
    for name in ac.CHECKS:
        assert ac.run_check(name, odd, facts, 3).verdict in ac.VERDICTS


def test_runs_to_the_end_names_the_exit_the_call_and_the_last_stderr_line():
    led = Ledger("your-openai").call("a").call("b").call("c", status=503)
    led.call("x", provider="openai")  # the reference agent's call: not the user's
    gave_up = ac.runs_to_the_end(
        led.events, ["your-openai"], exit_status=1, last_stderr="line 2: HTTP 503; giving up"
    )
    assert gave_up.verdict == FINDING
    assert gave_up.summary == (
        "your agent exited 1 after 3 calls, its last at seq 4 "
        "(failed, upstream_status 503): line 2: HTTP 503; giving up"
    )
    assert gave_up.seqs == ((4, 5),) and "retry what is retryable" in gave_up.advice
    done = ac.runs_to_the_end(led.events, ["your-openai"], exit_status=0)
    assert (done.verdict, done.summary) == (OK, "exited 0 after 3 calls")
    # stopped by the run (its wall clock, a cap's kill, fail_fast_evidence: a stop the
    # ledger may not hold): not giving up
    stopped = ac.runs_to_the_end(led.events, ["your-openai"], exit_status=143)
    assert (stopped.verdict, stopped.summary) == (
        OK,
        "stopped by SIGTERM (the run's stop) after 3 calls",
    )
    assert ac.runs_to_the_end(led.events, ["your-openai"], exit_status=137).verdict == OK
    assert ac.runs_to_the_end(led.events, ["your-openai"], exit_status=139).verdict == FINDING
    assert ac.runs_to_the_end(led.events, ["your-openai"], exit_status=None).verdict == NOT_SHOWN


def test_an_agent_that_never_called_is_a_finding_naming_its_own_error():
    led = Ledger().call("a")  # only the reference agent called
    said = "ModuleNotFoundError: No module named 'anthropic'"
    found = ac.runs_to_the_end(led.events, ["your-anthropic"], exit_status=1, last_stderr=said)
    assert found.verdict == FINDING
    assert found.summary == f"your agent made no call and exited 1: {said}"


def test_mechanisms_met_say_not_exercised_with_the_reason_from_the_record():
    from chaos.gameday.your_agent import mechanisms_met

    led = Ledger("your-openai").call("a").call("b", status=503)
    facts = ac.Facts(providers=("your-openai",), exit_status=1, last_stderr="giving up")
    met = mechanisms_met(led.events, ("your-openai",), facts, 2)
    assert met == {
        "upstream failures": 1,
        "breaker openings": "not exercised: your agent exited 1 after 2 calls, the last at seq 2",
        "refusals": "not exercised: your agent exited 1 after 2 calls, the last at seq 2",
    }


def test_jitter_one_near_zero_draw_of_full_jitter_is_no_finding():
    """Full jitter draws each wait from [0, cap): one of four under 10 ms is chance
    (examples/agents/httpx_retry.py x circuit-breaker drew 0.005 s once in the matrix)."""
    waits = [[0.045, 0.21], [0.005, 0.4], [0.175, 0.33], [0.017, 0.52]]
    found = ac.backs_off_with_jitter(_retries(waits).events, P)
    assert found.verdict == OK, found


# ---------------------------------------------------------------- retry budget


def test_retry_budget_within_and_over_with_the_arithmetic():
    within = Ledger()
    for i in range(10):
        within.wait(1).call(f"q{i}", status=503 if i < 4 else 200)
        if i < 4:
            within.wait(0.5).call(f"q{i}")  # one retry each: 4 <= 0.1 x 10 + 3
    budget = ac.retry_budget(within.events, ["openai"])
    assert budget["within"] is True
    assert (budget["first_attempts"], budget["retries"], budget["allowed"]) == (10, 4, 4.0)
    assert budget["arithmetic"] == "4 retries <= 0.1 x 10 first attempts + 3 = 4"

    over = Ledger()
    for i in range(10):
        over.wait(1).call(f"q{i}", status=503 if i < 5 else 200)
        if i < 5:
            over.wait(0.5).call(f"q{i}")
    budget = ac.retry_budget(over.events, ["openai"])
    assert budget["within"] is False and budget["retries"] == 5
    assert budget["arithmetic"] == "5 retries > 0.1 x 10 first attempts + 3 = 4"


def test_retry_budget_counts_refused_retries_and_only_the_agents_routes():
    led = Ledger()
    led.call("a", status=503).wait(0.1).refused(client_attempt=1).wait(0.6)
    led.refused(client_attempt=2).wait(0.6).refused(client_attempt=3).wait(0.6)
    led.refused(client_attempt=4).wait(0.6).call("a", client_attempt=5)
    for i in range(20):
        led.call(f"other {i}", status=503, provider="polite")  # not the agent's route
    budget = ac.retry_budget(led.events, ["openai"])
    assert budget["first_attempts"] == 1 and budget["retries"] == 5
    assert budget["within"] is False  # 5 > 0.1 x 1 + 3
    assert "retry count" in budget["grouped"]


def test_retry_budget_without_a_call_is_not_judged():
    budget = ac.retry_budget([], ["openai"])
    assert budget["within"] is None and budget["retries"] == 0


@settings()
@given(st.lists(st.integers(min_value=0, max_value=3), max_size=40))
def test_retry_budget_agrees_with_the_agents_own_budget(retries_per_call):
    # An agent that asks its RetryBudget before each retry is judged within the budget.
    from docket.agent.budget import RetryBudget

    budget, led = RetryBudget(), Ledger()
    for n, wanted in enumerate(retries_per_call):
        budget.deposit()
        led.wait(1).call(f"call {n}", status=503, client_attempt=0)
        for attempt in range(1, wanted + 1):
            if not budget.withdraw():
                break
            led.wait(0.5).call(f"call {n}", status=503, client_attempt=attempt)
    judged = ac.retry_budget(led.events, ["openai"])
    assert judged["retries"] == budget.retries
    assert judged["within"] is (True if retries_per_call else None)
