"""Live targets for the probes: a stub provider and a real `docket run`, as processes.

`live_run(folder)` starts `docket stub` on 127.0.0.1, writes a policy pointing at
it, and starts `docket run` with a small agent that reports its environment (the
boundary URL and the run token, as any agent would see them) to a file outside
the run folder and then waits on its stdin. The probes talk to the boundary
from this process; closing the agent's stdin ends the run normally, so the
receipt is written. Everything started is stopped on the way out, by pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

DOCKET = [sys.executable, "-m", "docket"]
KEY_ENV = "ATTACK_STUB_KEY"
PROVIDER_KEY = "sk-attack-provider-key-5f0c1a9e77d24b3c"  # what only the supervisor may hold
START_TIMEOUT = 30.0  # seconds for a process to report that it is up (2 shared cores)
STOP_TIMEOUT = 30.0

# The agent: report what it was given, then wait until the harness closes stdin.
WAITING_AGENT = """\
import json, os, sys
keep = ("DOCKET_BOUNDARY_URL", "DOCKET_RUN_TOKEN", "OPENAI_BASE_URL")
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    json.dump({k: os.environ.get(k) for k in keep}, f)
os.replace(tmp, sys.argv[1])
sys.stdin.read()
"""


@dataclass
class Live:
    url: str  # the boundary, http://127.0.0.1:PORT
    token: str  # the run token the agent holds
    run_dir: Path  # --ledger-dir: ledger, receipt, sidecars
    stub_url: str
    process: subprocess.Popen
    result: dict  # filled when the run ends: exit, stderr

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        if port is None:
            raise RuntimeError(f"the boundary's URL names no port: {self.url}")
        return port


def wait_for(predicate, timeout: float, what: str):
    """Poll `predicate` until truthy; raise TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def stop(process: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> int:
    """SIGTERM, then SIGKILL if it outlives `timeout`; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout)


@contextmanager
def stub(folder: Path, kind: str = "openai") -> Iterator[str]:
    """`docket stub` on a free port of 127.0.0.1; its URL."""
    with open(folder / f"stub-{kind}.err", "wb") as err:
        process = subprocess.Popen(
            [*DOCKET, "stub", "--kind", kind, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    assert process.stdout is not None  # stdout=PIPE
    try:
        line = process.stdout.readline().decode()  # "stub openai listening on URL"
        if "listening on " not in line:
            raise RuntimeError(f"docket stub did not start: {line!r}")
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        stop(process)
        process.stdout.close()


def policy_text(stub_url: str, extra: str = "", more: dict[str, str] | None = None) -> str:
    """A policy: route `openai` to the stub, each of `more` (name -> URL) to its own
    OpenAI-shaped upstream, all with the one key, then `extra` verbatim."""
    routes = {"openai": stub_url, **(more or {})}
    return (
        "".join(
            f'[providers.{name}]\nkind = "openai"\nbase_url = "{url}"\nkey_env = "{KEY_ENV}"\n'
            for name, url in routes.items()
        )
        + extra
    )


def run_env(**more: str) -> dict:
    env = dict(os.environ)
    env[KEY_ENV] = PROVIDER_KEY
    env.pop("DOCKET_DEBUG", None)
    env.update(more)
    return env


@contextmanager
def live_run(
    folder: Path, *, policy_extra: str = "", name: str = "run", more: dict[str, str] | None = None
) -> Iterator[Live]:
    """A stub and a supervised run whose agent waits; the run ends normally on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    run_dir = folder / name
    info = folder / f"{name}-agent-env.json"  # outside run_dir: the search must not see it
    agent = folder / "waiting_agent.py"
    agent.write_text(WAITING_AGENT)
    with stub(folder) as stub_url:
        policy = folder / f"{name}.toml"
        policy.write_text(policy_text(stub_url, policy_extra, more))
        # The child keeps its own copies of these descriptors; ours close once it started.
        with open(folder / f"{name}.out", "wb") as out, open(folder / f"{name}.err", "wb") as err:
            process = subprocess.Popen(
                [*DOCKET, "run", "--policy", str(policy), "--ledger-dir", str(run_dir), "--",
                 sys.executable, str(agent), str(info)],
                stdin=subprocess.PIPE, stdout=out, stderr=err, env=run_env(),
            )  # fmt: skip
        result: dict = {}
        try:
            wait_for(
                lambda: info.exists() or process.poll() is not None, START_TIMEOUT, "the agent"
            )
            if not info.exists():
                raise RuntimeError(f"docket run ended at start: {_tail(folder / f'{name}.err')}")
            given = json.loads(info.read_text())
            yield Live(
                given["DOCKET_BOUNDARY_URL"], given["DOCKET_RUN_TOKEN"], run_dir, stub_url,
                process, result,
            )  # fmt: skip
        finally:
            assert process.stdin is not None  # stdin=PIPE
            process.stdin.close()  # the agent's stdin ends: it exits, the run ends
            try:
                result["exit"] = process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                result["exit"] = stop(process, 5)
            result["stderr"] = (folder / f"{name}.err").read_text(errors="replace")
            result["stdout"] = (folder / f"{name}.out").read_text(errors="replace")


def _tail(path: Path) -> str:
    text = path.read_text(errors="replace").strip().splitlines()
    return text[-1] if text else "(nothing on stderr)"
