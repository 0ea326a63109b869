"""Several agents under one supervised command: `python -m chaos.launcher PLAN.json`.

The supervisor runs one command; a chaos scenario may name several agents that
run at once. This launcher is that command: it starts every agent of the plan
(in its own process group, so the supervisor's signals reach them all), sends
each one's stdout and stderr to its own file (the engine reads an agent's report,
its last JSON line, from there), waits for all of them, and exits with the first
non-zero status in plan order (128 + N for an agent killed by signal N), or 0.

Each agent is bound to the launcher by PR_SET_PDEATHSIG, as the launcher is to
the supervisor (docket.launch), so a killed supervisor leaves no agent behind.

A plan entry: {"name", "argv", "env": {...}, "route": "/openai/v1" or null,
"kind": "openai", "stdout": path, "stderr": path}. `route` is appended to
DOCKET_BOUNDARY_URL to give the agent its provider's door.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys

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


def _bind_to_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def shell_status(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("chaos launcher: usage: python -m chaos.launcher PLAN.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        plan = json.load(f)
    base = dict(os.environ)
    children = []
    for entry in plan:
        with open(entry["stdout"], "wb") as out, open(entry["stderr"], "wb") as err:
            try:
                children.append(
                    subprocess.Popen(
                        entry["argv"],
                        env=agent_env(base, entry),
                        stdout=out,
                        stderr=err,
                        preexec_fn=_bind_to_parent,  # noqa: PLW1509 - this process has one thread
                    )
                )
            except OSError as exc:
                err.write(f"chaos launcher: cannot start {entry['argv'][0]}: {exc}\n".encode())
                children.append(None)
    statuses = [127 if child is None else shell_status(child.wait()) for child in children]
    return next((s for s in statuses if s != 0), 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
