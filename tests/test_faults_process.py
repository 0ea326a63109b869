"""The process fault family: signals to the agent or the supervisor, recorded before they are sent.

The real tests run a chaos run end to end (stub, proxy, supervisor, agent) and
read the ledger from disk: the fault's record is durable, in the chain, before
the effect of its signal (the process.exit it causes).
"""

from __future__ import annotations

import signal
import subprocess
import sys

import trio
from helpers import read_chain, running, wait_until

from chaos.faults.grammar import parse_fault
from chaos.faults.process import kills_supervisor, signal_of
from chaos.faults.schedule import FaultSchedule
from chaos.faults.triggers import EventTriggers
from chaos.gameday import aftermath
from chaos.run.engine import run_chaos
from chaos.scenario import AgentSpec, Scenario
from docket.ledger.lock import holder_pid

DEADLINE = 60


def test_signals_and_who():
    assert signal_of(parse_fault("process:sigterm(agent)@seq 3")) == signal.SIGTERM
    assert signal_of(parse_fault("process:sigkill(supervisor)@t 1s")) == signal.SIGKILL
    assert kills_supervisor([parse_fault("process:sigkill(supervisor)@seq 3")])
    assert not kills_supervisor([parse_fault("process:sigterm(supervisor)@seq 3")])
    assert not kills_supervisor([parse_fault("process:sigkill(agent)@seq 3")])


def test_a_signal_fires_once_even_on_an_open_range():
    schedule = FaultSchedule.parse(3, ["process:sigterm(agent)@call 2.."])
    triggers = EventTriggers(schedule, list(schedule.faults), once=True)
    fired = []
    for seq in range(10):
        event = {"seq": seq, "type": "model.request"}
        fired += [(f.text, n) for f, n in triggers.on_event(event, 0.0)]
    assert fired == [("process:sigterm(agent)@call 2..", 2)]


def loop_scenario(*faults: str, calls: int = 30) -> Scenario:
    agent = AgentSpec(name="looper", mode="loop", calls=calls, timeout=5.0)
    return Scenario(faults=faults, agents=(agent,), max_wall_clock=30.0, probe_every=0.0)


async def test_sigterm_to_the_agent_is_recorded_before_it_lands(tmp_path):
    with trio.fail_after(DEADLINE):
        result = await run_chaos(
            loop_scenario("process:sigterm(agent)@call 3"), seed=11, folder=tmp_path / "run"
        )
    events = read_chain(result.ledger_path)
    types = [e["type"] for e in events]
    (record,) = [e for e in events if e["type"] == "fault.injected"]
    assert record["fault"] == "process:sigterm(agent)@call 3"
    assert record["ordinal"] == 3 and record["seed"] == 11 and record["signal"] == "SIGTERM"
    # durable after the 3rd request, before the child's exit that the signal caused
    third_request = [i for i, t in enumerate(types) if t == "model.request"][2]
    assert third_request < record["seq"] < types.index("process.exit")
    assert types.count("model.request") < 30  # the loop did not finish
    assert result.exit_status == 128 + signal.SIGTERM
    assert result.receipt["exit"]["status"] == 128 + signal.SIGTERM
    faults = result.receipt["faults"]
    assert (faults["seed"], faults["injected"], faults["by_fault"]) == (
        11,
        1,
        {"process:sigterm(agent)@call 3": 1},
    )
    # the agent stopped on the signal and still said what it had done
    report = result.agent_reports["looper"]
    assert report["stopped"] == "sigterm"
    # Every call answered is in the ledger; a call whose request was sent in full when
    # the signal came (`interrupted`) is there too unless the run ended first: the agent
    # exits at once, and the boundary, cancelled with the run, may not have recorded it
    # yet (nothing was forwarded for it). A call stopped mid-write is `unsent`, never there.
    recorded = types.count("model.request")
    assert report["calls"] <= recorded <= report["calls"] + report["interrupted"]
    # and what matters for spend: nothing reached a provider without its model.request
    forwarded = sum(len(log) for log in result.stub_logs.values())
    assert forwarded == recorded


async def test_sigterm_to_the_supervisor_ends_the_run_legibly_and_is_not_an_interrupt(tmp_path):
    with trio.fail_after(DEADLINE):
        result = await run_chaos(
            loop_scenario("process:sigterm(supervisor)@call 3"), seed=12, folder=tmp_path / "run"
        )
    events = read_chain(result.ledger_path)
    types = [e["type"] for e in events]
    (record,) = [e for e in events if e["type"] == "fault.injected"]
    (forwarded,) = [e for e in events if e["type"] == "signal.forwarded"]
    assert record["seq"] < forwarded["seq"] < types.index("session.end")  # cause, then effect
    assert forwarded["signal"] == "SIGTERM"
    assert result.receipt["exit"]["reason"].endswith("after SIGTERM to the supervisor")
    # the harness sent it itself: a caller must not take it for the user's Ctrl-C
    assert result.interrupted_by is None


async def test_sigkill_to_the_supervisor_leaves_a_clean_prefix_and_no_receipt(tmp_path):
    folder = tmp_path / "run"
    with trio.fail_after(DEADLINE):
        result = await run_chaos(
            loop_scenario("process:sigkill(supervisor)@seq 6"), seed=12, folder=folder
        )
    assert result.exit_status == 128 + signal.SIGKILL
    assert "SIGKILL" in result.reason
    assert result.receipt == {} and not result.receipt_path.exists()
    events = read_chain(result.ledger_path)  # every line whole, the chain intact
    assert events[-1]["type"] == "fault.injected"  # the last word is why it stopped
    assert events[-1]["fault"] == "process:sigkill(supervisor)@seq 6"
    assert "session.end" not in [e["type"] for e in events]
    assert holder_pid(result.ledger_path) is None  # the dead writer's lock is gone
    spawn = next(e for e in events if e["type"] == "process.spawn")
    # the launcher and every agent die with their supervisor (PR_SET_PDEATHSIG), and
    # the agent's pid was on file before it ran, so its death can be checked too
    assert set(result.agent_pids) == {"looper"}
    assert result.evidence()["agent_pids"] == result.agent_pids
    for pid in (spawn["pid"], result.agent_pids["looper"]):
        wait_until(lambda pid=pid: not running(pid), 10, f"process {pid} to die")


async def test_the_orphan_check_reads_the_agent_pids_and_finds_a_survivor(tmp_path):
    # What the game day's supervisor-killed phase relies on: the agents' pids on file,
    # and a process among them that did not die is named.
    (tmp_path / "agents").mkdir()
    # lives until this test kills it (the test takes ~0.2 s)
    survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "agents" / "stray.pid").write_text(f"{survivor.pid}\n")
        events = [{"type": "process.spawn", "pid": 1}, {"type": "model.request"}]
        notes: list[str] = []
        pids = aftermath.spawned_pids(events, tmp_path, notes)
        assert pids == [survivor.pid] and notes == []  # pid 1 is never one of ours
        with trio.fail_after(DEADLINE):
            assert await aftermath.orphans(pids, grace_s=0.2) == [survivor.pid]
            survivor.kill()
            survivor.wait()
            assert await aftermath.orphans(pids, grace_s=5) == []
    finally:
        survivor.kill()
        survivor.wait()
