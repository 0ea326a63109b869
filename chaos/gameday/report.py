"""The game day's report: one self-contained HTML file, the same results as JSON, and JUnit XML.

The HTML is rendered by jinja2 with autoescape from reports/report.html.j2
(its CSS is inlined from reports/report.css, its timelines are inline SVG):
nothing in it is fetched from the network. Every internal link points at an
anchor the same file defines (tests/test_gameday_report.py parses it to check).
JUnit has one testcase per assertion, grouped in one testsuite per phase: a
failed check is a <failure>, an unknown one an <error> (it could not be
evaluated, which CI must not read as a pass).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import jinja2
from markupsafe import Markup, escape

from chaos.data.locate import folder
from chaos.gameday.assertions import FAIL, UNKNOWN, brief, expectation
from chaos.gameday.fmea import fmea_rows
from chaos.gameday.numbers import latency_text, plain
from chaos.gameday.results import GameDayResult, PhaseResult, PhaseRun, phases_for_fmea
from chaos.gameday.review import changes_made, fmea_anchor, open_risks, review
from chaos.gameday.timeline import COLOURS, layout

HTML_NAME = "index.html"
JSON_NAME = "gameday.json"
JUNIT_NAME = "junit.xml"


@dataclass(frozen=True)
class FmeaLink:
    """A check that exercises an FMEA row: the phase, the check, and their verdicts."""

    phase: str
    phase_anchor: str
    phase_verdict: str
    check: str
    check_anchor: str
    check_verdict: str


@dataclass(frozen=True)
class FmeaView:
    id: str
    anchor: str
    mode: str
    effect: str
    severity: int | None
    occurrence: int | None
    detection: int | None
    rpn: int | None
    detectors: tuple[str, ...]
    mitigation: str
    links: tuple[FmeaLink, ...]
    in_table: bool  # False: a phase names it but the table has no such row

    @property
    def verdict(self) -> str:
        """The worst verdict of the phases that exercise it ('' when none does)."""
        verdicts = {link.phase_verdict for link in self.links}
        for v in (FAIL, UNKNOWN, "pass"):  # as the phases roll up: a fail is never hidden
            if v in verdicts:
                return v
        return ""


def fmea_view(rows: Sequence, phases: Sequence[PhaseResult]) -> tuple[FmeaView, ...]:
    """The FMEA rows with the phases and checks that exercise each, plus any row a phase
    names that the table lacks (shown, so the link from the phase still lands)."""
    by_row = phases_for_fmea(phases)

    def links(row_id: str) -> tuple[FmeaLink, ...]:
        out: list[FmeaLink] = []
        for p in by_row.get(row_id, ()):
            if not p.checks:  # the phase could not run: link the phase alone
                out.append(FmeaLink(p.name, p.anchor, p.verdict, "", "", ""))
            for i, c in enumerate(p.checks):
                label = f"{c.run}: {c.check.name}" if p.several_runs else c.check.name
                out.append(
                    FmeaLink(p.name, p.anchor, p.verdict, label, p.check_anchor(i), c.verdict)
                )
        return tuple(out)

    out = [
        FmeaView(
            id=row.id,
            anchor=fmea_anchor(row.id),
            mode=row.mode,
            effect=row.effect,
            severity=row.severity,
            occurrence=row.occurrence,
            detection=row.detection,
            rpn=row.rpn,
            detectors=tuple(row.detectors),
            mitigation=row.mitigation,
            links=links(row.id),
            in_table=True,
        )
        for row in rows
    ]
    known = {row.id for row in rows}
    for row_id in sorted(set(by_row) - known):
        out.append(
            FmeaView(row_id, fmea_anchor(row_id), "(not in the FMEA table)", "", None, None,
                     None, None, (), "", links(row_id), False)
        )  # fmt: skip
    return tuple(out)


# ---------------------------------------------------------------- HTML


def injected_counts(run: PhaseRun) -> dict[str, int]:
    """Injections per fault text, from a run's fault.injected records."""
    out: dict[str, int] = {}
    for record in run.injected:
        text = str(record.get("fault"))
        out[text] = out.get(text, 0) + 1
    return out


EVIDENCE_FILES = (
    ("ledger", "ledger.jsonl"),
    ("receipt", "receipt.json"),
    ("metrics", "metrics.txt"),
    ("probes", "probes.jsonl"),
    ("faults performed", "injected.jsonl"),
    ("notes", "notes.txt"),
    ("worker's output", "worker.err"),  # a run in a process of its own (chaos.run.worker)
)


