"""docket diff: two verified receipts, what moved between them, exit 0 / 1 / 2."""

from __future__ import annotations

import json
from pathlib import Path

from reading_ledgers import Script, seal

from docket.cli import main


def run(tmp_path: Path, name: str, script: Script) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return seal(script.write(folder / "ledger.jsonl"))


def baseline(run_id: str, calls: int = 3, **call) -> Script:
    s = Script(run_id=run_id, table_date=call.pop("table_date", "2026-11-29"))
    for i in range(calls):
        s.call(body=f"q {i}", **call)
    s.call(model="claude-3-5-haiku-20241022", fail="reset")
    s.refusal("x-docket.rate-limited", retry_after_s=0.5)
    return s.end()


def diff(capsys, a: Path, b: Path, *more: str) -> tuple[int, dict]:
    rc = main(["diff", str(a), str(b), "--json", *more])
    return rc, json.loads(capsys.readouterr().out)


def test_two_runs_that_did_the_same_are_equal(tmp_path, capsys):
    a = run(tmp_path, "a", baseline("run-a"))
    b = run(tmp_path, "b", baseline("run-b"))
    rc, report = diff(capsys, a, b)
    assert rc == 0 and report["equal"] and report["differences"] == []
    assert (report["a"]["run_id"], report["b"]["run_id"]) == ("run-a", "run-b")
    assert main(["diff", str(a), str(b)]) == 0
    assert "equal: all" in capsys.readouterr().out


def test_what_moved_per_model_provider_error_and_rule(tmp_path, capsys):
    a = run(tmp_path, "a", baseline("run-a"))
    more = baseline("run-b", calls=5)
    more.refusal("policy.denied", rule="caps.max_usd").refusal("load.shed")
    more.steps.append(more.steps.pop(-3))  # session.end last again
    b = run(tmp_path, "b", more)
    rc, report = diff(capsys, a, b)
    assert rc == 1
    rows = {r["figure"]: r for r in report["differences"]}
    assert rows["totals.model_calls"]["a"] == 4 and rows["totals.model_calls"]["b"] == 6
    assert rows["totals.model_calls"]["delta"] == "+2"
    assert rows["model.gpt-4o-mini.model_calls"]["delta"] == "+2"
    assert rows["provider.openai.model_calls"]["delta"] == "+2"
    assert rows["totals.usd"]["delta"] == "+0.000021300"
    assert rows["refusals.caps.max_usd"] == {
        "figure": "refusals.caps.max_usd",
        "a": None,
        "b": 1,
        "delta": None,
    }
    assert rows["refusals.resilience.max_queue"]["b"] == 1
    assert "errors.reset 200" not in rows  # the same failure in both
    assert report["notes"] == []
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "totals.model_calls" in out and "figures differ" in out


def test_spend_that_moved_while_the_calls_did_not_points_at_the_price_table(tmp_path, capsys):
    a = run(tmp_path, "a", baseline("run-a"))
    repriced = baseline("run-b", prices=("0.30", "0.15", "1.20"), table_date="2026-12-01")
    b = run(tmp_path, "b", repriced)
    rc, report = diff(capsys, a, b)
    assert rc == 1
    rows = {r["figure"]: r for r in report["differences"]}
    assert rows["pricing.table_date"]["b"] == "2026-12-01"
    assert rows["pricing.gpt-4o-mini.output"] == {
        "figure": "pricing.gpt-4o-mini.output",
        "a": "0.60",
        "b": "1.20",
        "delta": "+0.60",
    }
    assert "totals.model_calls" not in rows
    (note,) = report["notes"]
    assert "the price table moved (2026-11-29 -> 2026-12-01)" in note
    assert "gpt-4o-mini" in note


def test_caps_faults_and_evidence_are_compared(tmp_path, capsys):
    a = run(tmp_path, "a", baseline("run-a"))
    s = baseline("run-b")
    end = s.steps.pop()
    s.add(1, "cap.exceeded", cap="max_usd", limit=1000, observed=2000)
    s.add(1, "fault.injected", fault="upstream:status(503)@call 1", seed=None)
    s.steps.append((end[0], end[1], {**end[2], "exit_status": 42, "cap": "max_usd"}))
    b = run(tmp_path, "b", s)
    rc, report = diff(capsys, a, b)
    rows = {r["figure"] for r in report["differences"]}
    assert rc == 1
    assert {"caps.breached.max_usd", "faults.injected", "exit.status", "exit.cap"} <= rows
    assert "faults.upstream:status(503)@call 1" in rows
    # the max_usd limit in dollars, beside the dollar columns (the receipt holds nano-USD)
    (breach,) = [r for r in report["differences"] if r["figure"] == "caps.breached.max_usd"]
    assert breach["b"] == "limit $0.000001000"


def test_the_response_cache_is_compared(tmp_path, capsys):
    a = run(tmp_path, "a", baseline("run-a"))
    s = baseline("run-b")
    end = s.steps.pop()
    s.add(1, "cache.hit", provider="openai", model="gpt-4o-mini", saved_nusd=500,
          request_sha256="a" * 64, replays_seq=3, age_ms=10)  # fmt: skip
    s.steps.append(end)
    b = run(tmp_path, "b", s)
    rc, report = diff(capsys, a, b)
    rows = {r["figure"]: r for r in report["differences"]}
    assert rc == 1
    assert (rows["cache.hits"]["a"], rows["cache.hits"]["b"]) == (0, 1)
    assert rows["cache.saved_usd"]["b"] == "0.000000500"
