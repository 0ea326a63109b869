"""`docket diff RECEIPT_A RECEIPT_B`: what moved between two runs, and why.

Each receipt is first verified against its ledger (`docket verify`): a diff of
claims nobody checked would be a diff of assertions. Then each ledger is folded
once more for what a receipt does not itemise (per provider, errors by reason,
refusals by rule, the client's own retries). The figures of the two runs are
flattened to named values and compared; the run's identity and timing (run_id,
start, duration) are shown but are not differences. Exit 0 when every figure is
equal, 1 when any differs, 2 when an input is bad.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, InputError
from docket.reading.calls import POLICY_REFUSALS, TRANSIENT_REFUSALS, client_attempt
from docket.reading.source import read_lines
from docket.receipts.tally import COUNTERS, usd
from docket.receipts.verify import load_receipt, verify

_COUNTED = [c for c in COUNTERS if c != "cost_nusd"] + ["usd"]


def ledger_facts(path: Path, events: int) -> dict[str, int]:
    """What the receipt does not itemise, folded from its ledger's first `events` lines."""
    facts: Counter = Counter()
    providers: dict[str, str] = {}  # call_id -> provider, for calls in flight
    for seen, (_, event) in enumerate(read_lines(path)):
        if seen == events:
            break
        kind = event["type"]
        provider = event.get("provider")
        provider = provider if type(provider) is str else ""
        if kind == "model.request":
            facts[f"provider.{provider}.model_calls"] += 1
            if type(event.get("call_id")) is str:
                providers[event["call_id"]] = provider
            if (client_attempt(event) or 0) >= 1:
                facts["client_retries"] += 1
        elif kind in ("model.response", "model.error"):
            provider = providers.pop(event.get("call_id"), provider)  # type: ignore[arg-type]  # non-str ids find nothing
            cost = event.get("cost_nusd")
            facts[f"provider.{provider}.cost_nusd"] += cost if type(cost) is int else 0
            if kind == "model.error":
                facts[f"provider.{provider}.errors"] += 1
                reason = event.get("reason")
                status = event.get("status")
                label = reason if type(reason) is str else "error"
                if type(status) is int:
                    label += f" {status}"
                facts[f"errors.{label}"] += 1
        elif kind in POLICY_REFUSALS or kind in TRANSIENT_REFUSALS:
            rule = event.get("rule")
            facts[f"refusals.{rule if type(rule) is str else kind}"] += 1
    return dict(facts)


def figures(receipt_path: str) -> tuple[dict[str, object], dict[str, object]]:
    """(the figures compared, the run's identity) of one verified receipt."""
    verdict = verify(receipt_path)
    if not verdict.ok:
        raise InputError(
            f"receipt {receipt_path}: does not verify against its ledger: {verdict.summary()}"
        )
    receipt = load_receipt(receipt_path)
    assert isinstance(receipt, dict)  # verify accepted it
    ledger = Path(receipt_path).parent / receipt["ledger"]["file"]
    out: dict[str, object] = {}
    totals = receipt["totals"]
    for name in _COUNTED:
        out[f"totals.{name}"] = totals[name]
    for model, counters in totals["by_model"].items():
        for name in _COUNTED:
            out[f"model.{model or '(unknown)'}.{name}"] = counters[name]
    for key, n in ledger_facts(ledger, receipt["ledger"]["events"]).items():
        if key.endswith(".cost_nusd"):
            out[key.removesuffix("cost_nusd") + "usd"] = usd(n)
        else:
            out[key] = n
    exit_ = receipt["exit"]
    out["exit.status"], out["exit.cap"] = exit_["status"], exit_["cap"]
    for breach in receipt["caps"]["breaches"]:
        limit = breach["limit"]
        if breach["cap"] == "max_usd" and type(limit) is int:  # nano-USD, like the costs
            limit = f"${usd(limit)}"
        out[f"caps.breached.{breach['cap']}"] = f"limit {limit}"
    # The response cache (ops.cache; absent: nothing was asked of it).
    cache = receipt["ops"].get("cache") or {}
    for name in ("hits", "misses", "stored"):
        out[f"cache.{name}"] = cache.get(name, 0)
    out["cache.saved_usd"] = usd(cache.get("saved_nusd", 0))
    for reason, n in (cache.get("refused_by_reason") or {}).items():
        out[f"cache.not_stored.{reason}"] = n
    out["faults.injected"] = receipt["faults"]["injected"]
    for fault, n in receipt["faults"]["by_fault"].items():
        out[f"faults.{fault}"] = n
    evidence = receipt["ops"]["evidence"]
    for key in ("ledger_complete", "unwritten_events", "write_failures", "unrecorded_calls"):
        if key in evidence:
            out[f"evidence.{key}"] = evidence[key]
    pricing = receipt["pricing"]
    out["pricing.table_date"] = pricing["table_date"]
    for model, prices in pricing["unit_prices"].items():
        for name, value in prices.items():
            out[f"pricing.{model}.{name}"] = value
    identity = {
        "receipt": receipt_path,
        "run_id": receipt["run_id"],
        "started_at": receipt["started_at"],
        "duration_ms": receipt["duration_ms"],
    }
    return out, identity


