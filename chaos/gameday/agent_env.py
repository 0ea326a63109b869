"""`python -m chaos.gameday.agent_env -- CMD ARGS`: the user's agent, with only the boundary in reach.

A game day runs the team's own agent in a phase (chaos.gameday.your_agent). It
gets what `docket run` gives any agent (docket.run.child.child_env: base URLs and
a run token for the boundary, HTTP(S)_PROXY through it), but it also inherits the
shell's environment, where a team may keep e.g. AZURE_OPENAI_ENDPOINT or
LITELLM_API_BASE pointing at a real provider. This drops every variable whose
value is a URL to anywhere but the boundary, says which on stderr, and then
execs the command (same pid, so the launcher's pidfile and signals stay right).
What is left can only reach the boundary, whose egress allows only the phase's
stubs. It also lowers the agent's CPU priority a little (NICENESS): the reference
agents beside it must drive each phase's mechanism in time (a cap at 5 s of wall
clock, a breaker within its cooldown), and a user agent importing a large SDK on a
busy two-core runner must not starve them; the user's agent still runs, only second.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

NICENESS = 5
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXEC = 126
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _authority(url: str) -> tuple[str, int | None] | None:
    try:
        parts = urlsplit(url.strip())
        return (parts.hostname or "", parts.port)
    except ValueError:
        return None


def outside_urls(env: Mapping[str, str]) -> list[str]:
    """Names of variables holding a URL (anywhere in the value) that is not the boundary's."""
    boundary = _authority(env.get("DOCKET_BOUNDARY_URL", ""))
    out = []
    for name, value in env.items():
        if not _URL.search(value):
            continue
        urls = [part for part in re.split(r"[\s,;]+", value) if _URL.match(part)]
        if not urls or any(boundary is None or _authority(u) != boundary for u in urls):
            out.append(name)
    return sorted(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("agent_env: usage: python -m chaos.gameday.agent_env -- CMD ARGS", file=sys.stderr)
        return 2
    env = dict(os.environ)
    dropped = outside_urls(env)
    for name in dropped:
        env.pop(name)
    if dropped:
        print(
            f"docket game-day: not passed to the agent (URLs outside the boundary): "
            f"{', '.join(dropped)}",
            file=sys.stderr,
            flush=True,
        )
    try:
        os.nice(NICENESS)
    except OSError as exc:  # not allowed here (a container's seccomp): said, then on
        print(f"docket game-day: agent left at its priority: {exc.strerror}", file=sys.stderr)
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        print(f"docket game-day: {argv[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    except OSError as exc:
        print(f"docket game-day: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    return EXIT_CANNOT_EXEC  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
