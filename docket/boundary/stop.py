"""StopRequest: why a run is to end early, as the boundary (or the supervisor) asks it.

The boundary asks for a stop when a cap with on_breach = kill is breached, the
ledger is full or evidence could not be written; it calls the `stop` it was
given with a StopRequest. The supervisor (docket.run.supervisor) gives that
`stop` and makes its own requests (a signal during start-up, a hook, the
wall-clock cap). Defined here, on the boundary's side, so that the run depends
on the boundary and never the other way.
"""

from __future__ import annotations

from dataclasses import dataclass

from docket.errors import EXIT_CAP_KILL


@dataclass
class StopRequest:
    """Why the supervisor is ending the run early (a cap, a full ledger, lost evidence)."""

    reason: str
    cap: str | None = None
    exit_status: int = EXIT_CAP_KILL
