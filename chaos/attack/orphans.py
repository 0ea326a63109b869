"""Family `orphans`: an agent of the same user tries to outlive its run.

Each probe is a real `docket run` against a stub provider whose agent makes one
call through the boundary, then leaves something behind by one technique: a
double fork with setsid, a fork chain deeper than any number of sweep rounds, a
fork bomb (grown to a count, then every member replacing itself with a fork
as fast as it can), a process that ignores SIGTERM, one that re-parents itself
at every turn, one that stops itself with SIGSTOP, two that wake each other with
SIGCONT, one that makes itself a child subreaper, a shell's `setsid` daemon, and
a snooper that polls /proc for the next run's key while it forks (then a second
`docket run` with another key is made). The agent exits 0 once what it left is
established.

Every process of a run carries the probe's mark in its environment (the agent's
is inherited), so what outlived the run is found by reading every
/proc/*/environ right after `docket run` exits. Good: `docket run` exited 0,
nothing with the mark is alive, the ledger names no survivor, and, for the
snooper, the next run's key is in nothing it wrote. Reported: how many processes
outlived their run (0 is the figure), the ledger's `process.orphan` account, and
the isolation each run had (`cgroup` as root here; `pid_namespace` as a user
without a cgroup; `signals` where neither can be had). The full form runs every
probe again as uid 65534 (setpriv), where the supervisor may make no cgroup and
the run's pid namespace (docket/run/pid_namespace.py) ends it.
Whatever is found alive is frozen and killed before the next probe.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from chaos.attack import Figures
from chaos.attack.rig import DOCKET, KEY_ENV, policy_text, run_env, stub

NOBODY = 65534
AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--")
RUN_TIMEOUT = 180.0  # seconds for one `docket run` (a 200-link chain takes a while on 2 cores)
MARK_ENV = "DOCKET_ORPHAN_PROBE"  # in every process of a probe's run

PRELUDE = """\
import ctypes, json, os, signal, subprocess, sys, time, urllib.request
out = sys.argv[1]

def mark(name):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))

def idle(seconds=120.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)

