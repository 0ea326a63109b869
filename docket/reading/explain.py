"""`docket explain RUN`: the patterns a run shows, with their evidence and impact.

One pass over the ledger (docket.reading.source, so a torn or tampered ledger
is refused), pairing requests with their answers (docket.reading.calls) and
feeding every pattern (docket.reading.patterns). Findings come most costly
first; write-scope is "not judged" until the run has a snapshot to judge by.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from docket.errors import EXIT_OK
from docket.pricing import PriceTable, default_price_table
from docket.reading.calls import Call, close_call, open_call
from docket.reading.patterns import (
    CacheMiss,
    Concentration,
    FatContext,
    Finding,
    Pattern,
    PolicyDenials,
    PremiumForSmallCalls,
    RetryBudget,
    RetryStorm,
    RunawayLoop,
    WriteScope,
    retry_after_ms,
)
from docket.reading.sizing import Sizing
from docket.reading.source import ledger_path, read_events
from docket.reading.thresholds import DEFAULTS, Thresholds, load_thresholds
from docket.receipts.tally import usd


def _has(pattern: Pattern, hook: str) -> bool:
    return getattr(type(pattern), hook) is not getattr(Pattern, hook)


class Explainer:
    """Feed checked events in seq order with `add`; `report()` says what the run shows."""

    def __init__(self, limits: Thresholds = DEFAULTS, table: PriceTable | None = None) -> None:
        self.limits = limits
        self.table = table or default_price_table()
        self.write_scope = WriteScope(limits)
        self.patterns: list[Pattern] = [
            RunawayLoop(limits),
            RetryStorm(limits),
            RetryBudget(limits),
            CacheMiss(limits),
            FatContext(limits),
            PremiumForSmallCalls(limits, self.table),
            Concentration(limits),
            PolicyDenials(limits),
            self.write_scope,
        ]
        # Each hook, only for the patterns that have one: explain calls them per event.
        self._on_request = [p.on_request for p in self.patterns if _has(p, "on_request")]
        self._on_close = [p.on_close for p in self.patterns if _has(p, "on_close")]
        self._on_event = [p.on_event for p in self.patterns if _has(p, "on_event")]
        self.sizing = Sizing()  # Little's law: the bulkhead the run's traffic needed
        self.open: dict[str, Call] = {}  # calls in flight, by call_id
        self.events = 0
        self.calls = 0
        self.cost_nusd = 0
        self.start: dict | None = None
        self.end: dict | None = None
        self.first_mono: int | None = None
        self.last_mono = 0

    def add(self, event: dict) -> None:
        self.events += 1
        if self.first_mono is None:
            self.first_mono = event["mono_ms"]
        self.last_mono = event["mono_ms"]
        kind = event["type"]
        if kind == "model.request":
            call = open_call(event)
            self.calls += 1
            if type(event.get("call_id")) is str:
                self.open[event["call_id"]] = call
            for on_request in self._on_request:
                on_request(call)
            self.sizing.on_request(call)
            return
        if kind in ("model.response", "model.error"):
            call_or_none = self.open.pop(event.get("call_id"), None)  # type: ignore[arg-type]  # a non-str id finds nothing
            if call_or_none is None:
                return
            close_call(call_or_none, event)
            call_or_none.marks["retry_after_ms"] = retry_after_ms(event)
            self.cost_nusd += call_or_none.cost_nusd
            for on_close in self._on_close:
                on_close(call_or_none)
            self.sizing.on_close(call_or_none)
            return
        if kind == "session.start":
            self.start = event
        elif kind == "session.end":
            self.end = event
        for on_event in self._on_event:
            on_event(event)

    def findings(self) -> list[Finding]:
        found = [f for p in self.patterns for f in p.findings()]
        # most costly first; then the most calls, then the longest
        return sorted(found, key=lambda f: (-f.cost_nusd, -f.calls, -f.wall_ms, f.pattern))

    def report(self, path: str = "") -> dict:
        start = self.start or {}
        pricing = start.get("pricing") if isinstance(start.get("pricing"), dict) else {}
        not_judged = self.write_scope.not_judged()
        return {
            "ledger": path,
            "run_id": start.get("run_id"),
            "events": self.events,
            "model_calls": self.calls,
            "usd": usd(self.cost_nusd),
            "wall_ms": self.last_mono - (self.first_mono or 0),
            "ended": None if self.end is None else self.end.get("reason"),
            "table_date": pricing.get("table_date") if isinstance(pricing, dict) else None,
            "findings": [f.to_dict() for f in self.findings()],
            "not_judged": {} if not_judged is None else {"write-scope": not_judged},
            "sizing": self.sizing.advice(),
            "thresholds": dataclasses.asdict(self.limits),
        }


def explain_ledger(path: Path, limits: Thresholds = DEFAULTS) -> dict:
    explainer = Explainer(limits)
    live: list[int] = []
    for event in read_events(path, live):
        explainer.add(event)
    report = explainer.report(str(path))
    # a run still being written: explained as far as its last complete line
    report["live_writer_pid"] = live[0] if live else None
    return report


def explain_command(target: str, *, policy: str | None, as_json: bool) -> int:
    limits = load_thresholds(policy)
    path = ledger_path(target)
    report = explain_ledger(path, limits)
    if as_json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        render(report)
    return EXIT_OK


def _plain(value: object) -> str:
    """An evidence value as a person reads it: a count per name as `name n, name n`."""
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k} {v}" for k, v in value.items()) + ")"
    if isinstance(value, list):
        return "(" + ", ".join(map(str, value)) + ")"
    return str(value)


def render(report: dict) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    if report.get("live_writer_pid"):
        ended = f"; still being written (pid {report['live_writer_pid']}): so far"
    else:
        ended = f"; ended: {report['ended']}" if report["ended"] else "; no session.end"
    console.print(
        f"[bold]{escape(str(report['run_id']))}[/bold]: {report['events']} events, "
        f"{report['model_calls']} model calls, ${report['usd']}, "
        f"{report['wall_ms'] / 1000:.1f} s{escape(ended)}"
    )
    findings = report["findings"]
    if not findings:
        console.print("nothing to name: no pattern crossed its threshold")
    for i, f in enumerate(findings, 1):
        impact = f["impact"]
        console.print(
            f"\n[bold red]{i}. {f['pattern']}[/bold red]  ${impact['usd']}  "
            f"{impact['calls']} calls  {impact['wall_ms'] / 1000:.1f} s"
        )
        console.print(f"   {escape(f['summary'])}")
        evidence = ", ".join(f"{k} {_plain(v)}" for k, v in f["evidence"].items() if v is not None)
        console.print(f"   [dim]evidence: {escape(evidence)}[/dim]")
        if f.get("advice"):
            console.print(f"   do: {escape(f['advice'])}")
    for name, why in report["not_judged"].items():
        console.print(f"\n[yellow]{name}: not judged[/yellow] ({escape(why)})")
    for provider, size in report.get("sizing", {}).items():
        console.print(
            f"\n[bold]sizing {escape(provider)}[/bold] (Little's law): "
            f"max_concurrent_upstream = {size['max_concurrent_upstream']}, "
            f"max_queue = {size['max_queue']}"
        )
        console.print(f"   [dim]{escape(str(size['arithmetic']))}[/dim]")
