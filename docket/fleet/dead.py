"""A dead run's lapsed slice, settled by a live boundary on its host.

A killed boundary's lease lapses whole (it may have spent any part of it), and only
its ledger says how much it did spend (docket/fleet/settle.py). A live boundary on
the same host asks the budget for such runs (fleet_lapsed_here: run id, folder, and
the pin of its ledger at its last exchange), and for each one reads the facts here
and lets `decide` say whether the ledger may settle it:

- the run is dead and its ledger final: nobody holds the ledger's flock (the kernel
  drops it with its holder, docket/ledger/lock.py);
- the file is a regular file of bounded size whose chain holds (read to the end
  under a deadline; a torn last line is a write the death cut short, never a call
  that went out: model.request is durable before a call is forwarded);
- it is that run's ledger, under this budget (session.start's run_id and fleet);
- it still carries the pin: at least pin_seq lines, the line at pin_seq - 1 hashing
  to pin_head, as the run reported at its last exchange (a ledger rewritten before
  that point is refused; after it, see docs/fleet.md's attack section).

Whatever is refused is recorded with its reason and never settled; the budget
itself refuses a ledger that accounts for less than the run reported.
`read_facts` does the I/O (in a worker thread); `decide` is pure.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from docket.fleet.amounts import Amounts
from docket.fleet.settle import LedgerSpend
from docket.ledger.chain import ChainError, ChainVerifier
from docket.ledger.lock import holder_pid, lock_path
from docket.ledger.reader import LEDGER_MAGIC, Lines, LineTooLong
from docket.pricing import PriceTable

LEDGER_NAME = "ledger.jsonl"
# A ledger larger than this is not read to settle a slice: the run's own ledger
# limits are usually far below it, and the read must fit in one fleet timeout.
MAX_LEDGER_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class LedgerFacts:
    """What reading a dead run's folder found (problem: why it could not be read)."""

    holder: int | None = None  # the pid holding the ledger's lock: the run is alive
    problem: str | None = None
    run_id: str | None = None
    budget: str | None = None
    lines: int = 0  # complete lines whose chain holds
    head_at_pin: str | None = None  # the chain's head after pin_seq lines
    spent: Amounts = Amounts()


@dataclass(frozen=True)
class Settle:
    spent: Amounts


@dataclass(frozen=True)
class Refuse:
    reason: str


def decide(
    run_id: str, budget: str, pin: tuple[int, str] | None, facts: LedgerFacts
) -> Settle | Refuse:
    """Whether the dead run `run_id`'s ledger may settle its lapsed leases on `budget`."""
    if facts.holder is not None:
        return Refuse(f"its ledger is held by pid {facts.holder}: the run is alive")
    if facts.problem is not None:
        return Refuse(facts.problem)
    if facts.run_id != run_id:
        return Refuse(f"the ledger is run {facts.run_id}'s, not {run_id}'s")
    if facts.budget != budget:
        return Refuse(f"the ledger's run names fleet budget {facts.budget}, not {budget}")
    if pin is None:
        return Refuse("the run reported no ledger position (pin) at its exchanges")
    seq, head = pin
    if facts.lines < seq:
        return Refuse(
            f"the ledger holds {facts.lines} lines, fewer than the {seq} it had at its last "
            "exchange: truncated"
        )
    if facts.head_at_pin != head:
        return Refuse(
            f"the ledger's line {seq - 1} does not hash to what the run reported at its last "
            "exchange: rewritten"
        )
    return Settle(facts.spent)


def read_facts(
    folder: str,
    pin_seq: int | None,
    prices: PriceTable,
    *,
    deadline: float,
    max_bytes: int = MAX_LEDGER_BYTES,
) -> LedgerFacts:
    """Read the dead run's ledger in `folder` (a worker thread's work): its lock's
    holder, then, if nobody holds it, the whole file, by time.monotonic() `deadline`."""
    if not os.path.isabs(folder):
        return LedgerFacts(problem=f"the run's folder {folder!r} is not an absolute path")
    path = Path(folder) / LEDGER_NAME
    if not lock_path(path).exists():
        return LedgerFacts(problem=f"{path}: no lock file beside it: not a run's ledger")
    pid = holder_pid(path)
    if pid is not None:
        return LedgerFacts(holder=pid)
    try:
        st = os.lstat(path)
    except OSError as exc:
        return LedgerFacts(problem=f"{path}: cannot read ({exc.strerror})")
    if not stat.S_ISREG(st.st_mode):
        return LedgerFacts(problem=f"{path}: not a regular file")
    if st.st_size > max_bytes:
        return LedgerFacts(
            problem=f"{path}: {st.st_size} bytes, over the {max_bytes} read to settle"
        )
    return _read(path, pin_seq, prices, deadline, max_bytes)


def _read(
    path: Path, pin_seq: int | None, prices: PriceTable, deadline: float, max_bytes: int
) -> LedgerFacts:
    chain = ChainVerifier()
    fold = LedgerSpend(prices)
    budget: str | None = None
    head_at_pin = chain.head if pin_seq == 0 else None
    lines = Lines(path)
    read = 0
    try:
        for line in lines:
            read += len(line) + 1
            if read > max_bytes:  # it grew since it was measured
                return LedgerFacts(problem=f"{path}: over the {max_bytes} bytes read to settle")
            if chain.count == 0 and not line.startswith(LEDGER_MAGIC):
                return LedgerFacts(problem=f"{path}: not a docket ledger")
            event = chain.feed(line)
            if chain.count % 256 == 0 and time.monotonic() > deadline:
                return LedgerFacts(problem=f"{path}: not read within the fleet timeout")
            if event.get("type") == "session.start":
                fleet = event.get("fleet")
                budget = fleet.get("budget") if isinstance(fleet, dict) else None
            fold.feed(event)
            if chain.count == pin_seq:
                head_at_pin = chain.head
    except ChainError as exc:
        return LedgerFacts(problem=f"{path}: its chain does not hold ({exc})")
    except LineTooLong:
        return LedgerFacts(problem=f"{path}: a line longer than a ledger's")
    except (KeyError, TypeError, ValueError) as exc:
        # LedgerSpend on an event missing what a model event carries
        return LedgerFacts(problem=f"{path}: an event the settle cannot read ({exc!r})")
    except OSError as exc:
        return LedgerFacts(problem=f"{path}: cannot read ({exc.strerror})")
    # A torn last line (lines.tail) is a write the death cut short: never forwarded.
    return LedgerFacts(
        run_id=fold.run_id,
        budget=budget,
        lines=chain.count,
        head_at_pin=head_at_pin,
        spent=fold.total(),
    )