def call():
    body = json.dumps({"model": "gpt-4o-mini", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=body, headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                            "content-type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=15) as answer:
        answer.read()

call()
"""

# The agent leaves once its technique is established (`ready`), or gives up (99).
EPILOGUE = """
deadline = time.monotonic() + 50
while not os.path.exists(os.path.join(out, "ready")):
    if time.monotonic() > deadline:
        sys.exit(99)
    time.sleep(0.01)
sys.exit(0)
"""

TECHNIQUES = {
    "double fork, setsid": """
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        mark("ready")
        idle()
    os._exit(0)
""",
    "fork chain": """
if os.fork() == 0:
    for link in range(N):
        os.setsid()
        if link == N - 1:
            mark("ready")
            idle()
            os._exit(0)
        if os.fork():
            idle()
            os._exit(0)
""",
    "fork bomb to a count, then churning": """
# Grow to N members, each in a session of its own; then every member forks its
# replacement and exits, again and again: no pid holds still to be killed.
births = os.path.join(out, "births")
open(births, "wb").close()
if os.fork() == 0:
    os.setsid()
    while os.path.getsize(births) < N:
        with open(births, "ab") as f:
            f.write(b".")
        if os.fork() == 0:
            os.setsid()
    if not os.path.exists(os.path.join(out, "ready")):
        mark("ready")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.fork():
            os._exit(0)
        time.sleep(0.005)
    os._exit(0)
""",
    "ignores SIGTERM": """
if os.fork() == 0:
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    mark("ready")
    idle()
    os._exit(0)
""",
    "re-parents at every turn": """
if os.fork() == 0:
    os.setsid()
    mark("ready")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.fork():
            os._exit(0)  # the child is handed to a reaper: a new pid, a new parent
""",
    "stops itself with SIGSTOP": """
if os.fork() == 0:
    os.setsid()
    mark("ready")
    os.kill(os.getpid(), signal.SIGSTOP)
    idle()
    os._exit(0)
""",
    "two wake each other with SIGCONT": """
if os.fork() == 0:
    os.setsid()
    partner = os.fork()
    if partner == 0:
        partner = os.getppid()
    else:
        mark("ready")
    deadline, partner_gone = time.monotonic() + 120, 0
    while time.monotonic() < deadline:
        try:
            os.kill(partner, signal.SIGCONT)
        except ProcessLookupError:  # its partner was killed: this one keeps trying to live
            partner_gone += 1
    os._exit(0)
""",
    "its own child subreaper": """
if os.fork() == 0:
    os.setsid()
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come here
    if os.fork() == 0:
        if os.fork() == 0:
            mark("ready")
            idle()
        os._exit(0)
    idle()
    os._exit(0)
""",
    "a shell's setsid daemon": """
subprocess.run(["sh", "-c", "setsid sh -c 'trap \\"\\" TERM HUP; sleep 30' "
                "</dev/null >/dev/null 2>&1 & echo started > ready.tmp; mv ready.tmp ready"],
               cwd=out, check=True)
""",
    "snooper for the next run's key": """
# At the end of a chain deeper than the old sweep's 64 rounds: a process that forks a
# worker for every pass over /proc and writes down each environ or cmdline holding
# the variable the next run's key is in.
name = (os.environ["SNOOPED"] + "=").encode()
if os.fork() == 0:
    for link in range(70):
        os.setsid()
        if os.fork():
            idle()
            os._exit(0)
    mark("ready")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        worker = os.fork()
        if worker:
            os.waitpid(worker, 0)
            continue
        found = []
        for entry in os.listdir("/proc"):
            for what in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{entry}/{what}", "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                at = data.find(name)
                if at != -1:
                    found.append(data[at : at + 200].split(b"\\0")[0])
        if found:
            with open(os.path.join(out, "found"), "ab") as f:
                f.write(b"\\n".join(found) + b"\\n")
        os._exit(0)
""",
}


@dataclass
class EscapeProbe:
    technique: str
    count: int = 0  # N: links of a chain, members of a bomb
    quick: bool = False


PROBES = [
    EscapeProbe("double fork, setsid"),
    EscapeProbe("fork chain", 80, quick=True),
    EscapeProbe("fork chain", 200),
    EscapeProbe(
        "fork bomb to a count, then churning", 60
    ),  # not quick: it starves what runs beside
    EscapeProbe("fork bomb to a count, then churning", 250),
    EscapeProbe("ignores SIGTERM"),
    EscapeProbe("re-parents at every turn"),
    EscapeProbe("stops itself with SIGSTOP", quick=True),
    EscapeProbe("two wake each other with SIGCONT"),
    EscapeProbe("its own child subreaper"),
    EscapeProbe("a shell's setsid daemon"),
    EscapeProbe("snooper for the next run's key"),
]


def marked(mark: str) -> list[int]:
    """Live processes whose environment holds `MARK_ENV=mark`: the run's."""
    needle = f"{MARK_ENV}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone while we looked, or closed to us: not a live one we can see
        if stat[stat.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def stop_all(mark: str, seconds: float = 10.0) -> list[int]:
    """Freeze, then kill, what is left with the mark, until none is (bounded): the
    harness's own cleanup, so one probe's failure does not spoil the next. What it
    could not end."""
    deadline = time.monotonic() + seconds
    while (pids := marked(mark)) and time.monotonic() < deadline:
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    continue  # gone meanwhile
        time.sleep(0.01)
    return marked(mark)


def supervised(folder: Path, policy_toml: str, argv: list[str], env: dict, name: str,
               user: tuple[str, ...] = (), python: str = sys.executable):  # fmt: skip
    """`docket run` of `argv` in `folder/name` (as another `user`, a setpriv prefix,
    with the `python` it can run): its exit status and stderr. Output to a file: on
    a pipe, a survivor holds it open, and the wait would be for the survivor."""
    policy = folder / f"{name}.toml"
    policy.write_text(policy_toml)
    docket = [python, *DOCKET[1:]]
    command = [*user, *docket, "run", "--policy", str(policy), "--ledger-dir", str(folder / name)]
    with open(folder / f"{name}.err", "wb") as err:
        done = subprocess.run([*command, "--", *argv], stdout=err, stderr=err, env=env,
                              timeout=RUN_TIMEOUT, cwd=folder)  # fmt: skip
    return done.returncode, (folder / f"{name}.err").read_text(errors="replace")


def ledger_account(run_dir: Path) -> tuple[int, list[int], str | None]:
    """(orphans recorded, listed or counted; survivors the ledger names; isolation)."""
    orphans, isolation = 0, None
    survivors: list[int] = []
    if not (run_dir / "ledger.jsonl").exists():
        return orphans, survivors, isolation  # the run did not start: said by its exit
    with open(run_dir / "ledger.jsonl", "rb") as f:
        for line in f:
            event = json.loads(line)
            if event["type"] == "session.start":
                isolation = event.get("hardening", {}).get("isolation")
            elif event["type"] == "process.orphan":
                orphans += 1 if "pid" in event else event.get("unlisted", 0)
                survivors += event.get("survivors", [])
    return orphans, survivors, isolation


def attempt(probe: EscapeProbe, folder: Path, stub_url: str, user: tuple[str, ...] = (),
            python: str = sys.executable):  # fmt: skip
    """One probe (as another `user`, a setpriv prefix, with the `python` it can run):
    (good, what happened, figures)."""
    folder.mkdir(parents=True)
    out = folder / "out"
    out.mkdir()
    if user:
        for made in (folder, out):
            os.chown(made, NOBODY, NOBODY)
    agent = folder / "agent.py"
    code = f"N = {probe.count}\n" + PRELUDE + TECHNIQUES[probe.technique] + EPILOGUE
    agent.write_text(code)
    mark = secrets.token_hex(8)
    snooped = "DOCKET_ATTACK_SNOOPED_KEY"
    env = run_env(**{MARK_ENV: mark, "SNOOPED": snooped})
    next_key = f"sk-next-run-{secrets.token_hex(12)}"
    try:
        argv = [python, str(agent), str(out)]
        status, stderr = supervised(folder, policy_text(stub_url), argv, env, "run", user, python)
        left = marked(mark)  # at once: the run is over, nothing of it may be alive
        said = []
        if probe.technique.startswith("snooper"):
            # The next run, its provider's key in the variable the snooper reads.
            policy = policy_text(stub_url).replace(KEY_ENV, snooped)
            pause = [python, "-c", "import time; time.sleep(0.3)"]
            two = run_env(**{snooped: next_key})
            second, _ = supervised(folder, policy, pause, two, "next", user, python)
            seen = (out / "found").read_bytes() if (out / "found").exists() else b""
            if next_key.encode() in seen:
                said.append("the snooper read the next run's key")
            if second != 0:
                said.append(f"the next run exited {second}")
    finally:
        unended = stop_all(mark)
    orphans, named, isolation = ledger_account(folder / "run")
    if status != 0:
        said.append(f"docket run exited {status}: {stderr.strip().splitlines()[-1:]}")
    if left:
        said.append(f"{len(left)} process(es) outlived the run (pids {left[:8]})")
    if named:
        said.append(f"the ledger names {len(named)} survivor(s)")
    if unended:
        said.append(f"the harness could not end {len(unended)} of them either")
    figures = {"left": len(left), "orphans": orphans, "isolation": isolation}
    what = (
        "; ".join(said)
        or f"held: {orphans} orphan(s) ended and recorded, nothing alive ({isolation})"
    )
    return not said, what, figures


def python_for(folder: Path) -> str | None:
    """An interpreter uid 65534 can run (and run again from itself, as the supervisor
    runs the launcher) that imports docket: this one, or, when it lives under a home
    closed to others (pyenv in /root), a venv in `folder` on the system's python of
    the same version that adds our site-packages. None if neither can."""
    again = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import docket'], check=True)"
    check = [*AS_NOBODY, sys.executable, "-c", again]
    if subprocess.run(check, cwd=folder, capture_output=True, timeout=60).returncode == 0:
        return sys.executable
    system = shutil.which("python3", path="/usr/bin:/bin")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if system is None:
        return None
    shim = folder / "venv"
    site = shim / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    (shim / "bin").mkdir()
    (shim / "bin" / "python").symlink_to(system)
    (shim / "pyvenv.cfg").write_text(f"home = {Path(system).parent}\n")
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (site / "ours.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    python = str(shim / "bin" / "python")
    check = [*AS_NOBODY, python, "-c", again + "; print(sys.version)"]
    done = subprocess.run(check, cwd=folder, capture_output=True, text=True, timeout=60)
    return python if done.returncode == 0 and done.stdout.startswith(version) else None


def unprivileged(folder: Path) -> tuple[tuple[str, ...], str, str | None]:
    """(The setpriv prefix that runs as uid 65534, the interpreter it runs, None), or
    ((), "", why not). As 65534 the run has no cgroup of its own: the loop over its
    process tree is all there is."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return (), "", "needs root and setpriv"
    python = python_for(folder)
    if python is None:
        return (), "", f"no interpreter uid {NOBODY} can run docket with"
    return AS_NOBODY, python, None


def run(folder: Path, quick: bool) -> Figures:
    """Each probe as root (a cgroup leaf per run where the machine has cgroup2) and, in
    the full form, again as uid 65534 (the loop over the process tree)."""
    figures = Figures("orphans")
    folder.mkdir(parents=True, exist_ok=True)
    left = orphans = 0
    isolations: dict[str, int] = {}
    with stub(folder) as stub_url, tempfile.TemporaryDirectory(prefix="docket-orphans-") as tmp:
        shared = Path(tmp)  # uid 65534 cannot reach into the harness's own folder
        os.chmod(shared, 0o755)
        users: list[tuple[str, tuple[str, ...], str]] = [("", (), sys.executable)]
        why_not: str | None = "the quick form runs as is"
        if not quick:
            nobody, python, why_not = unprivileged(shared)
            if nobody:
                users.append((f"uid {NOBODY}, ", nobody, python))
        for who, user, python in users:
            for n, probe in enumerate(p for p in PROBES if p.quick or not quick):
                where = (shared if user else folder) / f"probe{n}"
                good, what, seen = attempt(probe, where, stub_url, user, python)
                left += seen["left"]
                orphans += seen["orphans"]
                key = str(seen["isolation"])
                isolations[key] = isolations.get(key, 0) + 1
                count = f" ({probe.count})" if probe.count else ""
                if user and not good:  # the temporary folder goes: keep what reproduces it
                    shutil.copytree(where, folder / f"nobody-probe{n}", dirs_exist_ok=True)
                    where = folder / f"nobody-probe{n}"
                figures.add(good, f"orphans {who}{probe.technique!r}{count}: {what} "
                                  f"(agent: {where / 'agent.py'})")  # fmt: skip
    figures.extra = {"outlived": left, "orphans_recorded": orphans, "isolation": isolations}
    if why_not:
        figures.extra["unprivileged_form"] = f"not run: {why_not}"
    return figures
