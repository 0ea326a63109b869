"""The run's own PID namespace (docket/run/pid_namespace.py): where there is no
cgroup, its init's end ends every process of the run, whatever its fork rate.

As root here, `DOCKET_ISOLATION=pid_namespace` skips the cgroup, so these run the
namespace's root form (no user namespace). The unprivileged form (uid 65534, a user
namespace mapping the user to itself) is run by tests/test_keys_agent.py, the slow
churning bomb of tests/test_orphans.py and the attack family `orphans`. Every
process of a run carries a mark in its environment (chaos.attack.orphans), found
from this side's /proc: the agent's own pids are the namespace's, not ours.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import docket_forked, read_events, wait_until, with_keys
from test_orphans import CHAIN, DETACH_AND_WAIT, LEAVES_A_DAEMON
from test_supervisor import READY, TIMEOUT, assert_verifies, assert_well_ended, docket_argv, of_type

from chaos.attack.orphans import MARK_ENV, marked, stop_all
from docket.run.isolation import ISOLATION_ENV, PIDNS, SIGNALS
from docket.run.orphans import OrphanSweep

KILLED_WITH_IT = "killed with the run's pid namespace"


def docket_run(folder: Path, agent: list[str], mark: str, *, prefix: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> tuple[int, str]:  # fmt: skip
    """`docket run` of `agent` in its namespace (under `prefix`): its exit status and
    output. Output to a file: a survivor would hold a pipe open."""
    argv = [*prefix, *docket_argv("run", "--ledger-dir", str(folder), "--", *agent)]
    env = {**with_keys(None), ISOLATION_ENV: PIDNS, MARK_ENV: mark, **(env or {})}
    out = folder.with_suffix(".out")
    with out.open("wb") as f:
        done = subprocess.run(argv, stdout=f, stderr=f, env=env, timeout=TIMEOUT)
    return done.returncode, out.read_text(errors="replace")


def test_a_fork_chain_dies_with_the_namespaces_init_and_each_link_is_recorded(tmp_path, capsys):
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    (tmp_path / "chain.py").write_text(CHAIN)
    mark = os.urandom(8).hex()
    try:
        status, said = docket_run(folder, [sys.executable, str(tmp_path / "chain.py"),
                                           str(out), "80"], mark)  # fmt: skip
        alive = marked(mark)
    finally:
        stop_all(mark)
    assert alive == [], f"{len(alive)} of the chain outlived the run"
    assert status == 0, said
    events = read_events(folder / "ledger.jsonl")
    assert events[0]["hardening"]["isolation"] == PIDNS
    orphans = of_type(events, "process.orphan")
    listed = [e for e in orphans if "pid" in e]
    # Every link once, listed or counted; the namespace's init (docket's own) is not one.
    assert len(listed) + sum(e.get("unlisted", 0) for e in orphans) == 80
    assert all(e["found"] == "running" and e["reason"] == KILLED_WITH_IT for e in listed)
    assert all(e["status"] is None for e in listed)  # reaped by the init, not by us
    assert not [e for e in events if "survivors" in e or "isolation_errors" in e]
    assert_well_ended(folder, events, 0)
    assert_verifies(folder, capsys)


# What the agent sees, then its end by a signal (the launcher must end the same way).
LOOKS_AROUND = textwrap.dedent(
    """
    import json, os, signal, sys
    seen = {"pid": os.getpid(), "ppid": os.getppid(),
            "proc": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "self": os.readlink("/proc/self")}
    open(sys.argv[1], "w").write(json.dumps(seen))
    os.kill(os.getpid(), signal.SIGTERM)
    """
)


def test_the_agent_sees_only_its_namespace_and_the_run_ends_as_the_agent_did(tmp_path):
    folder, report = tmp_path / "run", tmp_path / "seen.json"
    (tmp_path / "look.py").write_text(LOOKS_AROUND)
    mark = os.urandom(8).hex()
    try:
        status, said = docket_run(folder, [sys.executable, str(tmp_path / "look.py"),
                                           str(report)], mark)  # fmt: skip
    finally:
        stop_all(mark)
    seen = json.loads(report.read_text())
    # pid 1 is docket's init, 2 the agent; its /proc is the namespace's own, so its
    # pids and /proc agree, and nothing outside the run is there to read.
    assert (seen["pid"], seen["ppid"], seen["self"]) == (2, 1, "2")
    assert seen["proc"] == [1, 2], seen["proc"]
    # Killed by SIGTERM: so is the launcher the supervisor reaps, and docket says so.
    assert status == 128 + signal.SIGTERM, said
    events = read_events(folder / "ledger.jsonl")
    assert of_type(events, "process.exit")[0]["reason"] == "killed by SIGTERM"
    assert_well_ended(folder, events, 128 + signal.SIGTERM)


def test_a_detached_process_dies_with_a_sigkilled_supervisor(tmp_path):
    """The namespace's init watches the supervisor: its death ends the init, and
    the kernel ends the rest (docs/resilience.md F10)."""
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    (tmp_path / "detach.py").write_text(DETACH_AND_WAIT)
    mark = os.urandom(8).hex()
    argv = docket_argv("run", "--ledger-dir", str(folder), "--", sys.executable,
                       str(tmp_path / "detach.py"), str(out))  # fmt: skip
    env = {**with_keys(None), ISOLATION_ENV: PIDNS, MARK_ENV: mark}
    with (tmp_path / "stderr").open("wb") as err:
        supervisor = subprocess.Popen(argv, stdout=err, stderr=err, env=env)
    try:
        wait_until(lambda: (out / "daemon").exists(), READY, "the detached process")
        assert len(marked(mark)) >= 4  # the supervisor, launcher, init, agent, daemon
        supervisor.kill()
        supervisor.wait(timeout=TIMEOUT)
        wait_until(lambda: not marked(mark), 10, "the run's processes to die with it")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=TIMEOUT)
        stop_all(mark)


def test_where_the_kernel_refuses_the_namespace_the_run_says_so_and_signals_end_it(tmp_path):
    # A user namespace of the test's own whose pid-namespace limit is 0: the kernel
    # refuses the run's (ENOSPC), as a container's seccomp would (EPERM).
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    limit = 'echo 0 > /proc/sys/user/max_pid_namespaces && exec "$@"'
    prefix = ("unshare", "--user", "--map-root-user", "sh", "-c", limit, "sh")
    folder, out = tmp_path / "run", tmp_path / "daemon.pid"
    mark = os.urandom(8).hex()
    try:
        status, said = docket_run(folder, [sys.executable, "-c", LEAVES_A_DAEMON, str(out)],
                                  mark, prefix=prefix)  # fmt: skip
        alive = marked(mark)
    finally:
        stop_all(mark)
    if status != 0 and "max_pid_namespaces" in said:
        pytest.skip(f"cannot limit a user namespace here: {said.strip()[-200:]}")
    assert alive == [], f"{len(alive)} process(es) of the run outlived it"
    assert status == 0, said
    events = read_events(folder / "ledger.jsonl")
    assert events[0]["hardening"]["isolation"] == PIDNS  # what was asked for...
    (told,) = [e for e in of_type(events, "process.orphan") if "isolation" in e]
    assert told["isolation"] == SIGNALS  # ...and what it was: said, not silent
    assert "refused the run's pid namespace" in told["isolation_errors"][0]
    assert "survivors" not in told
    (daemon,) = [e for e in of_type(events, "process.orphan") if "pid" in e]
    assert daemon["pid"] == int(out.read_text())  # no namespace: the pids are ours
    assert (daemon["found"], daemon["status"]) == ("running", -signal.SIGKILL)
    assert_well_ended(folder, events, 0)


def test_the_launchers_report_is_read_whole_however_it_comes():
    """The report pipe (docket.run.launch): a refusal then the watcher's pid, in
    pieces; or the init's pid with what did not hold."""
    sweep = OrphanSweep(record=None)  # type: ignore[arg-type]  # nothing is recorded here
    sweep.isolation = PIDNS
    write = sweep.open_report_pipe()
    try:
        os.write(write, b"refused unshare(CLONE_NEWUSER): Operation not perm")
        assert sweep._watcher_pid() is None  # not all there yet
        os.write(write, b"itted\n4242\n")
        assert sweep._watcher_pid() == 4242
    finally:
        os.close(write)
    assert sweep.isolation == SIGNALS
    assert sweep._isolation_errors == [
        "the kernel refused the run's pid namespace (unshare(CLONE_NEWUSER): "
        "Operation not permitted): its processes were ended by signals"
    ]
    sweep = OrphanSweep(record=None)  # type: ignore[arg-type]
    write = sweep.open_report_pipe()
    os.write(write, f"{os.getpid()} {PIDNS} proc kept: mount proc /proc: EPERM\n".encode())
    os.close(write)
    assert sweep._watcher_pid() == os.getpid()
    assert sweep._init_fd is not None
    os.close(sweep._init_fd)
    assert sweep._isolation_errors == [
        "the run's pid namespace: proc kept: mount proc /proc: EPERM"
    ]


