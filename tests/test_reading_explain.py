"""docket explain: each pattern on a real ledger that shows it, and on one that does not."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st
from reading_ledgers import Script

from docket.agent.budget import RetryBudget
from docket.cli import main
from docket.reading.explain import explain_ledger
from docket.reading.thresholds import DEFAULTS, load_thresholds


def named(tmp_path, script: Script, limits=DEFAULTS) -> dict:
    """pattern -> its finding, for a ledger written from the script."""
    path = script.write(tmp_path / f"ledger-{len(list(tmp_path.iterdir()))}.jsonl")
    report = explain_ledger(path, limits)
    return {f["pattern"]: f for f in report["findings"]}


# ---------------------------------------------------------------- runaway-loop


def loop(calls: int, *, growing: bool = False, capped: bool = True) -> Script:
    s = Script()
    for i in range(calls):
        body = f"look again {i:03d}" + ("x" * 20 * i if growing else "")
        s.call(body=body)
    if capped:
        s.add(1, "cap.exceeded", cap="max_model_calls", limit=calls, observed=calls + 1)
        s.refusal("policy.denied", rule="caps.max_model_calls", cap="max_model_calls")
    return s.end(cap="max_model_calls" if capped else None)


def test_runaway_loop_named_when_near_same_calls_run_into_a_cap(tmp_path):
    found = named(tmp_path, loop(12))["runaway-loop"]
    assert found["evidence"]["calls"] == 12
    assert found["evidence"]["cap"] == "max_model_calls"
    assert found["evidence"]["refused_by_cap"] == 1
    assert found["evidence"]["seq"] == "1..26"  # the first request to the cap's refusal
    assert found["impact"]["calls"] == 12
    assert found["impact"]["cost_nusd"] == 12 * (7 * 150 + 16 * 600)


def test_runaway_loop_not_named_for_calls_that_change_or_stop_short(tmp_path):
    assert "runaway-loop" not in named(tmp_path, loop(12, growing=True))  # progress: bodies grow
    assert "runaway-loop" not in named(tmp_path, loop(12, capped=False))  # no cap, and short
    assert "runaway-loop" not in named(tmp_path, loop(9))  # below loop_min_calls


def test_runaway_loop_named_without_a_cap_when_very_long(tmp_path):
    found = named(tmp_path, loop(DEFAULTS.loop_min_calls_uncapped, capped=False))
    assert found["runaway-loop"]["evidence"]["cap"] is None


# ---------------------------------------------------------------- retry-storm


def storm(recalls: int, gap_ms: int, *, marker: int | None = None, retry_after="1") -> Script:
    s = Script()
    for i in range(recalls):
        attempt = None if marker is None else (0 if i == 0 else marker)
        s.call(
            fail="upstream_status",
            status=503,
            retry_after=retry_after,
            after_ms=gap_ms,
            client_attempt=attempt,
        )
    s.call(after_ms=gap_ms, client_attempt=None if marker is None else marker)
    return s.end()


def test_retry_storm_named_from_timing_when_failures_are_called_again_at_once(tmp_path):
    found = named(tmp_path, storm(12, 2))["retry-storm"]
    ev = found["evidence"]
    assert ev["immediate_recalls"] == 12
    assert ev["ignored_retry_after"] == 12  # each came 2 ms after "Retry-After: 1"
    assert ev["answered"] == {"model.error": 12}
    assert ev["marked_by_client"] == 0


def test_retry_storm_not_named_when_the_client_backs_off(tmp_path):
    assert "retry-storm" not in named(tmp_path, storm(12, 1500))  # past the window and Retry-After
    assert "retry-storm" not in named(tmp_path, storm(5, 2))  # a few quick retries: no storm


def test_retry_storm_uses_the_clients_attempt_markers(tmp_path):
    # 300 ms apart: outside the timing window, but the client says they are retries,
    # and each came before the Retry-After of 1 s it had been given.
    found = named(tmp_path, storm(12, 300, marker=1))["retry-storm"]
    assert found["evidence"]["marked_by_client"] == 12
    assert found["evidence"]["ignored_retry_after"] == 12
    # Marked as first attempts after failures that asked for no wait: new calls, not
    # retries, however quick.
    assert "retry-storm" not in named(tmp_path, storm(12, 2, marker=0, retry_after=None))
    # New calls sent before the Retry-After the last failure gave still ignore it (a
    # hammer that moves on to its next call at once): a storm, whatever the marker says.
    found = named(tmp_path, storm(12, 2, marker=0))["retry-storm"]
    assert found["evidence"]["ignored_retry_after"] == 12


def test_retry_storm_from_the_limiters_refusals(tmp_path):
    s = Script()
    for _ in range(15):
        s.refusal("x-docket.rate-limited", retry_after_s=0.5)
    s.call().end()
    found = named(tmp_path, s)["retry-storm"]
    assert found["evidence"]["answered"] == {"x-docket.rate-limited": 15}
    quiet = Script()
    for _ in range(15):
        quiet.refusal("x-docket.rate-limited", after_ms=600, retry_after_s=0.5)
    assert "retry-storm" not in named(tmp_path, quiet.end())


# ---------------------------------------------------------------- retry-budget


def retried(calls: int, retries: int, *, provider: str = "openai", end: bool = True) -> Script:
    """`calls` logical calls, the first `retries` of them failing once (503) and retried
    half a second later: backed off, so no storm, only the count of retries."""
    s = Script()
    for i in range(calls):
        if i < retries:
            s.call(fail="upstream_status", status=503, after_ms=500, client_attempt=0,
                   provider=provider, body=f"task {i}")  # fmt: skip
            s.call(after_ms=500, client_attempt=1, provider=provider, body=f"task {i}")
        else:
            s.call(after_ms=500, client_attempt=0, provider=provider, body=f"task {i}")
    return s.end() if end else s


def test_retry_budget_named_with_its_arithmetic_when_retries_exceed_it(tmp_path):
    found = named(tmp_path, retried(10, 6))
    assert "retry-storm" not in found  # each retry waited: the budget, not a storm
    ev = found["retry-budget"]["evidence"]
    assert ev["provider"] == "openai"
    assert ev["first_attempts"] == 10 and ev["retries"] == 6
    assert ev["allowed"] == 4  # 3 + 0.1 * 10
    assert ev["arithmetic"] == "6 retries > 0.1 x 10 first attempts + 3 = 4"
    # Four events a retried call (request, error, retry, answer) from seq 1: the fourth
    # retry (seq 3 + 4 * 3) is the first past the budget as it stood then, 3 + 0.1 * 4.
    assert ev["first_over_seq"] == 15
    assert found["retry-budget"]["impact"]["calls"] == 6
    assert found["retry-budget"]["impact"]["cost_nusd"] == 6 * (7 * 150 + 16 * 600)


def test_retry_budget_not_named_within_it_or_without_markers(tmp_path):
    assert "retry-budget" not in named(tmp_path, retried(10, 4))  # exactly the budget
    assert "retry-budget" not in named(tmp_path, retried(40, 7))  # 3 + 0.1 * 40 = 7
    unmarked = Script()
    for _ in range(10):
        unmarked.call(fail="upstream_status", status=503, after_ms=500)
    assert "retry-budget" not in named(tmp_path, unmarked.end())  # nothing to count


def test_retry_budget_counts_the_retries_the_boundary_refused_too(tmp_path):
    s = retried(10, 4, end=False)  # at the budget with its forwarded retries alone
    s.refusal("x-docket.rate-limited", after_ms=500, client_attempt=1, retry_after_s=0.1)
    ev = named(tmp_path, s.end())["retry-budget"]["evidence"]
    assert ev["retries"] == 5 and ev["refused_retries"] == 1
    assert ev["arithmetic"] == "5 retries > 0.1 x 10 first attempts + 3 = 4"


@settings(max_examples=io_examples(), deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=30))
def test_an_agent_that_keeps_its_budget_is_never_named(wanted):
    """The reference agent's RetryBudget asked before each retry: whatever retries each
    call wanted, the ledger it leaves (written by the ledger writer) is within what
    explain judges; and the run that retried every time it wanted is named exactly
    when its retries are over 0.1 x calls + 3."""
    budget, kept, greedy = RetryBudget(), Script(), Script()
    for n, want in enumerate(wanted):
        budget.deposit()
        for script in (kept, greedy):
            script.call(fail="upstream_status", status=503, after_ms=500, client_attempt=0,
                        body=f"task {n}")  # fmt: skip
        for attempt in range(1, want + 1):
            greedy.call(after_ms=500, client_attempt=attempt, body=f"task {n}")
            if budget.withdraw():
                kept.call(after_ms=500, client_attempt=attempt, body=f"task {n}")
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        assert "retry-budget" not in named(Path(folder), kept.end())
        over = sum(wanted) > 3 + 0.1 * len(wanted)
        assert ("retry-budget" in named(Path(folder), greedy.end())) is over


def test_retry_budget_counts_each_provider_apart(tmp_path):
    s = retried(10, 6, provider="openai", end=False)
    for i in range(30):
        s.call(after_ms=500, client_attempt=0, provider="anthropic", model="claude-3-5-haiku",
               body=f"other {i}")  # fmt: skip
    found = named(tmp_path, s.end())
    assert found["retry-budget"]["evidence"]["provider"] == "openai"  # not pooled: 6 <= 3 + 4


def test_retry_budget_thresholds_come_from_the_policy(tmp_path, capsys):
    path = retried(10, 6).write(tmp_path / "ledger.jsonl")
    policy = tmp_path / "docket.toml"
    policy.write_text("[explain]\nretry_budget_ratio = 0.2\nretry_budget_floor = 4\n")
    assert main(["explain", str(path), "--policy", str(policy)]) == 0
    assert "retry-budget" not in capsys.readouterr().out  # 6 <= 4 + 0.2 * 10
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "retry-budget" in out and "6 retries > 0.1 x 10 first attempts + 3 = 4" in out


# ---------------------------------------------------------------- cache-miss


def test_cache_miss_named_for_one_request_paid_again_and_again(tmp_path):
    s = Script()
    for _ in range(4):
        s.call(body="what is the capital of France?")
    s.call(body="something else")
    found = named(tmp_path, s.end())["cache-miss"]
    assert found["evidence"]["paid_again"] == 3
    assert found["impact"]["cost_nusd"] == 3 * (7 * 150 + 16 * 600)
    # one request: singular (was "1 identical requests were paid for")
    assert found["summary"].startswith("1 identical request was paid for 3 more times")


def test_cache_miss_counts_in_words_that_agree(tmp_path):
    s = Script()
    for body in ("a", "a", "a", "b", "b", "b"):
        s.call(body=body)
    found = named(tmp_path, s.end())["cache-miss"]
    assert found["summary"].startswith("2 identical requests were paid for 4 more times")


def test_cache_miss_not_named_for_distinct_or_unpaid_requests(tmp_path):
    s = Script()
    for i in range(6):
        s.call(body=f"question {i}")
    for _ in range(4):  # the same request failing is not paid for
        s.call(body="same", fail="upstream_status", status=503, after_ms=500)
    assert "cache-miss" not in named(tmp_path, s.end())


# ---------------------------------------------------------------- fat-context


def test_fat_context_named_for_input_that_keeps_growing(tmp_path):
    s = Script()
    for tokens in (2000, 3000, 4000, 6000, 8000, 10000):
        s.call(tokens_in=tokens, tokens_out=200, body=f"history {tokens}")
    found = named(tmp_path, s.end())["fat-context"]
    assert found["evidence"]["first_input_tokens"] == 2000
    assert found["evidence"]["last_input_tokens"] == 10000
    assert found["impact"]["cost_nusd"] == 33000 * 150


def test_fat_context_named_for_input_that_dwarfs_the_output(tmp_path):
    s = Script()
    for i in range(3):
        s.call(tokens_in=50000, tokens_out=100, body=f"big {i}")
    assert "fat-context" in named(tmp_path, s.end())


def test_fat_context_not_named_for_steady_input(tmp_path):
    s = Script()
    for i in range(6):
        s.call(tokens_in=2000, tokens_out=200, body=f"steady {i}")
    assert "fat-context" not in named(tmp_path, s.end())


# ---------------------------------------------------------------- premium-for-small-calls


def test_premium_named_for_an_expensive_model_answering_tiny_outputs(tmp_path):
    s = Script()
    for i in range(6):
        s.call(model="gpt-4o", tokens_in=100, tokens_out=5, body=f"yes or no {i}")
    found = named(tmp_path, s.end())["premium-for-small-calls"]
    ev = found["evidence"]
    assert ev["calls"] == 6
    # openai's cheapest output in the shipped table (0.40, and the cheaper input of the two)
    assert ev["cheaper_model"] == "gpt-5-nano"
    # gpt-4o: 100 * 2500 + 5 * 10000 = 300000 nUSD a call; gpt-5-nano: 100 * 50 + 5 * 400 = 7000
    assert found["impact"]["cost_nusd"] == 6 * (300000 - 7000)


def test_premium_not_named_for_cheap_models_or_long_answers(tmp_path):
    s = Script()
    for i in range(6):
        s.call(model="gpt-4o-mini", tokens_out=5, body=f"small {i}")
        s.call(model="gpt-4o", tokens_out=900, body=f"essay {i}")
    assert "premium-for-small-calls" not in named(tmp_path, s.end())


# ---------------------------------------------------------------- concentration


def test_concentration_named_for_spend_far_beyond_the_calls_share(tmp_path):
    s = Script()
    for i in range(9):
        s.call(model="gpt-4o-mini", body=f"cheap {i}")
    s.call(model="gpt-4o", tokens_in=20000, tokens_out=2000, body="the big one")
    found = named(tmp_path, s.end())["concentration"]
    assert found["evidence"]["name"] == "gpt-4o"
    assert found["evidence"]["of"] == "spend"
    assert found["evidence"]["call_share"] == 0.1


def test_concentration_named_for_one_provider_holding_the_failures(tmp_path):
    s = Script()
    for i in range(10):
        s.call(model="gpt-4o-mini", body=f"ok {i}", after_ms=300)
    for i in range(6):
        s.call(model="claude-3-5-haiku-20241022", fail="reset", body=f"f {i}", after_ms=300)
    found = named(tmp_path, s.end())["concentration"]
    assert (found["evidence"]["axis"], found["evidence"]["name"]) == ("provider", "anthropic")
    assert found["evidence"]["of"] == "failures"


def test_concentration_not_named_when_shares_follow_the_calls(tmp_path):
    s = Script()
    for i in range(10):
        s.call(model="gpt-4o-mini", body=f"a {i}")
        s.call(model="gpt-4o", body=f"b {i}", tokens_in=7, tokens_out=1)
    assert "concentration" not in named(tmp_path, s.end())


# ---------------------------------------------------------------- policy-denials


def test_policy_denials_named_with_what_the_agent_did_next(tmp_path):
    s = Script()
    for _ in range(6):
        s.refusal("net.denied", rule="egress.allow", after_ms=50)
    found = named(tmp_path, s.end())["policy-denials"]
    assert found["evidence"]["rule"] == "egress.allow"
    assert (found["evidence"]["refusals"], found["evidence"]["called_again"]) == (6, 5)
    assert found["evidence"]["refused_again"] == 5


def test_policy_denials_not_named_for_a_refusal_or_two(tmp_path):
    s = Script()
    s.refusal("policy.denied", rule="caps.max_usd").refusal("policy.denied", rule="caps.max_usd")
    assert "policy-denials" not in named(tmp_path, s.end())


# ---------------------------------------------------------------- write-scope


def test_write_scope_not_judged_without_a_snapshot(tmp_path):
    path = Script().call().end().write(tmp_path / "l.jsonl")
    report = explain_ledger(path)
    assert "snapshot" in report["not_judged"]["write-scope"]
    assert report["findings"] == []


def snapshot_run(path: str) -> Script:
    """A --snapshot run's two events as docket.snapshot writes them (see
    docket/snapshot/run.py): the tree taken, then what the run changed in it."""
    row = {"path": path, "before": None, "after": {"kind": "file", "mode": 420}}
    return (
        Script()
        .add(
            1,
            "snapshot.taken",
            index=0,
            root="/work/tree",
            manifest_sha256="0" * 64,
            files=3,
            bytes=120,
        )  # fmt: skip
        .call()
        .add(
            5,
            "snapshot.changes",
            index=0,
            created=[row],
            modified=[],
            deleted=[],
            mode_changed=[],
            counts={"created": 1, "modified": 0, "deleted": 0, "mode_changed": 0},
        )
        .end()
    )


def test_write_scope_judged_from_snapshot_changes_and_the_declared_scope(tmp_path):
    policy = tmp_path / "docket.toml"
    policy.write_text('[explain]\nwrite_scope = ["src"]\n')
    limits = load_thresholds(str(policy))
    found = named(tmp_path, snapshot_run("etc/passwd"), limits)["write-scope"]
    assert found["evidence"]["outside_scope"] == ["created etc/passwd"]
    assert "write-scope" not in named(tmp_path, snapshot_run("src/app.py"), limits)
    path = snapshot_run("etc/passwd").write(tmp_path / "unscoped.jsonl")
    assert "no scope declared" in explain_ledger(path)["not_judged"]["write-scope"]


# ---------------------------------------------------------------- the command


def test_findings_come_most_costly_first_and_as_json(tmp_path, capsys):
    s = Script()
    for i in range(6):
        s.call(model="gpt-4o", tokens_in=100, tokens_out=5, body=f"yes or no {i}")
    for _ in range(4):
        s.call(body="again")
    path = s.end().write(tmp_path / "ledger.jsonl")
    assert main(["explain", str(tmp_path), "--json"]) == 0  # a run's folder
    report = json.loads(capsys.readouterr().out)
    # premium saves 6 * 293000 nUSD; the cache missed 3 * 10650
    assert [f["pattern"] for f in report["findings"]] == ["premium-for-small-calls", "cache-miss"]
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1. premium-for-small-calls" in out and "write-scope: not judged" in out
    # each finding ends in one line of what to do, in the text and in the JSON
    from docket.reading.patterns import ADVICE

    assert f"do: {ADVICE['premium-for-small-calls']}" in " ".join(out.split())
    assert report["findings"][1]["advice"] == ADVICE["cache-miss"] != ""


def test_thresholds_from_the_policys_explain_table(tmp_path, capsys):
    path = storm(12, 2).write(tmp_path / "ledger.jsonl")
    policy = tmp_path / "docket.toml"
    policy.write_text("[explain]\nretry_min_recalls = 13\n")
    assert main(["explain", str(path), "--json", "--policy", str(policy)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["thresholds"]["retry_min_recalls"] == 13
    assert "retry-storm" not in [f["pattern"] for f in report["findings"]]


@pytest.mark.parametrize(
    "table, problem",
    [
        ("retry_min_recalls = -1", "explain.retry_min_recalls: must be between 0 and"),
        ("retry_min_recalls = 1.5", "explain.retry_min_recalls: must be a whole number"),
        ("retry_min_recall = 3", "explain.retry_min_recall: unknown key"),
        ("concentration_share = nan", "explain.concentration_share: must be a number"),
        ("write_scope = [1]", "explain.write_scope: must be a list of paths"),
    ],
)
def test_bad_explain_thresholds_are_one_line_and_exit_2(tmp_path, capsys, table, problem):
    path = Script().call().end().write(tmp_path / "ledger.jsonl")
    policy = tmp_path / "docket.toml"
    policy.write_text(f"[explain]\n{table}\n")
    assert main(["explain", str(path), "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1


def test_the_run_policy_accepts_an_explain_table(tmp_path):
    from docket.policy import load_policy

    policy = tmp_path / "docket.toml"
    policy.write_text("[caps]\nmax_usd = 1\n[explain]\nretry_min_recalls = 20\n")
    assert load_policy(policy).caps.max_usd == 1


def test_the_init_templates_explain_examples_are_valid(tmp_path):
    import re

    from docket.policy import template_text

    uncommented = re.sub(r"^# (\w+ = .*)$", r"\1", template_text(), flags=re.M)
    policy = tmp_path / "docket.toml"
    policy.write_text(uncommented)
    limits = load_thresholds(str(policy))
    assert limits.write_scope == ("src", "tests") and limits.retry_min_recalls == 10
