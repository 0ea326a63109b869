"""`docket run` says where it is: a start line (run id, folder, boundary, how to watch
it) and an end block read from the receipt it wrote (calls, spend, refusals, cache,
evidence, how to check it), then today's last line; --quiet keeps the last line only.
The two real runs are processes (`python -m docket run`) against an in-process stub;
the receipt readings (refusals by rule, a rollback) are pure."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import trio

from docket.cli import main
from docket.receipts.receipt import refusals_by_rule
from docket.run.run_report import end_block, summary_lines

DEADLINE = 60
# Two agents in one run: the first repeats a greedy call (served from the cache after
# the first), the second repeats an uncacheable one past max_model_calls (refused).
AGENTS = (
    f"{shlex.quote(sys.executable)} -m docket agent --mode repeat --calls 3 --temperature 0; "
    f"{shlex.quote(sys.executable)} -m docket agent --mode repeat --calls 3"
)


def _policy(path: Path, url: str) -> Path:
    path.write_text(
        "[caps]\nmax_model_calls = 2\n"
        f'[providers.openai]\nkind = "openai"\nbase_url = "{url}"\nkey_env = "STUB_KEY"\n'
        "[cache]\nenabled = true\n"
    )
    return path


async def _docket_run(argv: list[str]) -> tuple[int, str]:
    env = {**os.environ, "STUB_KEY": "sk-stub"}
    done = await trio.run_process(
        [sys.executable, "-m", "docket", "run", *argv],
        env=env,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return done.returncode, done.stderr.decode()


async def test_a_run_says_where_it_is_and_what_its_receipt_says(stub_server, tmp_path, capsys):
    folder = tmp_path / "r1"
    with trio.fail_after(DEADLINE):
        async with stub_server("openai", reply_tokens=6) as stub:
            policy = _policy(tmp_path / "docket.toml", stub.url)
            code, err = await _docket_run(
                ["--policy", str(policy), "--ledger-dir", str(folder), "--", "sh", "-c", AGENTS]
            )
    assert code == 0, err
    lines = err.splitlines()
    receipt = json.loads((folder / "receipt.json").read_text())
    run_id = receipt["run_id"]
    start = re.fullmatch(
        rf"docket: run {run_id} in (\S+), boundary (http://127\.0\.0\.1:\d+); "
        r"watch it: docket show --follow (\S+)",
        lines[0],
    )
    assert start, lines[0]
    assert start[1] == start[3] == str(folder)
    totals, cache = receipt["totals"], receipt["ops"]["cache"]
    assert totals["refused"] > 0 and cache["hits"] > 0  # the run shows both
    assert (
        f"docket: calls {totals['model_calls']} ({totals['responses']} answered, "
        f"{totals['errors']} failed), spend ${totals['usd']}"
    ) in lines
    assert any(x.startswith(f"docket: refused {totals['refused']}") for x in lines), lines
    (cache_line,) = [x for x in lines if x.startswith("docket: cache ")]
    assert cache_line.startswith(f"docket: cache {cache['hits']} hits, saved $0.")
    assert f"docket: evidence complete: {receipt['ledger']['events']} events" in lines
    check = f"docket: check it: docket verify {folder}"
    assert lines[-2] == check
    assert lines[-1].startswith(f"docket: run {run_id} ended (child exited with status 0)")
    capsys.readouterr()
    assert main(["verify", str(folder)]) == 0  # the command it printed works
    assert capsys.readouterr().out.startswith("ok: ")


async def test_quiet_keeps_only_the_last_line(stub_server, tmp_path):
    folder = tmp_path / "q"
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as stub:
            policy = _policy(tmp_path / "docket.toml", stub.url)
            code, err = await _docket_run(
                [
                    "--quiet",
                    "--policy",
                    str(policy),
                    "--ledger-dir",
                    str(folder),
                    "--",
                    sys.executable,
                    "-c",
                    "pass",
                ]  # fmt: skip
            )
    assert code == 0, err
    (line,) = err.splitlines()
    assert line.startswith("docket: run ") and line.endswith(f"receipt {folder}/receipt.json")


RECEIPT = {
    "ledger": {"events": 9},
    "totals": {"model_calls": 3, "responses": 2, "errors": 1, "usd": "0.01", "refused": 3},
    "ops": {"evidence": {"ledger_complete": True}},
}


def test_refusals_by_rule_with_and_without_the_member():
    # A receipt from before refused_by_rule: the policy's denials alone.
    assert refusals_by_rule(RECEIPT["totals"]) == {}
    assert "docket: refused 3" in summary_lines(RECEIPT)
    # With it: every rule's refusals, the policy's 3 among them, summed.
    totals = {**RECEIPT["totals"], "refused_by_rule": {"caps": 3, "rate_limit": 6, "breaker": 2}}
    assert refusals_by_rule(totals) == {"caps": 3, "rate_limit": 6, "breaker": 2}
    lines = summary_lines({**RECEIPT, "totals": totals})
    assert "docket: refused 11 (breaker 2, caps 3, rate_limit 6)" in lines


def test_a_rollback_and_lost_evidence_are_said():
    receipt = {
        **RECEIPT,
        "ops": {"evidence": {"ledger_complete": False, "unwritten_events": 4}},
        "snapshot": [{"root": "/w", "restored": {"applied": 1, "failed": 0, "verified": True}}],
    }
    lines = summary_lines(receipt)
    assert "docket: restored /w: 1 path, 0 failed, verified" in lines
    assert "docket: evidence INCOMPLETE: 4 events unwritten" in lines


def test_an_unreadable_receipt_is_a_warning_not_a_traceback(tmp_path):
    bad = tmp_path / "receipt.json"
    bad.write_text("{not json")
    (line,) = end_block(bad, tmp_path)
    assert line.startswith(f"docket: warning: cannot summarize the receipt {bad}")
