"""The values a supervised run is given and gives back.

`RunOptions` is what `docket run` (or a harness) asks for, `StopRequest` is why
the supervisor ends a run early (a cap, a full ledger, lost evidence, a signal
during start-up, a fault hook), and `Outcome` is what `Supervisor.run` returns
once the receipt is written. Plain dataclasses, no I/O; split from
docket/supervisor.py, which still exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from docket.errors import EXIT_CAP_KILL

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


@dataclass
class StopRequest:
    """Why the supervisor is ending the run early (a cap, a full ledger, lost evidence)."""

    reason: str
    cap: str | None = None
    exit_status: int = EXIT_CAP_KILL


@dataclass
class Outcome:
    exit_status: int
    reason: str
    cap: str | None
    ledger: Path
    receipt: Path
    # SIGINT/SIGTERM the supervisor caught, by name, in order: a harness that runs
    # the supervisor in its own process learns from this that its user pressed Ctrl-C
    signals: tuple[str, ...] = ()
