"""A recorded run, read for replay: its receipt verified, its calls listed.

What is read is what any process of the same user could have written (the run's
folder), so nothing is believed until it is proven: the receipt and the ledger are
copied into a private folder first (a file swapped after the check cannot be the
one served), the copy is verified as `docket verify` does (a ledger that is not the
receipt's, edited or re-chained, fails there), and only the copy's lines are read.
The ledger is bounded (MAX_RECORDING_BYTES) before a byte is copied, and each line
by the chain's own line limit; bodies in it are bounded by the recorder (1 MiB).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from docket.errors import InputError
from docket.ledger.chain import line_hash
from docket.ledger.reader import Lines
from docket.receipts.verify import VerifyInputError, verify
from docket.replay.match import NotReplayable, RecordedCall, recorded_calls

# The default ledger ceiling (ledger.max_ledger_bytes) and the receipt's 16 MiB:
# a recording larger than a run can write is not one.
MAX_RECORDING_BYTES = 256 << 20
MAX_RECEIPT_BYTES = 16 << 20


@dataclass(frozen=True)
class Recording:
    run_id: str
    head: str  # the ledger's chain head, as the verified receipt states it
    folder: Path
    calls: list[RecordedCall]

    @property
    def replay_of(self) -> dict:
        return {"run_id": self.run_id, "head": self.head}


def run_folder(run: str) -> Path:
    """RUN as given: a run's folder (holding receipt.json), its receipt, or a run id
    under ./docket-runs/."""
    path = Path(run)
    if path.is_file():
        return path.parent
    if path.is_dir():
        return path
    under = Path("docket-runs") / run
    if under.is_dir():
        return under
    raise InputError(f"replay: run {run}: no such folder, receipt or run id under docket-runs/")


def load_recording(run: str) -> Recording:
    """The recorded run, verified; InputError (one line, exit 2) when it cannot be replayed."""
    folder = run_folder(run)
    with tempfile.TemporaryDirectory(prefix="docket-replay-") as private:
        receipt = _copy(folder / "receipt.json", Path(private) / "receipt.json", MAX_RECEIPT_BYTES)
        try:
            named = json.loads(receipt.read_bytes())["ledger"]["file"]
        except (ValueError, KeyError, TypeError):
            named = None
        if not isinstance(named, str) or Path(named).is_absolute() or ".." in Path(named).parts:
            raise InputError(f"replay: {folder}/receipt.json does not verify (no ledger it names)")
        ledger = _copy(folder / named, Path(private) / "ledger.jsonl", MAX_RECORDING_BYTES)
        # The copy's receipt names its ledger beside it, whatever the original said.
        try:
            verdict = verify(receipt, ledger)
        except VerifyInputError as exc:
            raise InputError(f"replay: {folder}: the recording does not verify: {exc}") from None
        if not verdict.ok:
            raise InputError(
                f"replay: {folder}: the recording does not verify: {verdict.summary()}"
            )
        # One pass over the verified copy, one event at a time: only the calls are kept.
        first: list[dict] = []

        def events() -> Iterator[tuple[dict, str]]:
            for line in Lines(ledger):
                event = json.loads(line)
                if not first:
                    first.append(event)
                yield event, line_hash(line)

        try:
            calls = recorded_calls(events())
        except NotReplayable as exc:
            raise InputError(f"replay: {folder}: {exc.reason}") from None
    run_id = first[0].get("run_id") if first and first[0].get("type") == "session.start" else None
    if not isinstance(run_id, str):
        raise InputError(f"replay: {folder}: the ledger has no session.start with a run_id")
    assert verdict.head is not None  # an ok verdict read the chain
    return Recording(run_id, verdict.head, folder, calls)


def _copy(source: Path, target: Path, limit: int) -> Path:
    """A private copy of a regular file of at most `limit` bytes (read through one
    descriptor: the size checked is the size of the file copied)."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"replay: {source}: cannot read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"replay: {source}: not a regular file")
        if info.st_size > limit:
            raise InputError(
                f"replay: {source}: {info.st_size} bytes, over the {limit} a run writes"
            )
        with open(target, "wb") as out:
            shutil.copyfileobj(_Bounded(f, limit), out)
    return target


class _Bounded:
    """A reader that refuses to go past `limit` bytes (a file that grows while copied)."""

    def __init__(self, f, limit: int) -> None:
        self.f, self.left = f, limit

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(1 << 20 if n < 0 else n)
        self.left -= len(data)
        if self.left < 0:
            raise InputError("replay: a recording file grew past its bound while it was read")
        return data
