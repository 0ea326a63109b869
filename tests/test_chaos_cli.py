"""`docket chaos` from the command line: bad input refused before anything starts, a real
run printing its schedule, summary and repro command, and that command reproducing it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from helpers import read_chain

from docket.cli import main

TIMEOUT = 60


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--fault", "upstream:status(503@20%"], "column 24: expected ',' or ')'"),
        (["--fault", "ledger:eio@call 3"], "ledger faults cannot count 'call'"),
        (["--agent", "sprint"], "--agent 'sprint': not one of once"),
        (["--seed", "-3"], "--seed -3: must be in [0, 2**53)"),
        (["--seed", "x"], "invalid int value"),
        (["--agent", "once", "--", "python3", "a.py"], "give --agent MODE or -- CMD, not both"),
        (["--scenario", "{missing}"], "no such file"),
        (["--scenario", "{empty}"], "empty"),
        (["--scenario", "{binary}"], "binary"),
        (["--scenario", "{malformed}"], "malformed.yaml:2: at agents[0].calls must be a whole"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_starts(tmp_path, capsys, argv, expected):
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "binary.yaml").write_bytes(b"\x00\xff\x00")
    (tmp_path / "malformed.yaml").write_text("agents:\n  - {mode: loop, calls: many}\n")
    names = {k: str(tmp_path / f"{k}.yaml") for k in ("missing", "empty", "binary", "malformed")}
    run_dir = tmp_path / "run"
    argv = [a.format(**names) for a in argv]
    status = main(["chaos", *argv, "--dir", str(run_dir)] if "--" not in argv else
                  ["chaos", "--dir", str(run_dir), *argv])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("docket: ")
    assert expected in err, err
    assert not run_dir.exists()  # refused before anything started


def docket(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "docket", *argv], capture_output=True, text=True, timeout=TIMEOUT
    )


def test_a_run_prints_schedule_summary_and_a_command_that_reproduces_it(tmp_path):
    first = docket(
        "chaos", "--seed", "31",
        "--fault", "upstream:status(503)@40%", "--fault", "upstream:missing_usage@call 2",
        "--agent", "loop", "--dir", str(tmp_path / "one"),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0] == "seed 31"
    assert lines[1] == "fault schedule: seed 31, 2 fault(s)"
    assert lines[3] == "  upstream:missing_usage@call 2: call 2 (of the first 100)"
    assert any(line.startswith("run: 10 call(s), ") for line in lines)
    assert "exit 0: child exited with status 0" in lines
    (repro,) = [line.removeprefix("reproduce: ") for line in lines if line.startswith("reproduce")]
    argv = shlex.split(repro)
    assert argv[:4] == ["docket", "chaos", "--seed", "31"]
    again = docket(*argv[1:], "--dir", str(tmp_path / "two"))
    assert again.returncode == 0, again.stderr
    one, two = (read_chain(tmp_path / d / "ledger.jsonl") for d in ("one", "two"))
    assert [e["type"] for e in one] == [e["type"] for e in two]
    faults_one = [(e["fault"], e["ordinal"]) for e in one if e["type"] == "fault.injected"]
    assert faults_one == [(e["fault"], e["ordinal"]) for e in two if e["type"] == "fault.injected"]
    assert faults_one  # the 40% did fire somewhere in ten calls with this seed
    receipt = json.loads((tmp_path / "one" / "receipt.json").read_text())
    assert receipt["faults"]["seed"] == 31


def test_without_a_seed_one_is_drawn_and_printed(tmp_path):
    done = docket("chaos", "--agent", "once", "--dir", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("seed ") and first.endswith("(drawn: pass --seed to repeat it)")
    seed = int(first.split()[1])
    start = read_chain(tmp_path / "r" / "ledger.jsonl")[0]
    assert start["chaos"]["seed"] == seed
    assert f"--seed {seed}" in done.stdout
