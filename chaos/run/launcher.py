"""Several agents under one supervised command: `python -m chaos.run.launcher PLAN.json`.

The supervisor runs one command; a chaos scenario may name several agents that
run at once. This launcher is that command: it starts every agent of the plan
(in its own process group, so the supervisor's signals reach them all), sends
each one's stdout and stderr to its own file (the engine reads an agent's report,
its last JSON line, from there), waits for all of them, and exits with the first
non-zero status in plan order (128 + N for an agent killed by signal N), or 0.

Each agent is bound to the launcher by PR_SET_PDEATHSIG, as the launcher is to
the supervisor (docket.run.launch), so a killed supervisor leaves no agent behind.
Each agent's pid goes to its `pidfile` (agents/NAME.pid, the pid as text),
written by the agent's own process between fork and exec: it is on disk before
the agent runs a line of its own, so whoever checks afterwards that no agent
outlived its supervisor knows every pid to look for.

SIGINT and SIGTERM reach the agents directly (the supervisor signals the whole
group), so the launcher only notes them and keeps waiting: it ends when its
agents do, with their status, and never leaves one unwaited.

A plan entry: {"name", "argv", "env": {...}, "route": "/openai/v1" or null,
"kind": "openai", "stdout": path, "stderr": path, "pidfile": path, "exitfile": path}
(the agent's own exit status, written when it has been waited for). `route` is
appended to DOCKET_BOUNDARY_URL to give the agent its provider's door.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
BASE_URL_ENV = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


def agent_env(base: dict[str, str], entry: dict) -> dict[str, str]:
    env = base | entry["env"]
    route = entry.get("route")
    boundary = base.get("DOCKET_BOUNDARY_URL")
    if route and boundary:
        url = boundary + route
        env["DOCKET_AGENT_BASE_URL"] = url
        env["DOCKET_AGENT_PROVIDER"] = entry["kind"]
        env[BASE_URL_ENV[entry["kind"]]] = url  # for a command agent using an SDK
    return env


EXIT_ORPHANED = 126


def _in_the_agent(launcher: int, pidfile: str | None) -> Callable[[], None]:
    """What the agent's process does between fork and exec (this process has one thread)."""

    def before_exec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher:
            os._exit(EXIT_ORPHANED)  # the launcher died before the death signal was armed
        if pidfile is not None:
            # written whole, then renamed: a reader never sees half a pid
            partial = f"{pidfile}.part"
            with open(partial, "w", encoding="ascii") as f:
                f.write(f"{os.getpid()}\n")
            os.replace(partial, pidfile)

    return before_exec


def _note_signal(signum: int, frame) -> None:
    # The agents, in our process group, got the same signal; they decide what it means.
    # os.write, not print: a handler that runs inside a buffered write must not re-enter it
    os.write(2, f"chaos launcher: {signal.Signals(signum).name}; waiting for the agents\n".encode())


def shell_status(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("chaos launcher: usage: python -m chaos.run.launcher PLAN.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        plan = json.load(f)
    base = dict(os.environ)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _note_signal)
    children: list[subprocess.Popen | None] = []  # None: that agent never started
    for entry in plan:
        pidfile = entry.get("pidfile")
        with open(entry["stdout"], "wb") as out, open(entry["stderr"], "wb") as err:
            try:
                children.append(
                    subprocess.Popen(
                        entry["argv"],
                        env=agent_env(base, entry),
                        stdout=out,
                        stderr=err,
                        preexec_fn=_in_the_agent(os.getpid(), pidfile),  # noqa: PLW1509 - one thread
                    )
                )
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                # ValueError: an argv or env string holding a NUL (exec takes C strings)
                err.write(f"chaos launcher: cannot start {entry['argv'][0]}: {exc}\n".encode())
                children.append(None)
                if pidfile is not None and os.path.exists(pidfile):
                    os.unlink(pidfile)  # that process never ran the agent and is gone
    statuses = [127 if child is None else shell_status(child.wait()) for child in children]
    for entry, status in zip(plan, statuses, strict=True):
        if entry.get("exitfile"):  # each agent's own status (the launcher exits with one)
            try:
                with open(entry["exitfile"], "w", encoding="ascii") as f:
                    f.write(f"{status}\n")
            except OSError as exc:  # the status still reaches the supervisor as ours
                print(f"chaos launcher: cannot write {entry['exitfile']}: {exc}", file=sys.stderr)
    return next((s for s in statuses if s != 0), 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
