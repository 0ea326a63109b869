"""No process of a run outlives it, whatever its fork rate, and the
next run's key is not there to steal.

A fork chain deeper than any fixed number of sweep rounds, a snooper that keeps
forking and reads every /proc/*/environ for the next run's key: real `docket run`
processes, real forks and signals, every wait bounded. The ledger's account of what
was reaped is read from its bytes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
from helpers import read_events, running, wait_until, with_keys
from test_keys_agent import (
    NOBODY,
    as_nobody,
    needs_root,
    python_for_nobody,
    shared_dir,  # noqa: F401 - the fixture
)
from test_supervisor import READY, TIMEOUT, assert_verifies, assert_well_ended, docket_argv, of_type

from chaos.attack.orphans import MARK_ENV, marked, stop_all
from docket.run.cgroup import cgroup2_mount, own_cgroup
from docket.run.child import reap_exited
from docket.run.isolation import ISOLATION_ENV, PIDNS, SIGNALS

# A chain of N processes, each in a session of its own (out of the agent's group, so
# the group kill misses it) and each the parent of the next: when one is killed its
# child comes back to the supervisor (the subreaper), one generation at a time.
CHAIN = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    out, n = Path(sys.argv[1]), int(sys.argv[2])

    def idle(seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)

    if os.fork():  # the agent: wait for the whole chain, then leave it behind
        deadline = time.monotonic() + 20
        while not (out / "ready").exists():
            if time.monotonic() > deadline:
                sys.exit(99)
            time.sleep(0.01)
        sys.exit(0)
    for link in range(1, n + 1):
        os.setsid()
        with open(out / "chain.pids", "a") as f:
            f.write(f"{os.getpid()}\\n")
        if link == n:
            (out / "ready").write_text("")
            idle(30)
            os._exit(0)
        if os.fork():
            idle(30)  # this link stays, the parent of the next
            os._exit(0)
    """
)


