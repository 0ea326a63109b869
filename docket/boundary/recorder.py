"""Recorder: the run's one way to its ledger, and the one place that decides what a
full ledger or lost evidence does to the run.

Every event the boundary or the supervisor writes passes `Recorder`: its fields
through the redactor first (no known secret, in any form, reaches the ledger), then
to the ledger writer. When the writer refuses, the Recorder asks the run to stop,
saying why, before the refusal reaches the caller:

    LedgerFull     a ceiling (max_events, max_ledger_bytes): the run cannot go on
                   being recorded, so it stops (exit 42, the ceiling as its cap)
    EvidenceLost   a write failed under fail_fast_evidence (exit 43)

Callers then only choose their answer (a 503 in the provider's shape, a refusal
that says its event could not be written, nothing); none of them decides the stop,
so a new site that records cannot forget to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from docket.boundary.stop import StopRequest
from docket.errors import EXIT_EVIDENCE_LOST
from docket.guards.redact import Redactor
from docket.ledger.limits import EvidenceLost, LedgerFull
from docket.receipts.tally import refusal_rule

if TYPE_CHECKING:  # the writer (and trio) stay out of a light import of this module
    from docket.ledger.pending import ClosingSlot
    from docket.ledger.writer import Ledger

EVIDENCE_LOST_REASON = "evidence could not be written (fail_fast_evidence)"


class Recorder:
    """Appends redacted events; a refused write stops the run, then is re-raised.

    Each method spells out its own try/except rather than sharing a context manager:
    they run on every call's path (the model.request, its closing event), and the
    generator machinery of a @contextmanager showed in the boundary's profiles."""

    __slots__ = ("ledger", "redactor", "_stop", "refused_unrecorded")

    def __init__(
        self, ledger: Ledger, redactor: Redactor, stop: Callable[[StopRequest], None]
    ) -> None:
        self.ledger = ledger
        self.redactor = redactor
        self._stop = stop
        # Calls refused whose refusal has no event on disk (the ledger full, or evidence
        # lost), by the rule the receipt counts them under: session.end carries them.
        self.refused_unrecorded: dict[str, int] = {}

    def refusal_unrecorded(self, event_type: str | None, rule: str) -> None:
        """A call was refused and its refusal event (`event_type`, None when the ledger is
        what refused it) could not be written: count it under its rule."""
        key = refusal_rule(event_type or "policy.denied", rule)
        self.refused_unrecorded[key] = self.refused_unrecorded.get(key, 0) + 1

    async def record(self, type: str, /, **fields: object) -> int | None:
        """Append an event; its seq once durable, None if the write failed and the
        loss is disclosed (the ledger's stats). LedgerFull or EvidenceLost after
        asking the run to stop."""
        try:
            return await self.ledger.append(type, **self.redactor.fields(fields))
        except LedgerFull as full:
            self.ledger_full(full)
            raise
        except EvidenceLost as lost:
            self.evidence_lost(lost)
            raise

    async def record_opening(
        self, type: str, /, *, closing_bytes: int, **fields: object
    ) -> tuple[int | None, ClosingSlot]:
        """`record` for an event that holds room for its closing event: (seq, slot).
        Not cancellable (a cancellation is delivered after it): once a model.request
        is on its way to disk, a stopping run must not leave it without its slot."""
        try:
            return await self.ledger.append_opening(
                type, closing_bytes=closing_bytes, shield=True, **self.redactor.fields(fields)
            )
        except LedgerFull as full:
            self.ledger_full(full)
            raise
        except EvidenceLost as lost:
            self.evidence_lost(lost)
            raise

    async def record_closing(
        self, slot: ClosingSlot, type: str, /, *, optional: Iterable[str] = (), **fields: object
    ) -> int | None:
        """`record` for the event that closes `slot`: no ceiling refuses it. Not
        cancellable, like record_opening: a closing event, once started, is finished."""
        try:
            return await self.ledger.append_closing(
                slot, type, optional=optional, shield=True, **self.redactor.fields(fields)
            )
        except EvidenceLost as lost:
            self.evidence_lost(lost)
            raise

    def check_room(self, type: str, body_bytes: int, *, closing_bytes: int | None = None) -> None:
        """Raise (after asking the run to stop) if the ledger would refuse this event
        now: for work that must not start unless its event can be written."""
        try:
            self.ledger.check_room(type, body_bytes, closing_bytes=closing_bytes)
        except LedgerFull as full:
            self.ledger_full(full)
            raise
        except EvidenceLost as lost:
            self.evidence_lost(lost)
            raise

    def ledger_full(self, full: LedgerFull) -> None:
        self._stop(StopRequest(f"ledger full ({full.reason})", cap=full.reason))

    def evidence_lost(self, lost: EvidenceLost) -> None:
        # The reason stays short and fixed (phases and receipts compare it); what failed
        # is in the ledger's evidence stats and the receipt's evidence section.
        self._stop(StopRequest(EVIDENCE_LOST_REASON, exit_status=EXIT_EVIDENCE_LOST))
