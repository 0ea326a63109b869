"""The container image's recipe (Containerfile): the lines a deployment relies on, the
policy it copies, and its health check run against a real boundary.

No base image can be pulled on the machine this suite was written on, so the image is
not built here (docs/deploy.md); what can be checked without building it is.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import trio

from docket.policy import load_policy

ROOT = Path(__file__).resolve().parent.parent
CONTAINERFILE = ROOT / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in CONTAINERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def one(name: str) -> str:
    (found,) = [rest for word, rest in instructions() if word == name]
    return found


def test_it_stops_on_sigterm_as_a_user_with_the_runs_in_a_volume():
    assert one("STOPSIGNAL") == "SIGTERM"
    user = one("USER")
    assert user not in ("root", "0") and not user.startswith(("root:", "0:"))
    volumes = json.loads(one("VOLUME"))
    assert one("WORKDIR") == "/runs" in volumes  # docket-runs/<id>/ lands in the volume
    assert "docket:docket /runs" in " ".join(r for w, r in instructions() if w == "RUN")
    # the last USER comes after every RUN that needs root
    words = [w for w, _ in instructions()]
    assert max(i for i, w in enumerate(words) if w == "RUN") < words.index("USER")


def test_the_entrypoint_runs_the_copied_policy_and_the_health_check_asks_its_port():
    entry = json.loads(one("ENTRYPOINT"))
    assert entry[:3] == ["docket", "run", "--policy"] and entry[-1] == "--"
    (copied,) = [r.split() for w, r in instructions() if w == "COPY" and r.endswith(entry[3])]
    policy = load_policy(ROOT / copied[0])  # the file the image copies, read as docket reads it
    assert policy.boundary.host == "127.0.0.1" and policy.boundary.port == 8787
    check = one("HEALTHCHECK")
    assert f"http://127.0.0.1:{policy.boundary.port}/docket/healthz" in check


async def test_the_health_check_passes_against_a_boundary_and_fails_without_one(
    stub_server, boundary_rig
):
    """The HEALTHCHECK's own command, pointed at a real boundary's port: exit 0 while
    it serves, non-zero once it has stopped."""
    check = one("HEALTHCHECK")
    argv = json.loads(check[check.index("CMD") + 3 :].strip())
    assert argv[0] == "python"

    def run_check(port: int) -> int:
        code = argv[2].replace(":8787/", f":{port}/")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=20)
        return done.returncode

    with trio.fail_after(30):
        async with stub_server("openai") as up, boundary_rig({"openai": up}) as rig:
            port = int(rig.url.rsplit(":", 1)[1])
            serving = await trio.to_thread.run_sync(run_check, port)
        stopped = await trio.to_thread.run_sync(run_check, port)
    assert serving == 0, shlex.join(argv)
    assert stopped != 0
