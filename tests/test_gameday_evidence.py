"""The report says exactly what happened: each phase's evidence is kept and linked (and
`docket verify` passes on it), an is_false check reads "is false", a clock jump is a marked
break on the timeline, numbers never print in exponent form, percentiles say what they mean
over few calls, the phase file is `gamedays/...`, a run's non-zero exit is explained, the
FMEA table renders code spans inside the page, and the phases are collapsible."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from test_gameday_report import a_run, check, day, phase

from chaos.gameday.assertions import PASS, Check, expectation
from chaos.gameday.browser_check import Dom, is_local, missing_local
from chaos.gameday.numbers import latency_text, plain
from chaos.gameday.phase import load_phases
from chaos.gameday.report import code_spans, render_html, render_junit
from chaos.gameday.results import CheckResult, GameDayResult, TimelineEvent
from chaos.gameday.timeline import layout

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120

PHASE = """\
# A tiny phase, to see what a game day keeps.
name: tiny
title: Three calls
fmea: [F03]
seed: 5
budget: 20s
run:
  agents: [{name: a, mode: loop, calls: 3, timeout: 5s}]
  max_wall_clock: 10s
expect:
  - name: three calls were forwarded
    query: "counts.\\"model.request\\""
    equals: 3
  - name: nothing was refused
    query: "counts.\\"policy.denied\\" > `0`"
    is_false: true