@dataclass(frozen=True)
class EvidenceView:
    """A kept run's files, as links relative to the report, and `docket verify` for them."""

    folder: str  # the link to the folder
    shown: str  # the folder as a reader would type it
    files: tuple[tuple[str, str], ...]  # (label, href)
    verify: str  # `docket verify` of the receipt against the ledger (`docket doctor` if none)


def evidence_view(run: PhaseRun, report_dir: str | os.PathLike | None) -> EvidenceView | None:
    """The links to a run's kept evidence (None when it ran in a temporary folder). Links
    are relative to the report, so the folder can be moved or published as one artefact."""
    if not run.evidence_dir:
        return None
    folder = Path(run.evidence_dir)
    base = Path(report_dir) if report_dir is not None else Path.cwd()

    def href(path: Path) -> str:
        return quote(os.path.relpath(path, base))

    files = [
        (label, href(folder / name)) for label, name in EVIDENCE_FILES if (folder / name).is_file()
    ]
    files += [
        (f"stub log {p.stem.removeprefix('stub-')}", href(p))
        for p in sorted(folder.glob("stub-*.jsonl"))
    ]
    if (folder / "agents").is_dir():
        files.append(("agents' output", href(folder / "agents") + "/"))
    if (folder.parent / "run.yaml").is_file():
        files.append(("scenario", href(folder.parent / "run.yaml")))
    if (folder / "receipt.json").is_file():
        argv = ["docket", "verify", "--ledger", str(folder / "ledger.jsonl")]
        verify = shlex.join([*argv, str(folder / "receipt.json")])
    else:  # the recorder was killed before its receipt: doctor reads the ledger alone
        verify = shlex.join(["docket", "doctor", str(folder / "ledger.jsonl")])
    return EvidenceView(href(folder) + "/", str(folder), tuple(files), verify)


def _environment():
    reports = folder("reports")

    def load(name: str) -> str:
        return (reports / name).read_text(encoding="utf-8")

    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["brief"] = brief
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True, indent=1)
    env.globals["fmea_anchor"] = fmea_anchor
    env.globals["injected_counts"] = injected_counts
    env.globals["expectation"] = expectation
    env.globals["exit_note"] = exit_note
    env.globals["latency_text"] = latency_text
    env.filters["plain"] = plain
    env.filters["code_spans"] = code_spans
    return env


def _signal_name(number: int) -> str:
    try:
        return f"{number} ({signal.Signals(number).name})"
    except ValueError:
        return str(number)


def code_spans(text: object):
    """Markdown code spans (`x`) as <code>, the rest escaped: the FMEA table's cells come
    from docs/resilience.md, where `docket_breaker_open` is written with backticks."""

    parts = re.split(r"`([^`]+)`", str(text))
    return Markup("").join(
        Markup("<code>{}</code>").format(part) if i % 2 else escape(part)
        for i, part in enumerate(parts)
    )


def exit_note(phase: PhaseResult, run: PhaseRun) -> str:
    """Why a run's non-zero exit is not by itself a failure, and which checks judge it."""
    if run.exit_status in (None, 0):
        return ""
    status = run.exit_status
    if status in (42, 43):
        meaning = {
            42: "a cap or the ledger's ceiling stopped the run",
            43: "a ledger write failed and fail_fast_evidence stopped the run",
        }[status]
    elif status > 128:
        meaning = f"{status} is 128 + {status - 128}: killed by signal {_signal_name(status - 128)}"
    else:
        meaning = "the agent's own exit status, which the supervisor passes on"
        said = run.facts.get("agent_stderr") or {}
        if said:
            meaning += " (" + "; ".join(f"{name} said: {line}" for name, line in said.items()) + ")"
    judged = [
        str(i + 1)
        for i, c in enumerate(phase.checks)
        if c.run == run.name and "exit_status" in c.check.query
    ]
    said = (
        f"check{'s' if len(judged) > 1 else ''} {', '.join('#' + n for n in judged)} "
        "judge{} it".format("" if len(judged) > 1 else "s")
        if judged
        else "no check reads it, so it does not decide the verdict"
    )
    return f"{meaning}: a fact of the run, not a verdict; {said}"


