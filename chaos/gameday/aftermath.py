"""After a run: what `docket doctor` makes of its ledger, and whether any process outlived it.

A supervisor SIGKILLed mid-run cannot report anything afterwards; what an
operator would do next is the evidence: `doctor` (docket doctor's JSON for
the ledger), `quarantine` (what --quarantine-torn-tail did), `verify` (the
repaired prefix, read back and checked against doctor's head), and `orphans`
(processes the run spawned that are still alive). The runner adds these to
every phase's evidence; for a run that ended cleanly, quarantine refuses (there
is no torn tail) and says why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import trio

from chaos.run.collect import read_agent_pids
from docket.errors import DocketError
from docket.ledger.doctor import CLEAN, classify, quarantine_torn_tail

LEDGER = "ledger.jsonl"


def doctor_facts(ledger: Path) -> dict:
    """`doctor`, `quarantine` and `verify` for a ledger, as JSON values.

    doctor classifies; if it finds a torn tail, quarantine sets it aside; then the
    readable prefix (the repaired file, or the ledger itself when it is clean) is
    read back and must be clean with doctor's event count and head. A step that
    refuses is recorded with its reason, for the assertions to see.
    """
    try:
        diagnosis = classify(ledger)
    except DocketError as exc:
        return {
            "doctor": {"verdict": "unreadable", "error": str(exc)},
            "quarantine": {"done": False, "reason": "doctor could not read the ledger"},
            "verify": {"verdict": None, "reason": "nothing to verify"},
        }
    doctor = diagnosis.to_json()
    prefix = None
    quarantine: dict[str, object]
    verify: dict[str, object]
    try:
        q = quarantine_torn_tail(diagnosis)
    except DocketError as exc:
        quarantine = {"done": False, "reason": str(exc)}
        if diagnosis.verdict == CLEAN:
            prefix = classify(ledger)
    else:
        quarantine = {
            "done": True,
            "torn_path": q.torn_path.name,
            "torn_bytes": q.torn_path.stat().st_size,
            "torn_offset": diagnosis.tail.offset if diagnosis.tail else None,
            "repaired_path": q.repaired_path.name,
            "original_unchanged": ledger.stat().st_size == diagnosis.size,
        }
        prefix = q.repaired
    if prefix is None:
        verify = {
            "verdict": None,
            "reason": f"no readable prefix: the ledger is {diagnosis.verdict}",
        }
    else:
        verify = {
            "verdict": prefix.verdict,
            "events": prefix.events,
            "head": prefix.head,
            "bytes": prefix.size,
            "matches_doctor": prefix.head == diagnosis.head and prefix.events == diagnosis.events,
        }
    return {"doctor": doctor, "quarantine": quarantine, "verify": verify}


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting to be reaped) according to /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True  # it exists, though we may not read it
    # The state is the field after the parenthesised command name (which may hold spaces).
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def spawned_pids(events: Iterable[dict], folder: Path, notes: list[str]) -> list[int]:
    """The pids the supervisor spawned (process.spawn: the launcher) and every agent
    the launcher started (agents/NAME.pid, on file before each agent ran, read as
    chaos.run.collect reads them for RunResult.agent_pids)."""
    pids = [e["pid"] for e in events if e.get("type") == "process.spawn" and _pid(e.get("pid"))]
    pids += read_agent_pids(folder, notes).values()
    return sorted(set(pids))


def _pid(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 1


async def orphans(pids: list[int], *, grace_s: float = 3.0, poll_s: float = 0.02) -> list[int]:
    """The pids still alive once `grace_s` has passed (or none, as soon as all are gone).

    A child bound by PR_SET_PDEATHSIG gets its signal when its parent dies, but dies
    a moment later: waiting on the condition, with a deadline, tells a process that
    is going from one that stays.
    """
    with trio.move_on_after(grace_s):
        while any(_alive(pid) for pid in pids):
            await trio.sleep(poll_s)
    return [pid for pid in pids if _alive(pid) and pid != os.getpid()]
