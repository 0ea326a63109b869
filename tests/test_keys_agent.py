"""The agent never holds a provider key, looked for as a curious
agent would: a process of the same (unprivileged) user as the supervisor that reads
every /proc/*/environ and /proc/*/cmdline it can, and its own environment.

The run is a real `docket run` under uid/gid 65534 (setpriv), started by the
test (root) with the keys in its environment. Skipped where the test is not root.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from helpers import read_events

NOBODY = 65534
OPENAI_KEY = "sk-proj-the-real-configured-key-0123456789"
GEMINI_KEY = "AIza-an-unconfigured-providers-key-98765"
GATEWAY_KEY = "gw-a-key-the-policy-names-itself-4242"
SECRETS = (OPENAI_KEY, GEMINI_KEY, GATEWAY_KEY)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs the supervisor under another uid: needs root and setpriv",
)

CURIOUS_AGENT = textwrap.dedent(
    """
    import json, os, sys
    found, readable, refused = [], 0, []
    with open(sys.argv[2]) as f:  # what to look for (a file: argv is in /proc too)
        secrets = json.load(f)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    data = f.read()
            except OSError as exc:
                refused.append([int(pid), name, exc.errno])
                continue
            readable += 1
            found += [[int(pid), name, s] for s in secrets if s.encode() in data]
    found += [["self", name, s] for name, v in os.environ.items() for s in secrets if s in v]
    with open(f"/proc/{os.getpid()}/environ", "rb") as f:
        own = f.read()
    report = {
        "found": found,
        "readable": readable,
        "refused": refused,
        "ppid": os.getppid(),
        "uid": os.getuid(),
        "own_environ_has_token": os.environ["DOCKET_RUN_TOKEN"].encode() in own,
        "env": sorted(os.environ),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)
    """
)


def as_nobody(*argv: str) -> list[str]:
    return [f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]


def python_for_nobody(folder: Path) -> str:
    """An interpreter uid 65534 can exec that imports what this one does: this one,
    or (when it lives under a home closed to others, e.g. pyenv in /root) a venv in
    `folder` on the system's python of the same version that adds our site-packages."""
    # From a process already running as 65534: the supervisor execs sys.executable
    # again (the launcher), and setpriv's own exec is not a fair test of that.
    again = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import docket'], check=True)"
    probe = ["setpriv", *as_nobody(sys.executable, "-c", again)]
    if subprocess.run(probe, cwd=folder, capture_output=True, timeout=30).returncode == 0:
        return sys.executable
    system = shutil.which("python3", path="/usr/bin:/bin")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if system is None:
        pytest.skip("no interpreter uid 65534 can run")
    shim = folder / "venv"
    site = shim / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    (shim / "bin").mkdir()
    (shim / "bin" / "python").symlink_to(system)
    (shim / "pyvenv.cfg").write_text(f"home = {Path(system).parent}\n")
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (site / "ours.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    python = str(shim / "bin" / "python")
    check = ["setpriv", *as_nobody(python, "-c", again + "; print(sys.version)")]
    done = subprocess.run(check, cwd=folder, capture_output=True, text=True, timeout=30)
    if done.returncode != 0 or not done.stdout.startswith(version):
        pytest.skip(f"no interpreter uid 65534 can run docket with: {done.stderr.strip()[-200:]}")
    return python


@pytest.fixture
def shared_dir():
    """A folder uid 65534 owns (pytest's tmp_path is root's and closed to it)."""
    folder = Path(tempfile.mkdtemp(prefix="docket-keys-"))
    os.chown(folder, NOBODY, NOBODY)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@needs_root
def test_an_unprivileged_agent_finds_no_key_anywhere_in_proc(shared_dir):
    agent = shared_dir / "agent.py"
    agent.write_text(CURIOUS_AGENT)
    policy = shared_dir / "docket.toml"
    policy.write_text('[secrets]\ndrop_env = ["MY_GATEWAY_KEY"]\n')
    report = shared_dir / "report.json"
    wanted = shared_dir / "secrets.json"
    wanted.write_text(json.dumps(SECRETS))
    env = dict(
        os.environ,
        OPENAI_API_KEY=OPENAI_KEY,
        ANTHROPIC_API_KEY="sk-ant-the-real-anthropic-key-0000",
        GEMINI_API_KEY=GEMINI_KEY,
        MY_GATEWAY_KEY=GATEWAY_KEY,
    )
    python = python_for_nobody(shared_dir)
    argv = [
        "setpriv",
        *as_nobody(python),
        "-m",
        "docket",
        "run",
        "--policy",
        str(policy),
        "--ledger-dir",
        str(shared_dir / "run"),
        "--",
        python,
        str(agent),
        str(report),
        str(wanted),
    ]
    done = subprocess.run(argv, cwd=shared_dir, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(report.read_text())
    assert seen["uid"] == NOBODY
    # The scan was real: it read environs and its own holds the run's token...
    assert seen["own_environ_has_token"] and seen["readable"] > 0
    # ...and its parent's was closed to it: the run's pid namespace's init (docket's own;
    # the supervisor is not in the namespace's /proc at all).
    supervisor = read_events(shared_dir / "run" / "ledger.jsonl")[0]
    hardening = supervisor["hardening"]
    assert {k: hardening[k] for k in ("non_dumpable", "subreaper")} == {
        "non_dumpable": True,
        "subreaper": True,
    }
    # the open-file limit raised to the hard one
    assert hardening["nofile"] == resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # Not root: no cgroup of its own, so a pid namespace (tests/test_pid_namespace.py)
    assert hardening["isolation"] == "pid_namespace" and hardening["isolation_error"]
    assert [seen["ppid"], "environ", errno.EACCES] in seen["refused"]  # the init's
    assert seen["found"] == []
    assert "GEMINI_API_KEY" not in seen["env"] and "MY_GATEWAY_KEY" not in seen["env"]
    for secret in SECRETS:
        assert secret not in (shared_dir / "run" / "ledger.jsonl").read_text()