def render_html(
    result: GameDayResult,
    rows: Sequence | None = None,
    report_dir: str | os.PathLike | None = None,
) -> str:
    """The report as one HTML document; `rows` defaults to the FMEA table in docs/resilience.md.
    `report_dir` is where it will be written: the kept evidence is linked relative to it."""
    if rows is None:
        rows = fmea_rows()
    env = _environment()
    template = env.get_template("report.html.j2")
    css = env.loader.get_source(env, "report.css")[0]
    return template.render(
        result=result,
        day=result.to_json(),
        phases=result.phases,
        timelines={(p.name, r.name): layout(r.timeline) for p in result.phases for r in p.runs},
        fmea=fmea_view(rows, result.phases),
        reviews=review(result.phases),
        changes=changes_made(result.phases),
        risks=open_risks(result.phases, rows),
        evidence={
            (p.name, r.name): evidence_view(r, report_dir) for p in result.phases for r in p.runs
        },
        colours=COLOURS,
        css=css,
        yours=_your_agent_view(result),
    )


def _your_agent_view(result: GameDayResult) -> dict | None:
    """The "Your agent" section's head: None when the phases ran with their own agents
    and policy (the report is then as it always was)."""
    if result.agent_findings is None and not any(p.your_agent for p in result.phases):
        return None
    command = next(
        (p.your_agent.get("command", "") for p in result.phases if p.your_agent.get("command")),
        "",
    )
    policy = next((p.your_agent["policy"] for p in result.phases if p.your_agent.get("policy")), "")
    return {
        "command": command,
        "mode": result.agent_findings or "warn",
        "findings": result.findings(),
        "policy": policy,
    }


# ---------------------------------------------------------------- JSON and JUnit


def render_json(result: GameDayResult, rows: Sequence | None = None) -> str:
    if rows is None:
        rows = fmea_rows()
    data = result.to_json()
    data["fmea"] = [
        {
            "id": v.id,
            "in_table": v.in_table,
            "rpn": v.rpn,
            "verdict": v.verdict,
            "phases": sorted({link.phase for link in v.links}),
        }
        for v in fmea_view(rows, result.phases)
    ]
    return json.dumps(data, ensure_ascii=False, sort_keys=True, indent=2) + "\n"


