"""The child launcher (`python -m docket.run.launch PID -- CMD`), with real processes.

It must exec CMD in place (same pid), with the parent-death signal armed and
surviving the exec, with SIGPIPE/SIGXFSZ back at their defaults (Python ignores
them and exec would pass that on), refuse to run when its parent is not the
supervisor it names, and report a bad command in one line with a shell's status.
Every process a test starts is bounded by a timeout and killed on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import running, wait_until

TIMEOUT = 30  # seconds; generous for a shared 2-core machine
LAUNCH = [sys.executable, "-m", "docket.run.launch"]


def launch(*command: str, supervisor: int | None = None, **kw) -> subprocess.CompletedProcess:
    pid = os.getpid() if supervisor is None else supervisor
    return subprocess.run(
        [*LAUNCH, str(pid), "--", *command],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        **kw,
    )


def ignored_signals(status_text: str) -> set[int]:
    mask = int(
        next(ln for ln in status_text.splitlines() if ln.startswith("SigIgn:")).split()[1], 16
    )
    return {sig for sig in range(1, 65) if mask & (1 << (sig - 1))}


def test_usage_error_is_one_line_exit_2():
    for argv in ([], ["123"], ["123", "--"], ["abc", "--", "true"], ["123", "true"]):
        r = subprocess.run(
            [*LAUNCH, *argv], capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
        assert r.returncode == 2, argv
        assert r.stderr.count("\n") == 1 and "usage" in r.stderr, (argv, r.stderr)


def test_execs_in_place_with_the_death_signal_armed():
    # The command reports its own pid and its parent-death signal (PR_GET_PDEATHSIG).
    probe = textwrap.dedent(
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        sig = ctypes.c_int(0)
        assert libc.prctl(2, ctypes.byref(sig), 0, 0, 0) == 0
        print(os.getpid(), sig.value)
        """
    )
    proc = subprocess.Popen(
        [*LAUNCH, str(os.getpid()), "--", sys.executable, "-c", probe],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    pid, deathsig = map(int, out.split())
    assert proc.returncode == 0
    assert pid == proc.pid  # exec replaced the launcher: same process
    assert deathsig == signal.SIGKILL


def test_sigpipe_and_sigxfsz_are_restored_but_an_ignored_sigint_is_kept():
    r = launch("cat", "/proc/self/status")
    assert r.returncode == 0, r.stderr
    ignored = ignored_signals(r.stdout)
    assert signal.SIGPIPE not in ignored and signal.SIGXFSZ not in ignored
    # The launcher itself starts with both ignored (Python does that): the reset is real.
    assert {signal.SIGPIPE, signal.SIGXFSZ} <= ignored_signals(
        subprocess.run(
            [sys.executable, "-c", "print(open('/proc/self/status').read())"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=True,
        ).stdout
    )
    # A caller that ignores SIGINT (a background job) passes that on, through the launcher.
    r = launch(
        sys.executable,
        "-c",
        "print(open('/proc/self/status').read())",
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert r.returncode == 0, r.stderr
    assert signal.SIGINT in ignored_signals(r.stdout)


def test_command_not_found_is_127_in_one_line(tmp_path):
    r = launch(str(tmp_path / "no-such-agent"))
    assert r.returncode == 127
    assert r.stderr.splitlines() == [f"docket: command not found: {tmp_path / 'no-such-agent'}"]


def test_command_that_cannot_run_is_126_in_one_line(tmp_path):
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho ran > ran\n")
    script.chmod(0o644)  # not executable
    r = launch(str(script), cwd=tmp_path)
    assert r.returncode == 126
    assert r.stderr.splitlines() == [f"docket: cannot run {script}: Permission denied"]
    assert not (tmp_path / "ran").exists()


def test_refuses_when_its_parent_is_not_the_supervisor(tmp_path):
    # Named supervisor: pid 1, which is not our parent (the test is).
    marker = tmp_path / "ran"
    r = launch(sys.executable, "-c", f"open({str(marker)!r}, 'w').close()", supervisor=1)
    assert r.returncode == 126
    assert r.stderr.splitlines() == ["docket launch: supervisor 1 is gone; not starting"]
    assert not marker.exists()


def test_command_dies_with_its_supervisor(tmp_path):
    # A stand-in supervisor spawns the launcher from its main thread, reports the
    # child's pid, and waits; SIGKILLing it must take the child down with it.
    pidfile = tmp_path / "child.pid"
    supervisor_code = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-m", "docket.run.launch", str(os.getpid()), "--",
                                  "sleep", "60"], start_new_session=True)
        with open({str(pidfile)!r} + ".tmp", "w") as f:
            f.write(str(child.pid))
        os.rename({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
        time.sleep(60)
        """
    )
    supervisor = subprocess.Popen([sys.executable, "-c", supervisor_code])
    child = None
    try:
        child = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), 20, "the pid"))
        # The launcher has exec'd `sleep` (its pid's command line says so) before we kill.
        wait_until(
            lambda: Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep"),
            20,
            "the exec",
        )
        supervisor.kill()
        supervisor.wait(timeout=TIMEOUT)
        wait_until(lambda: not running(child), 10, f"child {child} to die with its supervisor")
    finally:
        supervisor.kill()
        supervisor.wait(timeout=TIMEOUT)
        if child is not None and running(child):
            os.kill(child, signal.SIGKILL)  # the test failed: leave nothing behind
