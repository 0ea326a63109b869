"""Fault windows anchored to the traffic: `@t A..B after call N`.

A window that counts from the run's start misses the agents on a machine where they
start late (a loaded CI runner) or finish early (a 70 ms agent before a 0.5 s
window). Anchored to the run's N-th request, the window meets the traffic whatever
the machine's speed. The grammar part is pure; the run part is a real run whose
agent starts late, read from the chain on disk.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from helpers import read_chain
from hypothesis import given
from hypothesis import strategies as st

from chaos.faults.grammar import FaultSyntaxError, parse_fault
from chaos.faults.net import schedule_roll, toxic_name
from chaos.faults.schedule import FaultSchedule
from chaos.faults.values import Instant, Window
from chaos.run.engine import run_chaos
from chaos.scenario import AgentSpec, Scenario, load_scenario

DEADLINE = 60


def test_an_anchored_window_parses_and_prints_back():
    fault = parse_fault("net:timeout(0)@t 0..1500ms  after  call 1")
    assert fault.trigger.timed == Window(0, 1500, after_call=1)
    assert fault.text == "net:timeout(0)@t 0..1500ms after call 1"
    assert parse_fault("net:latency(1s)@t 2s.. after call 3").text.endswith("@t 2s.. after call 3")
    instant = parse_fault("process:sigterm(agent)@t 100ms after call 2")
    assert instant.trigger.timed == Instant(100, after_call=2)
    # without an anchor nothing changes: the run's start is the origin
    assert parse_fault("net:timeout(0)@t 1s..2s").trigger.timed == Window(1000, 2000)


@given(
    start=st.integers(0, 10_000),
    length=st.one_of(st.none(), st.integers(1, 10_000)),
    call=st.integers(1, 500),
    instant=st.booleans(),
)
def test_every_anchored_trigger_round_trips(start, length, call, instant):
    if instant:
        timed = f"t {start}ms after call {call}"
    else:
        end = "" if length is None else f"{start + length}ms"
        timed = f"t {start}ms..{end} after call {call}"
    fault = parse_fault(f"clock:pause(1s)@{timed}")
    assert parse_fault(fault.text) == fault
    assert fault.trigger.timed.after_call == call


@pytest.mark.parametrize(
    ("text", "column", "reason"),
    [
        ("upstream:status(503)@t 1s after call 1", 22, "upstream faults are decided per ordinal"),
        ("ledger:eio@t 1s after call 1", 12, "ledger faults are decided per ordinal"),
        ("net:timeout(0)@t 1s after call 0", 32, "call numbers start at 1"),
        ("net:timeout(0)@t 1s after seq 3", 27, "expected 'call' after 'after'"),
        ("net:timeout(0)@t 1s after call 1 & 50%", 16, "stands alone"),
        ("net:timeout(0)@call 2 & t 1s after call 1", 25, "stands alone"),
    ],
)
def test_an_anchor_where_it_cannot_be_performed_is_refused(text, column, reason):
    with pytest.raises(FaultSyntaxError) as caught:
        parse_fault(text)
    assert caught.value.column == column
    assert reason in caught.value.reason


def test_the_embedded_roll_leaves_an_anchored_window_to_its_toxic():
    # The toxic exists only between anchor+A and anchor+B (hold_window puts it there), so
    # the roll does not ask the run's elapsed time, which counts from another origin.
    schedule = FaultSchedule.parse(1, ["net:timeout(0)@t 0..1s after call 1"])
    roll = schedule_roll(schedule)  # no clock needed
    assert roll(toxic_name(0, schedule.faults[0]), 7, "downstream") == 0.0


# The agent starts 0.7 s late, as on a busy machine: a window counted from the run's
# start (`@t 0..600ms`) would be over before its first call. The delay is the scenario
# (a late agent), not a wait for a condition; it is kept just past the old window.
LATE_START = "import os, sys, time; time.sleep(0.7); os.execv(sys.executable, [sys.executable, '-m', 'docket', 'agent'])"  # noqa: E501


async def test_an_anchored_black_hole_meets_an_agent_that_starts_late(tmp_path):
    agent = AgentSpec(
        name="late", mode="loop", command=(sys.executable, "-c", LATE_START), calls=8, timeout=5.0
    )
    fault = "net:timeout(0)@t 0..800ms after call 1"
    scenario = Scenario(
        faults=(fault,),
        agents=(agent,),
        policy={"boundary": {"upstream_timeout": 0.3, "connect_timeout": 0.3}},
        max_wall_clock=30.0,
        probe_every=0,
    )
    with trio.fail_after(DEADLINE):
        result = await run_chaos(scenario, seed=7, folder=tmp_path / "r")
    events = read_chain(result.ledger_path)
    first_call = next(e for e in events if e["type"] == "model.request")
    records = [e for e in events if e["type"] == "fault.injected"]
    assert [(e["fault"], e["action"]) for e in records] == [
        (fault, "toxic_added"),
        (fault, "toxic_removed"),
    ]
    added, removed = records
    # the window opened after the first request was durable, well after the old window
    assert added["seq"] > first_call["seq"]
    assert added["at_s"] >= 0.7 > 0.6  # after the late start, so after a run-anchored window
    assert removed["at_s"] == pytest.approx(added["at_s"] + 0.8, abs=0.01)
    # and the traffic met it: a call timed out in the black hole, before the toxic went
    timed_out = [e for e in events if e["type"] == "model.error" and e.get("reason") == "timeout"]
    assert timed_out, "no call met the black hole"
    assert added["seq"] < timed_out[0]["seq"]


def shipped_faults():
    from chaos.data.locate import folder
    from chaos.gameday.phase import load_phases

    # fleet-*.yaml (python -m chaos.fleet) count their windows from the moment every
    # boundary has served a call: anchored to the traffic by their runner
    for path in sorted(Path(str(folder("scenarios"))).glob("*.yaml")):
        if path.name.startswith("fleet-"):
            continue
        for text in load_scenario(path).faults:
            yield f"scenarios/{path.name}", text
    for phase in load_phases():
        for spec in phase.runs:
            for text in spec.scenario.faults:
                yield f"gamedays/{phase.name}", text


def test_no_shipped_fault_window_counts_from_the_run_s_start_alone():
    # The machine's speed decides whether such a window meets any call: the
    # shipped scenarios and phases anchor their windows to the traffic.
    from_start = [
        (where, text)
        for where, text in shipped_faults()
        if (timed := parse_fault(text).trigger.timed) is not None and timed.after_call is None
    ]
    assert from_start == []
    assert any("after call" in text for _, text in shipped_faults())  # the check saw them


async def test_the_partition_scenario_performs_its_black_hole(tmp_path):
    # It performed 0 faults in 3 of 4 runs when its window was `@t 500ms..2s`: the agent
    # was done in ~70 ms. Now the window opens at the first request, and a call meets it.
    from chaos.data.locate import folder

    scenario = load_scenario(Path(str(folder("scenarios"))) / "partition.yaml")
    with trio.fail_after(DEADLINE):
        result = await run_chaos(scenario, seed=1004, folder=tmp_path / "r")
    assert result.exit_status == 0, result.reason
    events = read_chain(result.ledger_path)
    actions = [e["action"] for e in events if e["type"] == "fault.injected"]
    assert actions == ["toxic_added", "toxic_removed"]
    assert any(e["type"] == "model.error" and e.get("reason") == "timeout" for e in events)