"""


def game_day(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "docket", "game-day", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
    )


def test_the_evidence_is_kept_linked_and_verifies(tmp_path: Path):
    phase_file = tmp_path / "tiny.yaml"
    phase_file.write_text(PHASE)
    report = tmp_path / "report"
    done = game_day(tmp_path, "--phase", str(phase_file), "--report", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = report / "evidence" / "tiny" / "run" / "run"
    for name in ("ledger.jsonl", "receipt.json", "metrics.txt", "stub-openai.jsonl"):
        assert (run_dir / name).stat().st_size > 0, name
    # `docket verify` runs on the kept evidence afterwards
    verify = subprocess.run(
        [sys.executable, "-m", "docket", "verify", "--ledger", str(run_dir / "ledger.jsonl"),
         str(run_dir / "receipt.json")],
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert verify.returncode == 0 and verify.stdout.startswith("ok:"), verify.stdout
    # the report links every file, relative to itself, and each link names a file
    html = (report / "index.html").read_text()
    dom = Dom()
    dom.feed(html)
    assert "evidence/tiny/run/run/ledger.jsonl" in dom.local
    assert "evidence/tiny/run/run/receipt.json" in dom.local
    assert missing_local(report / "index.html", dom.local) == [] and dom.external == []
    assert "docket verify --ledger" in html
    # the engine's own command is filled in, and names the scenario kept beside the run
    (data,) = json.loads((report / "gameday.json").read_text())["phases"][0]["runs"]
    assert data["evidence_dir"] == str(run_dir)
    assert data["engine_repro"].startswith(
        f"docket chaos --scenario {run_dir.parent / 'run.yaml'} --seed 5 --dir "
    )
    assert (run_dir.parent / "run.yaml").is_file()
    # and an is_false check is "expected: is false", in the report and in JUnit
    assert "<code>is false</code>" in html and "<code>is true</code>" not in html

    # a second game day into the same report replaces the evidence it left
    stale = run_dir / "stale"
    stale.write_text("from the first game day")
    again = game_day(tmp_path, "--phase", str(phase_file), "--report", str(report))
    assert again.returncode == 0, again.stdout + again.stderr
    assert not stale.exists() and (run_dir / "ledger.jsonl").is_file()


def test_keep_refuses_a_folder_a_game_day_did_not_leave(tmp_path: Path):
    phase_file = tmp_path / "tiny.yaml"
    phase_file.write_text(PHASE)
    keep = tmp_path / "mine"
    (keep / "tiny").mkdir(parents=True)
    (keep / "tiny" / "notes.txt").write_text("a person's file")
    done = game_day(tmp_path, "--phase", str(phase_file), "--report", "r", "--keep", str(keep))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"docket: --keep {keep}: {keep / 'tiny'} exists and was not left by a game day; "
        "give another folder\n"
    )
    assert (keep / "tiny" / "notes.txt").read_text() == "a person's file"


def test_is_false_reads_as_is_false():
    assert expectation("is_false", True) == "is false"
    assert expectation("is_true", True) == "is true"
    assert expectation("at_least", 1) == ">= 1"
    c = CheckResult(Check("no refusal", "q", "is_false", True, True, "fail", "observed true"), 3)
    result = GameDayResult((phase("p", ("F03",), (c,)),), "t", 1.0, None, "0.1.0")
    assert "<code>is false</code>" in render_html(result)
    assert "expected: is false\nobserved: true" in render_junit(result)
    assert c.to_json()["expects"] == "is false"


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e21, max_value=1e21))
def test_plain_never_prints_an_exponent(value):
    text = plain(value)
    assert "e" not in text.lower()
    assert abs(float(text) - value) <= 0.0005 + abs(value) * 1e-12


def test_a_clock_jump_is_a_marked_break_not_a_squeezed_timeline():
    # the upstream-latency phase: a 30-minute step between seq 1 and seq 2 of a 3 s run
    times = [0, 40, 80, 1_800_000 + 100, 1_800_000 + 1500, 1_800_000 + 3000]
    tl = layout([TimelineEvent(i, float(t), "model.request") for i, t in enumerate(times)])
    (gap,) = tl.breaks
    assert gap.label == "+30 min 0 s" and gap.gap_ms == 1_800_020
    xs = [m.x for m in tl.marks]
    plot = tl.width - 170 - 10
    # the run's own three seconds fill the axis (the old layout put five of six marks
    # within 3 px of the right edge)
    assert xs[-1] - xs[3] > 0.4 * plot and xs[2] - xs[0] > 0.02 * plot
    labels = [t.label for t in tl.ticks]
    assert labels[0] == "0 s" and "1802 s" in labels  # real time since the first event
    assert not any("e+" in label for label in labels)
    html = render_html(
        GameDayResult(
            (phase("p", ("F03",), (check("c", PASS),), runs=(a_run(timeline=tuple(
                TimelineEvent(i, float(t), "model.request") for i, t in enumerate(times)
            )),)),),
            "t", 1.0, None, "0.1.0",
        )
    )  # fmt: skip
    assert "events over 1803000 ms" in html and "+30 min 0 s is a jump" in html
    assert not re.search(r"\d\.\d+e[+-]\d", html)


@given(st.lists(st.floats(0, 9_000), min_size=2, max_size=60))
def test_a_run_without_a_jump_is_drawn_to_scale(times):
    tl = layout([TimelineEvent(i, t, "x") for i, t in enumerate(times)])
    assert tl.breaks == ()
    assert tl.drawn_ms == tl.span_ms


def test_percentiles_say_what_they_mean_over_few_calls():
    one = latency_text({"count": 1, "p50_ms": 18, "p99_ms": 18, "max_ms": 18})
    assert one.startswith("max 18 ms over 1 call (not shown:") and "p99 18" not in one
    forty = {"count": 40, "p50_ms": 10, "p95_ms": 30, "p99_ms": 45, "max_ms": 45}
    assert latency_text(forty).startswith("p50 10 ms · p95 30 ms · max 45 ms over 40 calls")
    many = {"count": 5000, "p50_ms": 1, "p95_ms": 2, "p99_ms": 3, "p999_ms": 4.5, "max_ms": 9}
    assert (
        latency_text(many)
        == "p50 1 ms · p95 2 ms · p99 3 ms · p99.9 4.5 ms · max 9 ms over 5000 calls"
    )
    assert latency_text({"count": 0}) == "no calls closed"


def test_the_bundled_phases_are_named_by_their_place_in_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the checkout, as nox's installed wheel is
    sources = [p.source for p in load_phases()]
    assert sources and all(re.fullmatch(r"gamedays/\d\d-[a-z-]+\.yaml", s) for s in sources)
    assert all((ROOT / s).is_file() for s in sources)


def test_junit_file_is_the_repository_path():
    root = ET.fromstring(render_junit(day()).split("\n", 1)[1])
    files = {case.get("file") for case in root.iter("testcase") if case.get("file")}
    assert files and all(f.startswith("gamedays/") for f in files)


def test_a_non_zero_exit_on_a_passing_phase_is_explained():
    c = CheckResult(Check("ok", "receipt.totals", "at_least", 1, 2, PASS, ""), 3)
    run = a_run(exit_status=1, run_reason="child exited with status 1")
    html = render_html(
        GameDayResult((phase("p", ("F03",), (c,), runs=(run,)),), "t", 1.0, None, "0")
    )
    assert "the agent&#39;s own exit status, which the supervisor passes on" in html
    assert "no check reads it, so it does not decide the verdict" in html
    judged = CheckResult(Check("exit", "exit_status", "equals", 1, 1, PASS, ""), 4)
    html = render_html(
        GameDayResult((phase("p", ("F03",), (c, judged), runs=(run,)),), "t", 1.0, None, "0")
    )
    assert "check #2 judges it" in html
    # the agent's last stderr line says why it exited so; a signal is named
    said = a_run(
        exit_status=1,
        run_reason="child exited with status 1",
        facts={"agent_stderr": {"streamer": "docket: agent: the call failed: peer closed"}},
    )
    html = render_html(
        GameDayResult((phase("p", ("F03",), (c,), runs=(said,)),), "t", 1, None, "0")
    )
    assert "(streamer said: docket: agent: the call failed: peer closed)" in html
    killed = a_run(exit_status=137, run_reason="docket chaos exited with status 137")
    html = render_html(
        GameDayResult((phase("p", ("F03",), (c,), runs=(killed,)),), "t", 1, None, "0")
    )
    assert "137 is 128 + 9: killed by signal 9 (SIGKILL)" in html


def test_fmea_cells_render_code_spans_inside_the_page():
    assert str(code_spans("the `docket_breaker_open` <b> & co")) == (
        "the <code>docket_breaker_open</code> &lt;b&gt; &amp; co"
    )
    html = render_html(day())
    fmea = html[html.index('<section id="fmea">') : html.index('<section id="review">')]
    assert "`" not in fmea and "<code>" in fmea
    assert '<table class="fmea">' in fmea and '<div class="wide">' in fmea
    css = (ROOT / "reports" / "report.css").read_text()
    assert "table.fmea { table-layout: fixed;" in css


def test_phases_are_collapsible_and_the_failing_ones_open():
    html = render_html(day())
    opened = re.findall(r'<article class="phase (\w+)" id="[^"]+">\n<details( open)?>', html)
    assert opened and all((verdict != "pass") == bool(is_open) for verdict, is_open in opened)
    assert any(v == "pass" for v, _ in opened)


def test_only_relative_links_count_as_evidence():
    assert is_local("evidence/p/run/run/ledger.jsonl") and is_local("../kept/x")
    assert not is_local("https://example.com/x") and not is_local("/etc/passwd")
    assert not is_local("file:///tmp/x")
    assert os.sep == "/"  # the links are POSIX paths, as the report is made here


def test_a_run_without_a_receipt_is_checked_with_doctor(tmp_path: Path):
    from chaos.gameday.report import evidence_view

    run_dir = tmp_path / "evidence" / "p" / "kill" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "ledger.jsonl").write_text("")
    view = evidence_view(a_run(evidence_dir=str(run_dir)), tmp_path)
    assert view.verify == f"docket doctor {run_dir / 'ledger.jsonl'}"
    assert ("ledger", "evidence/p/kill/run/ledger.jsonl") in view.files
    (run_dir / "receipt.json").write_text("{}")
    view = evidence_view(a_run(evidence_dir=str(run_dir)), tmp_path)
    assert view.verify.startswith("docket verify --ledger ")
    assert evidence_view(a_run(), tmp_path) is None  # a run in a temporary folder
