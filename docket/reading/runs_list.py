"""`docket ls [DIR]`: one line per run under a runs folder, newest first.

Each run's figures are read from its receipt as written (no re-verification: that is
`docket verify FOLDER`, which the table's folder column is ready for); a folder
with no receipt is a run still going (a writer holds its ledger's lock) or one that
never ended (killed), and a receipt that cannot be read is listed as such, with why.
A folder holding neither a ledger nor a receipt is not a run and is not listed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from docket.errors import EXIT_OK, InputError
from docket.ledger.lock import holder_pid
from docket.reading.run_paths import LEDGER_NAME, RECEIPT_NAME
from docket.receipts.receipt import refused_calls

DEFAULT_RUNS = "docket-runs"  # where `docket run` puts a run without --ledger-dir
FIRST_LINE_BYTES = 1 << 16  # enough for session.start; a longer first line: no start time
RECEIPT_MAX_BYTES = 16 << 20


@dataclass
class RunRow:
    folder: str
    run_id: str | None
    started: str | None
    duration_ms: int | None
    exit: int | None
    calls: int | None
    usd: str | None
    refused: int | None
    # complete | evidence incomplete | running | no receipt | receipt unreadable
    status: str
    note: str | None = None  # why, for the last three


def _first_event(ledger: Path) -> dict | None:
    """session.start, read from the ledger's first line (bounded), or None."""
    try:
        with open(ledger, "rb") as f:
            head = f.read(FIRST_LINE_BYTES)
        event = json.loads(head.split(b"\n", 1)[0])
    except (OSError, ValueError):
        return None
    return event if isinstance(event, dict) else None


def _from_receipt(folder: Path, receipt: Path) -> RunRow:
    try:
        if receipt.stat().st_size > RECEIPT_MAX_BYTES:
            raise ValueError(f"larger than {RECEIPT_MAX_BYTES >> 20} MiB")
        doc = json.loads(receipt.read_text(encoding="utf-8"))
        totals, exit_ = doc["totals"], doc["exit"]
        evidence = (doc.get("ops") or {}).get("evidence") or {}
        row = RunRow(
            folder=folder.name,
            run_id=str(doc["run_id"]),
            started=str(doc["started_at"]),
            duration_ms=int(doc["duration_ms"]),
            exit=int(exit_["status"]),
            calls=int(totals["model_calls"]),
            usd=str(totals["usd"]),
            refused=refused_calls(totals),
            status="complete",
        )
    except OSError as exc:
        return _without_receipt(folder, "receipt unreadable", f"{RECEIPT_NAME}: {exc.strerror}")
    except ValueError as exc:  # not UTF-8, not JSON, or too large
        why = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc).split(":")[0]
        return _without_receipt(folder, "receipt unreadable", f"{RECEIPT_NAME}: {why}")
    except (KeyError, TypeError, AttributeError) as exc:
        why = f"no field {exc}" if isinstance(exc, KeyError) else "not a receipt's shape"
        return _without_receipt(folder, "receipt unreadable", f"{RECEIPT_NAME}: {why}")
    if evidence.get("ledger_complete") is False:
        row.status = "evidence incomplete"
        row.note = f"{evidence.get('unwritten_events', '?')} events unwritten"
    return row


def _without_receipt(folder: Path, status: str, note: str) -> RunRow:
    ledger = folder / LEDGER_NAME
    start = _first_event(ledger) if ledger.exists() else None
    run_id = start.get("run_id") if start else None
    return RunRow(
        folder=folder.name,
        run_id=str(run_id) if run_id is not None else None,
        started=str(start["ts"]) if start and "ts" in start else None,
        duration_ms=None,
        exit=None,
        calls=None,
        usd=None,
        refused=None,
        status=status,
        note=note,
    )


def read_run(folder: Path) -> RunRow | None:
    """One run's row, or None if the folder holds no run."""
    receipt, ledger = folder / RECEIPT_NAME, folder / LEDGER_NAME
    if receipt.exists():
        return _from_receipt(folder, receipt)
    if not ledger.exists():
        return None
    writer = holder_pid(ledger)
    if writer is not None:
        return _without_receipt(folder, "running", f"pid {writer} is writing it")
    return _without_receipt(
        folder, "no receipt", "the run never ended (killed?): docket doctor says more"
    )


def list_runs(runs: Path) -> list[RunRow]:
    if not runs.exists():
        raise InputError(f"runs folder {runs}: no such folder")
    if not runs.is_dir():
        raise InputError(f"runs folder {runs}: not a folder")
    try:
        folders = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError as exc:
        raise InputError(f"runs folder {runs}: cannot read ({exc.strerror})") from None
    rows = [row for p in folders if (row := read_run(p)) is not None]

    def newest(row: RunRow) -> tuple[str, str]:
        if row.started:
            return row.started, row.folder
        mtime = (runs / row.folder).stat().st_mtime
        return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), row.folder

    return sorted(rows, key=newest, reverse=True)


COLUMNS = ("started", "run", "folder", "duration", "exit", "calls", "spend", "refused", "receipt")


def _cells(row: RunRow) -> tuple[str, ...]:
    dash = "-"
    status = row.status + (f" ({row.note})" if row.note else "")
    return (
        row.started or dash,
        row.run_id or dash,
        row.folder,
        dash if row.duration_ms is None else f"{row.duration_ms / 1000:.1f}s",
        dash if row.exit is None else str(row.exit),
        dash if row.calls is None else str(row.calls),
        dash if row.usd is None else f"${row.usd}",
        dash if row.refused is None else str(row.refused),
        status,
    )


def ls_command(target: str | None, *, as_json: bool) -> int:
    runs = Path(target if target is not None else DEFAULT_RUNS)
    rows = list_runs(runs)
    out = sys.stdout
    if as_json:
        print(json.dumps({"runs": [asdict(r) for r in rows]}, indent=2, ensure_ascii=False))
        return EXIT_OK
    if not rows:
        print(f"docket: no runs in {runs}", file=sys.stderr)
        return EXIT_OK
    cells = [_cells(r) for r in rows]
    if out.isatty():
        from rich.console import Console  # only for a person at a terminal
        from rich.markup import escape
        from rich.table import Table

        table = Table(show_edge=False, pad_edge=False)
        for name in COLUMNS:
            table.add_column(name, overflow="fold")
        for row in cells:
            table.add_row(*(escape(c) for c in row))
        Console(file=out, highlight=False).print(table)
        return EXIT_OK
    widths = [max(len(c[i]) for c in [COLUMNS, *cells]) for i in range(len(COLUMNS))]
    for row in [COLUMNS, *cells]:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        out.write("\n")
    return EXIT_OK