def kill_all(pids) -> None:
    """Cleanup for a failed test: SIGKILL whatever of `pids` is still running."""
    for pid in pids:
        if running(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue  # gone meanwhile


def run_chain(folder: Path, out: Path, script: Path, links: int, prefix: list[str], cwd=None,
              env: dict[str, str] | None = None):  # fmt: skip
    """`docket run` of the chain agent (under `prefix`: setpriv for another user);
    the chain's pids, the run's exit status and stderr. Output to a file: on a pipe,
    a survivor would hold it open, and reading to its end would wait for it."""
    argv = [*prefix, "-m", "docket", "run", "--ledger-dir", str(folder), "--"]
    with (out / "stderr").open("wb") as err:
        done = subprocess.run(
            [*argv, prefix[-1], str(script), str(out), str(links)], stdout=err, stderr=err,
            env={**with_keys(None), **(env or {})}, timeout=TIMEOUT, cwd=cwd,
        )  # fmt: skip
    pids = [int(p) for p in (out / "chain.pids").read_text().split()]
    alive = [pid for pid in pids if running(pid)]
    kill_all(alive)
    return pids, alive, done.returncode, (out / "stderr").read_text()


def assert_chain_accounted(folder: Path, pids: list[int]) -> list[dict]:
    """The ledger's account matches what was there: each link once, listed or counted,
    killed by docket's SIGKILL, no survivor named; the run ended well."""
    events = read_events(folder / "ledger.jsonl")
    orphans = of_type(events, "process.orphan")
    listed = [e for e in orphans if "pid" in e]
    counted = sum(e.get("unlisted", 0) for e in orphans)
    assert {e["pid"] for e in listed} <= set(pids)
    assert len(listed) + counted == len(pids), (len(listed), counted)
    assert all(e["found"] == "running" and e["status"] == -signal.SIGKILL for e in listed)
    assert not [e for e in events if "survivors" in e or "isolation_errors" in e]
    assert_well_ended(folder, events, 0)
    return events


def test_a_fork_chain_deeper_than_any_round_count_leaves_no_survivor(tmp_path, capsys):
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "chain.py"
    script.write_text(CHAIN)
    pids, alive, status, stderr = run_chain(folder, out, script, 80, [sys.executable])
    assert len(pids) == 80
    assert alive == [], f"{len(alive)} of 80 outlived the run"
    assert status == 0, stderr
    events = assert_chain_accounted(folder, pids)
    hardening = events[0]["hardening"]
    if in_a_cgroup_of_its_own():
        assert hardening["isolation"] == "cgroup", hardening  # this machine, and CI
    assert_verifies(folder, capsys)


def test_by_signals_alone_the_freeze_then_kill_loop_leaves_no_survivor(tmp_path):
    # Neither a cgroup nor a pid namespace (a machine with user namespaces off): the
    # loop over the supervisor's tree is all there is.
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "chain.py"
    script.write_text(CHAIN)
    pids, alive, status, stderr = run_chain(folder, out, script, 80, [sys.executable],
                                            env={ISOLATION_ENV: SIGNALS})  # fmt: skip
    assert alive == [], f"{len(alive)} of 80 outlived the run"
    assert status == 0, stderr
    events = assert_chain_accounted(folder, pids)
    hardening = events[0]["hardening"]
    assert hardening["isolation"] == SIGNALS, hardening
    assert hardening["isolation_error"] == f"{ISOLATION_ENV}={SIGNALS}; {ISOLATION_ENV}={SIGNALS}"


# A bomb grown to N members, each in a session of its own, then churning: every member
# forks its replacement and exits, again and again (thousands of exits a second, each a
# zombie handed to the supervisor). Each process carries the attack family's mark
# (chaos.attack.orphans.MARK_ENV) in its environment, found and ended by its helpers.
CHURN = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    out, n = Path(sys.argv[1]), int(sys.argv[2])
    if os.fork():  # the agent: leave once the bomb is grown
        deadline = time.monotonic() + 20
        while not (out / "ready").exists():
            if time.monotonic() > deadline:
                sys.exit(99)
            time.sleep(0.01)
        sys.exit(0)
    os.setsid()
    for member in range(n - 1):
        if os.fork() == 0:
            os.setsid()
            break
    else:
        (out / "ready").write_text("")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.fork():
            os._exit(0)
        time.sleep(0.005)
    os._exit(0)
    """
)


def test_reap_exited_reaps_the_runs_exited_children_and_stops_at_one_not_ours():
    # In a forked process of its own: the test process's other children are not ours.
    read, write = os.pipe()
    tester = os.fork()
    if tester == 0:
        os.close(read)
        try:
            kids = [os.fork() or os._exit(7) for _ in range(3)]
            stranger = os.fork() or os._exit(9)  # the drain must not reap this one
            deadline = time.monotonic() + 10
            while not all(Path(f"/proc/{k}/stat").read_bytes().split(b") ")[1][:1] == b"Z"
                          for k in [*kids, stranger]):  # fmt: skip
                assert time.monotonic() < deadline
                time.sleep(0.001)
            reaped, whole = reap_exited(lambda pid: pid != stranger)
            left = os.waitpid(stranger, os.WNOHANG)  # still there to be reaped by its owner
            again = reap_exited(lambda pid: True)
            os.write(write, json.dumps([kids, reaped, whole, left[1], again]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        kids, reaped, whole, stranger_status, again = json.loads(f.read())
    os.waitpid(tester, 0)
    # The kernel shows exited children in fork order: ours, up to the stranger.
    assert reaped == [[kid, 7] for kid in kids] and not whole
    assert os.waitstatus_to_exitcode(stranger_status) == 9
    assert again == [[], True]  # none left: every one reaped, by the drain or its owner


@pytest.mark.slow  # a bomb of 12,000 forks a second starves whatever runs beside it
@needs_root
def test_without_a_cgroup_a_churning_fork_bomb_leaves_no_survivor(
    shared_dir,  # noqa: F811 - the fixture
):
    # As uid 65534 (no cgroup): each look at /proc once walked thousands of zombies the
    # churn handed the supervisor, slower than they came, until the 5 s deadline cut it
    # short ("isolation failed", exit 43) and members outlived the run. With the reaps
    # and nice 19 the loop held 60 members, and 250 in 2 of 4 runs; the run's pid
    # namespace (docket/run/pid_namespace.py) holds whatever the count.
    folder, out = shared_dir / "run", shared_dir / "out"
    out.mkdir()
    os.chown(out, NOBODY, NOBODY)
    script = shared_dir / "churn.py"
    script.write_text(CHURN)
    python = python_for_nobody(shared_dir)
    mark = os.urandom(8).hex()
    argv = ["setpriv", *as_nobody(python), "-m", "docket", "run", "--ledger-dir", str(folder)]
    try:
        with (out / "stderr").open("wb") as err:
            done = subprocess.run(
                [*argv, "--", python, str(script), str(out), "250"], stdout=err, stderr=err,
                env={**with_keys(None), MARK_ENV: mark}, timeout=TIMEOUT, cwd=shared_dir,
            )  # fmt: skip
        alive = marked(mark)
    finally:
        stop_all(mark)
    assert alive == [], f"{len(alive)} churning member(s) outlived the run"
    assert done.returncode == 0, (out / "stderr").read_text()
    events = read_events(folder / "ledger.jsonl")
    assert events[0]["hardening"]["isolation"] == PIDNS, events[0]["hardening"]
    assert not [e for e in events if "survivors" in e]
    orphans = of_type(events, "process.orphan")
    ended = sum(e.get("unlisted", 0) for e in orphans) + len([e for e in orphans if "pid" in e])
    # Those one look saw, for the record (the namespace ended all): beside two CPU hogs the
    # look may not reach one in its second, and then the record says so.
    troubles = [t for e in orphans for t in e.get("isolation_errors", [])]
    assert ended >= 1 or [t for t in troubles if "ended unlisted" in t], (ended, troubles)
    assert all("did not finish within" in t for t in troubles), troubles
    assert_well_ended(folder, events, 0)


# Run 1's agent leaves a snooper behind the reach of a fixed number of sweep rounds
# (at the end of a chain of setsid'd links), which forks a new process for every
# pass over /proc, and each writes down every environ or cmdline holding the variable the next run's key is in.
SNOOPER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    out, name, depth = Path(sys.argv[1]), sys.argv[2].encode() + b"=", int(sys.argv[3])

    def idle(seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)

    if os.fork():  # the agent: a canary holding the variable, then wait for the snooper to see it
        canary = subprocess.Popen(["sleep", "30"], env={sys.argv[2]: "canary-value"})
        deadline = time.monotonic() + 20
        while b"canary-value" not in ((out / "found").exists() and (out / "found").read_bytes() or b""):
            if time.monotonic() > deadline:
                sys.exit(99)
            time.sleep(0.01)
        canary.kill()
        canary.wait()
        sys.exit(0)
    for link in range(depth):
        os.setsid()
        if os.fork():
            idle(30)
            os._exit(0)
    os.setsid()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        worker = os.fork()
        if worker:  # a new process for every pass
            os.waitpid(worker, 0)
            continue
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
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
            with open(out / "found", "ab") as f:
                f.write(b"\\n".join(found) + b"\\n")
        os._exit(0)
    """
)
SNOOPED_ENV = "DOCKET_SNOOPED_KEY"
RUN2_KEY = "sk-run-two-provider-key-never-for-anyone-9d41"


