"""Which ledger and which receipt a user means, however they named the run.

Every verb that reads a run takes the same three forms: the run's folder
(holding ledger.jsonl and receipt.json, as `docket run` writes them), its ledger,
or its receipt. A ledger's receipt is the receipt.json beside it; a receipt's
ledger is the file it names, relative to the receipt's folder (spec section 3,
as `docket verify` reads it). What cannot be found is one line naming what is
missing and where (InputError, exit 2); the file's contents are checked by the
verb that reads them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from docket.errors import InputError
from docket.inputs import existing_file, read_text
from docket.ledger.reader import LEDGER_MAGIC

LEDGER_NAME = "ledger.jsonl"
RECEIPT_NAME = "receipt.json"


@dataclass(frozen=True)
class NamedRun:
    """What the user named, sorted: the form it took and the paths it leads to.

    `ledger` and `receipt` are where each would be; either may not exist (a run
    still going has no receipt yet), which the `*_file` methods say in one line.
    """

    given: Path
    form: str  # "folder" | "ledger" | "receipt"
    ledger: Path | None  # None for a receipt: the one it names, read when asked for
    receipt: Path

    def ledger_file(self) -> Path:
        if self.ledger is None:  # the receipt form, resolved lazily: see ledger_named_by
            return ledger_named_by(self.receipt)
        if self.form == "folder" and not self.ledger.exists():
            raise InputError(f"run {self.given}: no {LEDGER_NAME} in this folder")
        return existing_file(self.ledger, "ledger")

    def receipt_file(self) -> Path:
        """The receipt's path; what is in it is the verifier's to judge (spec section 10
        gives each problem its code)."""
        if self.form != "receipt" and not self.receipt.exists():
            where = "in this folder" if self.form == "folder" else f"beside {self.given.name}"
            raise InputError(
                f"run {self.given}: no {RECEIPT_NAME} {where} (a run still going has none "
                "yet; one whose folder could not take it wrote it to ledger.fallback_dir)"
            )
        return self.receipt


def _looks_like_ledger(p: Path) -> bool:
    if p.suffix == ".jsonl":
        return True
    if p.suffix == ".json":
        return False
    try:
        with open(p, "rb") as f:
            head = f.read(len(LEDGER_MAGIC))
    except OSError:
        return True  # the ledger check names the problem (existing_file)
    # A receipt is one JSON object too, but never begins with the ledger's bytes.
    return head == LEDGER_MAGIC or not head.lstrip().startswith(b"{")


def named_run(target: str | os.PathLike) -> NamedRun:
    """Sort a path the user gave into folder, ledger or receipt (one line if none)."""
    p = Path(target)
    if "\x00" in str(p):
        raise InputError(f"run {str(p)!r}: a path cannot hold a NUL byte")
    if p.is_dir():
        return NamedRun(p, "folder", p / LEDGER_NAME, p / RECEIPT_NAME)
    if not p.exists():
        raise InputError(
            f"run {p}: no such file or folder (give a run's folder, its {LEDGER_NAME} "
            f"or its {RECEIPT_NAME})"
        )
    if _looks_like_ledger(p):
        return NamedRun(p, "ledger", p, p.parent / RECEIPT_NAME)
    return NamedRun(p, "receipt", None, p)


def ledger_named_by(receipt: Path) -> Path:
    """The ledger a receipt names (its ledger.file, relative to the receipt's folder)."""
    text = read_text(receipt, "receipt")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InputError(f"receipt {receipt}: not JSON ({exc})") from None
    claimed = doc.get("ledger") if isinstance(doc, dict) else None
    name = claimed.get("file") if isinstance(claimed, dict) else None
    if not isinstance(name, str) or not name:
        raise InputError(f"receipt {receipt}: names no ledger (no ledger.file string)")
    ledger = receipt.parent / name
    if not ledger.exists():
        raise InputError(f"receipt {receipt}: the ledger it names, {ledger}, is not there")
    return existing_file(ledger, "ledger")


def run_ledger(target: str | os.PathLike) -> Path:
    """The ledger of the run named: show, explain, doctor (each checks what is in it)."""
    return named_run(target).ledger_file()


def run_receipt(target: str | os.PathLike) -> Path:
    """The receipt of the run named: diff."""
    return named_run(target).receipt_file()


def verify_pair(target: str | os.PathLike, ledger: str | None) -> tuple[str, str | None]:
    """`docket verify`'s receipt and ledger. A receipt or a folder: the ledger the
    receipt names, as the verifier reads it, unless --ledger names another; a ledger:
    that ledger, against the receipt beside it."""
    run = named_run(target)
    receipt = run.receipt_file()
    if ledger is None and run.form == "ledger":
        ledger = str(run.given)
    return str(receipt), ledger
