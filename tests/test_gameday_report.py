"""chaos.gameday.report: one self-contained HTML file, JSON and JUnit, from hand-built results."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

from chaos.gameday.assertions import FAIL, PASS, UNKNOWN, Check
from chaos.gameday.fmea import load_fmea
from chaos.gameday.report import render_html, render_json, render_junit, write_reports
from chaos.gameday.results import (
    CheckResult,
    GameDayResult,
    PhaseResult,
    PhaseRun,
    TimelineEvent,
)
from chaos.gameday.review import changes_made, open_risks
from chaos.gameday.timeline import layout


def check(name: str, verdict: str, observed: object = 1, run: str = "run") -> CheckResult:
    reason = "" if verdict == PASS else f"observed {observed}"
    return CheckResult(
        Check(name, "length(events)", "at_least", 1, observed, verdict, reason), 20, run
    )


TIMELINE = (
    TimelineEvent(0, 0, "session.start"),
    TimelineEvent(1, 12, "fault.injected", "upstream:status(503)@20%"),
    TimelineEvent(2, 40, "model.error", "openai: upstream_status 503"),
    TimelineEvent(3, 95, "session.end"),
)


def a_run(name: str = "run", **kw) -> PhaseRun:
    fields = dict(
        name=name,
        engine_repro="docket chaos --seed 7",
        duration_s=1.5,
        exit_status=0,
        run_reason="child exited with status 0",
        schedule=("upstream:status(503)@20%",),
        injected=({"fault": "upstream:status(503)@20%"}, {"fault": "upstream:status(503)@20%"}),
        timeline=TIMELINE,
        policy={
            "boundary": {"connect_timeout": 0.3, "upstream_timeout": 0.3},
            "resilience": {"breaker_threshold": 3, "max_concurrent_upstream": 2, "max_queue": 1},
        },
        providers=({"name": "openai", "kind": "openai", "via_proxy": True},),
        agents=({"name": "polite", "mode": "backoff", "provider": None},),
        facts={
            "errors_by_reason": {"openai": {"timeout": 2}},
            "breaker_sequence": {"openai": "closed>open"},
        },
    )
    fields.update(kw)
    return PhaseRun(**fields)


def phase(
    name: str,
    fmea: tuple[str, ...],
    checks: tuple[CheckResult, ...],
    runs: tuple[PhaseRun, ...] | None = None,
) -> PhaseResult:
    return PhaseResult(
        name=name,
        title=f"<b>{name}</b> & co",  # escaped, not markup
        about="what it shows",
        fmea=fmea,
        seed=7,
        mode="in-process",
        source=f"gamedays/{name}.yaml",
        repro=f"docket game-day --phase {name} --seed 7",
        duration_s=1.5,
        budget_s=20,
        checks=checks,
        runs=runs if runs is not None else (a_run(),),
    )


def two_runs() -> PhaseResult:
    """A phase with two runs: deny passes, kill fails one check."""
    return phase(
        "runaway-loop",
        ("F06",),
        (
            check("refused", PASS, run="deny"),
            check("spend within the cap", PASS, run="deny"),
            check("exit 42", FAIL, 0, run="kill"),
        ),
        runs=(
            a_run(
                "deny",
                title="deny mode",
                repro="docket game-day --phase runaway-loop:deny --seed 7",
                schedule=(),
                injected=(),
            ),
            a_run(
                "kill",
                title="kill mode",
                repro="docket game-day --phase runaway-loop:kill --seed 7",
                exit_status=42,
                run_reason="cap max_model_calls breached (on_breach = kill)",
                timeline=TIMELINE[:2] + (TimelineEvent(2, 30, "cap.exceeded", "max_model_calls"),),
            ),
        ),
    )


def day() -> GameDayResult:
    return GameDayResult(
        phases=(
            phase("circuit-breaker", ("F03",), (check("cycle", PASS), check("quiet stub", PASS))),
            phase("partition", ("F04", "F17"), (check("live", PASS), check("shed", FAIL, 0))),
            phase("evidence-loss", ("F09",), (check("disclosed", UNKNOWN, None),)),
            phase(
                "supervisor-killed",
                ("F10",),
                (),
                runs=(a_run(error="the phase did not finish within its budget of 30 s"),),
            ),
        ),
        started_at="2026-01-01T00:00:00.000Z",
        duration_s=12.5,
        seed=None,
        docket_version="0.1.0",
    )


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.external: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for key, value in attrs:
            if key == "id":
                assert value not in self.ids, f"id {value} defined twice"
                self.ids.add(value)
            if key == "href":
                self.hrefs.append(value)
            if (
                key in ("src", "href", "xlink:href", "action")
                and value
                and not value.startswith("#")
            ):
                self.external.append(value)


def test_the_html_is_self_contained_and_every_link_lands():
    html = render_html(day())
    parser = Links()
    parser.feed(html)
    assert parser.external == []  # no src/href outside the page
    assert not re.search(r"https?://|url\(|@import", html, re.IGNORECASE)
    assert {"link", "img", "iframe"}.isdisjoint(parser.tags)
    # the only script is inline (it opens a collapsed phase that a link points into)
    assert html.count("<script") == 1 and "<script src" not in html
    internal = [h[1:] for h in parser.hrefs]
    assert internal, "the report links its parts"
    missing = sorted(set(internal) - parser.ids)
    assert missing == [], f"links without an anchor: {missing}"
    # the FMEA rows link to the phases and the checks that exercise them
    for target in ("phase-partition", "phase-partition-check-2", "fmea-f17", "upstream-openai"):
        assert target in parser.ids
        assert f'href="#{target}"' in html or target.startswith("upstream")


def test_the_html_shows_verdicts_values_faults_timeline_and_repro():
    html = render_html(day())
    assert (
        "<b>circuit-breaker</b>" not in html
        and "&lt;b&gt;circuit-breaker&lt;/b&gt; &amp; co" in html
    )
    assert 'class="verdict unknown"' in html and 'class="verdict fail"' in html
    assert "docket game-day --phase partition --seed 7" in html
    assert "upstream:status(503)@20%" in html
    assert html.count("<svg") == 4  # a timeline per phase (each hand-built one has events)
    assert "the phase did not finish within its budget of 30 s" in html
    for row in load_fmea():
        assert f'id="fmea-{row.id.lower()}"' in html
    # the FMEA row F17 carries the failed check's verdict
    row = html[html.index('id="fmea-f17"') : html.index("</tr>", html.index('id="fmea-f17"'))]
    assert 'href="#phase-partition-check-2"' in row and "verdict fail" in row


def test_a_phase_naming_a_row_the_table_lacks_still_links(tmp_path: Path):
    result = GameDayResult((phase("odd", ("F77",), (check("c", PASS),)),), "t", 1.0, None, "0.1.0")
    parser = Links()
    parser.feed(render_html(result, rows=[]))
    assert "fmea-f77" in parser.ids
    assert set(h[1:] for h in parser.hrefs) <= parser.ids


def test_junit_has_a_testcase_per_assertion_grouped_by_phase():
    root = ET.fromstring(render_junit(day()))
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["circuit-breaker", "partition", "evidence-loss", "supervisor-killed"]
    assert [len(s.findall("testcase")) for s in suites.values()] == [2, 2, 1, 1]
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("6", "1", "2")
    failed = suites["partition"].findall("testcase")[1]
    message = failed.find("failure").get("message")  # whose failure it is, then why
    assert (
        failed.get("name") == "shed"
        and message == "Docket's failure (a boundary invariant broke): observed 0"
    )
    assert suites["evidence-loss"].find("testcase/error").get("type") == UNKNOWN
    props = {p.get("name"): p.get("value") for p in suites["partition"].iter("property")}
    assert props["seed"] == "7" and props["fmea"] == "F04 F17"


def test_json_round_trips_and_links_fmea_rows():
    result = day()
    data = json.loads(render_json(result))
    # one phase fails and others are unknown: the day fails (a fail is never hidden)
    assert data["verdict"] == FAIL and data["counts"] == {"pass": 1, "fail": 1, "unknown": 2}
    assert GameDayResult.from_json(data).to_json() == result.to_json()
    rows = {r["id"]: r for r in data["fmea"]}
    assert rows["F17"]["phases"] == ["partition"] and rows["F17"]["verdict"] == FAIL
    assert rows["F03"]["verdict"] == PASS


def test_verdicts_and_exit_codes():
    assert day().exit_code == 1  # a failing phase outranks the unknown ones
    only = lambda *p: GameDayResult(tuple(p), "t", 1.0, None, "0.1.0")  # noqa: E731
    passing = phase("a", ("F03",), (check("c", PASS),))
    failing = phase("b", ("F03",), (check("c", FAIL),))
    unknown = phase("u", ("F03",), (check("c", UNKNOWN),))
    assert only(passing).exit_code == 0
    assert only(passing, failing).exit_code == 1
    assert only(passing, unknown).exit_code == 2
    assert only(unknown, failing).exit_code == 1
    interrupted = GameDayResult((passing,), "t", 1.0, None, "0.1.0", interrupted=True)
    assert interrupted.verdict == UNKNOWN


def test_write_reports(tmp_path: Path):
    written = write_reports(day(), report_dir=tmp_path / "r", junit_path=tmp_path / "ci" / "j.xml")
    assert written.html == tmp_path / "r" / "index.html" and written.html.stat().st_size > 1000
    assert json.loads(written.json.read_text())["format"] == "docket-gameday-2"
    assert ET.parse(tmp_path / "ci" / "j.xml").getroot().get("tests") == "6"
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["gameday.json", "index.html"]


def test_a_phase_with_several_runs_shows_each_run_under_the_phase():
    result = GameDayResult((two_runs(),), "t", 1.0, None, "0.1.0")
    html = render_html(result)
    parser = Links()
    parser.feed(html)
    assert {"phase-runaway-loop-run-deny", "phase-runaway-loop-run-kill"} <= parser.ids
    assert set(h[1:] for h in parser.hrefs) <= parser.ids
    # each run has its own heading, repro, timeline and verdict (kill failed, deny passed)
    deny = html[
        html.index('id="phase-runaway-loop-run-deny"') : html.index(
            'id="phase-runaway-loop-run-kill"'
        )
    ]
    kill = html[html.index('id="phase-runaway-loop-run-kill"') :]
    assert "Run deny: deny mode" in deny and 'class="verdict pass"' in deny
    assert "docket game-day --phase runaway-loop:deny --seed 7" in deny
    assert "No faults: this run" in deny and deny.count("<svg") == 1
    assert "Run kill: kill mode" in kill and 'class="verdict fail"' in kill.split("</section>")[0]
    assert "exit 42: cap max_model_calls breached" in kill and "max_model_calls" in kill
    assert html.count("<svg") == 2
    # the checks table names each check's run, linked to it
    row = html[html.index('id="phase-runaway-loop-check-3"') :]
    assert row.index('href="#phase-runaway-loop-run-kill"') < row.index("</tr>")
    # and the review has a row per run
    assert "runaway-loop / deny" in html and "runaway-loop / kill" in html
    assert "0.3 s between bytes" in html  # the read timeout, named as what it bounds


def test_several_runs_in_json_and_junit():
    result = GameDayResult((two_runs(), *day().phases), "t", 1.0, None, "0.1.0")
    data = json.loads(render_json(result))
    assert data["format"] == "docket-gameday-2"
    runaway = data["phases"][0]
    assert [r["name"] for r in runaway["runs"]] == ["deny", "kill"]
    assert [c["run"] for c in runaway["checks"]] == ["deny", "deny", "kill"]
    assert runaway["runs"][1]["exit_status"] == 42 and runaway["verdict"] == FAIL
    assert GameDayResult.from_json(data).to_json() == result.to_json()
    phase_two = GameDayResult.from_json(data).phases[0]
    assert (phase_two.run_verdict("deny"), phase_two.run_verdict("kill")) == (PASS, FAIL)
    suite = next(s for s in ET.fromstring(render_junit(result)) if s.get("name") == "runaway-loop")
    assert [c.get("classname") for c in suite.findall("testcase")] == [
        "gameday.runaway-loop.deny",
        "gameday.runaway-loop.deny",
        "gameday.runaway-loop.kill",
    ]
    out = suite.find("system-out").text
    assert "run kill: docket game-day --phase runaway-loop:kill --seed 7" in out
    assert "run kill: exit 42: cap max_model_calls breached" in out


def test_a_run_without_evidence_makes_its_phase_unknown_naming_the_run():
    broken = two_runs()
    runs = (broken.runs[0], PhaseRun("kill", error="the run could not run: OSError: boom"))
    p = PhaseResult(**{**broken.__dict__, "runs": runs})
    assert p.verdict == UNKNOWN and p.run_verdict("kill") == UNKNOWN
    assert p.error == "run kill: the run could not run: OSError: boom"
    assert p.run_verdict("deny") == PASS


def test_timeline_layout():
    events = [
        TimelineEvent(i, i * 10, "model.request" if i % 2 else "model.response") for i in range(5)
    ]
    out = layout(events)
    assert [lane.type for lane in out.lanes] == ["model.response", "model.request"]
    assert [lane.count for lane in out.lanes] == [3, 2]
    xs = [m.x for m in out.marks]
    assert xs == sorted(xs) and xs[0] == 170 and xs[-1] == out.width - 10
    assert out.span_ms == 40 and out.ticks[0].label == "0 ms"
    assert layout([]).total == 0


def test_the_review_lists_each_phases_changes_and_what_the_day_left_open():
    """The review template's last two sections, from the results alone."""
    result = day()
    rows = load_fmea(Path("docs/resilience.md").read_text(encoding="utf-8"))
    changed = {(c.phase, c.key): (c.value, c.default) for c in changes_made(result.phases)}
    assert changed[("partition", "boundary.connect_timeout")] == ("0.3", "10")
    assert changed[("partition", "boundary.upstream_timeout")] == ("0.3", "300")
    assert not [key for _, key in changed if key.startswith("providers.")]
    at_default = a_run(policy={"boundary": {"connect_timeout": 10.0}})
    assert changes_made((phase("p", (), (), runs=(at_default,)),)) == ()
    risks = open_risks(result.phases, rows)
    said = [(r.kind, r.what) for r in risks]
    assert ("unjudged check", "evidence-loss: disclosed: observed None") in said
    no_phase = {r.what.split()[0] for r in risks if r.kind == "no phase"}
    assert no_phase == {row.id for row in rows if not row.phases} != set()
    not_run = {r.what.split()[0] for r in risks if r.kind == "not run today"}
    assert "F06" in not_run  # runaway-loop did not run in this day
    assert not_run.isdisjoint({"F03", "F04", "F09", "F10", "F17"})  # their phases ran
    html = render_html(result, rows)
    assert 'id="changes-made"' in html and 'id="open-risks"' in html
    assert "<code>boundary.connect_timeout</code>" in html and "not run today" in html
