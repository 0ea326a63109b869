"""The game-day runner end to end: real phases through `docket game-day`, judged from the evidence.

The nine are the session's one game day (tests/conftest.py `gameday_run`), read here as
a user reads it; plus hand-made phases whose assertions fail or cannot be evaluated,
to see the exit codes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import CliResult, docket_forked

from chaos.gameday.phase import loads_phase
from chaos.gameday.runner import Outcome, complete_evidence, judge

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds for one `docket game-day` process: a bound, not an expectation


def game_day(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "docket", "game-day", "--report", str(report), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=tmp_path,
    )
    data = json.loads((report / "gameday.json").read_text()) if report.exists() else {}
    return done, data


def game_day_forked(tmp_path: Path, *args: str) -> tuple[CliResult, dict]:
    """game_day's refusals, from main(argv) forked (tests/helpers.py docket_forked):
    the exit and the bytes on stderr, without an interpreter's start per row."""
    report = tmp_path / "report"
    argv = ["game-day", "--report", str(report), *args]
    done = docket_forked(argv, cwd=tmp_path, env=dict(os.environ), timeout=TIMEOUT)
    data = json.loads((report / "gameday.json").read_text()) if report.exists() else {}
    return done, data


def test_the_nine_real_phases_pass_and_are_reported(gameday_run):
    # The session's one game day (tests/conftest.py gameday_run: `docket game-day --keep`
    # over the nine shipped phases), read as a user reads it: the command's exit and
    # words, gameday.json, junit.xml.
    data = json.loads((gameday_run.report / "gameday.json").read_text())
    phases = {p["name"]: p for p in data["phases"]}
    assert gameday_run.returncode == 0, gameday_run.output
    assert len(data["phases"]) == 9 and all(p["verdict"] == "pass" for p in data["phases"])
    killed, torn = phases["supervisor-killed"]["runs"]  # between writes, mid-write
    for run in (killed, torn):
        assert run["exit_status"] == 137 and run["facts"]["orphans"] == []
        assert run["facts"]["verify"]["verdict"] == "clean"  # the (repaired) prefix
    assert (killed["facts"]["doctor"]["state"], torn["facts"]["doctor"]["state"]) == (
        "clean",
        "torn_tail",
    )
    deny, kill = phases["runaway-loop"]["runs"]  # runaway-loop holds two runs, run in order
    assert (deny["name"], deny["exit_status"], kill["name"], kill["exit_status"]) == (
        "deny",
        0,
        "kill",
        42,
    )
    assert kill["repro"] == "docket game-day --phase runaway-loop:kill --seed 606"
    assert any(t["type"] == "cap.exceeded" for t in kill["timeline"])
    assert deny["facts"]["stub_match"]["openai"]["only_in_stub"] == 0
    assert {c["run"] for c in phases["runaway-loop"]["checks"]} == {"deny", "kill"}
    suites = ET.parse(gameday_run.report / "junit.xml").getroot()
    assert suites.get("failures") == "0" and suites.get("errors") == "0"
    assert int(suites.get("tests")) == sum(len(p["checks"]) for p in data["phases"])
    assert "PASS" in gameday_run.output and "game day pass" in gameday_run.output
    # every phase ran in a temporary folder of its own, removed afterwards (--keep copies)
    assert not list(Path("/tmp").glob("docket-gameday-runaway-loop-*/run/ledger.jsonl"))