def _delta(a: object, b: object) -> str | None:
    if type(a) is int and type(b) is int:
        return f"{b - a:+d}"
    if type(a) is str and type(b) is str:
        try:
            return f"{Decimal(b) - Decimal(a):+}"
        except ArithmeticError:
            return None
    return None


def compare(a: dict[str, object], b: dict[str, object]) -> tuple[list[dict], list[str]]:
    """The figures that differ (absent on one side: null), and what the differences point at."""
    rows = []
    for key in sorted(a.keys() | b.keys()):
        va, vb = a.get(key), b.get(key)
        if va != vb or type(va) is not type(vb):
            rows.append({"figure": key, "a": va, "b": vb, "delta": _delta(va, vb)})
    notes = []
    same_work = all(
        a.get(f"totals.{k}") == b.get(f"totals.{k}")
        for k in ("model_calls", "input_tokens", "output_tokens", "cached_tokens")
    )
    if a.get("totals.usd") != b.get("totals.usd") and same_work:
        figures = [str(r["figure"]) for r in rows]
        moved = sorted(
            {f.split(".")[1] for f in figures if f.startswith("pricing.")} - {"table_date"}
        )
        why = f"the price table moved ({a.get('pricing.table_date')} -> {b.get('pricing.table_date')})"
        if moved:
            why += f"; unit prices changed for {', '.join(moved)}"
        notes.append(f"the spend moved while the calls and tokens did not: {why}")
    return rows, notes


def diff_command(receipt_a: str, receipt_b: str, *, as_json: bool) -> int:
    a, who_a = figures(receipt_a)
    b, who_b = figures(receipt_b)
    rows, notes = compare(a, b)
    if as_json:
        report = {"equal": not rows, "a": who_a, "b": who_b, "differences": rows, "notes": notes}
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        _render(who_a, who_b, rows, notes, len(a.keys() | b.keys()))
    return EXIT_OK if not rows else EXIT_CHECK_FAILED


def _render(who_a: dict, who_b: dict, rows: list[dict], notes: list[str], total: int) -> None:
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    for tag, who in (("A", who_a), ("B", who_b)):
        console.print(
            f"{tag}: {escape(str(who['run_id']))}  started {escape(str(who['started_at']))}, "
            f"{who['duration_ms']} ms  ({escape(who['receipt'])})"
        )
    if not rows:
        console.print(f"equal: all {total} figures are the same")
        return
    table = Table(show_edge=False, pad_edge=False)
    for name, justify in (("figure", "left"), ("A", "right"), ("B", "right"), ("delta", "right")):
        # fold, never cut: a figure's name is the one thing the row must show whole
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]  # rich's literal type
    for r in rows:
        table.add_row(
            escape(r["figure"]),
            escape("-" if r["a"] is None else str(r["a"])),
            escape("-" if r["b"] is None else str(r["b"])),
            escape(r["delta"] or ""),
        )
    console.print(table)
    console.print(f"{len(rows)} of {total} figures differ")
    for note in notes:
        console.print(f"[yellow]{escape(note)}[/yellow]")
