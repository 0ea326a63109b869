"""`docket ls [DIR]`: the runs under a folder, newest first, from their receipts; a
folder whose receipt is missing or broken is listed as such, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from reading_ledgers import Script, seal

from docket.cli import main
from docket.ledger.writer import open_ledger
from docket.reading.runs_list import list_runs


def _run(folder: Path, calls: int, started: str) -> Path:
    folder.mkdir(parents=True)
    s = Script()
    for i in range(calls):
        s.call(body=f"q {i}")
    receipt = seal(s.end().write(folder / "ledger.jsonl"))
    doc = json.loads(receipt.read_text())
    # The ledger's clock is the script's; the listing orders by the receipt's started_at,
    # which is all it reads, so the test sets it (the receipt is not re-verified by ls).
    doc["started_at"] = started
    receipt.write_text(json.dumps(doc))
    return folder


@pytest.fixture
def runs(tmp_path) -> Path:
    base = tmp_path / "docket-runs"
    _run(base / "old", 1, "2027-02-01T08:00:00.000Z")
    _run(base / "new", 3, "2027-02-02T09:00:00.000Z")
    odd = _run(base / "odd", 1, "2027-02-03T00:00:00.000Z")
    (odd / "receipt.json").write_text('{"run_id": "x"}')
    broken = _run(base / "broken", 2, "2026-12-01T12:00:00.000Z")
    (broken / "receipt.json").write_bytes(b"\x00\xff not json")
    killed = _run(base / "killed", 2, "2026-11-30T00:00:00.000Z")
    (killed / "receipt.json").unlink()
    (base / "not-a-run").mkdir()
    (base / ".docket-snapshot-store").mkdir()
    return base


def test_newest_first_with_each_state_said(runs, capsys):
    assert main(["ls", str(runs), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    # the two without a receipt start when their ledgers do (the script's clock: 2027-01-15)
    assert [r["folder"] for r in rows] == ["new", "old", "odd", "killed", "broken"]
    new = rows[0]
    receipt = json.loads((runs / "new" / "receipt.json").read_text())
    assert new == {
        "folder": "new",
        "run_id": receipt["run_id"],
        "started": "2027-02-02T09:00:00.000Z",
        "duration_ms": receipt["duration_ms"],
        "exit": 0,
        "calls": 3,
        "usd": receipt["totals"]["usd"],
        "refused": 0,
        "status": "complete",
        "note": None,
    }
    odd, killed, broken = rows[2], rows[3], rows[4]
    assert (
        odd["status"] == "receipt unreadable" and odd["note"] == "receipt.json: no field 'totals'"
    )
    assert broken["status"] == "receipt unreadable"
    assert broken["note"] == "receipt.json: not UTF-8"
    assert broken["calls"] is None and broken["run_id"] == "run-1"  # from its ledger
    assert killed["status"] == "no receipt" and "killed" in killed["note"]


def test_plain_text_when_piped(runs, capsys):
    assert main(["ls", str(runs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "started", "run", "folder", "duration", "exit", "calls", "spend", "refused", "receipt"
    ]  # fmt: skip
    assert len(out) == 6
    assert out[1].startswith("2027-02-02T09:00:00.000Z") and " new " in out[1]
    assert out[5].endswith("receipt unreadable (receipt.json: not UTF-8)")
    assert "\x1b" not in "".join(out)  # no terminal codes in a pipe


def test_a_rich_table_at_a_terminal(runs, monkeypatch):
    """At a terminal (a pty), the table is rich's: box-drawing rules between header and rows."""
    master, slave = os.openpty()
    try:
        with open(slave, "w", encoding="utf-8", closefd=False) as tty:
            monkeypatch.setattr("sys.stdout", tty)
            assert main(["ls", str(runs)]) == 0
            tty.flush()
        os.set_blocking(master, False)
        text = os.read(master, 1 << 16).decode("utf-8", "replace")
    finally:
        os.close(master)
        os.close(slave)
    assert "│" in text and "━" in text and "started" in text and "new" in text


def test_a_run_still_going_is_running(tmp_path, capsys):
    base = tmp_path / "runs"
    (base / "live").mkdir(parents=True)

    async def while_open() -> None:
        async with open_ledger(base / "live" / "ledger.jsonl") as ledger:
            await ledger.append("session.start", run_id="live-1", docket_version="0.1.0")
            (row,) = list_runs(base)
            assert row.status == "running" and f"pid {os.getpid()}" in (row.note or "")
            assert row.run_id == "live-1"

    trio.run(while_open)


def test_default_folder_and_no_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["ls"]) == 2
    assert capsys.readouterr().err == "docket: runs folder docket-runs: no such folder\n"
    (tmp_path / "docket-runs").mkdir()
    assert main(["ls"]) == 0
    assert capsys.readouterr().err == "docket: no runs in docket-runs\n"
    (tmp_path / "a-file").write_text("x")
    assert main(["ls", "a-file"]) == 2
    assert capsys.readouterr().err == "docket: runs folder a-file: not a folder\n"
