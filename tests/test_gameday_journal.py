"""`docket game-day --journal DIR`: a Chaos Toolkit journal per phase, read by chaoslib.

chaoslib (chaostoolkit-lib, the test extra) has no journal reader of its own: `chaos
report` (chaostoolkit-reporting) opens a journal with json.load and reads its fields,
and `chaos validate` checks an experiment with chaoslib.experiment.ensure_experiment_is_valid.
So each journal of the session's one game day (tests/conftest.py gameday_run) is loaded
the first way and its experiment checked the second; each probe's recorded verdict is
judged again by chaoslib's own chaoslib.hypothesis.within_tolerance. The mapping itself
is tested pure, on phase results built by hand.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers import docket_forked
from hypothesis import given
from hypothesis import strategies as st

from chaos.gameday.assertions import FAIL, PASS, UNKNOWN, Assertion, Check, evaluate
from chaos.gameday.journal import journals, phase_journal, tolerance, tolerance_met
from chaos.gameday.results import CheckResult, GameDayResult, PhaseResult, PhaseRun

chaoslib_experiment = pytest.importorskip(
    "chaoslib.experiment", reason="chaostoolkit-lib (the test extra)"
)
from chaoslib.hypothesis import within_tolerance  # noqa: E402

STATUSES = ("completed", "failed", "aborted", "interrupted")  # chaoslib.run's own four
START = datetime(2026, 12, 2, 9, 0, 0, tzinfo=UTC)


def check(name: str, verdict: str, *, run: str = "run", requires=(), observed=3) -> CheckResult:
    return CheckResult(
        Check(name, "length(events)", "at_least", 2, observed, verdict, ""),
        line=10,
        run=run,
        requires=tuple(requires),
    )


def phase(checks, runs=None, name="tiny") -> PhaseResult:
    runs = runs or (PhaseRun("run", duration_s=2.5, schedule=("upstream:status(503)@call 2",)),)
    return PhaseResult(
        name=name,
        title="A tiny phase",
        about="What it shows.",
        fmea=("F01",),
        seed=7,
        mode="in-process",
        source="gamedays/tiny.yaml",
        repro=f"docket game-day --phase {name} --seed 7",
        duration_s=3.0,
        budget_s=30.0,
        checks=tuple(checks),
        runs=tuple(runs),
    )


def test_a_passing_phase_is_completed_and_not_deviated():
    j = phase_journal(phase([check("a", PASS), check("b", PASS)]), START)
    assert (j["status"], j["deviated"]) == ("completed", False)
    assert j["steady_states"]["after"]["steady_state_met"] is True
    assert [p["tolerance_met"] for p in j["steady_states"]["after"]["probes"]] == [True, True]
    # no `requires:`: the before state has no probes, and is met
    assert j["steady_states"]["before"] == {"steady_state_met": True, "probes": []}
    assert j["rollbacks"] == [] and j["experiment"]["rollbacks"] == []
    method = j["experiment"]["method"]
    assert [(a["type"], a["name"]) for a in method] == [("action", "upstream:status(503)@call 2")]
    [activity] = j["run"]
    assert activity["status"] == "succeeded"
    assert (activity["start"], activity["end"]) == (
        "2026-12-02T09:00:00+00:00",
        "2026-12-02T09:00:02.500000+00:00",
    )
    assert j["end"] == "2026-12-02T09:00:03+00:00" and j["duration"] == 3.0
    json.dumps(j, allow_nan=False)  # plain JSON, as chaoslib's journal.json is


def test_a_failed_check_is_a_deviation():
    j = phase_journal(phase([check("a", PASS), check("b", FAIL, observed=1)]), START)
    assert j["deviated"] is True
    # chaoslib's own rule (run_deviation_validation_hypothesis): a tolerance not met
    # with every probe run is a deviation of a completed experiment
    assert j["status"] == "completed"
    after = j["steady_states"]["after"]
    assert after["steady_state_met"] is False
    assert [(p["status"], p["tolerance_met"], p["output"]) for p in after["probes"]] == [
        ("succeeded", True, 3),
        ("succeeded", False, 1),
    ]


def test_an_unjudged_check_is_a_failed_probe_and_a_run_without_evidence_aborts():
    unknown = CheckResult(
        Check("b", "x", "at_least", 2, None, UNKNOWN, "the query yielded null"), line=3
    )
    j = phase_journal(phase([check("a", FAIL), unknown]), START)
    assert (j["status"], j["deviated"]) == ("failed", True)
    probe = j["steady_states"]["after"]["probes"][1]
    assert probe["status"] == "failed" and probe["exception"] == [
        "docket: the query yielded null\n"
    ]
    cut = PhaseRun("run", duration_s=30.0, error="the phase did not finish within its budget")
    j = phase_journal(phase([check("a", UNKNOWN)], runs=[cut]), START)
    assert (j["status"], j["deviated"]) == ("aborted", False)
    assert j["run"][0]["status"] == "failed"
    assert "within its budget" in j["run"][0]["exception"][0]
    assert j["end"] == "2026-12-02T09:00:30+00:00"  # the run's duration outlasts the phase's
    assert j["duration"] == 30.0


def test_preconditions_are_the_before_state_and_runs_follow_one_another():
    runs = (PhaseRun("deny", duration_s=1.0), PhaseRun("kill", duration_s=1.5))
    checks = [
        check("opened", PASS, run="deny"),
        check("held", PASS, run="deny", requires=["opened"]),
        check("opened", FAIL, run="kill"),
    ]
    j = phase_journal(phase(checks, runs=runs), START)
    before = j["steady_states"]["before"]
    assert [p["activity"]["name"] for p in before["probes"]] == ["deny: opened"]
    assert before["steady_state_met"] is True
    assert [(r["start"], r["end"]) for r in j["run"]] == [
        ("2026-12-02T09:00:00+00:00", "2026-12-02T09:00:01+00:00"),
        ("2026-12-02T09:00:01+00:00", "2026-12-02T09:00:02.500000+00:00"),
    ]
    # and phases follow one another from the day's start
    day = GameDayResult(
        (phase([check("a", PASS)], name="one"), phase([check("a", PASS)], name="two")),
        started_at="2026-12-02T09:00:00.000Z",
        duration_s=6.0,
        seed=None,
        docket_version="0.1.0",
    )
    assert [j["start"] for j in journals(day).values()] == [
        "2026-12-02T09:00:00+00:00",
        "2026-12-02T09:00:03+00:00",
    ]


def test_each_journal_experiment_is_valid_to_chaoslib(monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    one_of = Check("c", "state", "one_of", ["open", "closed"], "open", PASS, "")
    checks = [check("a", PASS), check("b", FAIL), CheckResult(one_of, line=4)]
    chaoslib_experiment.ensure_experiment_is_valid(
        phase_journal(phase(checks), START)["experiment"]
    )


# ---------------------------------------------------------------- tolerances

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
NUMBERS = st.integers(-1000, 1000) | st.floats(-1e6, 1e6, allow_nan=False)


@st.composite
def judged(draw):
    """An operator, an operand it takes, and an observed value Docket judges (pass or fail)."""
    op = draw(st.sampled_from(["equals", "not_equals", "at_least", "at_most", "greater_than",
                               "less_than", "is_true", "is_false", "contains", "not_contains",
                               "one_of", "matches"]))  # fmt: skip
    if op in ("at_least", "at_most", "greater_than", "less_than"):
        expected, observed = draw(NUMBERS), draw(NUMBERS)
    elif op in ("is_true", "is_false"):
        expected, observed = True, draw(st.booleans())
    elif op == "matches":
        expected, observed = draw(st.sampled_from(["^a", "b$", "[0-9]+", "x|y"])), draw(st.text())
    elif op == "one_of":
        expected, observed = draw(st.lists(JSON_SCALARS, max_size=4)), draw(JSON_SCALARS)
    elif op in ("contains", "not_contains"):
        expected, observed = draw(JSON_SCALARS), draw(st.lists(JSON_SCALARS, max_size=3))
    elif op == "not_equals":
        expected, observed = draw(JSON_SCALARS.filter(lambda v: v is not None)), draw(JSON_VALUES)
    else:
        expected, observed = draw(JSON_VALUES), draw(JSON_VALUES)
    return op, expected, observed


def _same_kind(expected: object, observed: object) -> bool:
    """chaoslib compares with Python's ==, where true == 1; Docket compares as JSON
    does, where it is not. The journal records Docket's verdict; the tolerance is
    chaoslib's reading of it for values of one JSON kind."""
    return _json_kind(expected) == _json_kind(observed)


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__  # str, list, dict, NoneType


