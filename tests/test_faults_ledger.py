"""The ledger fault family: schedule-driven write failures, read back from the bytes on disk."""

from __future__ import annotations

import errno
import os

import pytest
import trio
from helpers import io_examples, read_chain
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.faults.ledger import ERRNOS, LedgerFaults, choose
from chaos.faults.schedule import FaultSchedule
from docket.ledger.writer import open_ledger


def test_each_kind_fails_with_its_errno():
    assert ERRNOS == {"enospc": errno.ENOSPC, "eio": errno.EIO, "ebadf": errno.EBADF}
    for kind, code in ERRNOS.items():
        faults = LedgerFaults(FaultSchedule.parse(1, [f"ledger:{kind}@seq 3"]))
        assert faults.before_write(2, "model.request") is None
        error = faults.before_write(3, "model.request")
        assert isinstance(error, OSError) and error.errno == code
        assert error.strerror == os.strerror(code)


def test_the_first_fault_in_schedule_order_wins_and_other_targets_are_ignored():
    schedule = FaultSchedule.parse(
        9, ["upstream:status(503)@call 1..", "ledger:eio@seq 4..5", "ledger:enospc@seq 5.."]
    )
    assert choose(schedule, 3) is None
    assert choose(schedule, 4).kind == "eio"
    assert choose(schedule, 5).kind == "eio"
    assert choose(schedule, 6).kind == "enospc"


def test_a_schedule_without_ledger_faults_is_inactive():
    faults = LedgerFaults(FaultSchedule.parse(1, ["upstream:status(503)@call 1.."]))
    assert faults.active is False
    assert all(faults.before_write(n, "model.request") is None for n in range(50))


def test_a_timed_ledger_fault_needs_the_elapsed_time():
    schedule = FaultSchedule.parse(1, ["ledger:eio@t 1s..2s"])
    with pytest.raises(ValueError, match="time-triggered"):
        LedgerFaults(schedule)
    now = [0.5]
    faults = LedgerFaults(schedule, elapsed=lambda: now[0])
    assert faults.before_write(0, "model.request") is None
    now[0] = 1.5
    assert faults.before_write(1, "model.request").errno == errno.EIO
    now[0] = 2.0
    assert faults.before_write(2, "model.request") is None


@settings(max_examples=io_examples(), deadline=None)
@given(seed=st.integers(0, 2**53 - 1), percent=st.integers(1, 99))
def test_chance_decisions_are_the_schedule_s_and_repeat(seed, percent):
    text = f"ledger:enospc@{percent}%"
    schedule = FaultSchedule.parse(seed, [text])
    first, second = LedgerFaults(schedule), LedgerFaults(FaultSchedule.parse(seed, [text]))
    got = [first.before_write(n, "x") is not None for n in range(64)]
    assert got == [second.before_write(n, "x") is not None for n in range(64)]
    assert got == [schedule.decide(0, n) for n in range(64)]


async def test_injected_failures_reach_the_disk_as_a_gap(tmp_path):
    path = tmp_path / "ledger.jsonl"
    seen: list[dict] = []
    schedule = FaultSchedule.parse(77, ["ledger:enospc@seq 2..3"])
    faults = LedgerFaults(schedule, on_inject=seen.append)
    with trio.fail_after(10):
        async with open_ledger(path, faults=faults) as ledger:
            seqs = [await ledger.append("model.request", call_id=f"c{n}") for n in range(6)]
            stats = ledger.stats
    assert seqs == [0, 1, None, None, 3, 4]
    assert [(s["ordinal"], s["fault"], s["seed"], s["event_type"]) for s in seen] == [
        (2, "ledger:enospc@seq 2..3", 77, "model.request"),
        (3, "ledger:enospc@seq 2..3", 77, "model.request"),
    ]
    assert stats.ledger_complete is False and stats.unwritten_events == 2
    events = read_chain(path)
    assert [e["type"] for e in events] == ["model.request"] * 2 + ["evidence.gap"] + [
        "model.request"
    ] * 2
    assert events[2]["lost"] == 2 and events[2]["first_failing_seq"] == 2
    assert events[2]["error"] == f"ENOSPC: {os.strerror(errno.ENOSPC)}"
    assert [e.get("call_id") for e in events] == ["c0", "c1", None, "c4", "c5"]
