"""The fleet scenario harness (chaos.fleet): its file is checked before anything starts
(a bad one is one line, exit 2), its judge fails each check on the evidence that breaks
it, and a short run of scenarios/fleet-partition.yaml holds, read back from disk."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from chaos.faults.grammar import parse_fault
from chaos.fleet.judge import BoundarySeen, Evidence, WindowSeen, judge
from chaos.fleet.postgres import postgres_bin
from chaos.fleet.runner import HarnessError, run_fleet
from chaos.fleet.scenario import FleetScenario, Window, load_fleet_scenario
from docket.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "scenarios" / "fleet-partition.yaml"
T0 = 1_800_000_000.0  # the evidence's clock: a fixed epoch second


def fleet(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chaos.fleet", *argv],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip


# ---------------------------------------------------------------- the file


def test_the_shipped_scenario_names_the_four_database_faults():
    s = load_fleet_scenario(SHIPPED)
    assert s.boundaries == 4
    assert [(w.what, w.length, w.expect) for w in s.timeline] == [
        ("net:reset_peer", 3.0, "outage"),
        ("net:timeout(0)", 10.0, "outage"),
        ("restart", 1.0, "outage"),
        ("net:latency(500ms)", 6.0, "served"),
    ]
    short = s.scaled(0.5, boundaries=2)
    assert short.boundaries == 2 and short.duration == s.duration / 2
    assert [w.at for w in short.timeline] == [w.at / 2 for w in s.timeline]
    assert short.timeout == s.timeout and short.lease_seconds == s.lease_seconds


@pytest.mark.parametrize(
    "content, said",
    [
        (None, "no such file"),
        (b"", "is empty"),
        (b"boundaries: 4\x00\x01\x02", "binary"),
        (b"boundaries: [4\ntimeline: {", "not valid YAML"),
    ],
    ids=["missing", "empty", "binary", "malformed"],
)
def test_a_bad_scenario_file_is_one_line_and_exit_2(tmp_path, content, said):
    path = tmp_path / "s.yaml"
    if content is not None:
        path.write_bytes(content)
    done = fleet(str(path), "--dir", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


GOOD = """\
cap_usd: 0.01
slice_usd: 0.001
duration: 20s
timeline:
  - {name: a, at: 1s, for: 2s, fault: "net:timeout(0)", expect: outage}
