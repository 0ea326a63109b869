"""What doctor can know of a ledger's evidence, beside its chain.

From the file alone: the evidence.gap records (events lost while it was
written), evidence.low_disk records, and whether the run's session.end is last
and calls its record complete. From the receipt beside it (receipt.json naming
the file): the writer's own ops.evidence. doctor.py folds each verified event
in (`EvidenceFacts`), adds the receipt's word (`receipt_evidence`), and prints
`evidence_lines`. No claim is checked here: that is `docket verify`'s work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class EvidenceFacts:
    """What the verified events say about lost evidence (fed one event at a time)."""

    def __init__(self) -> None:
        self.gaps = 0
        self.lost = 0
        self.low_disk = 0
        self.end_complete: bool | None = None  # session.end's word, if the ledger has one
        self.last_type: str | None = None
        # The type of the last whole line past a chain problem (read leniently, not
        # verified): a run that ended has its session.end there, which doctor must not
        # call missing, only unverified.
        self.unverified_last_type: str | None = None

    def past_the_break(self, line: bytes) -> None:
        """A whole line after the chain's first problem: only its type is kept."""
        try:
            event = json.loads(line)
        except ValueError:
            self.unverified_last_type = None
            return
        kind = event.get("type") if isinstance(event, dict) else None
        self.unverified_last_type = kind if isinstance(kind, str) else None

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        self.last_type = kind
        if kind == "evidence.gap":
            self.gaps += 1
            lost = event.get("lost")
            self.lost += lost if type(lost) is int else 0
        elif kind == "evidence.low_disk" and event.get("below") is True:
            self.low_disk += 1
        elif kind == "session.end":
            evidence = event.get("evidence")
            said = evidence.get("ledger_complete") if isinstance(evidence, dict) else None
            self.end_complete = said if type(said) is bool else None

    def as_dict(self) -> dict[str, Any]:
        ended = self.last_type == "session.end"
        if self.gaps or self.end_complete is False:
            complete = False
        elif ended and self.end_complete is True:
            complete = True
        else:
            complete = None  # no session.end last: killed, or its end was not written
        return {
            "complete": complete,
            "gaps": self.gaps,
            "lost": self.lost,
            "low_disk": self.low_disk,
            "session_end": ended,
            # a session.end is the last line, past a chain problem: there, but not verified
            "session_end_unverified": not ended and self.unverified_last_type == "session.end",
            "receipt": None,
        }


def receipt_evidence(ledger: Path) -> dict[str, Any] | None:
    """ops.evidence of the receipt beside `ledger` (receipt.json naming it), if there is one.

    Only a hint for the summary: `docket verify` is what checks a receipt."""
    beside = ledger.parent / "receipt.json"
    try:
        receipt = json.loads(beside.read_text(encoding="utf-8"))
        if receipt["ledger"]["file"] != ledger.name:
            return None
        evidence = receipt["ops"]["evidence"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"unreadable": f"{beside}: {type(exc).__name__}: {exc}"}
    return evidence if isinstance(evidence, dict) else None


def evidence_lines(evidence: dict[str, Any] | None) -> list[str]:
    if evidence is None:
        return []
    said = []
    if evidence["gaps"]:
        said.append(f"{evidence['lost']} events lost in {evidence['gaps']} evidence.gap records")
    if evidence["low_disk"]:
        said.append(f"{evidence['low_disk']} evidence.low_disk warnings")
    receipt = evidence["receipt"]
    if receipt is not None and "unreadable" in receipt:
        said.append(f"receipt unreadable ({receipt['unreadable']})")
    elif receipt is not None and receipt.get("ledger_complete") is False:
        calls = receipt.get("unrecorded_calls")
        said.append(
            f"the receipt discloses {receipt.get('unwritten_events')} unwritten events"
            + (f" and {calls} calls that went upstream unrecorded" if calls else "")
        )
    if evidence.get("session_end_unverified"):
        said.append(
            "a session.end is the last line, but past the chain's problem: not verified, "
            "so what it says of the evidence is not taken"
        )
    elif not evidence["session_end"]:
        said.append("no session.end last: the run was killed, or its end could not be written")
    if evidence["complete"] is True:
        head = "complete (session.end says so)"
    elif evidence["complete"] is False:
        head = "INCOMPLETE"
    else:
        head = "unknown"
    return [f"evidence {head}" + (": " + "; ".join(said) if said else "")]
