"""The ledger writer on real files: every check reads the bytes back from disk.

The sans-IO book is property-tested on its own (no files, no clock); the trio
shell is tested through open_ledger against real files with real fdatasync.
"""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import trio
import trio.testing
from helpers import append_from_tasks, io_examples, read_chain
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.clock import FakeClock
from docket.errors import InputError
from docket.ledger import book as book_module
from docket.ledger.book import LedgerBook
from docket.ledger.chain import (
    CONTROL_TYPES,
    GENESIS,
    ChainVerifier,
    encode_body,
    line_hash,
    line_overhead,
)
from docket.ledger.limits import GAP_TYPE, LedgerFull, LedgerLimits
from docket.ledger.pending import Batch, Loss
from docket.ledger.reader import iter_lines
from docket.ledger.writer import LedgerDamaged, open_ledger

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
TS = "2026-11-29T21:52:28.123Z"


def line_ends(path: Path) -> list[int]:
    """Byte offset just past each line's newline, by seq."""
    return [line.offset + len(line.data) + 1 for line in iter_lines(path)]


# ---------------------------------------------------------------------------
# append and read back


async def test_append_reads_back_as_a_valid_chain(tmp_path):
    path = tmp_path / "ledger.jsonl"
    clock = FakeClock()
    with trio.fail_after(10):
        async with open_ledger(path, clock=clock) as ledger:
            seqs = [await ledger.append("session.start", run_id="r1", argv=["python", "a.py"])]
            clock.advance(0.25)
            seqs.append(await ledger.append("model.request", call_id="c0", model="gpt-4o-mini"))
            clock.advance(1.5)
            seqs.append(
                await ledger.append(
                    "model.response", call_id="c0", usage={"input_tokens": 12}, note="héllo ✓"
                )
            )
            clock.advance(-30)  # a monotonic source stepping back is clamped
            seqs.append(await ledger.append("session.end", reason="done", exit_status=0))
            head, count, size = ledger.head, ledger.count, ledger.bytes
    events = read_chain(path)
    assert seqs == [0, 1, 2, 3]
    assert [e["seq"] for e in events] == [0, 1, 2, 3]
    assert [e["type"] for e in events] == [
        "session.start",
        "model.request",
        "model.response",
        "session.end",
    ]
    assert [e["mono_ms"] for e in events] == [0, 250, 1750, 1750]
    assert all(RFC3339.match(e["ts"]) for e in events)
    assert events[0]["argv"] == ["python", "a.py"]
    assert events[2]["usage"] == {"input_tokens": 12} and events[2]["note"] == "héllo ✓"
    assert events[3]["exit_status"] == 0
    data = path.read_bytes()
    assert (count, size) == (4, len(data))
    assert head == line_hash(data.rstrip(b"\n").rsplit(b"\n", 1)[1])


async def test_reopening_continues_the_chain(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        clock = FakeClock()
        async with open_ledger(path, clock=clock) as ledger:
            for n in range(3):
                clock.advance(1)
                await ledger.append("model.request", call_id=f"c{n}")
        # A new session: its clock starts afresh, mono_ms carries on from the file.
        async with open_ledger(path, clock=FakeClock(mono=5.0)) as ledger:
            assert (ledger.count, ledger.bytes) == (3, path.stat().st_size)
            assert await ledger.append("session.start", run_id="r2") == 3
            assert await ledger.append("session.end", reason="done") == 4
    events = read_chain(path)
    assert [e["seq"] for e in events] == [0, 1, 2, 3, 4]
    assert [e["mono_ms"] for e in events] == [1000, 2000, 3000, 3000, 3000]


@pytest.mark.parametrize(
    "damage",
    ["torn_tail", "flipped_byte", "not_a_ledger"],
)
async def test_a_damaged_ledger_is_refused_and_left_as_it_was(tmp_path, damage):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path) as ledger:
            for n in range(3):
                await ledger.append("model.request", call_id=f"c{n}")
        data = path.read_bytes()
        if damage == "torn_tail":
            data += b'{"v":1,"seq":3,"ts"'
        elif damage == "flipped_byte":
            i = data.index(b"c1")
            data = data[:i] + b"x" + data[i + 1 :]
        else:
            data = b"hello, world\n"
        path.write_bytes(data)
        with pytest.raises(LedgerDamaged) as caught:
            async with open_ledger(path):
                pytest.fail("a damaged ledger was opened")
    message = str(caught.value)
    assert "\n" not in message and f"docket doctor {path}" in message
    assert path.read_bytes() == data


