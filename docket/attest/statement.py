"""The in-toto Statement v1 Docket signs for a run folder or a game-day report folder.

predicateType is a name (a URI Docket owns), never fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from docket import __version__
from docket.errors import InputError
from docket.receipts.receipt import plain_number

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
RUN_PREDICATE = "https://docket.dev/attestation/run/v1"
GAMEDAY_PREDICATE = "https://docket.dev/attestation/gameday/v1"
# The files each kind of folder is attested by, in the order the subjects list them.
SUBJECT_FILES = {
    RUN_PREDICATE: ("ledger.jsonl", "receipt.json"),
    GAMEDAY_PREDICATE: ("gameday.json", "junit.xml"),
}
HASH_CHUNK = 1024 * 1024


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_kind(folder: Path) -> str:
    """The predicate type a folder is attested under: a run's (receipt.json) or a game
    day's report (gameday.json). Neither: bad input."""
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder (attest takes a run's or a report's folder)")
    for kind, names in SUBJECT_FILES.items():
        if (folder / names[1] if kind == RUN_PREDICATE else folder / names[0]).is_file():
            missing = [n for n in names if not (folder / n).is_file()]
            if missing:
                raise InputError(f"{folder}: has no {', '.join(missing)}")
            return kind
    raise InputError(
        f"{folder}: neither a run's folder (receipt.json) nor a game-day report (gameday.json)"
    )


def subjects(folder: Path, kind: str) -> list[dict]:
    return [
        {"name": name, "digest": {"sha256": file_sha256(folder / name)}}
        for name in SUBJECT_FILES[kind]
    ]


def run_predicate(receipt: dict, verdict) -> dict:
    """What a reader learns without opening the files: the chain's figures, the verdict
    of `docket verify` when signed, and the receipt's totals."""
    return {
        "run_id": receipt["run_id"],
        "ledger": {"events": verdict.events, "head": verdict.head, "bytes": verdict.bytes},
        "verify": {
            "verdict": "ok",
            "complete": verdict.complete,
            "unbacked": list(verdict.unbacked),
            "by": f"docket {__version__}",
        },
        "totals": receipt["totals"],
    }


def gameday_predicate(report: dict) -> dict:
    phases = report.get("phases")
    if not isinstance(phases, list):
        raise InputError("gameday.json: no phases list; not a game-day report")
    verdicts = {}
    for phase in phases:
        if isinstance(phase, dict) and isinstance(phase.get("name"), str):
            verdicts[phase["name"]] = str(phase.get("verdict"))
    return {
        "verdict": str(report.get("verdict")),
        "phases": verdicts,
        "by": f"docket {__version__}",
    }


def statement(kind: str, subject_list: list[dict], predicate: dict) -> dict:
    return {
        "_type": STATEMENT_TYPE,
        "subject": subject_list,
        "predicateType": kind,
        "predicate": predicate,
    }


def statement_bytes(stmt: dict) -> bytes:
    return json.dumps(
        stmt, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=plain_number
    ).encode("utf-8")


def default_out(folder: str | os.PathLike) -> Path:
    return Path(folder) / "attestation.dsse.json"
