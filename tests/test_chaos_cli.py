"""`docket chaos` from the command line: bad input refused before anything starts, a real
run printing its schedule, summary and repro command, and that command reproducing it."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys

import pytest
import trio
from helpers import read_chain, running, wait_until

import chaos.cli
from docket.cli import main

TIMEOUT = 60


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--fault", "upstream:status(503@20%"], "column 24: expected ',' or ')'"),
        (["--fault", "ledger:eio@call 3"], "ledger faults cannot count 'call'"),
        (["--agent", "sprint"], "--agent 'sprint': not one of once"),
        (["--seed", "-3"], "--seed -3: must be in [0, 2**53)"),
        (["--seed", "x"], "invalid whole number value"),
        (["--agent", "once", "--", "python3", "a.py"], "give --agent MODE or -- CMD, not both"),
        (["--scenario", "{missing}"], "no such file"),
        (["--scenario", "{empty}"], "empty"),
        (["--scenario", "{binary}"], "binary"),
        (["--scenario", "{malformed}"], "malformed.yaml:2: at agents[0].calls must be a whole"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_starts(tmp_path, capsys, argv, expected):
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "binary.yaml").write_bytes(b"\x00\xff\x00")
    (tmp_path / "malformed.yaml").write_text("agents:\n  - {mode: loop, calls: many}\n")
    names = {k: str(tmp_path / f"{k}.yaml") for k in ("missing", "empty", "binary", "malformed")}
    run_dir = tmp_path / "run"
    argv = [a.format(**names) for a in argv]
    status = main(["chaos", *argv, "--dir", str(run_dir)] if "--" not in argv else
                  ["chaos", "--dir", str(run_dir), *argv])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("docket: ")
    assert expected in err, err
    assert not run_dir.exists()  # refused before anything started


def docket(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "docket", *argv], capture_output=True, text=True, timeout=TIMEOUT
    )


def test_a_run_prints_schedule_summary_and_a_command_that_reproduces_it(tmp_path):
    first = docket(
        "chaos", "--seed", "31",
        "--fault", "upstream:status(503)@40%", "--fault", "upstream:missing_usage@call 2",
        "--agent", "loop", "--dir", str(tmp_path / "one"),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0] == "seed 31"
    assert lines[1] == "fault schedule: seed 31, 2 fault(s)"
    assert lines[3] == "  upstream:missing_usage@call 2: call 2 (of the first 100)"
    assert any(line.startswith("run: 10 call(s), ") for line in lines)
    assert "exit 0: child exited with status 0" in lines
    (repro,) = [line.removeprefix("reproduce: ") for line in lines if line.startswith("reproduce")]
    argv = shlex.split(repro)
    assert argv[:4] == ["docket", "chaos", "--seed", "31"]
    again = docket(*argv[1:], "--dir", str(tmp_path / "two"))
    assert again.returncode == 0, again.stderr
    one, two = (read_chain(tmp_path / d / "ledger.jsonl") for d in ("one", "two"))
    assert [e["type"] for e in one] == [e["type"] for e in two]
    faults_one = [(e["fault"], e["ordinal"]) for e in one if e["type"] == "fault.injected"]
    assert faults_one == [(e["fault"], e["ordinal"]) for e in two if e["type"] == "fault.injected"]
    assert faults_one  # the 40% did fire somewhere in ten calls with this seed
    receipt = json.loads((tmp_path / "one" / "receipt.json").read_text())
    assert receipt["faults"]["seed"] == 31


def test_without_a_seed_one_is_drawn_and_printed(tmp_path):
    done = docket("chaos", "--agent", "once", "--dir", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("seed ") and first.endswith("(drawn: pass --seed to repeat it)")
    seed = int(first.split()[1])
    start = read_chain(tmp_path / "r" / "ledger.jsonl")[0]
    assert start["chaos"]["seed"] == seed
    assert f"--seed {seed}" in done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://[::1", "toxiproxy URL 'http://[::1': expected http://HOST:PORT"),
        ("ftp://127.0.0.1:8474", "toxiproxy URL 'ftp://127.0.0.1:8474': expected http://HOST:PORT"),
        (
            "http://127.0.0.1:{port}",
            "toxiproxy http://127.0.0.1:{port}: cannot connect (Connection",
        ),
    ],
)
def test_a_bad_toxiproxy_is_one_line_exit_2_and_nothing_starts(tmp_path, url, expected):
    port = _free_port()  # nothing listens there
    run_dir = tmp_path / "run"
    done = docket(
        "chaos", "--seed", "1", "--agent", "once",
        "--toxiproxy", url.format(port=port), "--dir", str(run_dir),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("docket: " + expected.format(port=port)), done.stderr
    assert not run_dir.exists()  # refused before the folder, a stub or an agent existed


# One provider per agent: a request in each stub's log means each agent is past
# its start-up (a signal before that kills it without a report, as documented).
SLOW_RUN = """\
providers:
  - {name: first, kind: openai, latency: 100ms}
  - {name: second, kind: anthropic, latency: 100ms}
