"""The game-day report in a real headless Chromium at 1366 px: a failing phase with a long
expected value stays within the window (every cell's right edge measured from the DOM),
and a check failed by an unmet precondition says so instead of "observed true"."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_gameday_report import a_run, check, phase

from chaos.gameday.assertions import FAIL, PASS, Check, with_preconditions
from chaos.gameday.browser_check import (
    LAYOUT_WIDTH,
    layout_problems,
    measure_layout,
)
from chaos.gameday.report import render_html, render_junit, write_reports
from chaos.gameday.results import CheckResult, GameDayResult

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(
    BROWSER is None,
    reason="no chromium on PATH (apt-get install chromium; CI installs it for report-check)",
)
# One word of 400 characters (a breaker's state string has no space to break at) and a
# list of 300 numbers: either alone widened the checks table past 1366 px.
STATES = ">".join(["closed", "open", "half_open"] * 30)
LONG_LIST = list(range(100000, 100300))


def failing_day() -> GameDayResult:
    opened = Check("the breaker opened", "breaker_sequence.openai", "equals", "closed>open",
                   "closed", FAIL, "observed \"closed\", expected == \"closed>open\"")  # fmt: skip
    vacuous = Check("no call while open", "open_calls == `0`", "is_true", True, True, PASS, "")
    judged = with_preconditions([opened, vacuous], [(), ("the breaker opened",)])
    checks = (
        CheckResult(
            Check(
                "states",
                "breaker_sequence.openai",
                "equals",
                STATES,
                "closed>open",
                FAIL,
                'observed "closed>open", expected == ...',
            ),
            18,
        ),  # fmt: skip
        CheckResult(
            Check(
                "ports",
                "calls[].port",
                "equals",
                LONG_LIST,
                LONG_LIST[:3],
                FAIL,
                "observed a shorter list",
            ),
            21,
        ),  # fmt: skip
        CheckResult(judged[0], 12),
        CheckResult(judged[1], 15, requires=("the breaker opened",)),
        check("quiet stub", PASS),
    )
    runs = (a_run(facts={"breaker_sequence": {"openai": STATES}}),)
    return GameDayResult(
        phases=(
            phase("calm", ("F03",), (check("cycle", PASS),)),
            phase("circuit-breaker", ("F03",), checks, runs=runs),
        ),
        started_at="2026-12-02T10:00:00Z",
        duration_s=3.0,
        docket_version="test",
        seed=7,
    )


def test_a_check_failed_by_its_precondition_names_it_not_its_own_value():
    day = failing_day()
    unmet = day.phases[1].checks[3]
    assert unmet.verdict == FAIL and unmet.check.unmet == "the breaker opened"
    html = render_html(day, rows=[])
    row = html.split(f'id="{day.phases[1].check_anchor(3)}"')[1].split("</tr>")[0]
    assert "precondition «the breaker opened» not met" in row
    assert "its own query saw <code>true</code>" in row
    junit = render_junit(day)
    assert "precondition not met: «the breaker opened» failed\nquery: open_calls" in junit
    # the JSON round trip keeps it (a report rebuilt from gameday.json says the same)
    again = GameDayResult.from_json(day.to_json())
    assert again.phases[1].checks[3].check.unmet == "the breaker opened"
    assert "unmet" not in day.phases[1].checks[2].check.to_json()


@needs_browser
def test_a_long_expected_value_wraps_inside_a_1366px_window(tmp_path: Path):
    assert BROWSER is not None
    # the FMEA table of docs/resilience.md too: every table of a real report is measured
    written = write_reports(failing_day(), report_dir=tmp_path / "report")
    assert written.html is not None
    measured = measure_layout(BROWSER, written.html)
    assert measured["window"] == LAYOUT_WIDTH and 0 < measured["width"] <= LAYOUT_WIDTH
    assert measured["cells"] > 20  # both phases' tables were laid out (details opened)
    assert measured["beyond"] == [], measured["beyond"][:3]
    assert layout_problems(measured) == []


@needs_browser
def test_the_measure_sees_a_table_wider_than_the_window(tmp_path: Path):
    """The same report without its wrapping rules: the measure must name cells past the
    edge, or the test above could not fail."""
    assert BROWSER is not None
    written = write_reports(failing_day(), report_dir=tmp_path / "report", rows=[])
    assert written.html is not None
    html = written.html.read_text(encoding="utf-8")
    unwrapped = html.replace("overflow-wrap: anywhere", "overflow-wrap: normal").replace(
        "word-break: break-word", "word-break: normal"
    )
    assert unwrapped != html
    written.html.write_text(unwrapped, encoding="utf-8")
    measured = measure_layout(BROWSER, written.html)
    assert measured["beyond"], "a 400-character word laid out within 1366 px?"
    assert any("closed>open>half_open" in b["text"] for b in measured["beyond"])
    (problem,) = layout_problems(measured)
    assert "reach past a 1366 px window" in problem


@needs_browser
def test_browser_check_runs_the_layout_check_and_keeps_a_wide_screenshot(tmp_path: Path):
    written = write_reports(failing_day(), report_dir=tmp_path / "report", rows=[])
    assert written.html is not None
    shot = tmp_path / "wide.png"
    proc = subprocess.run(
        [sys.executable, "-m", "chaos.gameday.browser_check", str(written.html),
         "--browser", str(BROWSER), "--wide-screenshot", str(shot)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no table cell past a 1366 px window" in proc.stdout
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
