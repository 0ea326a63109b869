"""chaos.gameday.phase: phase files are checked before anything starts, errors as FILE:LINE."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.gameday.fmea import load_fmea
from chaos.gameday.phase import (
    Phase,
    leading_comment,
    load_phase,
    load_phases,
    loads_phase,
    parse_duration,
)
from chaos.yamldoc import YamlError
from docket.cli_help import GAMEDAY_PHASES
from docket.errors import InputError

GOOD = """\
# Shows a thing.
# On two lines.
name: demo
title: A demo phase
fmea: [F03]
seed: 7
budget: 10s
run:
  faults: ["upstream:status(503)@call 2"]
  agents: [{name: a, mode: loop, calls: 3}]
  max_wall_clock: 5s
expect:
  - name: a call was made
    query: "length(events[?type=='model.request'])"
    at_least: 1
  - name: the stub agrees
    query: "stub_calls.openai == counts.\\"model.request\\""
    is_true: true
"""

ISSUE_PHASES = list(GAMEDAY_PHASES)


def test_a_good_phase_loads():
    phase = loads_phase(GOOD, "gamedays/01-demo.yaml")
    assert isinstance(phase, Phase)
    assert (phase.name, phase.title, phase.fmea, phase.seed) == (
        "demo",
        "A demo phase",
        ("F03",),
        7,
    )
    assert (phase.mode, phase.budget_s) == ("in-process", 10.0)
    assert phase.about == "Shows a thing. On two lines."
    assert [e.line for e in phase.expect] == [13, 16]
    assert phase.run.faults == ("upstream:status(503)@call 2",)
    assert phase.run.max_wall_clock == 5.0
    assert phase.repro() == "docket game-day --phase demo --seed 7"
    assert phase.repro(9) == "docket game-day --phase demo --seed 9"


def _with(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            _with("seed: 7\n", "seed: 7\ncolour: red\n"),
            "01-demo.yaml:7: at colour unknown key (known: name, title, fmea,",
        ),
        (_with("title: A demo phase\n", ""), "01-demo.yaml:3: missing key 'title'"),
        (_with("name: demo", "name: Demo!"), "01-demo.yaml:3: at name name must be lowercase"),
        (_with("name: demo", "name: other"), "01-demo.yaml:3: at name name 'other' does not match"),
        (
            _with("seed: 7", "seed: -1"),
            "01-demo.yaml:6: at seed must be between 0 and 9007199254740991",
        ),
        (
            _with("seed: 7", "seed: true"),
            "01-demo.yaml:6: at seed must be a whole number, got true",
        ),
        (_with("seed: 7", "seed: 9007199254740992"), "01-demo.yaml:6: at seed"),
        (_with("fmea: [F03]", "fmea: []"), "01-demo.yaml:5: at fmea fmea must be a non-empty list"),
        (
            _with("fmea: [F03]", "fmea: [F3]"),
            "01-demo.yaml:5: at fmea[0] 'F3' is not an FMEA row id",
        ),
        (
            _with("fmea: [F03]", "fmea: [F99]"),
            "01-demo.yaml:5: at fmea[0] FMEA row F99 does not exist",
        ),
        (
            _with("fmea: [F03]", "fmea: [F03, F03]"),
            "01-demo.yaml:5: at fmea[1] FMEA row F03 named twice",
        ),
        (
            _with("budget: 10s", "budget: 10 seconds"),
            "01-demo.yaml:7: at budget must be a positive duration",
        ),
        (
            _with("budget: 10s", "budget: 0s"),
            "01-demo.yaml:7: at budget must be a positive duration",
        ),
        (_with("budget: 10s", "budget: 2s"), "budget 2s is shorter than run.max_wall_clock 5s"),
        (
            _with("budget: 10s", "budget: 10s\nmode: threads"),
            '01-demo.yaml:8: at mode must be "in-process" or "subprocess", got "threads"',
        ),
        (_with("run:\n", "run: 3\nx:\n"), "at x unknown key (known: name,"),
        (
            _with("    at_least: 1\n", ""),
            "01-demo.yaml:13: at expect[0] an assertion needs exactly one operator",
        ),
        (
            _with("    at_least: 1\n", "    at_least: 1\n    at_most: 3\n"),
            "exactly one operator (equals",
        ),
        (
            _with("    at_least: 1\n", "    at_least: '1'\n"),
            "01-demo.yaml:15: at expect[0].at_least at_least needs a number",
        ),
        (
            _with("    at_least: 1\n", "    at_least: 1\n    because: x\n"),
            "01-demo.yaml:16: at expect[0].because unknown key",
        ),
        (
            _with("    is_true: true\n", "    is_true: false\n"),
            "at expect[1].is_true write `is_true: true`",
        ),
        (
            _with("length(events", "lenght(events"),
            "01-demo.yaml:14: at expect[0].query JMESPath has no function lenght()",
        ),
        (
            _with("type=='model.request'", "type=="),
            "01-demo.yaml:14: at expect[0].query not a JMESPath query",
        ),
        (
            _with("name: the stub agrees", "name: a call was made"),
            "at expect[1].name assertion name 'a call was made' used twice",
        ),
        (_with("expect:\n", "expect: []\nx:\n"), "at x unknown key (known: name,"),
        (
            _with('faults: ["upstream:status(503)@call 2"]', 'faults: ["upstream:status(999)"]'),
            "01-demo.yaml:9: at run.faults[0]",
        ),
        (_with("mode: loop", "mode: sprint"), "01-demo.yaml:10: at run.agents[0].mode"),
        ("- a list\n", "01-demo.yaml:1: a phase file must be a mapping"),
        ("name: [unclosed\n", "01-demo.yaml:2: not valid YAML"),
    ],
)
def test_a_malformed_phase_is_one_line_naming_file_and_line(text, error):
    with pytest.raises(YamlError) as info:
        loads_phase(text, "gamedays/01-demo.yaml")
    message = str(info.value)
    assert error in message
    assert "\n" not in message
    assert info.value.exit_code == 2


def test_run_must_be_a_scenario_block():
    start, end = GOOD.index("run:\n"), GOOD.index("expect:\n")
    text = GOOD[:start] + "run: [1, 2]\n" + GOOD[end:]
    with pytest.raises(YamlError, match=r"01-demo.yaml:8: at run run must be a mapping"):
        loads_phase(text, "gamedays/01-demo.yaml")


def test_a_phase_file_on_disk(tmp_path: Path):
    path = tmp_path / "demo.yaml"
    path.write_text(GOOD)
    assert load_phase(path).source == str(path)
    path.write_text("")
    with pytest.raises(InputError, match="is empty"):
        load_phase(path)


def test_durations_and_comments():
    # docket.values' one grammar: `1h` reads as it does in docket.toml (it was refused here)
    assert [parse_duration(v) for v in ("20s", "500ms", "1.5m", "1h", 3, 2.5)] == [
        20,
        0.5,
        90,
        3600,
        3,
        2.5,
    ]
    assert [parse_duration(v) for v in ("20", "1d", True, None, [])] == [None] * 5
    assert leading_comment("\n# one\n#two\n\nname: x  # not this\n# nor this") == "one two"


def test_the_nine_phases_of_the_issue_load_with_existing_fmea_rows():
    phases = load_phases()
    assert [p.name for p in phases] == ISSUE_PHASES
    rows = {row.id for row in load_fmea()}
    for phase in phases:
        assert set(phase.fmea) <= rows
        assert phase.expect, phase.name
        assert phase.about, (
            f"{phase.name}: the file should begin with a comment saying what it shows"
        )
    assert {p.name: p.mode for p in phases}["supervisor-killed"] == "subprocess"
    assert sum(p.budget_s for p in phases) <= 300


def test_selecting_phases(tmp_path: Path):
    assert [p.name for p in load_phases(["partition", "circuit-breaker"])] == [
        "partition",
        "circuit-breaker",
    ]
    other = tmp_path / "demo.yaml"
    other.write_text(GOOD)
    assert [p.name for p in load_phases([str(other)])] == ["demo"]
    with pytest.raises(InputError, match="no phase named 'nope'; the phases are: upstream-failure"):
        load_phases(["nope"])
    with pytest.raises(InputError, match="asked for twice"):
        load_phases(["partition", "partition"])


def test_a_folder_with_two_phases_of_one_name_is_refused(tmp_path: Path):
    (tmp_path / "01-demo.yaml").write_text(GOOD)
    (tmp_path / "demo.yaml").write_text(GOOD)
    with pytest.raises(InputError, match="phase name 'demo' is also used by"):
        load_phases(folder=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no phase files"):
        load_phases(folder=empty)


TWO_RUNS = """\
# Two runs, one policy each.
name: demo
title: A demo phase with two runs
fmea: [F06]
seed: 7
budget: 20s
runs:
  - name: deny
    title: deny mode
    run:
      agents: [{name: a, mode: loop, calls: 3}]
      policy: {caps: {max_model_calls: 2, on_breach: deny}}
      max_wall_clock: 5s
  - name: kill
    run:
      faults: ["upstream:status(503)@call 2"]
      agents: [{name: a, mode: loop, calls: 3}]
      policy: {caps: {max_model_calls: 2, on_breach: kill}}
      max_wall_clock: 5s