def test_the_game_day_signs_its_report_folder(gameday_run, capsys):
    # The session's game day ran with --attest: its report folder's gameday.json and
    # junit.xml are the subjects, and docket verify --attestation says so.
    from docket.cli import main

    envelope = gameday_run.report / "attestation.dsse.json"
    assert f"attested the report: {envelope}" in gameday_run.output
    argv = ["verify", str(gameday_run.report), "--attestation", str(envelope), "--pubkey",
            str(gameday_run.pubkey), "--json"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["attestation"]["subjects"] == ["gameday.json", "junit.xml"]
    assert got["attestation"]["kind"] == "https://docket.dev/attestation/gameday/v1"


@pytest.mark.parametrize("case", ["readable key", "with --json"])
def test_game_day_attest_refuses_before_any_phase_runs(tmp_path, case):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from docket.attest.keys import private_pem

    key = tmp_path / "k.pem"
    key.write_bytes(private_pem(Ed25519PrivateKey.generate()))
    os.chmod(key, 0o644 if case == "readable key" else 0o600)
    argv = [sys.executable, "-m", "docket", "game-day", "--phase", "runaway-loop", "--report",
            str(tmp_path / "report"), "--attest", str(key)]  # fmt: skip
    if case == "with --json":
        argv += ["--json", str(tmp_path / "g.json")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("docket: ")
    why = "lets group or others read it" if case == "readable key" else "not with --json"
    assert why in done.stderr, done.stderr
    assert not (tmp_path / "report").exists()  # no phase ran, nothing was written


PHASE = """\
# A hand-made phase whose assertions fail or cannot be evaluated.
name: probe
title: Exit codes
fmea: [F06]
seed: 11
budget: 20s
run:
  agents: [{{name: once, mode: once}}]
  max_wall_clock: 10s
expect:
  - name: one call was forwarded
    query: "counts.\\"model.request\\""
    equals: 1
  - name: the second check
    query: "{query}"
    {op}
"""


@pytest.mark.parametrize(
    ("query", "op", "code", "verdict"),
    [
        ('counts.\\"model.request\\"', "equals: 2", 1, "fail"),
        ("receipt.no_such_field", "equals: 1", 2, "unknown"),
    ],
)
def test_a_failing_or_unknown_assertion_sets_the_exit_code(tmp_path, query, op, code, verdict):
    path = tmp_path / "probe.yaml"
    path.write_text(PHASE.format(query=query, op=op))
    done, data = game_day(tmp_path, "--phase", str(path), "--junit", str(tmp_path / "j.xml"))
    assert done.returncode == code, done.stdout + done.stderr
    (phase,) = data["phases"]
    assert [c["verdict"] for c in phase["checks"]] == ["pass", verdict]
    assert ET.parse(tmp_path / "j.xml").getroot().get("tests") == "2"


def test_bad_input_is_one_line_and_exit_2_before_anything_runs(tmp_path: Path):
    bad = tmp_path / "probe.yaml"
    bad.write_text(PHASE.format(query="length(", op="equals: 1"))
    done, data = game_day(tmp_path, "--phase", str(bad))
    assert done.returncode == 2
    assert done.stderr.startswith(f"docket: {bad}:15: at expect[1].query not a JMESPath query")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert data == {}  # no report: nothing ran
    # The rest forked (the interpreter's start is the row above's).
    forked, _ = game_day_forked(tmp_path, "--phase", "no-such-phase")
    assert forked.returncode == 2 and b"no phase named 'no-such-phase'" in forked.stderr
    # where results go and the Toxiproxy are checked before any phase runs, too
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    refusals = {
        ("--junit", str(a_file / "j.xml")): f"docket: --junit {a_file}: cannot create",
        ("--report", str(a_file / "r")): f"docket: --report {a_file / 'r'}: cannot create",
        ("--toxiproxy", "http://[::1"): "docket: toxiproxy URL 'http://[::1': expected",
        ("--toxiproxy", "http://127.0.0.1:1"): "docket: toxiproxy http://127.0.0.1:1: cannot",
    }
    for args, said in refusals.items():
        forked, data = game_day_forked(tmp_path, "--phase", "ledger-pressure", *args)
        stderr = forked.stderr.decode()
        assert (forked.returncode, stderr.count("\n")) == (2, 1), stderr
        assert stderr.startswith(said), stderr
        assert b"PASS" not in forked.stdout and data == {}


def test_a_phase_that_could_not_run_is_unknown_with_its_reason():
    phase = loads_phase(PHASE.format(query="x", op="equals: 1"), "probe.yaml")
    result = judge(
        phase,
        {"run": Outcome(None, "the phase did not finish within its budget of 20 s")},
        seed=11,
        duration_s=20.0,
    )
    assert result.verdict == "unknown"
    assert {c.verdict for c in result.checks} == {"unknown"}
    assert result.checks[0].check.reason == "the phase did not finish within its budget of 20 s"


def test_complete_evidence_adds_derived_facts_and_the_resolved_policy():
    phase = loads_phase(PHASE.format(query="x", op="equals: 1"), "probe.yaml")
    evidence = complete_evidence({"events": [], "stubs": {"openai": []}}, phase.run)
    assert evidence["stub_calls"] == {"openai": 0}
    assert evidence["policy"]["resilience"]["breaker_threshold"] == 5  # a default, filled in
    assert "providers" not in evidence["policy"]


TWO_RUNS = """\
# A hand-made phase with two runs: one passes, the other's assertion fails.
name: pair
title: Two runs
fmea: [F06]
seed: 12
budget: 30s
runs:
  - name: first
    run:
      agents: [{name: once, mode: once}]
      max_wall_clock: 10s
  - name: second
    run:
      agents: [{name: twice, mode: loop, calls: 2}]
      max_wall_clock: 10s
expect:
  - name: one call was forwarded
    run: first
    query: "counts.\\"model.request\\""
    equals: 1
  - name: the stub saw it
    run: first
    query: "stub_match.openai.[forwarded, only_in_ledger, only_in_stub]"
    equals: [1, 0, 0]
  - name: the second run made two calls, not three
    run: second
    query: "counts.\\"model.request\\""
    equals: {second}
"""


@pytest.mark.parametrize(("second", "code", "verdicts"), [(2, 0, "pass"), (3, 1, "fail")])
def test_a_phase_with_two_runs_judges_each_on_its_own_evidence(tmp_path, second, code, verdicts):
    path = tmp_path / "pair.yaml"
    path.write_text(TWO_RUNS.replace("{second}", str(second)))
    done, data = game_day(tmp_path, "--phase", str(path))
    assert done.returncode == code, done.stdout + done.stderr
    (phase,) = data["phases"]
    assert [r["name"] for r in phase["runs"]] == ["first", "second"]
    assert [(c["run"], c["verdict"]) for c in phase["checks"]] == [
        ("first", "pass"),
        ("first", "pass"),
        ("second", verdicts),
    ]
    assert [r["exit_status"] for r in phase["runs"]] == [0, 0]
    assert phase["runs"][1]["facts"]["counts"]["model.request"] == 2
    assert phase["runs"][1]["repro"] == "docket game-day --phase pair:second --seed 12"
    if code:
        assert "second: the second run made two calls, not three" in done.stdout
    # and one run alone, by NAME:RUN
    done, data = game_day(tmp_path, "--phase", f"{path}:first")
    assert done.returncode == 0, done.stdout + done.stderr
    (phase,) = data["phases"]
    assert [r["name"] for r in phase["runs"]] == ["first"] and len(phase["checks"]) == 2
    assert phase["repro"] == "docket game-day --phase pair:first --seed 12"


def test_ctrl_c_during_an_in_process_run_stops_the_day(tmp_path: Path):
    """The run's supervisor catches SIGINT (to stop its agent legibly); the day must still
    stop there, with exit 130 and the report of what ran, not go on to the next phase."""
    import os
    import signal
    import time

    report = tmp_path / "report"
    env = os.environ | {"TMPDIR": str(tmp_path)}  # a temporary folder would land here
    proc = subprocess.Popen(
        [sys.executable, "-m", "docket", "game-day", "--report", str(report)]
        + ["--phase", "upstream-latency", "--phase", "circuit-breaker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        # wait until an agent is running under the first phase's supervisor
        while not list(report.glob("evidence/upstream-latency/*/run/agents/*.pid")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    data = json.loads((report / "gameday.json").read_text())
    assert data["interrupted"] is True
    assert [p["name"] for p in data["phases"]] == []  # the cut phase is not reported as judged
    assert "circuit-breaker" not in out  # the day stopped; the next phase never started
    assert list(tmp_path.glob("docket-gameday-*")) == []  # nothing left in a temporary folder
    # the cut phase's evidence is kept beside the report, for a reader to see how far it got
    assert list(report.glob("evidence/upstream-latency/run/run/ledger.jsonl"))


def test_a_run_that_could_not_run_names_the_exception_inside_the_group():
    """A nursery's ExceptionGroup is said by what it holds (the matrix once saw only
    "ExceptionGroup: Exceptions from Trio nursery (1 sub-exception)")."""
    from chaos.gameday.runner import _leaves

    group = ExceptionGroup("Exceptions from Trio nursery", [OSError(24, "Too many open files")])
    nested = BaseExceptionGroup("outer", [group, ValueError("bad")])
    assert _leaves(group) == "OSError: [Errno 24] Too many open files"
    assert _leaves(nested) == "OSError: [Errno 24] Too many open files; ValueError: bad"