def test_an_agent_that_signals_the_namespaces_init_ends_only_itself(tmp_path):
    # pid 1 is docket's: a SIGINT from the agent once raised in it and ended the run.
    # A signal init does not catch is dropped when it is sent, so the agent reads
    # init's ignored and caught sets as it signals: nothing to wait for afterwards.
    folder, seen = tmp_path / "run", tmp_path / "seen"
    agent = (
        "import os, signal, sys\n"
        "status = open('/proc/1/status').read().split('\\n')\n"
        "masks = {k: int(v, 16) for k, v in (l.split(':\\t') for l in status if l[:6] in ('SigIgn', 'SigCgt'))}\n"
        "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):\n"
        "    os.kill(1, sig)\n"
        "open(sys.argv[1], 'w').write(str(masks['SigCgt']))\n"
    )
    mark = os.urandom(8).hex()
    try:
        status, said = docket_run(folder, [sys.executable, "-c", agent, str(seen)], mark)
    finally:
        stop_all(mark)
    assert status == 0, said
    caught = int(seen.read_text())
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        assert not caught & (1 << (sig - 1)), f"init catches {sig.name}: the agent could end it"
    events = read_events(folder / "ledger.jsonl")
    assert of_type(events, "process.exit")[0]["reason"] == "exited with status 0"
    assert not [e for e in events if "isolation_errors" in e or "survivors" in e]


def test_an_unknown_isolation_is_one_line_and_exit_2(tmp_path):
    for value in ("bogus", "x" * 100_000, "cgroup\udcff", "signals "):
        done = docket_forked(["run", "--ledger-dir", str(tmp_path / "run"), "--", "true"],
                             cwd=tmp_path, env={**os.environ, ISOLATION_ENV: value})  # fmt: skip
        err = done.stderr.decode("utf-8", "replace")
        assert (done.returncode, err.count("\n")) == (2, 1), err
        assert err.startswith(f"docket: {ISOLATION_ENV}=") and "expected one of" in err
        assert not (tmp_path / "run").exists()  # refused before anything was written
