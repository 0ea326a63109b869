"""The values a supervised run is given and gives back.

`RunOptions` is what `docket run` (or a harness) asks for and `RunOutcome` is what
`Supervisor.run` returns once the receipt is written (why a run ends early,
StopRequest, is docket.boundary.stop's: the boundary makes most of them).
Plain dataclasses, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL


@dataclass
class RunOptions:
    command: list[str]
    policy_path: str | None = None
    ledger_dir: str | None = None
    max_wall_clock: float | None = None  # a hard stop, whatever caps.on_breach says
    budget_mode: str | None = None  # overrides caps.budget_mode ("usd" | "quota")
    grace_seconds: float = GRACE_SECONDS
    extra_env: dict[str, str] = field(default_factory=dict)
    stdout: IO | None = None  # the child's stdout (default: ours), e.g. a file to read its report
    stderr: IO | None = None
    # --snapshot: the trees copied before the child starts (docket.snapshot); empty: none
    snapshot: tuple[str, ...] = ()
    rollback_on_breach: bool = False  # a cap's stop (exit 42) restores them before the receipt
    snapshot_store: str | None = None  # default: .docket-snapshot-store beside the run's folder


@dataclass
class RunOutcome:
    exit_status: int
    reason: str
    cap: str | None
    ledger: Path
    receipt: Path | None
    # SIGINT/SIGTERM the supervisor caught, by name, in order: a harness that runs
    # the supervisor in its own process learns from this that its user pressed Ctrl-C
    signals: tuple[str, ...] = ()
    evidence: dict | None = None  # the writer's account (ops.evidence and more)
    # Why the receipt is not at `receipt` in the run's folder (then `receipt` is the
    # fallback copy, or None: it went to stderr only), or None.
    receipt_error: str | None = None
    notes: tuple[str, ...] = ()  # warnings for the user, printed before the last line
