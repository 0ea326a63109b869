"""Run a command as a child subreaper that reaps what is orphaned below it, as init would:
`python tests/reaper.py -- ARGV...`, exiting with the command's status.

The suite's game day runs under it (tests/conftest.py). A phase orphans processes on
purpose (supervisor-killed SIGKILLs a `docket run`), and an orphan goes to the nearest
ancestor that is a child subreaper: without this, the pytest worker, once an in-process
Supervisor test has made it one. A Supervisor test running there at that moment counted
them as its own run's orphans (test_cache_run saw four process.orphan events so, in the
coverage session on 2026-12-03). Here they come back to this process and are reaped at
once, as under `nox -s gameday`, where init takes them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from docket.run.hardening import set_subreaper

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(argv: list[str]) -> int:
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: reaper.py -- ARGV...", file=sys.stderr)
        return 2
    command = argv[1:]
    why = set_subreaper()
    if why is not None:
        print(f"reaper.py: cannot become a subreaper: {why}", file=sys.stderr)
        return 1
    libc = ctypes.CDLL(None, use_errno=True)
    child = os.fork()
    if child == 0:
        # Killed with this process (a timeout that kills the reaper ends the command too).
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            os.execv(command[0], command)
        except OSError as exc:
            print(f"reaper.py: cannot run {command[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    while True:
        pid, status = os.waitpid(-1, 0)  # the command, or an orphan it left
        if pid == child:
            break
    # The command is over: reap the orphans already dead; the living ones (none, when
    # the game day ends as it should) go on to this process's own parent's reaper.
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
