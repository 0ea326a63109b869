"""A shielded paired append (what the boundary uses for model.request and its closing
event) cannot be cancelled: it returns once its line is durable, and the
cancellation reaches the caller at its next checkpoint. Unshielded, it is
cancelled as before (its event still written). Read back from the file on disk."""

from __future__ import annotations

import json

import pytest
import trio

from docket.ledger.writer import open_ledger

DEADLINE = 10


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def test_a_shielded_opening_and_closing_finish_inside_a_cancelled_scope(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(DEADLINE):
        async with open_ledger(path) as ledger:
            with trio.CancelScope() as scope:
                scope.cancel()
                seq, slot = await ledger.append_opening(
                    "model.request", closing_bytes=200, shield=True, call_id="c1"
                )
                on_disk = lines(path)  # durable by the time it returns
                closed = await ledger.append_closing(
                    slot, "model.response", shield=True, call_id="c1", status=200
                )
                on_disk_after = lines(path)
                await trio.lowlevel.checkpoint()  # the cancellation arrives here
                raise AssertionError("the cancellation was lost")
            assert scope.cancelled_caught
    assert (seq, closed) == (0, 1)
    assert [e["type"] for e in on_disk] == ["model.request"]
    assert [(e["type"], e["call_id"]) for e in on_disk_after] == [
        ("model.request", "c1"),
        ("model.response", "c1"),
    ]


async def test_a_shielded_append_waiting_for_a_batch_is_not_cancelled_meanwhile(tmp_path):
    """Several appenders at once: most wait for a batch another submits; cancelling
    them all while they wait takes none of them out early."""
    path = tmp_path / "ledger.jsonl"
    results: list[int | None] = []
    with trio.fail_after(DEADLINE):
        async with open_ledger(path) as ledger:
            with trio.CancelScope() as scope:

                async def one(n: int) -> None:
                    seq, _ = await ledger.append_opening(
                        "model.request", closing_bytes=100, shield=True, call_id=f"c{n}"
                    )
                    results.append(seq)
                    assert any(e["seq"] == seq for e in lines(path))
                    await trio.lowlevel.checkpoint()  # the cancellation arrives here
                    results.append(None)  # (not reached)

                async with trio.open_nursery() as nursery:
                    for n in range(8):
                        nursery.start_soon(one, n)
                    await trio.lowlevel.checkpoint()  # they have all appended and wait
                    scope.cancel()
            assert scope.cancelled_caught
    assert sorted(results) == list(range(8))


async def test_unshielded_the_append_is_cancelled_but_its_event_written(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(DEADLINE):
        async with open_ledger(path) as ledger:
            with trio.CancelScope() as scope:
                scope.cancel()
                await ledger.append_opening("model.request", closing_bytes=200, call_id="c1")
                raise AssertionError("an unshielded append finished in a cancelled scope")
            assert scope.cancelled_caught
    assert [e["type"] for e in lines(path)] == ["model.request"]


@pytest.mark.parametrize("shield", [True, False])
async def test_a_refused_append_raises_its_refusal_not_the_cancellation(tmp_path, shield):
    from docket.ledger.limits import LedgerFull, LedgerLimits

    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(DEADLINE):
        async with open_ledger(path, limits=LedgerLimits(max_events=1)) as ledger:
            with trio.CancelScope() as scope:
                scope.cancel()
                with pytest.raises(LedgerFull if shield else trio.Cancelled):
                    await ledger.append_opening(
                        "model.request", closing_bytes=200, shield=shield, call_id="c1"
                    )
    assert not path.read_bytes()
