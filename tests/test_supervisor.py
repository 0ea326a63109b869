"""The supervisor (`docket run`), with real processes, real signals and the bytes on disk.

Most tests run `python -m docket run ...` as a subprocess and signal it; a few
run the Supervisor in-process where a clock hook, a fault hook or an in-process
stub makes that cleaner. Every test is bounded in time, kills what it started,
reads the ledger (chain-verified) and the receipt afterwards, and has
`docket verify` accept the receipt. Child behaviour lives in one small script
(CHILD, below) whose modes write marker files the test waits on.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest
import trio
from helpers import read_events, running, wait_until, with_keys
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.stub.server import Stub, StubConfig, fingerprint
from docket.cli import main as docket_main
from docket.clock import Clock
from docket.ledger.chain import TORN_TAIL
from docket.ledger.faults import FailOrdinals
from docket.ledger.lock import holder_pid
from docket.policy import policy_from_dict
from docket.run.child import child_env, command_missing, describe_exit, wait_status
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

TIMEOUT = 60  # seconds for one supervised run; generous for a shared 2-core machine
READY = 20  # seconds for a child to come up
GRACE = "0.5"
REAL_KEY = "sk-real-provider-key-never-for-the-agent-5f2a"
OTHER_KEY = "sk-ant-real-other-key-never-for-the-agent-77c1"

# One script, several behaviours: `python child.py OUT MODE`. Markers are written
# atomically (write, then rename) so a poller never reads half a file. Every
# wait is bounded so nothing outlives a failed test by long.
CHILD = textwrap.dedent(
    r"""
    import json, os, signal, subprocess, sys, time, urllib.request
    from pathlib import Path

    out, mode = Path(sys.argv[1]), sys.argv[2]

    def mark(name, text=""):
        (out / (name + ".tmp")).write_text(text)
        os.rename(out / (name + ".tmp"), out / name)

    def idle(seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)

    def await_file(name):
        deadline = time.monotonic() + 20
        while not (out / name).exists():
            if time.monotonic() > deadline:
                sys.exit(99)
            time.sleep(0.01)

    if mode == "env":
        env = dict(os.environ)
        with urllib.request.urlopen(env["DOCKET_BOUNDARY_URL"] + "/docket/healthz", timeout=10) as r:
            env["__healthz"] = str(r.status)
        mark("env.json", json.dumps(env))
    elif mode == "trap":  # exit 10+N on signal N, after the grandchild has gone too
        grandchild = subprocess.Popen([sys.executable, sys.argv[0], str(out), "grandchild"])
        def on_signal(sig, frame):
            mark("child-" + signal.Signals(sig).name, str(os.getpid()))
            grandchild.wait(timeout=20)
            sys.exit(10 + sig)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        await_file("grandchild-ready")
        mark("ready", str(os.getpid()))
        idle()
    elif mode == "grandchild":
        def on_signal(sig, frame):
            mark("grandchild-" + signal.Signals(sig).name, str(os.getpid()))
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        mark("grandchild-ready", str(os.getpid()))
        idle()
    elif mode == "ignore":  # notes SIGTERM and carries on
        signal.signal(signal.SIGTERM, lambda sig, frame: mark("child-SIGTERM"))
        mark("ready", str(os.getpid()))
        idle()
    elif mode == "sleep":
        mark("ready", str(os.getpid()))
        idle(float(sys.argv[3]) if len(sys.argv) > 3 else 60)
    elif mode == "straggler":  # leaves a process in its group and exits
        straggler = subprocess.Popen(["sleep", "60"])
        mark("straggler.pid", str(straggler.pid))
    elif mode == "exit":
        sys.exit(int(sys.argv[3]))
    elif mode == "self-signal":
        os.kill(os.getpid(), int(sys.argv[3]))
        idle(10)
    elif mode == "touch":
        mark("ran")
    """
)


# ---------------------------------------------------------------- helpers


@pytest.fixture
def child(tmp_path) -> list[str]:
    """The argv prefix of the child script; its markers go to tmp_path/out."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    (tmp_path / "out").mkdir()
    return [sys.executable, str(script), str(tmp_path / "out")]


