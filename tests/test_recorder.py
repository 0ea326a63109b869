"""The recorder: the one place that decides what a full ledger or lost evidence does
to the run (docket/boundary/recorder.py). A real ledger on disk, read back."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import trio
from conftest import TOKEN
from helpers import read_chain

import docket
from docket.boundary.recorder import Recorder
from docket.errors import EXIT_CAP_KILL, EXIT_EVIDENCE_LOST
from docket.guards.redact import MARKER, Redactor
from docket.ledger.faults import FailNext
from docket.ledger.limits import EvidenceLost, LedgerFull, LedgerLimits
from docket.ledger.writer import open_ledger

DEADLINE = 10
SECRET = "sk-test-recorder-0123456789abcdef"


async def test_a_full_ledger_stops_the_run_once_per_refusal_and_keeps_what_fit(tmp_path):
    path = tmp_path / "ledger.jsonl"
    stops: list = []
    with trio.fail_after(DEADLINE):
        async with open_ledger(path, limits=LedgerLimits(max_events=2)) as ledger:
            recorder = Recorder(ledger, Redactor([SECRET]), stops.append)
            assert await recorder.record("cache.refused", problem=f"key {SECRET}") == 0
            assert await recorder.record("cache.refused", problem="two") == 1
            assert stops == []
            with pytest.raises(LedgerFull):
                await recorder.record("cache.refused", problem="three")
            with pytest.raises(LedgerFull):
                recorder.check_room("cache.refused", 2)
    assert [(s.reason, s.cap, s.exit_status) for s in stops] == [
        ("ledger full (max_events)", "max_events", EXIT_CAP_KILL)
    ] * 2
    events = read_chain(path)
    assert [(e["type"], e["problem"]) for e in events] == [
        ("cache.refused", f"key {MARKER}"),  # the secret redacted on its way
        ("cache.refused", "two"),
    ]
    assert SECRET not in path.read_text()


async def test_lost_evidence_under_fail_fast_stops_the_run_with_43(tmp_path):
    path = tmp_path / "ledger.jsonl"
    stops: list = []
    limits = LedgerLimits(fail_fast_evidence=True)
    with trio.fail_after(DEADLINE):
        async with open_ledger(path, limits=limits, faults=FailNext(errno.EIO)) as ledger:
            recorder = Recorder(ledger, Redactor([]), stops.append)
            with pytest.raises(EvidenceLost):
                await recorder.record("cache.refused", problem="lost")
    (stop,) = stops
    assert stop.exit_status == EXIT_EVIDENCE_LOST and stop.cap is None
    assert stop.reason == "evidence could not be written (fail_fast_evidence)"
    assert "lost" not in path.read_text()


async def test_a_models_list_on_a_full_ledger_is_a_503_ledger_full_and_stops_the_run(
    stub_server, boundary_rig
):
    """The relayed models list takes one event: the first fits max_events = 1, the
    second is answered docket_ledger_full in the provider's shape (it was a 500
    internal error before: the relay called a method the Boundary did not have)."""
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, {"ledger": {"max_events": 1}}) as rig,
            rig.client() as http,
        ):
            first = await http.get("/openai/v1/models")
            second = await http.get("/openai/v1/models")
    assert first.status_code == 200
    error = second.json()["error"]
    assert (second.status_code, error["type"], error["code"]) == (
        503,
        "docket_ledger_full",
        "max_events",
    )
    assert [e["type"] for e in rig.events()] == ["provider.call"]
    assert [s.cap for s in rig.stops] == ["max_events"]


async def test_a_refusal_the_full_ledger_cannot_hold_says_so_and_stops_the_run(
    stub_server, boundary_rig
):
    """A refusal is recorded through the same door: when it cannot be, the answer says
    so and the run stops, as for any other event a full ledger refuses."""
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as up,
            boundary_rig({"openai": up}, {"ledger": {"max_events": 1}}) as rig,
            rig.client() as http,
        ):
            assert (await http.get("/openai/v1/models")).status_code == 200
            refused = await http.post(
                "/openai/v1/chat/completions",
                json={"model": "gpt-4o-mini", "messages": []},
                headers={"authorization": "Bearer not-the-token"},
            )
    assert refused.status_code == 401
    assert "could not be recorded" in refused.json()["error"]["message"]
    assert [s.cap for s in rig.stops] == ["max_events"]
    # counted for session.end under the rule that refused it (spec section 6.5)
    assert rig.boundary.recorder.refused_unrecorded == {"auth": 1}
    assert TOKEN not in rig.raw().decode()


def test_only_the_recorder_decides_that_a_full_ledger_stops_the_run():
    """A new site that records cannot forget the stop: no module but the recorder (and
    the ledger, which names its own ceiling) builds the full-ledger stop."""
    root = Path(docket.__file__).parent
    deciding = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "ledger full (" in path.read_text()
        and path.parent.name != "ledger"
        and path.name != "recorder.py"
    ]
    assert deciding == []
