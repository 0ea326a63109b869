"""Family `diskfull`: the ledger on a small tmpfs that the agent fills mid-run (root only).

Each point is a real `docket run` whose ledger folder is a fresh tmpfs of its
own. The agent makes some calls through the boundary, fills the filesystem
itself (writes until ENOSPC, then frees a few bytes back, or none), makes more
calls, and exits 0. Points vary when the disk fills, how much room is given
back, the tmpfs size, `min_free_bytes` and `fail_fast_evidence`. Good: a receipt
is found where the docs say (the run folder's receipt.json, or a JSON receipt
on docket run's stderr, the documented fallback) and it discloses the loss:
`ops.evidence.ledger_complete` is false, or it is true and `docket verify`
accepts it and it counts every call the stub saw (the loss was prevented, not
hidden), and where the docs promise an exit code (43 under `fail_fast_evidence`), that
code. Reported beside it: the exit codes seen. A control run, the disk left alone,
must end complete first, so a point fails for the full disk and not for the rig.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from chaos.attack import Figures
from chaos.attack.rig import DOCKET, KEY_ENV, run_env, stub

RUN_TIMEOUT = 60.0  # seconds per point

# The agent: N calls, fill the disk at `mnt` (give back `leave` bytes), M calls, report.
FILLING_AGENT = """\
import errno, json, os, sys, urllib.error, urllib.request
before, after, mnt, leave = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
base, token = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
body = json.dumps({"model": "gpt-4o-mini", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
def call():
    request = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "authorization": "Bearer " + token, "content-type": "application/json"})
    try:
        return opener.open(request, timeout=15).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__
seen = [call() for _ in range(before)]
filler = os.path.join(mnt, "agent-filler")
if leave >= 0:  # -1: the control, which leaves the disk alone
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\\0" * 65536)
                f.flush()
        except OSError as exc:  # filled: the point of this agent
            if exc.errno != errno.ENOSPC:
                raise
if leave > 0:
    os.truncate(filler, max(0, os.path.getsize(filler) - leave))