def snoopers(script: Path) -> list[int]:
    """Live processes running the snooper's script (forks keep their parent's cmdline)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if str(script).encode() in f.read() and running(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue  # gone while we looked
    return found


def stop_snoopers(script: Path) -> None:
    """Cleanup: freeze every snooper, then kill them all, until none is left (bounded)."""
    deadline = time.monotonic() + 10
    while (pids := snoopers(script)) and time.monotonic() < deadline:
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    continue  # gone meanwhile
        time.sleep(0.01)


def test_a_forking_snooper_left_by_run_1_dies_with_it_and_never_sees_run_2s_key(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "snooper.py"
    script.write_text(SNOOPER)
    policy = tmp_path / "docket.toml"
    policy.write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        f'key_env = "{SNOOPED_ENV}"\n'
    )
    env = with_keys(None)
    try:
        first = docket_argv("run", "--policy", str(policy), "--ledger-dir", str(tmp_path / "one"))
        # Output to files: on a pipe, a survivor would hold it open and the wait for
        # its end would wait for the survivor, not for docket.
        with (tmp_path / "one.err").open("wb") as err:
            one = subprocess.run(
                [*first, "--", sys.executable, str(script), str(out), SNOOPED_ENV, "70"],
                stdout=err, stderr=err, env=env | {SNOOPED_ENV: "sk-run-one-key-0000"},
                timeout=TIMEOUT,
            )  # fmt: skip
        # 99: the snooper never saw the canary
        assert one.returncode == 0, (tmp_path / "one.err").read_text()
        left = snoopers(script)
        second = docket_argv("run", "--policy", str(policy), "--ledger-dir", str(tmp_path / "two"))
        with (tmp_path / "two.err").open("wb") as err:
            two = subprocess.run(
                [*second, "--", sys.executable, "-c", "import time; time.sleep(0.3)"],
                stdout=err, stderr=err, env=env | {SNOOPED_ENV: RUN2_KEY}, timeout=TIMEOUT,
            )  # fmt: skip
        assert two.returncode == 0, (tmp_path / "two.err").read_text()
    finally:
        stop_snoopers(script)
    seen = (out / "found").read_bytes()
    assert RUN2_KEY.encode() not in seen, "the snooper read run 2's key"
    assert b"canary-value" in seen  # the snooper really read environs
    assert left == [], f"{len(left)} snooper process(es) outlived run 1"


# `docket run`, in a process of its own, with os.environ watched: each read of the
# key's variable notes whether the process was dumpable at that moment.
WATCHED_START = textwrap.dedent(
    """
    import ctypes, json, os, sys
    libc = ctypes.CDLL(None)
    reads = []

    class Watched(type(os.environ)):
        def __getitem__(self, name):
            if name == sys.argv[1]:
                reads.append(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
            return super().__getitem__(name)

    os.environ.__class__ = Watched
    from docket.cli import main
    status = main(sys.argv[2:])
    print(json.dumps({"status": status, "dumpable_at_reads": reads}))
    """
)


def test_the_supervisor_is_non_dumpable_before_it_reads_any_key(tmp_path):
    policy = tmp_path / "docket.toml"
    policy.write_text(
        f'[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        f'key_env = "{SNOOPED_ENV}"\n'
    )
    argv = ["run", "--policy", str(policy), "--ledger-dir", str(tmp_path / "run"), "--", "true"]
    done = subprocess.run(
        [sys.executable, "-c", WATCHED_START, SNOOPED_ENV, *argv],
        capture_output=True, text=True, env=with_keys(None) | {SNOOPED_ENV: RUN2_KEY},
        timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == 0, done.stderr
    assert report["dumpable_at_reads"], "the key was never read"
    assert set(report["dumpable_at_reads"]) == {0}, report


DETACH_AND_WAIT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    daemon = subprocess.Popen(["sleep", "300"], start_new_session=True)  # out of the group
    (out / "daemon.tmp").write_text(str(daemon.pid))
    os.rename(out / "daemon.tmp", out / "daemon")
    time.sleep(60)  # the agent waits to be killed with its run (the test takes ~0.5 s)
    """
)