@pytest.fixture
def processes():
    """Supervisors a test started: killed (and reaped) on the way out if still running."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=TIMEOUT)


def docket_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "docket", *args]


def run_docket(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    env = with_keys(env)
    return subprocess.run(
        docket_argv(*args),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=env,
        cwd=cwd,
    )


def start_docket(processes, *args: str, stderr_path: Path, env: dict | None = None):
    proc = subprocess.Popen(
        docket_argv(*args),
        stdout=subprocess.DEVNULL,
        stderr=stderr_path.open("wb"),
        env=with_keys(env),
    )
    processes.append(proc)
    return proc


def kill_group(pgid: int) -> None:
    """Cleanup for a failed test: SIGKILL a child's group if anything is left in it."""
    if not running(pgid):
        return  # the leader is gone and the run swept its group
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return  # nothing left: the run cleaned up after itself


def of_type(events: list[dict], type: str) -> list[dict]:
    return [e for e in events if e["type"] == type]


def read_receipt(folder: Path) -> dict:
    return json.loads((folder / "receipt.json").read_text())


def assert_verifies(folder: Path, capsys) -> None:
    """`docket verify RECEIPT` (the CLI's own entry point, in-process) says ok."""
    capsys.readouterr()
    status = docket_main(["verify", str(folder / "receipt.json")])
    out = capsys.readouterr()
    assert status == 0, out.out + out.err
    assert out.out.startswith("ok: "), out.out


def assert_well_ended(folder: Path, events: list[dict], exit_status: int) -> dict:
    """The shape every finished run shares: session.start first, session.end last,
    nothing after the child's exit but signals to stragglers and orphans ended, and a receipt that
    agrees with session.end and was written after it."""
    assert events[0]["type"] == "session.start"
    end = events[-1]
    assert end["type"] == "session.end"
    assert len(of_type(events, "session.end")) == 1
    assert end["exit_status"] == exit_status
    exits = of_type(events, "process.exit")
    if exits:
        after = events[exits[0]["seq"] + 1 : -1]
        # signals to stragglers, and the orphans ended (tests/test_keys_supervisor.py)
        assert all(e["type"] in ("signal.forwarded", "process.orphan") for e in after), after
    receipt = read_receipt(folder)
    assert receipt["exit"] == {"status": exit_status, "reason": end["reason"], "cap": end["cap"]}
    assert receipt["ended_at"] == end["ts"]
    assert receipt["ledger"]["events"] == len(events)
    assert receipt["duration_ms"] == end["mono_ms"] - events[0]["mono_ms"] >= 0
    assert holder_pid(folder / "ledger.jsonl") is None  # the ledger was closed
    return receipt


def policy_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "docket.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


# ---------------------------------------------------------------- the child's environment