expect:
  - name: deny went on
    run: deny
    query: "exit_status"
    equals: 0
  - name: kill stopped
    run: kill
    query: "exit_status"
    equals: 42
"""


def _two(old: str, new: str) -> str:
    assert old in TWO_RUNS
    return TWO_RUNS.replace(old, new)


def test_a_phase_with_several_runs_loads():
    phase = loads_phase(TWO_RUNS, "gamedays/06-demo.yaml")
    assert [r.name for r in phase.runs] == ["deny", "kill"]
    assert [r.title for r in phase.runs] == ["deny mode", ""]
    assert [r.line for r in phase.runs] == [8, 14]
    assert phase.runs[1].scenario.faults == ("upstream:status(503)@call 2",)
    assert phase.runs[0].scenario.policy == {"caps": {"max_model_calls": 2, "on_breach": "deny"}}
    assert [(e.run, e.line) for e in phase.expect] == [("deny", 21), ("kill", 25)]
    assert phase.several_runs
    with pytest.raises(ValueError, match="has 2 runs"):
        phase.run  # noqa: B018 - a phase with several runs has no one `run`
    kill = phase.only("kill")
    assert [r.name for r in kill.runs] == ["kill"] and [e.run for e in kill.expect] == ["kill"]
    assert kill.repro(9, "kill") == "docket game-day --phase demo:kill --seed 9"
    with pytest.raises(
        InputError, match="phase demo has no run named 'nope'; its runs: deny, kill"
    ):
        phase.only("nope")
    single = loads_phase(GOOD, "gamedays/01-demo.yaml")
    assert [r.name for r in single.runs] == ["run"] and [e.run for e in single.expect] == [
        "run",
        "run",
    ]
    assert not single.several_runs
    with pytest.raises(InputError, match="phase demo has one run: name the phase alone"):
        single.only("run")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            _two("runs:\n", "run: {}\nruns:\n"),
            "06-demo.yaml:9: at runs give `run:` (one run) or `runs:`",
        ),
        (
            TWO_RUNS[: TWO_RUNS.index("runs:\n")] + TWO_RUNS[TWO_RUNS.index("expect:\n") :],
            "06-demo.yaml:2: missing key 'run' (one scenario block) or 'runs' (several)",
        ),
        (
            TWO_RUNS[: TWO_RUNS.index("  - name: kill\n")]
            + TWO_RUNS[TWO_RUNS.index("expect:\n") :],
            "06-demo.yaml:8: at runs runs must be a list of two or more named runs",
        ),
        (
            _two("  - name: kill\n", "  - name: kill\n    colour: red\n"),
            "06-demo.yaml:15: at runs[1].colour unknown key (known: name, title, run)",
        ),
        (
            _two("  - name: kill\n", "  - name: deny\n"),
            "06-demo.yaml:14: at runs[1].name run name 'deny' used twice",
        ),
        (
            _two("  - name: kill\n", "  - name: Kill!\n"),
            "at runs[1].name a run's name must be lowercase",
        ),
        (
            _two("    title: deny mode\n", "    title: ''\n"),
            "06-demo.yaml:9: at runs[0].title must be a non-empty string",
        ),
        (
            _two("  - name: kill\n    run:\n", "  - name: kill\n    ran:\n"),
            "at runs[1].ran unknown key (did you mean run?)",
        ),
        (
            _two(
                "  - name: kill\n    run:\n      faults",
                "  - name: kill\n    run: []\n    x:\n      faults",
            ),
            "at runs[1].x unknown key",
        ),
        (
            _two('"upstream:status(503)@call 2"', '"upstream:status(999)"'),
            "06-demo.yaml:16: at runs[1].run.faults[0]",
        ),
        (
            _two(
                "mode: loop, calls: 3}]\n      policy: {caps: {max_model_calls: 2, on_breach: kill",
                "mode: sprint, calls: 3}]\n      policy: {caps: {max_model_calls: 2, on_breach: kill",
            ),
            "06-demo.yaml:17: at runs[1].run.agents[0].mode",
        ),
        (_two("on_breach: kill", "on_breach: maim"), "06-demo.yaml:18: at runs[1].run.policy"),
        (
            _two("    run: kill\n", ""),
            "06-demo.yaml:25: at expect[1] an assertion in a phase with several runs names one (deny, kill)",
        ),
        (
            _two("    run: kill\n", "    run: kil\n"),
            "06-demo.yaml:26: at expect[1].run no run named 'kil' in this phase (deny, kill)",
        ),
        (
            _two("    run: kill\n", "    run: deny\n"),
            "06-demo.yaml:21: at expect no assertion reads run 'kill'",
        ),
        (
            _two("budget: 20s", "budget: 8s"),
            "budget 8s is shorter than the runs' max_wall_clock together 10s",
        ),
        (
            _with("    at_least: 1\n", "    at_least: 1\n    run: run\n"),
            "at expect[0].run this phase has one run: an assertion names none",
        ),
    ],
)
def test_a_malformed_phase_with_runs_is_one_line_naming_file_and_line(text, error):
    with pytest.raises(YamlError) as info:
        loads_phase(text, "gamedays/06-demo.yaml")
    message = str(info.value)
    assert error in message
    assert "\n" not in message


def test_selecting_one_run_of_a_phase(tmp_path: Path):
    (tmp_path / "06-demo.yaml").write_text(TWO_RUNS)
    (tmp_path / "01-other.yaml").write_text(GOOD.replace("name: demo", "name: other"))
    (kill,) = load_phases(["demo:kill"], folder=tmp_path)
    assert kill.name == "demo" and [r.name for r in kill.runs] == ["kill"]
    assert kill.selected_run == "kill" and kill.several_runs
    with pytest.raises(InputError, match="phase demo has no run named 'sulk'"):
        load_phases(["demo:sulk"], folder=tmp_path)
    with pytest.raises(InputError, match="phase other has one run"):
        load_phases(["other:run"], folder=tmp_path)
    with pytest.raises(InputError, match="asked for twice"):
        load_phases(["demo:kill", "demo"], folder=tmp_path)
    path = tmp_path / "06-demo.yaml"
    (deny,) = load_phases([f"{path}:deny"], folder=tmp_path)
    assert [r.name for r in deny.runs] == ["deny"]
