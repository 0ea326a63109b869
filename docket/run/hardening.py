"""What the supervisor asks of the kernel for itself: prctl, via ctypes on libc.

Non-dumpable (PR_SET_DUMPABLE 0): the supervisor holds the provider keys, in its
memory and in the environment it was started with, and /proc/<pid>/environ,
/proc/<pid>/mem and ptrace are open to every process of the same user, the
agent included. A non-dumpable process's /proc files belong to root and
ptrace needs CAP_SYS_PTRACE, so the agent (same user, no capabilities) can read
none of them. Root on the same machine still can: that is a limit, not a bug.
`docket run` asks for it first thing (docket.cli.main, before anything reads a
key from the environment), so a process of an earlier run still polling /proc
has no window to read the next run's key but the interpreter's own start-up;
the supervisor asks again (a no-op then) to record what the kernel said.

Child subreaper (PR_SET_CHILD_SUBREAPER): a process the agent detaches (setsid,
a double fork) is re-parented to the nearest subreaper instead of init, so it
comes back to the supervisor, which ends and records it with the run.

Linux only. Elsewhere, or if the call fails, each function returns the reason
it could not, and the run says so (session.start's `hardening`, a warning line).
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int) -> str | None:
    """None when the call succeeded, else why not."""
    if sys.platform != "linux":
        return f"prctl is Linux only (this is {sys.platform})"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        return f"cannot load libc: {exc}"
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        return f"prctl failed: {os.strerror(ctypes.get_errno())}"
    return None


def make_non_dumpable() -> str | None:
    """Close this process's environ, memory and ptrace to same-user processes."""
    return _prctl(PR_SET_DUMPABLE, 0)


def set_subreaper(on: bool = True) -> str | None:
    """Make this process (or stop it being) the reaper of its descendants' orphans."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def raise_nofile() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one; (soft before, soft now).

    The boundary holds a descriptor per agent connection and per upstream
    connection: a soft limit of 256 or 1024 (a desktop's default) is reached by an
    agent's idle connections long before the hard limit is. The agent inherits the
    raised limit, as it would under any service manager that sets it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, hard