async def test_bad_paths_are_one_line_input_errors(tmp_path):
    with trio.fail_after(10):
        with pytest.raises(InputError, match="is a directory"):
            async with open_ledger(tmp_path):
                pass
        with pytest.raises(InputError, match="No such file or directory"):
            async with open_ledger(tmp_path / "missing" / "ledger.jsonl"):
                pass


async def test_bad_events_are_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path) as ledger:
            with pytest.raises(ValueError, match="seq"):
                await ledger.append("model.request", seq=7)
            with pytest.raises(ValueError, match="not an event type"):
                await ledger.append("model.requset")
            with pytest.raises(ValueError, match="not an event type"):
                await ledger.append(GAP_TYPE, lost=0)  # the writer's own record
            with pytest.raises(TypeError):
                await ledger.append("model.request", when=object())
            with pytest.raises(ValueError):
                await ledger.append("model.request", cost=float("nan"))
            assert await ledger.append("model.request", call_id="ok") == 0
    assert [e["call_id"] for e in read_chain(path)] == ["ok"]


async def test_observers_see_each_durable_event_in_seq_order(tmp_path):
    path = tmp_path / "ledger.jsonl"
    seen: list[dict] = []
    with trio.fail_after(10):
        async with open_ledger(path, observers=[seen.append]) as ledger:

            async def appender(n: int) -> None:
                for k in range(5):
                    await ledger.append("model.request", call_id=f"{n}-{k}")
                    # By the time an append returns, the observers have its event.
                    assert any(e["call_id"] == f"{n}-{k}" for e in seen)

            async with trio.open_nursery() as nursery:
                for n in range(8):
                    nursery.start_soon(appender, n)
    assert seen == read_chain(path)


async def test_a_cancelled_append_is_still_written(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path) as ledger:
            with trio.CancelScope() as scope:
                scope.cancel()  # cancelled before it could wait for its fsync
                await ledger.append("model.request", call_id="cancelled")
            assert scope.cancelled_caught
    assert [e["call_id"] for e in read_chain(path)] == ["cancelled"]