def render_junit(result: GameDayResult) -> str:
    root = ET.Element("testsuites", name="docket game-day")
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for phase in result.phases:
        suite = ET.SubElement(root, "testsuite", name=phase.name)
        props = ET.SubElement(suite, "properties")
        for key, value in (
            ("title", phase.title),
            ("seed", str(phase.seed)),
            ("repro", phase.repro),
            ("fmea", " ".join(phase.fmea)),
            ("verdict", phase.verdict),
        ):
            ET.SubElement(props, "property", name=key, value=value)
        counts = {"tests": 0, "failures": 0, "errors": 0}
        if phase.error is not None and not phase.checks:
            case = ET.SubElement(suite, "testcase", classname=f"gameday.{phase.name}", name="(run)")
            ET.SubElement(case, "error", type=UNKNOWN, message=phase.error)
            counts["tests"] += 1
            counts["errors"] += 1
        for c in phase.checks:
            check = c.check
            classname = f"gameday.{phase.name}" + (f".{c.run}" if phase.several_runs else "")
            case = ET.SubElement(
                suite,
                "testcase",
                classname=classname,
                name=check.name,
                file=phase.source,
                line=str(c.line),
            )
            counts["tests"] += 1
            detail = (
                f"query: {check.query}\nexpected: {expectation(check.op, check.expected)}\n"
                f"observed: {brief(check.observed, 2000)}"
            )
            if check.unmet:  # its own value may have held: the verdict is the precondition's
                detail = f"precondition not met: «{check.unmet}» failed\n{detail} (not judged)"
            if check.verdict == FAIL:
                counts["failures"] += 1
                ET.SubElement(
                    case, "failure", type=FAIL, message=f"{DOCKETS} {check.reason}"
                ).text = detail
            elif check.verdict == UNKNOWN:
                counts["errors"] += 1
                ET.SubElement(case, "error", type=UNKNOWN, message=check.reason).text = detail
        ET.SubElement(suite, "system-out").text = _system_out(phase)
        suite.set("tests", str(counts["tests"]))
        suite.set("failures", str(counts["failures"]))
        suite.set("errors", str(counts["errors"]))
        suite.set("time", f"{phase.duration_s:.3f}")
        for key in totals:
            totals[key] += counts[key]
    if result.agent_findings is not None:
        counts = _your_agent_suite(root, result)
        for key in totals:
            totals[key] += counts[key]
    for key, total in totals.items():
        root.set(key, str(total))
    root.set("time", f"{result.duration_s:.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


YOUR_AGENT_SUITE = "your-agent"
# Whose failure a JUnit <failure> is, at the head of its message: a CI log line then
# says who has to act (the Docket team, or the team that owns the agent).
DOCKETS = "Docket's failure (a boundary invariant broke):"
AGENTS = "your agent's finding, not Docket's:"


def _your_agent_suite(root: ET.Element, result: GameDayResult) -> dict[str, int]:
    """The agent findings as a test suite of their own: a CI gates on the phases'
    suites (the boundary) and reads this one. With --agent-findings fail a finding is a
    <failure>; with warn it is <skipped> with the finding as its message, as is a check
    the run never put the agent to (not shown)."""
    suite = ET.SubElement(root, "testsuite", name=YOUR_AGENT_SUITE)
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="agent_findings", value=str(result.agent_findings))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for phase in result.phases:
        view = phase.your_agent
        if not view.get("beside"):
            case = ET.SubElement(
                suite, "testcase", classname=f"your_agent.{phase.name}", name="(your agent)"
            )
            why = view.get("why_not") or "the phase ran with its own agents"
            ET.SubElement(case, "skipped", message=f"ran with its own agents: {why}")
            counts["tests"] += 1
            counts["skipped"] += 1
            continue
        for run in phase.runs:
            classname = f"your_agent.{phase.name}" + (f".{run.name}" if phase.several_runs else "")
            if not run.your_agent:
                case = ET.SubElement(suite, "testcase", classname=classname, name="(run)")
                ET.SubElement(case, "error", type=UNKNOWN, message=run.error or "no evidence")
                counts["tests"] += 1
                counts["errors"] += 1
                continue
            for finding in run.your_agent.get("findings", ()):
                case = ET.SubElement(
                    suite, "testcase", classname=classname, name=str(finding.get("title"))
                )
                counts["tests"] += 1
                detail = "\n".join([*finding.get("evidence", ()), finding.get("advice", "")])
                if finding.get("verdict") == "finding":
                    message = f"{finding.get('summary')} (advice: {finding.get('advice')})"
                    if result.agent_findings == "fail":
                        message = f"{AGENTS} {message}"
                        counts["failures"] += 1
                        ET.SubElement(
                            case, "failure", type="finding", message=message
                        ).text = detail
                    else:
                        counts["skipped"] += 1
                        ET.SubElement(case, "skipped", message=f"finding (warn): {message}")
                elif finding.get("verdict") == "not_shown":
                    counts["skipped"] += 1
                    ET.SubElement(case, "skipped", message=f"not shown: {finding.get('summary')}")
                ET.SubElement(case, "system-out").text = f"{finding.get('summary')}\n{detail}\n"
    for key, value in counts.items():
        suite.set(key, str(value))
    return counts


def _system_out(phase: PhaseResult) -> str:
    """The phase's repro, each run's (when it has several) and how each ended."""
    lines = [phase.repro]
    for run in phase.runs:
        label = f"run {run.name}: " if phase.several_runs else ""
        for command in (run.repro, run.engine_repro):
            if command:
                lines.append(f"{label}{command}")
        if run.error:
            lines.append(f"{label}error: {run.error}")
        elif run.exit_status is not None:
            lines.append(f"{label}exit {run.exit_status}: {run.run_reason}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- writing


def write_file(path: str | os.PathLike, text: str) -> Path:
    """Write text durably and atomically (temp file, fsync, rename): a report is never half there."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@dataclass(frozen=True)
class Written:
    html: Path | None
    json: Path | None
    junit: Path | None


def write_reports(
    result: GameDayResult,
    *,
    report_dir: str | os.PathLike | None,
    json_path: str | os.PathLike | None = None,
    junit_path: str | os.PathLike | None = None,
    rows: Sequence | None = None,
) -> Written:
    """The HTML report (and JSON and JUnit beside it) in `report_dir`; --json and --junit
    put those two where they say instead."""
    if rows is None:
        rows = fmea_rows()
    html = json_out = junit_out = None
    if report_dir is not None:
        folder = Path(report_dir)
        html = write_file(folder / HTML_NAME, render_html(result, rows, folder))
        json_out = write_file(json_path or folder / JSON_NAME, render_json(result, rows))
        junit_out = write_file(junit_path or folder / JUNIT_NAME, render_junit(result))
    else:
        if json_path is not None:
            json_out = write_file(json_path, render_json(result, rows))
        if junit_path is not None:
            junit_out = write_file(junit_path, render_junit(result))
    return Written(html, json_out, junit_out)