seen += [call() for _ in range(after)]
print("agent saw:", json.dumps(seen), file=sys.stderr)
"""


@dataclass
class Point:
    name: str
    before: int  # calls before the disk fills
    after: int  # calls after
    size: str = "2m"  # the tmpfs
    leave: int = 0  # bytes freed after filling; -1: no filling (the control)
    ledger: str = "min_free_bytes = 0\n"  # the policy's [ledger] table
    quick: bool = False
    exit: int | None = None  # the exit code the docs promise, where they promise one


POINTS = [
    Point("full before the first call", 0, 5),
    Point("full after 1 call", 1, 5),
    Point("full after 5 calls", 5, 20, quick=True),
    Point("full after 5 calls, 1 KiB given back", 5, 10, leave=1024),
    Point("full after 5 calls, 8 KiB given back", 5, 10, leave=8192),
    Point("full after 5 calls, fail_fast_evidence", 5, 10,
          ledger="min_free_bytes = 0\nfail_fast_evidence = true\n", quick=True, exit=43),
    Point("24 MiB tmpfs, default min_free_bytes (16 MiB)", 5, 10, size="24m", ledger=""),
    Point("64 KiB tmpfs, min_free_bytes 0", 2, 5, size="64k"),
    Point("full after 12 calls", 12, 5),
]  # fmt: skip


# The same run with the disk left alone: must end with a complete receipt that verifies and
# counts every call, so a point fails for the full disk and not for the rig.
CONTROL = Point("control: the disk never fills", 3, 3, leave=-1)


def cannot_run() -> str | None:
    if os.geteuid() != 0:
        return "not root: mounting a tmpfs needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount not found"
    return None


def receipts(run_dir: Path, stderr: str) -> list[tuple[str, dict]]:
    """Every receipt the run left: (where, receipt) from the run folder and from stderr."""
    found = []
    for path in sorted(run_dir.rglob("*.json")):
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(obj, dict) and "ops" in obj:
            found.append((str(path.name), obj))
    for line in stderr.splitlines():
        start = line.find("{")
        if start == -1:
            continue
        try:
            obj = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(obj, dict) and "ops" in obj:
            found.append(("stderr", obj))
    return found


def upstream_calls(stub_url: str) -> int:
    with urllib.request.urlopen(stub_url + "/_stub/log", timeout=10) as answer:
        return sum(1 for line in answer.read().splitlines() if line.strip())


def attempt(point: Point, folder: Path) -> tuple[bool, int | str, str]:
    """(disclosed?, exit code, one line saying what was found)."""
    folder.mkdir(parents=True)
    mnt = folder / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={point.size},mode=0700", "tmpfs",
                    str(mnt)], check=True, capture_output=True, timeout=30)  # fmt: skip
    try:
        agent = folder / "agent.py"
        agent.write_text(FILLING_AGENT)
        with stub(folder) as url:
            policy = folder / "p.toml"
            policy.write_text(
                f'[providers.openai]\nkind = "openai"\nbase_url = "{url}"\nkey_env = "{KEY_ENV}"\n'
                f"[ledger]\n{point.ledger}"
            )
            run_dir = mnt / "run"
            argv = [*DOCKET, "run", "--policy", str(policy), "--ledger-dir", str(run_dir), "--",
                    "python3", str(agent), str(point.before), str(point.after), str(mnt),
                    str(point.leave)]  # fmt: skip
            try:
                done = subprocess.run(argv, capture_output=True, timeout=RUN_TIMEOUT,
                                      env=run_env(), check=False)  # fmt: skip
                code: int | str = done.returncode
                stderr = done.stderr.decode("utf-8", "replace")
            except subprocess.TimeoutExpired as exc:
                code, stderr = "timeout", (exc.stderr or b"").decode("utf-8", "replace")
            upstream = upstream_calls(url)
        found = receipts(run_dir, stderr)
        last = stderr.strip().splitlines()[-1][:200] if stderr.strip() else "(stderr empty)"
        if not found:
            return (
                False,
                code,
                f"no receipt in the run folder or on stderr; {upstream} calls "
                f"went upstream; last stderr line: {last}",
            )
        where, receipt = found[0]
        evidence = receipt.get("ops", {}).get("evidence", {})
        if evidence.get("ledger_complete") is False:
            return True, code, f"receipt ({where}) says ledger_complete false: {evidence}"
        calls = receipt.get("totals", {}).get("model_calls")
        verified = (
            subprocess.run([*DOCKET, "verify", str(run_dir / "receipt.json")],
                           capture_output=True, timeout=60, check=False).returncode
            if where != "stderr" else None
        )  # fmt: skip
        ok = verified == 0 and calls == upstream
        return ok, code, (f"receipt ({where}) says ledger_complete {evidence.get('ledger_complete')}"
                          f", {calls} model calls; stub saw {upstream}; verify exit {verified}")  # fmt: skip
    finally:
        done_umount = subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)
        if done_umount.returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("diskfull")
    reason = cannot_run()
    if reason:
        figures.skipped = reason
        return figures
    ok, code, said = attempt(CONTROL, folder / "diskfull" / "control")
    if not ok:
        raise RuntimeError(f"the control run failed (exit {code}): {said}")
    exits: dict[str, int] = {}
    for n, point in enumerate(p for p in POINTS if p.quick or not quick):
        good, code, said = attempt(point, folder / "diskfull" / f"point{n}")
        if point.exit is not None and code != point.exit:
            good, said = False, f"wanted exit {point.exit} (docs/resilience.md); {said}"
        exits[str(code)] = exits.get(str(code), 0) + 1
        figures.add(good, f"diskfull {point.name!r}: tmpfs size={point.size}, [ledger] "
                          f"{point.ledger.strip() or '(defaults)'!r}, agent makes {point.before} "
                          f"calls, fills the disk, gives back {point.leave} bytes, makes "
                          f"{point.after} more -> exit {code}; {said}")  # fmt: skip
    figures.extra = {"exit_codes": exits}
    return figures
