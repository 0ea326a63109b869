"""What `docket run` says on stderr: where the run is when it starts, and what its
receipt says when it ends.

The end block reads the receipt the run just wrote (not the supervisor's memory), so
what it prints is what `docket verify` will check. It ends with the run's last line
(supervisor.last_line), which `--quiet` keeps alone, as scripts read it.
"""

from __future__ import annotations

import json
import shlex
from decimal import Decimal
from pathlib import Path

from docket.receipts.receipt import refusals_by_rule, refused_calls

NUSD_PER_USD = Decimal(10**9)


def start_line(run_id: str, folder: Path, boundary_url: str) -> str:
    where = shlex.quote(str(folder))
    return (
        f"docket: run {run_id} in {folder}, boundary {boundary_url}; "
        f"watch it: docket show --follow {where}"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _usd(nusd: int) -> str:
    return f"${(Decimal(nusd) / NUSD_PER_USD).normalize():f}"


def summary_lines(receipt: dict) -> list[str]:
    """The receipt's figures a person checks first, one line each."""
    totals = receipt.get("totals", {})
    ops = receipt.get("ops") or {}
    calls = totals.get("model_calls", 0)
    lines = [
        f"docket: calls {calls} ({totals.get('responses', 0)} answered, "
        f"{totals.get('errors', 0)} failed), spend ${totals.get('usd', '0')}"
        + (
            f" ({_count(totals['unpriced_calls'], 'call')} unpriced)"
            if totals.get("unpriced_calls")
            else ""
        )
    ]
    # totals.refused counts the policy's denials only; refused_by_rule counts every rule's
    # (the rate limiter, the breaker, shedding, egress, a full ledger), so it is the total.
    rules = refusals_by_rule(totals)
    refused = refused_calls(totals)
    line = f"docket: refused {refused}"
    if rules:
        line += " (" + ", ".join(f"{rule} {n}" for rule, n in sorted(rules.items())) + ")"
    lines.append(line)
    cache = ops.get("cache")
    if isinstance(cache, dict) and (cache.get("hits") or cache.get("stored")):
        lines.append(
            f"docket: cache {_count(cache.get('hits', 0), 'hit')}, saved "
            f"{_usd(cache.get('saved_nusd', 0))}, {_count(cache.get('stored', 0), 'answer')} stored"
        )
    for snap in receipt.get("snapshot") or []:
        restored = snap.get("restored") if isinstance(snap, dict) else None
        if isinstance(restored, dict):
            verified = "verified" if restored.get("verified") else "NOT verified"
            lines.append(
                f"docket: restored {snap.get('root')}: {_count(restored.get('applied', 0), 'path')}, "
                f"{restored.get('failed', 0)} failed, {verified}"
            )
    evidence = ops.get("evidence") or {}
    ledger = receipt.get("ledger") or {}
    if evidence.get("ledger_complete", True):
        lines.append(f"docket: evidence complete: {ledger.get('events', '?')} events")
    else:
        lines.append(
            f"docket: evidence INCOMPLETE: {evidence.get('unwritten_events', '?')} events unwritten"
        )
    return lines


def end_block(receipt_path: Path, folder: Path) -> list[str]:
    """The lines before the last line: the receipt's figures and how to check them.
    Only for a receipt in the run's folder: one that went to stderr is the line just
    above the last line, which says so ("the JSON line above")."""
    try:
        receipt = json.loads(receipt_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"docket: warning: cannot summarize the receipt {receipt_path} ({exc})"]
    if not isinstance(receipt, dict):
        return [f"docket: warning: cannot summarize the receipt {receipt_path} (not an object)"]
    lines = summary_lines(receipt)
    lines.append(f"docket: check it: docket verify {shlex.quote(str(folder))}")
    return lines