def test_a_range_tolerance_is_chaoslibs_only_for_a_number():
    # Docket fails `equals 0.0` against a list; chaoslib's range tolerance raises on one
    # (Decimal([])) instead of saying no: the mapping's promise is for one JSON kind only.
    assert evaluate(Assertion("t", "@", "equals", 0.0), []).verdict == FAIL
    with pytest.raises(ValueError):
        within_tolerance(tolerance("equals", 0.0), [])


@given(judged())
def test_chaoslib_reads_each_tolerance_as_docket_judges(case):
    op, expected, observed = case
    verdict = evaluate(Assertion("t", "@", op, expected), observed).verdict
    if verdict == UNKNOWN or not _same_kind(expected, observed):
        return
    met = within_tolerance(tolerance(op, expected), observed)
    assert met == (verdict == PASS) == tolerance_met(op, expected, observed), tolerance(
        op, expected
    )


def test_tolerances_are_the_expected_value_where_chaoslib_means_the_same():
    assert tolerance("equals", 4) == 4
    assert tolerance("equals", "closed") == "closed"
    assert tolerance("is_false", True) is False
    assert tolerance("at_least", 2)["range"][0] == 2.0
    assert tolerance("greater_than", 2)["range"][0] > 2.0
    assert tolerance("matches", "^5")["pattern"] == "^5"
    assert tolerance("one_of", [1, 2])["provider"]["func"] == "tolerance_met"


