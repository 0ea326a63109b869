"""Live progress for `docket game-day`: a line per phase with its verdict and time.

On a terminal, rich shows a spinner on the phase that is running; anywhere else
(CI logs, a pipe) each phase is one plain line when it starts and one when it
ends, so a log reads the same as the screen did.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.status import Status

from chaos.gameday.phase import Phase
from chaos.gameday.results import GameDayResult, PhaseResult

STYLE = {"pass": "bold green", "fail": "bold red", "unknown": "bold yellow"}


class Progress:
    def __init__(self, total: int, *, console: Console | None = None) -> None:
        self.console = console or Console(file=sys.stdout, highlight=False)
        self.total = total
        self.index = 0
        self._status: Status | None = None

    @property
    def live(self) -> bool:
        return self.console.is_terminal

    def start(self, phase: Phase) -> None:
        self.index += 1
        what = f"[{self.index}/{self.total}] {phase.name}: {phase.title}"
        if self.live:
            status = self.console.status(escape(what) + " …")
            self._status = status
            status.start()
        else:
            print(f"{what} ...", file=self.console.file, flush=True)

    def finish(self, result: PhaseResult) -> None:
        self._stop_status()
        passed = sum(1 for c in result.checks if c.verdict == "pass")
        line = (
            f"{result.verdict.upper():7} {result.name:20} {result.duration_s:6.1f} s  "
            f"{passed}/{len(result.checks)} checks"
        )
        if result.several_runs:
            line += f" over {len(result.runs)} run{'s' if len(result.runs) > 1 else ''}"
        if result.error:
            line += f"  ({result.error})"
        if self.live:
            style = STYLE.get(result.verdict, "")
            self.console.print(f"[{style}]{result.verdict.upper():7}[/] " + escape(line[8:]))
            for c in result.checks:
                if c.verdict != "pass":
                    self.console.print(
                        f"        [{STYLE[c.verdict]}]{c.verdict}[/] "
                        + escape(f"{_named(result, c)}: {c.check.reason}")
                    )
        else:
            print(line, file=self.console.file, flush=True)
            for c in result.checks:
                if c.verdict != "pass":
                    print(
                        f"        {c.verdict} {_named(result, c)}: {c.check.reason}",
                        file=self.console.file,
                        flush=True,
                    )

        for line in your_agent_lines(result):
            print(f"        {line}", file=self.console.file, flush=True)

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self._stop_status()

    def summary(self, result: GameDayResult, written, evidence=None) -> None:
        counts = result.counts()
        head = (
            f"game day {result.verdict}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['unknown']} unknown in {result.duration_s:.1f} s"
        )
        if result.interrupted:
            head += " (interrupted: the phases not listed did not run)"
        out = self.console.file
        print(head, file=out)
        whose = result.whose()
        if whose:  # who has to act: the Docket team, or the team that owns the agent
            print(f"  whose failure: {whose}", file=out)
        for label, path in (
            ("report", written.html),
            ("json", written.json),
            ("junit", written.junit),
        ):
            if path is not None:
                print(f"  {label}: {path}", file=out)
        if evidence is not None:
            print(f"  evidence: {evidence}/PHASE (ledger, receipt, stub logs, metrics)", file=out)
        if result.agent_findings is not None:
            effect = "fail the day" if result.agent_findings == "fail" else "do not fail the day"
            print(
                f"  your agent: {result.findings()} findings (--agent-findings "
                f'{result.agent_findings}: they {effect}); the report\'s "Your agent" section',
                file=out,
            )
        out.flush()


def your_agent_lines(result: PhaseResult) -> list[str]:
    """A phase's lines about the user's agent: where it did not run, and each finding."""
    view = result.your_agent
    if not view:
        return []
    if not view.get("beside"):
        return [f"your agent: not in this phase ({view['why_not']})"] if view.get("why_not") else []
    out = []
    for run in result.runs:
        label = f"{run.name}: " if result.several_runs else ""
        exits = ", ".join(f"{n} exit {s}" for n, s in run.your_agent.get("exit", {}).items())
        verdicts = [
            f"{f['verdict'].replace('_', ' ')} {f['check']}"
            for f in run.your_agent.get("findings", ())
        ]
        out.append(f"your agent: {label}{exits}; {', '.join(verdicts) or 'no checks'}")
        budget = run.your_agent.get("retry_budget")
        if budget and budget.get("within") is not None:
            stayed = "within" if budget["within"] else "OVER"
            out.append(f"  retry budget {label}{stayed}: {budget['arithmetic']}")
        for f in run.findings:
            out.append(f"  finding {label}{f['check']}: {f['summary']}")
    return out


def _named(result: PhaseResult, check) -> str:
    """A check's name, with its run's when the phase has several."""
    return f"{check.run}: {check.check.name}" if result.several_runs else check.check.name
