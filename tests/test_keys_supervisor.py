"""A second Ctrl-C (or SIGTERM) kills at
once instead of waiting out --grace, and a process the agent detaches (setsid)
comes back to the supervisor (a child subreaper), is ended with the run and
recorded. Real `docket run` processes, real signals, every wait bounded."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import read_events, running, wait_until
from test_supervisor import (
    READY,
    TIMEOUT,
    assert_verifies,
    assert_well_ended,
    docket_argv,
    kill_group,
    of_type,
    processes,  # noqa: F401 - the fixture
    start_docket,
    with_keys,
)

STUBBORN = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    (out / "ready.tmp").write_text(str(os.getpid()))
    os.rename(out / "ready.tmp", out / "ready")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_kills_at_once_instead_of_waiting_out_the_grace(
    tmp_path,
    processes,  # noqa: F811 - the fixture
    capsys,
    sig,
):
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    grace = 300  # far longer than TIMEOUT: waiting it out fails the test
    supervisor = start_docket(
        processes,
        "run",
        "--ledger-dir",
        str(folder),
        "--grace",
        str(grace),
        "--",
        sys.executable,
        str(script),
        str(out),
        stderr_path=tmp_path / "stderr",
    )
    pid = int(
        wait_until(
            lambda: (out / "ready").exists() and (out / "ready").read_text(), READY, "the child"
        )
    )
    ledger = folder / "ledger.jsonl"
    name = signal.Signals(sig).name
    try:
        supervisor.send_signal(sig)
        wait_until(
            lambda: of_type(read_events(ledger), "signal.forwarded"), READY, "the first forward"
        )
        sent = time.monotonic()
        supervisor.send_signal(sig)
        assert supervisor.wait(timeout=TIMEOUT) == 128 + signal.SIGKILL
        took = time.monotonic() - sent
    finally:
        kill_group(pid)
    assert took < grace / 10
    events = read_events(ledger)
    first, kill = of_type(events, "signal.forwarded")
    assert (first["signal"], kill["signal"]) == (name, "SIGKILL")
    assert kill["reason"] == (
        f"{name} received by the supervisor again: killed without waiting out the grace period"
    )
    receipt = assert_well_ended(folder, events, 128 + signal.SIGKILL)
    assert (
        receipt["exit"]["reason"]
        == f"child killed by SIGKILL after {name}, {name} to the supervisor"
    )
    assert_verifies(folder, capsys)


DETACHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])

    def session_of(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3])

    # A daemon in a session of its own, and a shell in another whose child sleeps:
    # neither is in the agent's process group, so killing the group misses both.
    daemon = subprocess.Popen(["sleep", "300"], start_new_session=True)
    shell = subprocess.Popen(["sh", "-c", "sleep 301 & echo $! > inner.pid; wait"],
                             cwd=out, start_new_session=True)
    deadline = time.monotonic() + 20
    while not ((out / "inner.pid").exists() and (out / "inner.pid").read_text().strip()):
        if time.monotonic() > deadline:
            sys.exit(99)
        time.sleep(0.01)
    assert session_of(daemon.pid) == daemon.pid and session_of(shell.pid) == shell.pid
    (out / "detached").write_text(f"{daemon.pid} {shell.pid} {(out / 'inner.pid').read_text()}")
    """
)


