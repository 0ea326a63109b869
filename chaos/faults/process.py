"""The process fault family: SIGTERM or SIGKILL to the supervisor or the agent.

`who=agent` signals the supervised child's process group (the agent and
anything it started), as an OOM killer or an operator would; `who=supervisor`
signals the process the recorder runs in. The supervisor handles SIGTERM (it
forwards it to the agent and ends the run legibly); SIGKILL it cannot handle,
which is the point: the ledger must then hold a clean prefix, no receipt, and
a fault.injected saying why. A harness that runs the supervisor in its own
process (chaos.run.here does, in a worker, for sigkill(supervisor)) survives that.

Fired on the run's events or at a time (chaos.faults.triggers), at most once
per fault. The `fault.injected` record is durable BEFORE the signal is sent.
"""

from __future__ import annotations

import os
import signal

from chaos.faults.grammar import Fault
from docket.run.hooks import RunHandle

TARGET = "process"
SIGNALS = {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}


def signal_of(fault: Fault) -> signal.Signals:
    if fault.target != TARGET:
        raise ValueError(f"{fault.text} is not a process fault")
    return SIGNALS[fault.kind]


def kills_supervisor(faults) -> bool:
    """Whether a process running these faults' supervisor would be killed outright."""
    return any(
        f.target == TARGET and f.kind == "sigkill" and f.arg("who") == "supervisor" for f in faults
    )


def send(fault: Fault, handle: RunHandle) -> str | None:
    """Send the fault's signal; None if sent, else why not (the agent was gone)."""
    sig = signal_of(fault)
    if fault.arg("who") == "supervisor":
        os.kill(handle.supervisor_pid, sig)
        return None
    pid = handle.child_pid
    if pid is None:
        return "no agent was running"
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return "the agent's process group was already gone"
    return None