# ---------------------------------------------------------------- the session's game day


def test_the_game_day_journals_load_as_chaos_report_reads_them(gameday_run, monkeypatch):
    # an activity runs `docket game-day ...`: chaoslib checks the program is on PATH
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    day = json.loads((gameday_run.report / "gameday.json").read_text())
    written = sorted(p.name for p in gameday_run.journal.iterdir())
    assert written == sorted(f"{p['name']}.journal.json" for p in day["phases"])
    assert len(written) == 9, gameday_run.output
    for data in day["phases"]:
        with open(gameday_run.journal / f"{data['name']}.journal.json") as fp:
            journal = json.load(fp)  # as chaosreport.generate_report_header does
        chaoslib_experiment.ensure_experiment_is_valid(journal["experiment"])
        # what `chaos report` reads of every journal (chaosreport.generate_report)
        assert journal["chaoslib-version"] is None  # no chaoslib wrote it: its newest template
        assert isinstance(journal["duration"], float)
        for key in ("start", "end"):
            assert datetime.fromisoformat(journal[key]).tzinfo is not None
        assert journal["status"] in STATUSES
        verdicts = [c["verdict"] for c in data["checks"]]
        assert journal["deviated"] == (FAIL in verdicts)
        expected_status = (
            "aborted" if data["error"] else "failed" if UNKNOWN in verdicts else "completed"
        )
        assert journal["status"] == expected_status
        probes = journal["steady_states"]["after"]["probes"]
        assert [p["tolerance_met"] for p in probes] == [v == PASS for v in verdicts]
        for probe, c in zip(probes, data["checks"], strict=True):
            assert probe["output"] == c["observed"]
            if c["verdict"] != UNKNOWN and _same_kind(c["expected"], c["observed"]):
                tol = probe["activity"]["tolerance"]
                assert within_tolerance(tol, probe["output"]) == probe["tolerance_met"], probe
        runs = journal["run"]
        assert [r["activity"]["docket_run"] for r in runs] == [r["name"] for r in data["runs"]]
        assert all(r["start"] <= r["end"] for r in runs)
        faults = [a["docket_fault"] for a in journal["experiment"]["method"]]
        assert faults == [f for r in data["runs"] for f in r["schedule"]]
        [ext] = journal["experiment"]["extensions"]
        assert [le["folder"] for le in ext["ledgers"]] == [r["evidence_dir"] for r in data["runs"]]


def test_a_bad_journal_folder_is_one_line_before_any_phase_runs(tmp_path: Path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    argv = ["game-day", "--report", str(tmp_path / "r"), "--phase", "ledger-pressure"]
    done = docket_forked([*argv, "--journal", str(a_file / "j")], cwd=tmp_path, timeout=60)
    stderr = done.stderr.decode()
    assert (done.returncode, stderr.count("\n")) == (2, 1), stderr
    assert stderr.startswith(f"docket: --journal {a_file / 'j'}: cannot create"), stderr
    assert b"PASS" not in done.stdout and not (tmp_path / "r").exists()