def in_a_cgroup_of_its_own() -> bool:
    """Whether `docket run` here gets a cgroup leaf (root, cgroup2 mounted)."""
    return os.geteuid() == 0 and any(
        line.split(" - ")[1].startswith("cgroup2 ")
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if " - " in line
    )


def test_a_detached_process_dies_with_a_sigkilled_supervisor(tmp_path):
    """The watcher the launcher leaves kills the run's whole cgroup when the
    supervisor dies, not only the agent's process group (docs/resilience.md F10)."""
    if not in_a_cgroup_of_its_own():
        pytest.skip("needs a cgroup leaf per run: root and a cgroup2 hierarchy")
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "detach.py"
    script.write_text(DETACH_AND_WAIT)
    argv = docket_argv("run", "--ledger-dir", str(folder), "--", sys.executable, str(script))
    with (tmp_path / "stderr").open("wb") as err:
        supervisor = subprocess.Popen(
            [*argv, str(out)], stdout=err, stderr=err, env=with_keys(None)
        )
    daemon = None
    try:
        daemon = int(wait_until(lambda: (out / "daemon").exists() and (out / "daemon").read_text(),
                                READY, "the detached process"))  # fmt: skip
        assert running(daemon)
        supervisor.kill()
        supervisor.wait(timeout=TIMEOUT)
        wait_until(lambda: not running(daemon), 10, f"detached {daemon} to die with the run")
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(timeout=TIMEOUT)
        if daemon is not None:
            kill_all([daemon])