def test_a_cancellation_round_the_ledger_and_its_callers_still_writes_every_closing(tmp_path):
    """A deadline round both the ledger and the tasks that close their calls (a rig's, a
    run's): those append their closing events shielded, so the flusher must outlive the
    cancellation until the block ends; when it was cancelled with them, 32 closing events
    waited for it for ever and the block never ended. Run in a thread of its own, so a
    hang (which no cancellation can end) fails this test instead of holding the suite."""
    path = tmp_path / "ledger.jsonl"
    ended: list[bool] = []

    async def scenario() -> None:
        with trio.CancelScope() as round_all:
            async with open_ledger(path) as ledger:

                async def held_then_closed(n: int, slot) -> None:
                    try:
                        await trio.sleep_forever()  # held upstream until the cancellation
                    finally:
                        await ledger.append_closing(
                            slot, "model.error", shield=True, call_id=f"c{n}", reason="cut"
                        )

                async with trio.open_nursery() as nursery:
                    for n in range(32):
                        _, slot = await ledger.append_opening(
                            "model.request", closing_bytes=200, call_id=f"c{n}"
                        )
                        nursery.start_soon(held_then_closed, n, slot)
                    await trio.testing.wait_all_tasks_blocked()  # all 32 held
                    round_all.cancel()
        ended.append(round_all.cancelled_caught)

    runner = threading.Thread(target=trio.run, args=(scenario,), daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive(), "the ledger's block did not end after the cancellation"
    assert ended == [True]
    closed = [e["call_id"] for e in read_chain(path) if e["type"] == "model.error"]
    assert sorted(closed) == sorted(f"c{n}" for n in range(32))


def test_a_ledger_closing_while_an_appender_leads_a_batch_ends_when_it_settles(
    tmp_path, monkeypatch
):
    """The block ends while a batch an appender leads is still being written (the
    appender lives outside the block, as a boundary's handler in a rig does): the
    flusher, told to close, sees the batch in flight and waits for it; the leader must
    ring it as the batch settles, or the block never ends (the selftest's egress check
    hung so). The write is held in the writer thread until the block is on its way out."""
    from docket.ledger import sync

    entered, real = threading.Event(), sync.write_durably

    def held_write(*args, **kwargs):
        entered.set()
        time.sleep(0.2)  # the block's exit is under way meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(sync, "write_durably", held_write)
    path = tmp_path / "ledger.jsonl"
    seqs: list[int | None] = []

    async def scenario() -> None:
        async with trio.open_nursery() as outside, open_ledger(path) as ledger:

            async def lead() -> None:
                seqs.append(await ledger.append("model.request", call_id="led"))

            outside.start_soon(lead)
            await trio.to_thread.run_sync(entered.wait, 10)

    runner = threading.Thread(target=trio.run, args=(scenario,), daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert not runner.is_alive(), "the ledger's block did not end after the led batch settled"
    assert seqs == [0] and [e["call_id"] for e in read_chain(path)] == ["led"]


async def test_closing_leaves_no_thread_and_refuses_later_appends(tmp_path):
    before = {t.ident for t in threading.enumerate()}
    with trio.fail_after(10):
        async with open_ledger(tmp_path / "ledger.jsonl") as ledger:
            await ledger.append("model.request")
            assert any(t.name == "docket-ledger-sync" for t in threading.enumerate())
    assert {t.ident for t in threading.enumerate()} <= before
    with pytest.raises(RuntimeError, match="closed"):
        await ledger.append("model.request")


async def test_leaving_by_an_exception_still_writes_what_was_queued(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        with pytest.raises(KeyError):
            async with open_ledger(path) as ledger:
                await ledger.append("session.start")
                with trio.CancelScope() as scope:
                    scope.cancel()
                    await ledger.append("model.request", call_id="queued")
                raise KeyError("the body failed")
    assert [e["type"] for e in read_chain(path)] == ["session.start", "model.request"]


async def test_an_observer_that_raises_stops_the_ledger_loudly(tmp_path):
    path = tmp_path / "ledger.jsonl"

    def fussy(event: dict) -> None:
        if event["seq"] == 2:
            raise ValueError("the tally cannot take this event")

    with trio.fail_after(10):
        async with open_ledger(path, observers=[fussy]) as ledger:
            await ledger.append("session.start")
            await ledger.append("model.request", call_id="c0")
            with pytest.raises(ValueError, match="tally"):
                await ledger.append("model.request", call_id="c1")
            with pytest.raises(RuntimeError, match="stopped after an internal error"):
                await ledger.append("model.request", call_id="c2")
    # The event the observer choked on was already durable; nothing after it is written.
    assert [e.get("call_id") for e in read_chain(path)] == [None, "c0", "c1"]


async def test_a_crash_among_many_appenders_leaves_none_waiting(tmp_path):
    path = tmp_path / "ledger.jsonl"
    ended: list[str] = []

    def fussy(event: dict) -> None:
        if event["seq"] == 40:
            raise ValueError("the tally cannot take this event")

    async def appender(ledger, n: int) -> None:
        try:
            for k in range(20):
                await ledger.append("model.request", call_id=f"{n}-{k}")
            ended.append("done")
        except (ValueError, RuntimeError) as exc:
            ended.append(type(exc).__name__)

    surfaced = []
    with trio.fail_after(20):  # the point: nobody waits for ever
        try:
            async with (
                open_ledger(path, observers=[fussy]) as ledger,
                trio.open_nursery() as nursery,
            ):
                for n in range(16):
                    nursery.start_soon(appender, ledger, n)
        except* ValueError as group:
            surfaced.extend(group.exceptions)  # the flusher met it: the block was cancelled
    assert surfaced or "ValueError" in ended
    assert "done" not in ended  # 16 x 20 events cannot all have been written
    events = read_chain(path)
    assert 41 <= len(events) < 16 * 20


async def test_batches_are_split_at_their_cap(tmp_path, monkeypatch):
    """A leader whose own event did not fit in the batch it submitted waits for the next."""
    monkeypatch.setattr(book_module, "MAX_BATCH_LINES", 3)
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(20):
        async with open_ledger(path) as ledger:
            await append_from_tasks(ledger, tasks=16, each=5)
            fsyncs = ledger.fsyncs
    assert len(read_chain(path)) == 80
    assert fsyncs >= 80 / 3


# ---------------------------------------------------------------------------
# group commit


async def test_concurrent_appends_share_fsyncs_and_return_only_once_synced(tmp_path, monkeypatch):
    """64 appenders; each append must return only after an fdatasync covered its line."""
    path = tmp_path / "ledger.jsonl"
    synced = {"size": 0, "threads": set()}
    real_fdatasync = os.fdatasync

    def watched_fdatasync(fd: int) -> None:
        real_fdatasync(fd)
        synced["size"] = os.fstat(fd).st_size  # everything up to here is durable
        synced["threads"].add(threading.get_ident())

    monkeypatch.setattr(os, "fdatasync", watched_fdatasync)
    returned: list[tuple[int, int]] = []  # (seq, durable size when append returned)
    appenders, each = 64, 10
    with trio.fail_after(30):
        async with open_ledger(path) as ledger:

            async def appender(n: int) -> None:
                for k in range(each):
                    seq = await ledger.append("model.request", call_id=f"{n}-{k}")
                    returned.append((seq, synced["size"]))

            async with trio.open_nursery() as nursery:
                for n in range(appenders):
                    nursery.start_soon(appender, n)
            fsyncs = ledger.fsyncs
    events = read_chain(path)
    assert len(events) == appenders * each
    assert sorted(e["call_id"] for e in events) == sorted(
        f"{n}-{k}" for n in range(appenders) for k in range(each)
    )
    assert sorted(seq for seq, _ in returned) == list(range(appenders * each))
    ends = line_ends(path)
    late = [(seq, size) for seq, size in returned if size < ends[seq]]
    assert not late, f"appends returned before their line was synced: {late[:5]}"
    assert 0 < fsyncs < appenders * each
    assert threading.get_ident() not in synced["threads"]  # never on the event loop's thread


async def test_appenders_that_come_and_go_each_get_their_own_line(tmp_path):
    """Appenders that do other work between appends (as the boundary's do), some
    of them cancelled while they wait: every event lands once, and each returned
    seq is the line of that very event."""
    path = tmp_path / "ledger.jsonl"
    rng = random.Random(7)
    plans = [[rng.randrange(4) for _ in range(12)] for _ in range(24)]
    returned: dict[str, int] = {}
    cancelled: set[str] = set()
    with trio.fail_after(30):
        async with open_ledger(path) as ledger:

            async def appender(n: int, plan: list[int]) -> None:
                for k, work in enumerate(plan):
                    for _ in range(work):
                        await trio.lowlevel.checkpoint()  # busy elsewhere for a while
                    call_id = f"{n}-{k}"
                    if (n + k) % 11 == 0:
                        with trio.CancelScope() as scope:
                            scope.cancel()
                            await ledger.append("model.request", call_id=call_id)
                        cancelled.add(call_id)
                    else:
                        returned[call_id] = await ledger.append("model.request", call_id=call_id)

            async with trio.open_nursery() as nursery:
                for n, plan in enumerate(plans):
                    nursery.start_soon(appender, n, plan)
    events = read_chain(path)
    assert len(events) == 24 * 12
    by_call = {e["call_id"]: e["seq"] for e in events}
    assert len(by_call) == len(events)
    assert all(by_call[call_id] == seq for call_id, seq in returned.items())
    assert cancelled and cancelled <= by_call.keys()


# ---------------------------------------------------------------------------
# ceilings


async def test_max_events_refuses_ordinary_events_but_not_control_events(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path, limits=LedgerLimits(max_events=3)) as ledger:
            await ledger.append("session.start", run_id="r")
            for n in range(3):
                await ledger.append("model.request", call_id=f"c{n}")
            ledger.check_room("process.exit")
            with pytest.raises(LedgerFull) as caught:
                ledger.check_room("model.request")
            assert caught.value.reason == "max_events"
            with pytest.raises(LedgerFull) as caught:
                await ledger.append("model.request", call_id="refused")
            assert caught.value.reason == "max_events"
            await ledger.append("process.exit", pid=1, status=0)
            await ledger.append("session.end", reason="cap")
    events = read_chain(path)
    assert [e["type"] for e in events] == ["session.start"] + ["model.request"] * 3 + [
        "process.exit",
        "session.end",
    ]
    # The ceiling holds across sessions: the file's events count toward it.
    with trio.fail_after(10):
        async with open_ledger(path, limits=LedgerLimits(max_events=3)) as ledger:
            with pytest.raises(LedgerFull):
                await ledger.append("model.request")


async def test_the_byte_ceiling_keeps_room_for_the_record_of_why_a_run_stopped(tmp_path):
    path = tmp_path / "ledger.jsonl"
    limits = LedgerLimits(max_ledger_bytes=8192)  # reserve: a quarter, 2 KiB
    assert limits.reserve_bytes == 2048
    with trio.fail_after(10):
        async with open_ledger(path, limits=limits) as ledger:
            await ledger.append("session.start", run_id="r")
            with pytest.raises(LedgerFull) as caught:
                while True:
                    await ledger.append("model.request", pad="x" * 300)
            assert caught.value.reason == "max_ledger_bytes"
            assert "max_ledger_bytes" in str(caught.value)
            full_at = ledger.bytes
            assert full_at <= 8192 - 2048
            # The reserve takes the stop record, several of them.
            await ledger.append("process.exit", pid=1, status=-9, reason="killed by signal 9")
            await ledger.append("session.end", reason="ledger full", exit_status=1, cap=None)
            # ...but never past the ceiling itself.
            with pytest.raises(LedgerFull):
                await ledger.append("session.end", pad="x" * 4000)
    assert path.stat().st_size <= 8192
    assert read_chain(path)[-1]["type"] == "session.end"


@settings(max_examples=io_examples(), deadline=None)
@given(
    ceiling=st.integers(min_value=1024, max_value=16384),
    sizes=st.lists(st.integers(min_value=0, max_value=1500), min_size=1, max_size=40),
    concurrency=st.sampled_from([1, 4]),
)
def test_the_file_never_passes_its_byte_ceiling(ceiling, sizes, concurrency):
    async def scenario(path: Path) -> None:
        with trio.fail_after(20):
            async with open_ledger(path, limits=LedgerLimits(max_ledger_bytes=ceiling)) as ledger:

                async def appender(part: list[int]) -> None:
                    for size in part:
                        try:
                            written.append(await ledger.append("model.request", pad="x" * size))
                        except LedgerFull as exc:
                            assert exc.reason == "max_ledger_bytes"
                        assert ledger.bytes <= ceiling

                async with trio.open_nursery() as nursery:
                    for n in range(concurrency):
                        nursery.start_soon(appender, sizes[n::concurrency])
                # Whatever the ordinary events did, the reserve takes the stop record.
                await ledger.append("session.end", reason="done")

    written: list[int | None] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ledger.jsonl"
        trio.run(scenario, path)
        assert path.stat().st_size <= ceiling
        events = read_chain(path)
    assert sorted(e["seq"] for e in events if e["type"] == "model.request") == sorted(written)
    assert events[-1]["type"] == "session.end"


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_ledger_bytes"):
        LedgerLimits(max_ledger_bytes=0)
    with pytest.raises(ValueError, match="max_events"):
        LedgerLimits(max_events=0)
    with pytest.raises(ValueError, match="control_reserve_bytes"):
        LedgerLimits(max_ledger_bytes=100, control_reserve_bytes=100)
    assert LedgerLimits().reserve_bytes == 64 * 1024
    assert LedgerLimits(max_ledger_bytes=4096).reserve_bytes == 1024


# ---------------------------------------------------------------------------
# memory


async def test_memory_does_not_grow_with_the_number_of_events(tmp_path):
    """Counters, not lists: 4,800 more events cost no more than a few KiB of Python objects."""
    path = tmp_path / "ledger.jsonl"
    appenders = 32

    async def run(ledger, rounds: int) -> None:
        async def appender(n: int) -> None:
            for k in range(rounds):
                await ledger.append("model.request", call_id=f"{n}-{k}", tokens=k)

        async with trio.open_nursery() as nursery:
            for n in range(appenders):
                nursery.start_soon(appender, n)

    with trio.fail_after(60):
        async with open_ledger(path, observers=[lambda event: None]) as ledger:
            await run(ledger, 30)  # warm up: caches, the date string, trio's internals
            tracemalloc.start()
            try:
                await run(ledger, 30)
                after_small = tracemalloc.get_traced_memory()[0]
                await run(ledger, 150)
                after_large = tracemalloc.get_traced_memory()[0]
            finally:
                tracemalloc.stop()
            count = ledger.count
    assert count == appenders * 210
    assert after_large - after_small < 64 * 1024, (after_small, after_large)


# ---------------------------------------------------------------------------
# the sans-IO book


def test_the_fast_line_size_bound_matches_the_chain():
    book = LedgerBook(LedgerLimits())
    for type in ("model.request", "session.end", "x-docket.breaker-open"):
        for seq in (0, 9, 10, 12345, 10**12):
            for mono in (0, 7, 99999):
                assert book._overhead(type, seq, TS, mono) == line_overhead(seq, TS, type, mono)


EVENT_KINDS = ["model.request", "model.response", "session.end", "process.exit", "cache.hit"]


@settings(deadline=None)
@given(
    ceiling=st.integers(min_value=512, max_value=20000),
    max_events=st.one_of(st.none(), st.integers(min_value=1, max_value=30)),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["admit", "admit", "admit", "write", "fail", "fault"]),
            st.sampled_from(EVENT_KINDS),
            st.integers(min_value=0, max_value=900),
        ),
        max_size=80,
    ),
)
def test_the_book_keeps_a_valid_chain_and_its_ceilings_through_any_failures(
    ceiling, max_events, ops
):
    limits = LedgerLimits(max_ledger_bytes=ceiling, max_events=max_events)
    book = LedgerBook(limits)
    verifier = ChainVerifier()
    mono = 0
    admitted_ordinary = lost = lost_since_gap = 0

    class OneFault:
        armed = False

        def before_write(self, ordinal, type):
            if self.armed:
                self.armed = False
                return OSError(28, "No space left on device")
            return None

    fault = OneFault()
    for op, type, size in ops:
        if op == "admit":
            mono += size % 7
            try:
                book.admit(type, TS, mono, encode_body({"pad": "x" * size}))
            except LedgerFull as exc:
                assert exc.reason in ("max_events", "max_ledger_bytes")
            else:
                admitted_ordinary += type not in CONTROL_TYPES
            continue
        if op == "fault":
            fault.armed = True
        step = book.next_step(fault)
        if step is None:
            continue
        if isinstance(step, Loss) or op == "fail":
            items = step.items
            if isinstance(step, Batch):
                book.lose(items, "EIO: Input/output error", attempted=True)
            else:
                book.lose(items, step.error, attempted=step.attempted)
            lost += len(items)
            lost_since_gap += len(items)
            assert all(item.seq is None and item.settled for item in items)
        else:
            book.commit(step)
            events = [verifier.feed(line) for line in step.lines]
            if lost_since_gap:  # a loss is on record before any later event
                gap, events = events[0], events[1:]
                assert gap["type"] == GAP_TYPE and gap["lost"] == lost_since_gap
                assert gap["first_failing_seq"] == gap["seq"]
                lost_since_gap = 0
            assert all(e["type"] != GAP_TYPE for e in events)
            assert [e["seq"] for e in events] == [i.seq for i in step.items]
            item_lines = step.lines[len(step.lines) - len(step.items) :]
            for line, item in zip(item_lines, step.items, strict=True):
                assert len(line) + 1 <= item.reserved  # the bound admission charged holds
        assert book.size + book.reserved <= ceiling
        assert (book.count, book.head, book.size) == (
            verifier.count,
            verifier.head,
            verifier.offset,
        )
    if max_events is not None:
        assert admitted_ordinary <= max_events
    stats = book.stats()
    assert stats.unwritten_events == lost == sum(stats.unwritten_by_type.values())
    assert stats.ledger_complete == (lost == 0)
    assert (stats.first_failing_seq is None) == (lost == 0)


def test_an_empty_book_starts_at_genesis():
    book = LedgerBook(LedgerLimits())
    assert (book.count, book.head, book.size, book.next_step(None)) == (0, GENESIS, 0, None)
    assert json.loads(json.dumps(book.stats().as_dict()))["ledger_complete"] is True
