"""Family `replay`: what `docket replay RUN` reads is the recorded run's folder, which any
process of the same user (the agent included) can write. Each probe plants something
there and runs the real reader (docket.replay.recording.load_recording) in a thread
joined with a deadline; one probe goes through `python -m docket replay` itself.

Planted: a line of the ledger edited; the whole ledger swapped for another run's that
verifies on its own; the receipt swapped for one that names a ledger outside the
folder; a forgery that verifies (re-chained, its receipt rebuilt: the chain has no
key) but holds a body the recorder never writes (past its 1 MiB cap grown by redaction: 12 MiB),
or a body marked not recorded; receipt.json a symlink to a file elsewhere, and a FIFO
(a reader that opened it would block forever); a ledger past the recording bound (a
sparse file, read no further than its size).

Held: every probe is refused with one InputError line (exit 2 for the process probe),
within the deadline, before any answer is served; a body over the cap is refused
by size, never loaded into an answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from chaos.attack import Figures
from docket.errors import InputError
from docket.ledger.chain import GENESIS, encode_body, encode_line, line_hash
from docket.receipts.receipt import build_receipt, encode_receipt
from docket.receipts.tally import Tally
from docket.replay import recording
from docket.replay.match import MAX_BODY_BYTES
from docket.replay.recording import load_recording

DEADLINE = 30.0
VERSION = "0.0.0-attack"
WALL = "2026-12-02T10:00:00.000Z"


def forge(folder: Path, events: list[tuple[str, dict]], *, run_id: str = "attack-run") -> Path:
    """A run folder whose ledger chains and whose receipt verifies: what any process of
    the user can make with the spec alone."""
    folder.mkdir(parents=True)
    start = {
        "run_id": run_id,
        "docket_version": VERSION,
        "policy_digest": "sha256:" + "0" * 64,
        "pricing": {"table_date": None, "provenance": None},
        "caps": {},
    }
    evidence = {
        "ledger_complete": True,
        "unwritten_events": 0,
        "first_failing_seq": None,
        "write_failures": 0,
    }
    end = {
        "reason": "child exited with status 0",
        "exit_status": 0,
        "cap": None,
        "evidence": evidence,
    }
    every = [("session.start", start), *events, ("session.end", end)]
    tally, prev, lines = Tally(), GENESIS, []
    for seq, (kind, fields) in enumerate(every):
        line = encode_line(
            seq=seq, ts=WALL, mono_ms=seq, type=kind, prev=prev, body=encode_body(fields)
        )
        tally.add(json.loads(line))
        lines.append(line)
        prev = line_hash(line)
    data = b"".join(line + b"\n" for line in lines)
    (folder / "ledger.jsonl").write_bytes(data)
    receipt = build_receipt(
        tally, ledger_path="ledger.jsonl", head=prev, count=len(lines), size=len(data),
        evidence=evidence, version=VERSION,
    )  # fmt: skip
    (folder / "receipt.json").write_bytes(encode_receipt(receipt))
    return folder


def a_call(answer: str = '{"ok": true}', **closing: object) -> list[tuple[str, dict]]:
    body = '{"model": "m", "messages": []}'
    request = {
        "call_id": "c1",
        "provider": "openai",
        "model": "m",
        "base_url": "https://api.openai.example",
        "url": "https://api.openai.example/v1/chat/completions",
        "request_sha256": "0" * 64,
        "request_body": body,
    }
    response = {"call_id": "c1", "provider": "openai", "model": "m", "status": 200}
    response |= {"cost_nusd": 0, "priced": False, "response_body": answer} | closing
    return [("model.request", request), ("model.response", response)]


def refused(folder: Path) -> tuple[str, str]:
    """("refused", its line), ("served", ...) when the reader accepted it, ("hung", ...) or
    ("raised", ...) for anything but the one-line refusal."""
    out: dict = {}

    def body() -> None:
        try:
            load_recording(str(folder))
            out["served"] = "accepted"
        except InputError as exc:
            out["refused"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - the probe's outcome, judged by the caller
            out["raised"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    if thread.is_alive():
        return "hung", f"no answer in {DEADLINE:g} s"
    ((what, text),) = out.items()
    return what, text


def _edited_line(root: Path) -> Path:
    run = forge(root / "edited", a_call())
    ledger = run / "ledger.jsonl"
    ledger.write_bytes(ledger.read_bytes().replace(b'{\\"ok\\": true}', b'{\\"ok\\": fals}'))
    return run


def _swapped(root: Path) -> Path:
    run = forge(root / "swapped", a_call())
    other = forge(root / "other", a_call('{"planted": true}'))
    shutil.copy(other / "ledger.jsonl", run / "ledger.jsonl")
    return run


def _ledger_outside(root: Path) -> Path:
    run = forge(root / "outside", a_call())
    receipt = json.loads((run / "receipt.json").read_text())
    receipt["ledger"]["file"] = "../other/ledger.jsonl"
    (run / "receipt.json").write_text(json.dumps(receipt))
    return run


def _huge_body(root: Path) -> Path:
    # Past anything the recorder writes (its cap, grown by redaction at most to MAX_BODY_BYTES).
    huge = json.dumps({"x": "a" * (MAX_BODY_BYTES + 1)})
    return forge(root / "huge", a_call(huge))


def _not_recorded(root: Path) -> Path:
    calls = a_call()
    calls[1][1].pop("response_body")
    calls[1][1]["response_body_not_recorded"] = "not_json"
    return forge(root / "not-recorded", calls)


def _receipt_link(root: Path) -> Path:
    real = forge(root / "real", a_call())
    run = root / "link"
    run.mkdir()
    shutil.copy(real / "ledger.jsonl", run / "ledger.jsonl")
    (run / "receipt.json").symlink_to(real / "receipt.json")
    return run


def _receipt_fifo(root: Path) -> Path:
    run = root / "fifo"
    run.mkdir()
    os.mkfifo(run / "receipt.json")
    return run


def _ledger_too_big(root: Path) -> Path:
    run = forge(root / "big", a_call())
    with open(run / "ledger.jsonl", "r+b") as f:
        f.truncate(recording.MAX_RECORDING_BYTES + 1)  # sparse: no disk spent
    return run


PROBES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("a line of the ledger edited", _edited_line, "chain_break"),
    ("the ledger swapped for another run's", _swapped, "head_mismatch"),
    ("the receipt naming a ledger outside the folder", _ledger_outside, "no ledger it names"),
    ("a verifying forgery with a body past the recorder's bound", _huge_body, "not the recorder's"),
    ("a verifying forgery with a body not recorded", _not_recorded, "was not recorded (not_json)"),
    ("receipt.json a symlink out of the folder", _receipt_link, "cannot read"),
    ("receipt.json a FIFO", _receipt_fifo, "not a regular file"),
    ("a ledger past the recording bound", _ledger_too_big, "over the"),
]


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("replay")
    started = time.monotonic()
    slowest = 0.0
    for name, plant, wanted in PROBES:
        target = plant(folder)
        began = time.monotonic()
        what, text = refused(target)
        slowest = max(slowest, time.monotonic() - began)
        figures.add(
            what == "refused" and wanted in text and "\n" not in text,
            f"{name}: {what}: {text[:300]}",
        )
    # Through the command itself: one line on stderr, exit 2, the command never run.
    marker = folder / "ran"
    done = subprocess.run(
        [sys.executable, "-m", "docket", "replay", str(folder / "swapped"), "--",
         sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    figures.add(
        done.returncode == 2 and done.stderr.count("\n") == 1 and not marker.exists(),
        f"docket replay of a swapped ledger: exit {done.returncode}, stderr {done.stderr[:300]!r}",
    )
    figures.extra = {"probes": len(PROBES) + 1, "slowest_probe_s": round(slowest, 2)}
    figures.seconds = time.monotonic() - started
    return figures