"""


@pytest.mark.parametrize(
    "change, said",
    [
        ("boundries: 3\n", "1: at boundries unknown key (did you mean boundaries?)"),
        ("timeout: 6s\n", "must be under half of lease_seconds"),
        ("boundaries: 0\n", "must be between 1 and 16"),
        (
            "  - {name: b, at: 2s, for: 1s, fault: restart, expect: outage}\n",
            "6: at timeline[1].at starts before window 'a' ends",
        ),
        (
            '  - {name: b, at: 5s, for: 1s, fault: "net:timeout(0)@t 1s", expect: outage}\n',
            "takes no trigger",
        ),
        (
            '  - {name: b, at: 5s, for: 1s, fault: "upstream:status(503)", expect: outage}\n',
            "is not a net fault",
        ),
        ("  - {name: b, at: 5s, for: 20s, fault: restart, expect: outage}\n", "not before"),
        ("  - {name: b, at: 5s, for: 1s, fault: restart, expect: maybe}\n", '"outage" or'),
    ],
)
def test_a_bad_key_names_its_line(tmp_path, change, said):
    path = tmp_path / "s.yaml"
    text = change + GOOD if not change.startswith("  -") else GOOD + change
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_fleet_scenario(path)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_bad_flag_is_one_line_and_exit_2(tmp_path):
    done = fleet(str(SHIPPED), "--time-scale", "2", "--dir", str(tmp_path / "run"))
    assert done.returncode == 2 and "--time-scale 2: must be above 0" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- the judge


def at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def event(type_: str, t: float, **fields) -> dict:
    return {"type": type_, "ts": at(t), **fields}


SCENARIO = FleetScenario(
    boundaries=2, callers=1, cap_usd=0.001, slice_usd=0.0001, timeout=1.0, duration=20.0,
    timeline=(
        Window("slow", 1.0, 2.0, parse_fault("net:latency(500ms)"), "served"),
        Window("cut", 5.0, 2.0, parse_fault("net:timeout(0)"), "outage"),
    ),
)  # fmt: skip


def boundary(name: str, cost: int, *, store_at=(), extra=()) -> BoundarySeen:
    events = [
        event("fleet.lease", 0.1, change="drawn"),
        event("model.response", 1.5, duration_ms=40),
        *(event("fleet.store", t, reason="timeout") for t in store_at),
        event("fleet.lease", 8.0, change="renewed"),
        *extra,
    ]
    receipt = {"totals": {"cost_nusd": cost}, "fleet": {"store_failures": len(store_at)}}
    report = {"calls": 10, "errors": {}}
    return BoundarySeen(name, 143, events, receipt, True, "ok", [report])


def evidence(**changes) -> Evidence:
    base = Evidence(
        SCENARIO,
        [
            WindowSeen(SCENARIO.timeline[0], T0 + 1.0, T0 + 3.0),
            WindowSeen(SCENARIO.timeline[1], T0 + 5.0, T0 + 7.0),
        ],
        [boundary("b0", 400_000, store_at=(6.0,)), boundary("b1", 500_000)],
        {k: {"nusd": v} for k, v in (("spent", 900_000), ("leased", 0), ("lapsed", 0))},
        20.0,
    )
    return dataclasses.replace(base, **changes)


def failed(ev: Evidence) -> list[str]:
    return [c.name for c in judge(ev).checks if not c.held]


def test_the_judge_holds_on_good_evidence():
    verdict = judge(evidence())
    assert verdict.held, verdict.lines()
    assert verdict.figures["store_failures"] == 1 and verdict.figures["spent_nusd"] == 900_000
    assert verdict.lines()[-1] == "verdict: held"


def test_the_judge_fails_each_check_on_the_evidence_that_breaks_it():
    ev = evidence()
    b0, b1 = ev.boundaries
    over = {k: {"nusd": v} for k, v in (("spent", 1_100_000), ("leased", 0), ("lapsed", 0))}
    assert failed(
        dataclasses.replace(ev, boundaries=[b0, boundary("b1", 700_000)], status=over)
    ) == ["cap"]
    assert failed(dataclasses.replace(ev, status={**ev.status, "spent": {"nusd": 800_000}})) == [
        "database",
        "counted once",
    ]
    assert failed(dataclasses.replace(ev, status={**ev.status, "spent": {"nusd": 950_000}})) == [
        "counted once"
    ]
    assert failed(dataclasses.replace(ev, boundaries=[b0, dataclasses.replace(b1, verified=False)]))
    lying = dataclasses.replace(b0, receipt={**b0.receipt, "fleet": {"store_failures": 0}})
    assert failed(dataclasses.replace(ev, boundaries=[lying, b1])) == ["receipts"]
    # an outage no boundary recorded
    quiet = [boundary("b0", 400_000), b1]
    assert failed(dataclasses.replace(ev, boundaries=quiet)) == [
        "window cut (net:timeout(0), 2.0 s)"
    ]
    # a boundary never back at the database after the outage
    gone = dataclasses.replace(b1, events=[e for e in b1.events if e.get("change") != "renewed"])
    assert failed(dataclasses.replace(ev, boundaries=[b0, gone])) == [
        "window cut (net:timeout(0), 2.0 s)"
    ]
    # a failed exchange while the database was only slow
    slow_fail = boundary("b1", 500_000, store_at=(2.0,))
    assert "window slow (net:latency(500ms), 2.0 s)" in failed(
        dataclasses.replace(ev, boundaries=[b0, slow_fail])
    )
    timed_out = dataclasses.replace(b1, reports=[{"calls": 10, "errors": {"ReadTimeout": 1}}])
    assert failed(dataclasses.replace(ev, boundaries=[b0, timed_out])) == ["deadline"]
    silent = dataclasses.replace(b1, reports=[None])
    assert failed(dataclasses.replace(ev, boundaries=[b0, silent])) == ["deadline"]


@given(st.lists(st.integers(min_value=0, max_value=600_000), min_size=2, max_size=2))
def test_the_cap_check_holds_exactly_when_the_receipts_stay_within_the_cap(costs):
    ev = evidence()
    spent = sum(costs)
    status = {k: {"nusd": v} for k, v in (("spent", spent), ("leased", 0), ("lapsed", 0))}
    bs = [
        dataclasses.replace(b, receipt={**b.receipt, "totals": {"cost_nusd": c}})
        for b, c in zip(ev.boundaries, costs, strict=True)
    ]
    cap_check = judge(dataclasses.replace(ev, boundaries=bs, status=status)).checks[0]
    assert cap_check.name == "cap" and cap_check.held == (spent <= 1_000_000)


# ---------------------------------------------------------------- runs


async def test_a_boundary_that_cannot_start_is_a_harness_error_naming_it(
    tmp_path, postgres_cluster
):
    # the file's reader refuses this timeout (under half the lease); built directly, it
    # reaches `docket run`, which refuses the policy: exit 2 before any call
    scenario = FleetScenario(boundaries=1, callers=1, lease_seconds=10, timeout=6.0)
    with (
        trio.fail_after(60),
        pytest.raises(HarnessError, match=r"boundary-0 exited \(2\) before it served a call"),
    ):
        await run_fleet(scenario, tmp_path / "run", postgres_cluster)
    assert "timeout" in (tmp_path / "run" / "boundary-0.err").read_text()


@pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL is not installed (no initdb)")
def test_a_short_run_of_the_partition_scenario_holds(tmp_path):
    run = tmp_path / "run"
    done = fleet(str(SHIPPED), "--time-scale", "0.3", "--boundaries", "2", "--dir", str(run),
                 timeout=120)  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # Every check, `counted once` among them: an exchange whose COMMIT landed but whose
    # answer was lost is sent again, and a report is the lease's whole use, so the
    # repeat adds nothing (tests/test_fleet_faults.py makes that case certain).
    checks = [x for x in lines if x.startswith(("ok   ", "FAIL "))]
    assert len(checks) == 9, done.stdout
    assert all(x.startswith("ok   ") for x in checks), done.stdout
    assert done.returncode == 0 and lines[-2].startswith("verdict: ")
    # read back from disk, not from the harness: the receipts and ledgers it judged
    receipts = [json.loads((run / f"boundary-{i}" / "receipt.json").read_text()) for i in (0, 1)]
    ledgers = [
        [json.loads(x) for x in (run / f"boundary-{i}" / "ledger.jsonl").read_text().splitlines()]
        for i in (0, 1)
    ]
    cap = 15_000_000
    assert sum(r["totals"]["cost_nusd"] for r in receipts) <= cap
    for r, events in zip(receipts, ledgers, strict=True):
        stored = [e for e in events if e["type"] == "fleet.store"]
        assert r["fleet"]["store_failures"] == len(stored)
    assert sum(r["fleet"]["store_failures"] for r in receipts) >= 3  # three outages
    verdict = json.loads((run / "fleet-verdict.json").read_text())
    assert verdict["figures"]["spent_nusd"] <= verdict["figures"]["database_spent_nusd"] <= cap


def test_docket_chaos_given_a_fleet_scenario_names_the_command_that_runs_it(capsys):
    from docket.cli import main as cli_main

    assert cli_main(["chaos", "--scenario", str(SHIPPED)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a fleet scenario, not a chaos one" in err[0]
    assert f"python -m chaos.fleet {SHIPPED}" in err[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="as root the cluster is started with runuser")
def test_a_machine_missing_a_tool_the_harness_needs_is_one_line_not_a_traceback(tmp_path):
    # An empty PATH: runuser (which starts the cluster as nobody when root) is missing, and
    # initdb too unless Debian's versioned folder has it. Either is one line, exit 1.
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "chaos.fleet", str(SHIPPED), "--dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PATH": str(empty)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chaos.fleet: "), done.stderr