LEAVES_A_DAEMON = (
    "import subprocess, sys\n"
    "daemon = subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
    "open(sys.argv[1], 'w').write(str(daemon.pid))\n"
)


async def test_survivors_are_named_and_the_run_exits_43(tmp_path, monkeypatch):
    """When the end's deadline passes with processes of the run alive (here: a
    deadline of 0), the ledger names them, the run's reason says its isolation
    failed, and it exits 43, in the receipt too; the receipt still verifies."""
    from docket.receipts.verify import verify
    from docket.run import orphans
    from docket.run.supervisor import Supervisor
    from docket.run.values import RunOptions

    monkeypatch.setattr(orphans, "SWEEP_SECONDS", 0.0)
    pid_file = tmp_path / "daemon.pid"
    options = RunOptions(
        command=[sys.executable, "-c", LEAVES_A_DAEMON, str(pid_file)],
        ledger_dir=str(tmp_path / "run"),
    )
    daemon = None
    try:
        with trio.fail_after(TIMEOUT):
            outcome = await Supervisor(options, env=with_keys(None)).run()
        daemon = int(pid_file.read_text())
        events = read_events(outcome.ledger)
        (named,) = [e for e in of_type(events, "process.orphan") if "survivors" in e]
        assert daemon in named["survivors"] and named["survivors_count"] >= 1
        assert named["reason"].startswith("isolation failed: ")
        assert outcome.exit_status == 43
        assert "; isolation failed: " in outcome.reason and str(daemon) in outcome.reason
        receipt = json.loads(outcome.receipt.read_text())
        assert receipt["exit"]["status"] == 43 and receipt["exit"]["reason"] == outcome.reason
        assert verify(outcome.receipt).ok
    finally:
        if daemon is not None:
            cleanup_survivor(daemon)


def cleanup_survivor(pid: int) -> None:
    """Kill a survivor the run left (on purpose) and remove the leaf it was left in."""
    mount = cgroup2_mount(Path("/proc/self/mountinfo").read_text())
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            leaf = own_cgroup(f.read())
    except OSError:
        leaf = None  # gone already
    kill_all([pid])
    if mount is not None and leaf is not None and Path(leaf).name.startswith("docket-"):
        path = Path(mount) / leaf.lstrip("/")
        wait_until(lambda: rmdir_quietly(path), 10, f"{path} to empty")


def rmdir_quietly(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # still populated: the kill has not landed yet
    return True
