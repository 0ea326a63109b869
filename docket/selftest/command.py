"""`docket selftest`: run the checks, show progress and a table (or one JSON object).

Exit 0 when every check passed, 1 when one failed, 2 for a bad flag (an --only
naming no check)."""

from __future__ import annotations

import json
import sys
import time

import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table

from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, DocketError
from docket.selftest import all_checks
from docket.selftest.runner import Check, Result, run_all


def select(checks: list[Check], only: list[str] | None) -> list[Check]:
    """The checks named by --only (a check's name or a group's), in their order."""
    if not only:
        return checks
    known = {c.name for c in checks} | {c.group for c in checks}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise DocketError(
            f"selftest --only {unknown[0]}: no such check or group; one of "
            + ", ".join(sorted(known))
        )
    return [c for c in checks if c.name in only or c.group in only]


def selftest_command(only: list[str] | None = None, *, as_json: bool = False) -> int:
    checks = select(all_checks(), only)
    started = time.monotonic()
    if as_json:
        results = trio.run(run_all, checks, lambda c: None, lambda r: None)
    else:
        results = _run_with_progress(checks)
    seconds = time.monotonic() - started
    failed = [r for r in results if not r.ok]
    if as_json:
        report = {
            "ok": not failed,
            "passed": len(results) - len(failed),
            "failed": len(failed),
            "seconds": round(seconds, 3),
            "checks": [r.as_dict() for r in results],
        }
        print(json.dumps(report, ensure_ascii=False))
    else:
        _print_table(results, seconds)
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def _run_with_progress(checks: list[Check]) -> list[Result]:
    console = Console(stderr=True, highlight=False)
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]selftest[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # a log or a pipe gets the table alone
    ) as progress:
        task = progress.add_task("", total=len(checks))

        def started(check: Check) -> None:
            progress.update(task, description=f"{check.group}: {check.name}")

        def done(result: Result) -> None:
            if not result.ok:  # a failure is shown as it happens; the table has the rest
                progress.console.print(f"  [red]FAIL[/] {result.name}: {result.detail}")
            progress.advance(task)

        return trio.run(run_all, checks, started, done)


def _print_table(results: list[Result], seconds: float) -> None:
    console = Console(highlight=False, soft_wrap=False)
    table = Table(title="docket selftest", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("s", justify="right")
    table.add_column("what it saw (a failure: what was expected, and what happened)")
    for r in results:
        mark = "[green]ok[/]" if r.ok else "[red]FAIL[/]"
        text = r.detail if r.ok else f"{r.what}: [red]{r.detail}[/]"
        table.add_row(f"{r.group}/{r.name}", mark, f"{r.seconds:.2f}", text)
    console.print(table)
    failed = sum(not r.ok for r in results)
    verdict = "[green]all passed[/]" if not failed else f"[red]{failed} failed[/]"
    console.print(f"{len(results)} checks, {verdict}, in {seconds:.1f} s")
    sys.stdout.flush()