def test_child_gets_boundary_urls_and_token_never_a_provider_key(tmp_path, child, capsys):
    policy = policy_file(
        tmp_path,
        """
        [providers.openai]
        kind = "openai"
        base_url = "http://127.0.0.1:9"
        key_env = "H9_OPENAI_KEY"
        [providers.claude]
        kind = "anthropic"
        base_url = "http://127.0.0.1:9"
        key_env = "H9_ANTHROPIC_KEY"
        """,
    )
    env = dict(os.environ, H9_OPENAI_KEY=REAL_KEY, H9_ANTHROPIC_KEY=OTHER_KEY)
    env["OPENAI_API_KEY"] = REAL_KEY  # a stray copy of the key under the SDK's own name
    folder = tmp_path / "run"
    r = run_docket(
        "run", "--policy", policy, "--ledger-dir", str(folder), "--", *child, "env", env=env
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads((tmp_path / "out" / "env.json").read_text())

    token = seen["DOCKET_RUN_TOKEN"]
    assert token.startswith("dkt-") and len(token) > 20
    assert seen["OPENAI_API_KEY"] == seen["ANTHROPIC_API_KEY"] == token
    assert "H9_OPENAI_KEY" not in seen and "H9_ANTHROPIC_KEY" not in seen
    for value in seen.values():
        assert REAL_KEY not in value and OTHER_KEY not in value
    boundary = seen["DOCKET_BOUNDARY_URL"]
    assert boundary.startswith("http://127.0.0.1:")
    assert seen["OPENAI_BASE_URL"] == f"{boundary}/openai/v1"
    assert seen["ANTHROPIC_BASE_URL"] == f"{boundary}/claude"
    assert seen["__healthz"] == "200"  # the URL was live while the child ran

    # Neither the keys nor the token are written to the ledger or the receipt.
    for path in (folder / "ledger.jsonl", folder / "receipt.json"):
        data = path.read_text()
        assert REAL_KEY not in data and OTHER_KEY not in data and token not in data
    events = read_events(folder / "ledger.jsonl")
    assert [e["type"] for e in events] == [
        "session.start",
        "process.spawn",
        "process.exit",
        "session.end",
    ]
    assert_well_ended(folder, events, 0)
    assert_verifies(folder, capsys)


@settings(deadline=None)
@given(
    base=st.dictionaries(
        st.sampled_from(
            ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "K1", "K2", "K3", "PATH", "OPENAI_BASE_URL"]
        ),
        st.text(max_size=12),
        max_size=7,
    ),
    providers=st.lists(
        st.tuples(
            st.sampled_from(["openai", "anthropic"]),
            st.sampled_from(["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "K1", "K2", "K3"]),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_child_env_never_carries_a_key_env(base, providers):
    policy = policy_from_dict(
        {
            "providers": {
                f"p{i}": {"kind": kind, "base_url": "http://127.0.0.1:9", "key_env": key_env}
                for i, (kind, key_env) in enumerate(providers)
            }
        }
    )
    token = "dkt-token"
    env = child_env(base, "http://127.0.0.1:1", token, policy)
    for provider in policy.providers.values():
        # A key variable is either gone or holds the run token: never what it held.
        assert env.get(provider.key_env, token) == token
    assert env["DOCKET_RUN_TOKEN"] == token
    kinds = {kind for kind, _ in providers}
    key_envs = {key_env for _, key_env in providers}
    for kind, var in (("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")):
        # The SDK's own variable carries the token; a well-known key name whose kind
        # is not configured is removed all the same.
        assert env.get(var) == (token if kind in kinds else None)
    untouched = set(base) - key_envs - {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
    untouched -= {
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "DOCKET_BOUNDARY_URL",
        "DOCKET_RUN_TOKEN",
    }
    assert all(env[name] == base[name] for name in untouched)


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_is_forwarded_to_the_childs_group(tmp_path, child, processes, capsys, sig):
    folder, out = tmp_path / "run", tmp_path / "out"
    supervisor = start_docket(
        processes,
        "run",
        "--ledger-dir",
        str(folder),
        "--grace",
        "20",
        "--",
        *child,
        "trap",
        stderr_path=tmp_path / "stderr",
    )
    pid = int(
        wait_until(
            lambda: (out / "ready").exists() and (out / "ready").read_text(), READY, "the child"
        )
    )
    try:
        supervisor.send_signal(sig)
        assert supervisor.wait(timeout=TIMEOUT) == 10 + sig  # the child's own status
    finally:
        kill_group(pid)
    name = signal.Signals(sig).name
    assert (out / f"child-{name}").read_text() == str(pid)
    grandchild = int((out / "grandchild-ready").read_text())
    assert (out / f"grandchild-{name}").read_text() == str(grandchild)  # same group, signalled

    events = read_events(folder / "ledger.jsonl")
    spawn = of_type(events, "process.spawn")[0]
    assert spawn["pid"] == pid  # the launcher exec'd in place
    (forwarded,) = of_type(events, "signal.forwarded")  # no SIGKILL: it exited in time
    assert forwarded["signal"] == name and forwarded["pgid"] == pid
    assert forwarded["reason"] == f"{name} received by the supervisor"
    (exited,) = of_type(events, "process.exit")
    assert exited["status"] == 10 + sig
    assert spawn["seq"] < forwarded["seq"] < exited["seq"] < events[-1]["seq"]
    assert (
        events[-1]["reason"]
        == f"child exited with status {10 + sig} after {name} to the supervisor"
    )
    assert_well_ended(folder, events, 10 + sig)
    assert_verifies(folder, capsys)


def test_child_that_ignores_sigterm_is_killed_after_the_grace_period(
    tmp_path, child, processes, capsys
):
    folder, out = tmp_path / "run", tmp_path / "out"
    supervisor = start_docket(
        processes,
        "run",
        "--ledger-dir",
        str(folder),
        "--grace",
        GRACE,
        "--",
        *child,
        "ignore",
        stderr_path=tmp_path / "stderr",
    )
    pid = int(
        wait_until(
            lambda: (out / "ready").exists() and (out / "ready").read_text(), READY, "the child"
        )
    )
    try:
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=TIMEOUT) == 128 + signal.SIGKILL
    finally:
        kill_group(pid)
    assert (out / "child-SIGTERM").exists()  # it got the SIGTERM, and carried on

    events = read_events(folder / "ledger.jsonl")
    term, kill = of_type(events, "signal.forwarded")
    assert (term["signal"], kill["signal"]) == ("SIGTERM", "SIGKILL")
    assert kill["reason"] == f"SIGTERM received by the supervisor; not gone after {GRACE} s"
    assert kill["mono_ms"] - term["mono_ms"] >= 1000 * float(GRACE)
    (exited,) = of_type(events, "process.exit")
    assert exited["status"] == -signal.SIGKILL
    # Only once the child was reaped: process.exit, then session.end, then the receipt.
    assert term["seq"] < kill["seq"] < exited["seq"] < events[-1]["seq"]
    receipt = assert_well_ended(folder, events, 137)
    assert receipt["exit"]["reason"] == "child killed by SIGKILL after SIGTERM to the supervisor"
    assert (folder / "receipt.json").stat().st_mtime_ns >= (
        folder / "ledger.jsonl"
    ).stat().st_mtime_ns
    assert_verifies(folder, capsys)


def test_child_dies_with_a_sigkilled_supervisor(tmp_path, child, processes, capsys):
    folder, out = tmp_path / "run", tmp_path / "out"
    ledger = folder / "ledger.jsonl"
    supervisor = start_docket(
        processes,
        "run",
        "--ledger-dir",
        str(folder),
        "--",
        *child,
        "sleep",
        stderr_path=tmp_path / "stderr",
    )
    pid = int(
        wait_until(
            lambda: (out / "ready").exists() and (out / "ready").read_text(), READY, "the child"
        )
    )
    try:
        wait_until(lambda: b'"type":"process.spawn"' in ledger.read_bytes(), READY, "the spawn")
        supervisor.kill()
        supervisor.wait(timeout=TIMEOUT)
        wait_until(lambda: not running(pid), 10, f"child {pid} to die with the supervisor")
    finally:
        kill_group(pid)

    # What is left is a readable prefix: doctor finds it clean (or with a torn tail), unlocked.
    capsys.readouterr()
    docket_main(["doctor", "--json", str(ledger)])
    diagnosis = json.loads(capsys.readouterr().out)
    assert diagnosis["verdict"] in ("clean", TORN_TAIL), diagnosis
    assert diagnosis["locked"] is False
    events = read_events(ledger)
    assert events[0]["type"] == "session.start"
    assert of_type(events, "process.spawn")[0]["pid"] == pid
    assert not of_type(events, "session.end")
    assert not (folder / "receipt.json").exists()  # the run did not end: no claim that it did


def test_grandchildren_die_with_a_sigkilled_supervisor(tmp_path, child, processes):
    """The death signal takes the agent; the watcher the launcher leaves behind takes
    what the agent started in its group (docket/run/launch.py keep_group)."""
    folder, out = tmp_path / "run", tmp_path / "out"
    supervisor = start_docket(
        processes, "run", "--ledger-dir", str(folder), "--", *child, "trap",
        stderr_path=tmp_path / "stderr",
    )  # fmt: skip
    pid = int(
        wait_until(
            lambda: (out / "ready").exists() and (out / "ready").read_text(), READY, "the child"
        )
    )
    grandchild = int((out / "grandchild-ready").read_text())
    try:
        assert running(grandchild)
        supervisor.kill()
        supervisor.wait(timeout=TIMEOUT)
        wait_until(lambda: not running(pid), 10, f"child {pid} to die with the supervisor")
        wait_until(lambda: not running(grandchild), 10, f"grandchild {grandchild} to die too")
    finally:
        kill_group(pid)
        if running(grandchild):  # the failure this test is for: do not leave it behind
            os.kill(grandchild, signal.SIGKILL)
    assert not (out / "grandchild-SIGTERM").exists()  # SIGKILLed, not asked


def test_stragglers_in_the_childs_group_do_not_outlive_the_run(tmp_path, child, capsys):
    folder, out = tmp_path / "run", tmp_path / "out"
    r = run_docket("run", "--ledger-dir", str(folder), "--", *child, "straggler")
    straggler = int((out / "straggler.pid").read_text())
    try:
        assert r.returncode == 0, r.stderr
        wait_until(lambda: not running(straggler), 10, f"straggler {straggler} to be killed")
    finally:
        if running(straggler):
            os.kill(straggler, signal.SIGKILL)
    events = read_events(folder / "ledger.jsonl")
    exited, swept = of_type(events, "process.exit")[0], of_type(events, "signal.forwarded")
    assert len(swept) == 1 and swept[0]["signal"] == "SIGKILL"
    assert swept[0]["seq"] > exited["seq"]
    assert swept[0]["reason"] == "the child exited; 1 process(es) of its group still running"
    assert_well_ended(folder, events, 0)
    assert_verifies(folder, capsys)


# ---------------------------------------------------------------- the wall-clock cap


def test_wall_clock_cap_stops_the_run(tmp_path, child, capsys):
    folder = tmp_path / "run"
    started = time.monotonic()
    r = run_docket(
        "run",
        "--ledger-dir",
        str(folder),
        "--max-wall-clock",
        "1",
        "--grace",
        GRACE,
        "--",
        *child,
        "sleep",
        "30",
    )
    elapsed = time.monotonic() - started
    assert r.returncode == 42, r.stderr
    assert 1.0 <= elapsed < 1.0 + float(GRACE) + 5.0  # 5 s: interpreter start-ups, a busy machine
    events = read_events(folder / "ledger.jsonl")
    (exceeded,) = of_type(events, "cap.exceeded")
    assert exceeded["cap"] == "max_wall_seconds" and exceeded["limit"] == 1
    assert exceeded["observed"] >= 1
    (warning,) = of_type(events, "cap.warning")  # at warn_at (0.8) of the cap, before it
    assert warning["cap"] == "max_wall_seconds" and warning["seq"] < exceeded["seq"]
    term = of_type(events, "signal.forwarded")[0]
    assert term["signal"] == "SIGTERM" and term["reason"] == "wall-clock cap reached"
    assert exceeded["seq"] < term["seq"] < of_type(events, "process.exit")[0]["seq"]
    assert events[0]["caps"]["max_wall_seconds"] == 1  # the limit the run was held to
    receipt = assert_well_ended(folder, events, 42)
    assert receipt["exit"] == {
        "status": 42,
        "reason": "wall-clock cap reached",
        "cap": "max_wall_seconds",
    }
    assert [b["cap"] for b in receipt["caps"]["breaches"]] == ["max_wall_seconds"]
    assert 1000 <= receipt["duration_ms"] <= elapsed * 1000
    assert "wall-clock cap reached" in r.stderr
    assert_verifies(folder, capsys)


class SteppingWallClock(Clock):
    """The real monotonic clock; a wall clock that steps `step` seconds at every
    reading: alternately back and forth (`swing`), or always forward."""

    def __init__(self, step: float, *, swing: bool) -> None:
        super().__init__()
        self.step, self.swing, self.readings = step, swing, 0

    def wall(self) -> float:
        self.readings += 1
        if self.swing:
            return time.time() + (self.step if self.readings % 2 else -self.step)
        return time.time() + self.step * self.readings


def ts_seconds(event: dict) -> float:
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


async def test_wall_clock_steps_cannot_shorten_lengthen_or_breach(tmp_path, child, capsys):
    # A wall clock swinging an hour back and forth at every reading: the 1 s cap still
    # stops the run after 1 s of monotonic time, and no duration is negative.
    folder = tmp_path / "swing"
    clock = SteppingWallClock(3600, swing=True)
    options = RunOptions(
        command=[*child, "sleep", "30"],
        ledger_dir=str(folder),
        max_wall_clock=1.0,
        grace_seconds=float(GRACE),
    )
    with trio.fail_after(TIMEOUT):
        started = trio.current_time()
        outcome = await Supervisor(options, clock).run()
        elapsed = trio.current_time() - started
    assert outcome.exit_status == 42 and outcome.cap == "max_wall_seconds"
    assert 1.0 <= elapsed < 1.0 + float(GRACE) + 5.0
    events = read_events(folder / "ledger.jsonl")
    walls = [ts_seconds(e) for e in events]
    assert any(b < a - 3000 for a, b in zip(walls, walls[1:], strict=False))  # it did step back
    monos = [e["mono_ms"] for e in events]
    assert monos == sorted(monos)
    assert len(of_type(events, "cap.exceeded")) == 1
    receipt = assert_well_ended(folder, events, 42)
    assert 1000 <= receipt["duration_ms"] <= elapsed * 1000
    assert_verifies(folder, capsys)

    # A wall clock leaping a day forward at every reading manufactures no breach of a
    # 30 s cap (the policy's, this time) on a run of a fraction of a second.
    folder = tmp_path / "leap"
    clock = SteppingWallClock(86400, swing=False)
    policy = policy_file(tmp_path, '[caps]\nmax_wall_seconds = "30s"\non_breach = "kill"\n')
    options = RunOptions(
        command=[*child, "sleep", "0.3"], policy_path=policy, ledger_dir=str(folder)
    )
    with trio.fail_after(TIMEOUT):
        started = trio.current_time()
        outcome = await Supervisor(options, clock).run()
        elapsed = trio.current_time() - started
    assert outcome.exit_status == 0, outcome.reason
    events = read_events(folder / "ledger.jsonl")
    assert not of_type(events, "cap.exceeded") and not of_type(events, "cap.warning")
    walls = [ts_seconds(e) for e in events]
    assert walls[-1] - walls[0] > 86400  # the wall clock did leap
    receipt = assert_well_ended(folder, events, 0)
    assert 300 <= receipt["duration_ms"] <= elapsed * 1000
    assert_verifies(folder, capsys)


# ---------------------------------------------------------------- exit status


@pytest.mark.parametrize(
    ("mode", "status", "reason"),
    [
        (["exit", "3"], 3, "child exited with status 3"),
        (
            ["self-signal", str(int(signal.SIGUSR1))],
            128 + signal.SIGUSR1,
            "child killed by SIGUSR1",
        ),
    ],
    ids=["own-code", "killed-by-signal"],
)
def test_exit_status_is_the_childs(tmp_path, child, capsys, mode, status, reason):
    folder = tmp_path / "run"
    r = run_docket("run", "--quiet", "--ledger-dir", str(folder), "--", *child, *mode)
    assert r.returncode == status, r.stderr
    assert r.stderr.splitlines() == [  # --quiet: the last line alone
        f"docket: run {read_receipt(folder)['run_id']} ended ({reason}), exit {status}; "
        f"receipt {folder / 'receipt.json'}"
    ]
    events = read_events(folder / "ledger.jsonl")
    assert of_type(events, "process.exit")[0]["status"] == (
        status if status < 128 else 128 - status
    )
    assert_well_ended(folder, events, status)
    assert_verifies(folder, capsys)


def test_command_not_found_is_127_in_one_line(tmp_path, capsys):
    folder = tmp_path / "run"
    r = run_docket("run", "--ledger-dir", str(folder), "--", "no-such-agent-h9")
    assert r.returncode == 127
    assert "Traceback" not in r.stderr
    line = r.stderr.splitlines()[-1]  # after the start line and the receipt's summary
    assert "command not found: no-such-agent-h9" in line and "exit 127" in line
    events = read_events(folder / "ledger.jsonl")
    assert [e["type"] for e in events] == ["session.start", "session.end"]  # nothing spawned
    assert_well_ended(folder, events, 127)
    assert_verifies(folder, capsys)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "give the command to supervise"),
        (["--"], "give the command to supervise"),
        (["--max-wall-clock", "0", "--", "true"], "--max-wall-clock must be"),
        (["--max-wall-clock", "-1", "--", "true"], "--max-wall-clock"),
        (["--max-wall-clock", "nan", "--", "true"], "--max-wall-clock"),
        (["--grace", "-1", "--", "true"], "--grace"),
        (["--grace", "soon", "--", "true"], "invalid duration (seconds, or 30s, 500ms, 10m, 1h)"),
        (["--max-wall-clock", "10 min", "--", "true"], "invalid duration (seconds, or 30s, 500"),
    ],
)
def test_bad_run_arguments_are_one_line_exit_2(tmp_path, args, needle):
    r = run_docket("run", *args, cwd=tmp_path)
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert line.startswith("docket: ") and needle in line
    assert not (tmp_path / "docket-runs").exists()  # refused before any ledger was opened


async def test_cap_kill_exits_42(tmp_path, capsys):
    # A looping agent against a stub, under max_model_calls = 2 and on_breach = "kill".
    folder = tmp_path / "run"
    stub = Stub(StubConfig(kind="openai"))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            listening = await nursery.start(stub.serve)
            policy = policy_file(
                tmp_path,
                f"""
                [providers.openai]
                kind = "openai"
                base_url = "{listening.url}"
                key_env = "H9_STUB_KEY"
                [caps]
                max_model_calls = 2
                on_breach = "kill"
                """,
            )
            agent = [sys.executable, "-m", "docket", "agent", "--mode", "loop", "--calls", "50"]
            result = await trio.run_process(
                docket_argv(
                    "run",
                    "--policy",
                    policy,
                    "--ledger-dir",
                    str(folder),
                    "--grace",
                    GRACE,
                    "--",
                    *agent,
                ),
                env=dict(os.environ, H9_STUB_KEY=REAL_KEY),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            nursery.cancel_scope.cancel()
    assert result.returncode == 42, result.stderr.decode()
    log = stub.log.entries()
    assert len(log) == 2  # what the provider really saw
    assert {entry["key"] for entry in log} == {fingerprint(REAL_KEY)}
    events = read_events(folder / "ledger.jsonl")
    assert len(of_type(events, "model.request")) == len(of_type(events, "model.response")) == 2
    exceeded = of_type(events, "cap.exceeded")
    assert exceeded and exceeded[0]["cap"] == "max_model_calls"
    receipt = assert_well_ended(folder, events, 42)
    assert receipt["exit"]["cap"] == "max_model_calls"
    assert receipt["totals"]["model_calls"] == 2
    assert_verifies(folder, capsys)


# ---------------------------------------------------------------- runs that cannot start


def test_boundary_that_cannot_listen_ends_the_run_legibly(tmp_path, child, capsys):
    folder = tmp_path / "run"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        policy = policy_file(tmp_path, f"[boundary]\nport = {port}\n")
        r = run_docket(
            "run", "--policy", policy, "--ledger-dir", str(folder), "--", *child, "touch"
        )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "watch it" not in r.stderr  # it never listened
    line = r.stderr.splitlines()[-1]  # after the receipt's summary
    assert f"the boundary cannot listen on 127.0.0.1:{port} (Address already in use)" in line
    assert not (tmp_path / "out" / "ran").exists()  # the child was never started
    events = read_events(folder / "ledger.jsonl")
    assert [e["type"] for e in events] == ["session.start", "session.end"]
    assert_well_ended(folder, events, 2)
    assert_verifies(folder, capsys)


async def test_child_that_cannot_be_spawned_ends_the_run_legibly(tmp_path, child, capsys):
    # An environment the kernel refuses to exec with (one variable over MAX_ARG_STRLEN).
    folder = tmp_path / "run"
    env = dict(os.environ, H9_HUGE="x" * (256 * 1024))
    options = RunOptions(command=[*child, "touch"], ledger_dir=str(folder))
    with trio.fail_after(TIMEOUT):
        outcome = await Supervisor(options, env=env).run()
    assert outcome.exit_status == 126
    assert outcome.reason.startswith("cannot start the child: [Errno 7] Argument list too long")
    assert not (tmp_path / "out" / "ran").exists()
    events = read_events(folder / "ledger.jsonl")
    assert [e["type"] for e in events] == ["session.start", "session.end"]
    assert_well_ended(folder, events, 126)
    assert_verifies(folder, capsys)


class InterruptingClock(Clock):
    """Sends SIGINT to this process at its first wall reading: the ledger's stamp on
    session.start, i.e. in the middle of the supervisor's start-up."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = False

    def wall(self) -> float:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return super().wall()


async def test_ctrl_c_during_start_up_ends_the_run_before_the_child(tmp_path, child, capsys):
    folder = tmp_path / "run"
    clock = InterruptingClock()
    options = RunOptions(command=[*child, "touch"], ledger_dir=str(folder))
    with trio.fail_after(TIMEOUT):
        outcome = await Supervisor(options, clock).run()
    assert clock.sent
    assert outcome.exit_status == 128 + signal.SIGINT
    assert outcome.reason == "SIGINT received before the child was started"
    assert not (tmp_path / "out" / "ran").exists()
    events = read_events(folder / "ledger.jsonl")
    assert [e["type"] for e in events] == ["session.start", "session.end"]
    assert_well_ended(folder, events, 130)
    assert_verifies(folder, capsys)


async def test_child_outlives_idle_worker_threads(tmp_path, child, capsys, monkeypatch):
    # The parent-death signal fires when the *thread* that forked the child exits.
    # Make trio's idle worker threads exit after 0.5 s instead of 10: a child forked
    # from one (as trio.lowlevel.open_process does) would be SIGKILLed mid-run, once
    # its launcher has armed the signal (well within 0.5 s; were it slower, this
    # test could only miss the bug, never fail a correct supervisor).
    import trio._core._thread_cache as thread_cache

    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 0.5)
    folder = tmp_path / "run"
    options = RunOptions(command=[*child, "sleep", "2"], ledger_dir=str(folder))
    with trio.fail_after(TIMEOUT):
        outcome = await Supervisor(options).run()
    assert outcome.exit_status == 0, outcome.reason
    events = read_events(folder / "ledger.jsonl")
    assert of_type(events, "process.exit")[0]["status"] == 0
    assert_well_ended(folder, events, 0)
    assert_verifies(folder, capsys)


async def test_lost_evidence_under_fail_fast_stops_the_run_with_43(tmp_path, child, capsys):
    # Every write after session.start fails (EIO) and fail_fast_evidence is set.
    folder = tmp_path / "run"
    policy = policy_file(tmp_path, "[ledger]\nfail_fast_evidence = true\n")
    options = RunOptions(
        command=[*child, "sleep", "30"],
        policy_path=policy,
        ledger_dir=str(folder),
        grace_seconds=float(GRACE),
    )
    with trio.fail_after(TIMEOUT):
        outcome = await Supervisor(options, faults=FailOrdinals(errno.EIO, start=1)).run()
    assert outcome.exit_status == 43
    assert outcome.reason.startswith("evidence could not be written (fail_fast_evidence)")
    events = read_events(folder / "ledger.jsonl")
    assert [e["type"] for e in events] == ["session.start"]  # nothing after the failure
    receipt = read_receipt(folder)
    assert receipt["exit"]["status"] == 43
    assert receipt["ops"]["evidence"]["ledger_complete"] is False
    assert holder_pid(folder / "ledger.jsonl") is None
    assert_verifies(folder, capsys)


# ---------------------------------------------------------------- the pure parts


@given(st.integers(min_value=-64, max_value=255))
def test_wait_status_is_a_shell_status(returncode):
    status = wait_status(returncode)
    if returncode >= 0:  # the child's own code, as is
        assert status == returncode
        assert describe_exit(returncode) == f"exited with status {returncode}"
    else:  # killed by signal N: 128 + N
        assert status == 128 - returncode and 129 <= status <= 192
        assert describe_exit(returncode).startswith("killed by ")


def test_command_missing(tmp_path):
    (tmp_path / "agent").write_text("")
    assert not command_missing("agent", str(tmp_path))  # exists, even if not runnable
    assert command_missing("agent", "/nonexistent-dir")
    assert not command_missing(str(tmp_path / "agent"), "")
    assert command_missing(str(tmp_path / "missing"), str(tmp_path))
    assert not command_missing("sh", os.defpath)


def test_a_volume_below_min_free_bytes_refuses_to_start(tmp_path):
    # No volume here has an exabyte free: the floor is above the free space.
    policy = policy_file(tmp_path, "[ledger]\nmin_free_bytes = 1000000000000000000\n")
    result = run_docket(
        "run", "--policy", policy, "--ledger-dir", str(tmp_path / "run"), "--", "true"
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "below ledger.min_free_bytes" in line and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "ledger.jsonl").exists()


def test_budget_mode_quota_is_refused_beside_a_usd_cap_and_recorded_otherwise(tmp_path, capsys):
    usd = policy_file(tmp_path, "[caps]\nmax_usd = 1\n")
    refused = run_docket(
        "run",
        "--policy",
        usd,
        "--budget-mode",
        "quota",
        "--ledger-dir",
        str(tmp_path / "a"),
        "--",
        "true",
    )
    assert refused.returncode == 2 and "caps.max_usd" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    ok = run_docket(
        "run", "--budget-mode", "quota", "--ledger-dir", str(tmp_path / "b"), "--", "true"
    )
    assert ok.returncode == 0, ok.stderr
    (start,) = of_type(read_events(tmp_path / "b" / "ledger.jsonl"), "session.start")
    assert start["caps"]["budget_mode"] == "quota"