agents:
  - {name: looper, mode: loop, calls: 200, timeout: 5s, provider: first}
  - {name: hammer, mode: hammer, calls: 400, concurrency: 2, timeout: 5s, provider: second}
max_wall_clock: 30s
probe_every: 50ms
"""


def has_requests(path) -> bool:
    return path.exists() and path.stat().st_size > 0


def test_ctrl_c_mid_run_tears_everything_down_and_writes_the_receipt(tmp_path):
    scenario = tmp_path / "slow.yaml"
    scenario.write_text(SLOW_RUN)
    run_dir = tmp_path / "run"
    ledger = run_dir / "ledger.jsonl"
    chaos = subprocess.Popen(
        [sys.executable, "-m", "docket", "chaos", "--seed", "8",
         "--scenario", str(scenario), "--dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a Ctrl-C reaches a foreground process with SIGINT at its default action
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        wait_until(
            lambda: all(has_requests(run_dir / f"stub-{p}.jsonl") for p in ("first", "second")),
            TIMEOUT,
            "a call from each agent",
        )
        chaos.send_signal(signal.SIGINT)
        out, err = chaos.communicate(timeout=TIMEOUT)
    finally:
        if chaos.poll() is None:
            chaos.kill()
            chaos.wait()
    assert chaos.returncode == 130, err
    assert "Traceback" not in err
    lines = out.splitlines()
    assert "exit 130: child exited with status 130 after SIGINT to the supervisor" in lines
    receipt = json.loads((run_dir / "receipt.json").read_text())
    assert receipt["exit"]["status"] == 130
    events = read_chain(ledger)
    assert events[-1]["type"] == "session.end"
    forwarded = [e for e in events if e["type"] == "signal.forwarded"]
    assert [e["signal"] for e in forwarded] == ["SIGINT"]  # all stopped within the grace
    # every agent reported, stopped by the signal; the launcher waited for them quietly
    for name in ("looper", "hammer"):
        report = json.loads((run_dir / "agents" / f"{name}.out").read_text().splitlines()[-1])
        assert report["stopped"] == "sigint"
    assert "Traceback" not in (run_dir / "agents" / "launcher.err").read_text()
    verified = docket("verify", str(run_dir / "receipt.json"))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # nothing the run started is still running
    spawned = [e["pid"] for e in events if e["type"] == "process.spawn"]
    pids = [int((run_dir / "agents" / f"{n}.pid").read_text()) for n in ("looper", "hammer")]
    assert spawned and all(not running(pid) for pid in spawned + pids)


def test_an_interrupt_outside_the_supervised_part_is_one_line_exit_130(
    tmp_path, capsys, monkeypatch
):
    # e.g. Ctrl-C while the stubs start: it leaves trio's nurseries wrapped in a group
    async def interrupted_while_starting(*args, **kwargs):
        async def starting():
            raise KeyboardInterrupt

        async with trio.open_nursery() as nursery:
            nursery.start_soon(starting)

    monkeypatch.setattr(chaos.cli, "run_chaos", interrupted_while_starting)
    status = main(["chaos", "--seed", "1", "--agent", "once", "--dir", str(tmp_path / "r")])
    assert status == 130
    assert capsys.readouterr().err == "docket: interrupted\n"


def test_an_agent_that_cannot_start_is_explained_and_a_used_folder_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    done = docket("chaos", "--seed", "2", "--dir", str(run_dir), "--", "no-such-agent-cmd")
    assert done.returncode == 127, done.stderr
    err = run_dir / "agents" / "agent.err"
    assert (
        f"agent 'agent': printed no JSON report (output in {run_dir / 'agents' / 'agent.out'} "
        f"and agent.err); its last stderr line: chaos launcher: cannot start no-such-agent-cmd: "
        in done.stdout
    ), done.stdout
    assert err.is_file()
    assert not (run_dir / "agents" / "agent.pid").exists()  # that process never ran it
    again = docket("chaos", "--seed", "2", "--dir", str(run_dir), "--agent", "once")
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr == f"docket: run folder {run_dir} already holds a run: give a new folder\n"
