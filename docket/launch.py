"""The supervised child's first instant: bind its life to the supervisor's, then exec.

`python -m docket.launch SUPERVISOR_PID -- CMD ...` asks the kernel to SIGKILL
this process when its parent dies (PR_SET_PDEATHSIG), checks the parent did not
die before that request took effect, and execs CMD in place (the pid, the
process group and the death signal carry over). Doing this here rather than in
a subprocess preexec_fn keeps fork free of Python code while the supervisor has
threads (the ledger's writer), which the subprocess docs warn can deadlock.

The kernel sends the death signal when the *thread* that forked this process
ends, not the whole supervisor: the supervisor must spawn from a thread that
lives as long as the run (its main thread), never from a worker pool.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127

# Python ignores these at start-up and exec keeps an ignored signal ignored: an
# agent must start with them at their defaults, as subprocess's restore_signals does.
RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


def restore_default_signals() -> None:
    # Only these: a signal our caller ignored on purpose (SIGINT for a background
    # job) stays ignored, and exec resets every handled one to its default anyway.
    for sig in RESTORED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("docket launch: usage: python -m docket.launch PID -- CMD ...", file=sys.stderr)
        return 2
    supervisor, command = int(argv[0]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        print(f"docket launch: prctl failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    if os.getppid() != supervisor:
        # The supervisor died before the death signal was armed: do not run orphaned.
        print(f"docket launch: supervisor {supervisor} is gone; not starting", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    restore_default_signals()
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        print(f"docket: command not found: {command[0]}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except OSError as exc:
        print(f"docket: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    return EXIT_CANNOT_EXEC  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
