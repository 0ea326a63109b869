"""A real Toxiproxy server (Shopify's `toxiproxy-server`) as a child process.

The embedded proxy (chaos.toxiproxy) serves every test and run by default; this
starts the real one, for what the embedded one cannot prove: that Docket's chaos
runs and game days drive the server staging deployments run.

    python -m chaos.toxiproxy.real [--host 127.0.0.1] -- CMD ARG... {url} ...

starts the server on a free port of `--host`, runs each command (`;;` between
commands) with `{url}` replaced by the server's API URL (also in $TOXIPROXY_URL),
stops the server by its pid, and exits with the first failing command's status.
Where the binary is: $TOXIPROXY_SERVER, else ../shared/tools/toxiproxy/toxiproxy-server
beside the repository (where CI has it) or beside the current folder. No binary:
a one-line message, exit 3, so a caller can tell "absent" from "failed".
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import IO

ENV = "TOXIPROXY_SERVER"
BESIDE_REPO = Path("..") / "shared" / "tools" / "toxiproxy" / "toxiproxy-server"
START_TIMEOUT = 10.0  # seconds for the API to answer
ABSENT = 3


def locate(repo_root: Path | None = None) -> tuple[Path | None, str]:
    """(the binary, or None; where it was looked for, for a skip reason or a message)."""
    given = os.environ.get(ENV)
    if given:
        path = Path(given)
        found = path.is_file() and os.access(path, os.X_OK)
        return (path if found else None), f"${ENV}={given}"
    # the repository this file is in (a source checkout), or the current folder's (an
    # installed wheel, run from the clone as nox does)
    roots = [repo_root] if repo_root else [Path(__file__).resolve().parents[2], Path.cwd()]
    paths = [(root / BESIDE_REPO).resolve() for root in roots]
    for path in paths:
        if path.is_file() and os.access(path, os.X_OK):
            return path, str(path)
    return None, " or ".join(dict.fromkeys(str(p) for p in paths)) + f" (or ${ENV})"


def free_port(host: str) -> int:
    # a port the kernel had free a moment ago; the server binds it straight after
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/version", timeout=1) as answer:  # noqa: S310 - our own URL
            return answer.status == 200
    except OSError:
        return False


@contextmanager
def running(binary: Path, host: str = "127.0.0.1", log: Path | None = None):
    """The server on a free port of `host` until the block ends; yields its API URL."""
    port = free_port(host)
    url = f"http://{host}:{port}"
    out: IO[bytes] | int = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [str(binary), "-host", host, "-port", str(port)], stdout=out, stderr=out
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(url):
            if proc.poll() is not None:
                raise RuntimeError(f"toxiproxy-server exited with status {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"toxiproxy-server: no answer at {url} in {START_TIMEOUT:g} s")
            time.sleep(0.05)  # polling a condition (the API answers), with a deadline
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not isinstance(out, int):  # a log file of ours, not DEVNULL
            out.close()


def split_commands(argv: list[str]) -> list[list[str]]:
    commands: list[list[str]] = [[]]
    for arg in argv:
        if arg == ";;":
            commands.append([])
        else:
            commands[-1].append(arg)
    return [c for c in commands if c]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.toxiproxy.real", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--log", type=Path, default=None, help="the server's output here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    commands = split_commands([a for a in args.command if a != "--"] if args.command else [])
    if not commands:
        parser.error("give a command to run against the server (after --)")
    binary, where = locate()
    if binary is None:
        print(f"no toxiproxy-server at {where}", file=sys.stderr)
        return ABSENT
    with running(binary, args.host, args.log) as url:
        print(f"toxiproxy-server {binary} at {url}", flush=True)
        env = {**os.environ, "TOXIPROXY_URL": url}
        for command in commands:
            command = [a.replace("{url}", url) for a in command]
            print("$ " + " ".join(command), flush=True)
            status = subprocess.run(command, env=env, check=False).returncode
            if status != 0:
                return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