def test_a_detached_process_does_not_outlive_the_run_and_is_recorded(tmp_path, capsys):
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "detacher.py"
    script.write_text(DETACHER)
    # Output to a file: on a pipe, a process that outlives the run holds it open,
    # and reading to its end would wait for that process, not for docket.
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as err:
        argv = docket_argv("run", "--ledger-dir", str(folder), "--", sys.executable, str(script))
        r = subprocess.run(
            [*argv, str(out)], stdout=err, stderr=err, env=with_keys(None), timeout=TIMEOUT
        )
    daemon, shell, inner = (int(x) for x in (out / "detached").read_text().split())
    try:
        assert r.returncode == 0, stderr.read_text()
        for pid in (daemon, shell, inner):
            # Reaped by the supervisor before it exited: gone, not even a zombie.
            assert not running(pid), f"{pid} outlived the run"
    finally:
        for pid in (daemon, shell, inner):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    events = read_events(folder / "ledger.jsonl")
    orphans = {e["pid"]: e for e in of_type(events, "process.orphan")}
    assert set(orphans) == {daemon, shell, inner}  # the launcher's watcher is not listed
    assert orphans[daemon]["argv"] == ["sleep", "300"]
    assert orphans[daemon]["found"] == "running"
    for e in orphans.values():
        assert (e["status"], e["reason"]) == (-signal.SIGKILL, "killed by SIGKILL")
    # After the agent's exit, before the end of the record; the receipt still verifies.
    (exited,) = of_type(events, "process.exit")
    assert all(exited["seq"] < e["seq"] < events[-1]["seq"] for e in orphans.values())
    hardening = events[0]["hardening"]
    assert {k: hardening[k] for k in ("non_dumpable", "subreaper")} == {
        "non_dumpable": True,
        "subreaper": True,
    }
    # the open-file limit raised to the hard one
    assert hardening["nofile"] == resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hardening["isolation"] in ("cgroup", "signals")  # tests/test_orphans.py
    assert_well_ended(folder, events, 0)
    assert_verifies(folder, capsys)


def test_prctl_elsewhere_degrades_with_a_stated_reason(monkeypatch):
    from docket.run import hardening

    monkeypatch.setattr(hardening.sys, "platform", "darwin")
    assert hardening.make_non_dumpable() == "prctl is Linux only (this is darwin)"
    assert hardening.set_subreaper() == "prctl is Linux only (this is darwin)"


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux only")
def test_prctl_on_linux_is_granted_and_read_back():
    # In a child process: this test must not leave pytest itself non-dumpable.
    code = textwrap.dedent(
        """
        import ctypes
        from docket.run import hardening
        libc = ctypes.CDLL(None)
        assert libc.prctl(hardening.PR_GET_DUMPABLE, 0, 0, 0, 0) == 1
        assert hardening.make_non_dumpable() is None
        assert libc.prctl(hardening.PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
        assert hardening.set_subreaper() is None
        value = ctypes.c_int(-1)
        assert libc.prctl(37, ctypes.byref(value), 0, 0, 0) == 0  # PR_GET_CHILD_SUBREAPER
        assert value.value == 1
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


SHORT_LIVED = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    # A shell that starts a background job and exits: the job is re-parented to the
    # supervisor, and exits (status 3) only once told to, after its shell has gone
    # (a job that ended first would be its shell's to reap, not an orphan).
    job = "i=0; while [ ! -e go ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; exit 3"
    subprocess.run(["sh", "-c", f"sh -c '{job}' & echo $! > late.pid"], cwd=out, check=True)
    pid = int((out / "late.pid").read_text())
    (out / "go").write_text("")
    deadline = time.monotonic() + 20
    while os.path.exists(f"/proc/{pid}"):  # a zombie stays until its parent reaps it
        if time.monotonic() > deadline:
            sys.exit(99)
        time.sleep(0.01)
    (out / "reaped").write_text(str(pid))  # reaped while this agent still ran
    """
)


def test_an_orphan_that_exits_during_the_run_is_reaped_then_and_recorded(tmp_path, capsys):
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "short_lived.py"
    script.write_text(SHORT_LIVED)
    argv = docket_argv("run", "--ledger-dir", str(folder), "--", sys.executable, str(script))
    r = subprocess.run(
        [*argv, str(out)], capture_output=True, text=True, env=with_keys(None), timeout=TIMEOUT
    )
    assert r.returncode == 0, r.stderr  # 99: the zombie waited for the run's end
    pid = int((out / "reaped").read_text())
    events = read_events(folder / "ledger.jsonl")
    orphans = of_type(events, "process.orphan")
    assert len(orphans) == 1, orphans
    (orphan,) = orphans
    assert (orphan["pid"], orphan["found"], orphan["status"]) == (pid, "exited", 3)
    assert orphan["reason"] == "exited with status 3"
    (exited,) = of_type(events, "process.exit")
    assert orphan["seq"] < exited["seq"]  # recorded while the agent ran
    assert_verifies(folder, capsys)
