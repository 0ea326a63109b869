"""`docket chaos`'s summary: every refusal counted, by rule; each agent's output located;
the scenarios' README says what their files do."""

from __future__ import annotations

import re
from pathlib import Path

from chaos.cli import agent_lines
from chaos.run.collect import RunResult, refusals_by_rule

ROOT = Path(__file__).resolve().parent.parent


def result(tmp_path: Path, events: list[dict], reports: dict) -> RunResult:
    return RunResult(
        seed=1, schedule=[], exit_status=0, reason="ok", folder=tmp_path,
        ledger_path=tmp_path / "ledger.jsonl", receipt_path=tmp_path / "receipt.json",
        receipt={}, events=events, stub_logs={}, metrics="", probes=[],
        agent_reports=reports, injected=[], duration_s=1.0, repro="",
    )  # fmt: skip


def test_every_refusal_is_counted_by_rule(tmp_path):
    events = (
        [{"type": "x-docket.breaker-open", "upstream": "openai"}] * 25
        + [{"type": "policy.denied", "rule": "caps.max_usd"}] * 2
        + [{"type": "policy.denied", "rule": "egress"}]
        + [{"type": "x-docket.rate-limited"}, {"type": "load.shed"}, {"type": "model.request"}]
    )
    summary = result(tmp_path, events, {}).summary()
    assert summary["refused"] == 30  # the old count read policy.denied alone: 3
    assert summary["refused_by_rule"] == {
        "caps.max_usd": 2,
        "docket_breaker_open": 25,
        "docket_load_shed": 1,
        "docket_rate_limited": 1,
        "egress": 1,
    }
    assert refusals_by_rule([{"type": "policy.denied"}]) == {"docket_policy_denied": 1}


def test_each_agent_line_says_where_its_output_went(tmp_path):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "sh.err").write_text("warming up\nbye\n")
    lines = agent_lines(result(tmp_path, [], {"polite": {"ok": 3}, "sh": None}))
    out = tmp_path / "agents"
    assert lines == [
        f"agent 'polite': report {{\"ok\": 3}} (output in {out / 'polite.out'} and polite.err)",
        f"agent 'sh': printed no JSON report (output in {out / 'sh.out'} and sh.err); "
        "its last stderr line: bye",
    ]


def test_the_scenarios_readme_names_the_calls_each_file_faults():
    readme = (ROOT / "scenarios" / "README.md").read_text()
    text = (ROOT / "scenarios" / "flapping-provider.yaml").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| flapping-provider.yaml")]
    for first, last in re.findall(r'"upstream:status\([^"]*@call (\d+)(?:\.\.(\d+))?"', text):
        shown = f"{first}-{last}" if last else first
        assert re.search(rf"\b{shown}\b", row), (shown, row)
