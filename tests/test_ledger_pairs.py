"""Paired admission: an opening (model.request) holds room for its closing event.

The book is driven directly with facts (no files, no clock), property-tested
under random ceilings; the trio shell is checked through open_ledger against
real files, reading the bytes back.
"""

from __future__ import annotations

import pytest
import trio
from helpers import read_chain
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.ledger.book import LedgerBook
from docket.ledger.chain import (
    CONTROL_TYPES,
    EVENT_TYPES,
    ChainVerifier,
    encode_body,
    line_overhead,
)
from docket.ledger.limits import EvidenceLost, LedgerFull, LedgerLimits
from docket.ledger.pending import Batch
from docket.ledger.writer import open_ledger

TS = "2026-11-29T21:52:28.123Z"
CLOSES = ("model.response", "model.error")


def fields(size: int, **extra) -> bytes:
    return encode_body({**extra, "pad": "x" * size})


def drain(book: LedgerBook, verifier: ChainVerifier) -> list[dict]:
    """Write everything queued (every write succeeds); the events, checked as a chain."""
    events = []
    while (step := book.next_step(None)) is not None:
        assert isinstance(step, Batch)
        book.commit(step)
        events += [verifier.feed(line) for line in step.lines]
    return events


def ordinary(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] not in CONTROL_TYPES]


# ---------------------------------------------------------------------------
# the book: event arithmetic


def test_an_opening_counts_two_toward_max_events_and_its_closing_nothing_more():
    book = LedgerBook(LedgerLimits(max_events=3))
    _, slot = book.admit_opening("model.request", TS, 0, fields(10, call_id="a"), 200)
    assert (book.events, book.slots) == (2, 1)
    with pytest.raises(LedgerFull) as caught:
        book.admit_opening("model.request", TS, 0, fields(10, call_id="b"), 200)
    assert caught.value.reason == "max_events"
    assert "need 2" in str(caught.value)
    book.admit("cache.hit", TS, 1, fields(10))  # the third and last event
    with pytest.raises(LedgerFull):
        book.admit("cache.hit", TS, 1, fields(10))
    book.admit("session.end", TS, 1, fields(10))  # control events stay exempt
    # The ceiling is reached, and the closing event is still admitted: it has its slot.
    book.admit_closing(slot, "model.response", TS, 2, fields(10, call_id="a"))
    assert (book.events, book.slots, book.held) == (3, 0, 0)
    events = drain(book, ChainVerifier())
    assert [e["type"] for e in ordinary(events)] == ["model.request", "cache.hit", "model.response"]


def test_a_released_slot_gives_its_event_and_bytes_back():
    book = LedgerBook(LedgerLimits(max_events=2, max_ledger_bytes=8192))
    _, slot = book.admit_opening("model.request", TS, 0, fields(10), 3000)
    assert book.held >= 3000
    with pytest.raises(LedgerFull):
        book.admit("cache.hit", TS, 0, fields(10))  # both events taken
    assert book.release(slot) is True
    assert (book.events, book.slots, book.held) == (1, 0, 0)
    assert book.release(slot) is False  # once only
    book.admit("cache.hit", TS, 0, fields(10))
    with pytest.raises(ValueError, match="already taken or released"):
        book.admit_closing(slot, "model.response", TS, 0, fields(10))
    assert book.events == 2


def test_an_opening_is_refused_unless_its_closing_event_fits_too():
    limits = LedgerLimits(max_ledger_bytes=4096)  # 3 KiB for ordinary events
    book = LedgerBook(limits)
    _, first = book.admit_opening("model.request", TS, 0, fields(10), 2000)
    book.check_room("model.request", TS, 0, 30)  # the line alone would fit...
    with pytest.raises(LedgerFull) as caught:  # ...but not with its closing event's room
        book.check_room("model.request", TS, 0, 30, closing_bytes=2000)
    assert caught.value.reason == "max_ledger_bytes"
    assert "for its closing event" in str(caught.value)
    with pytest.raises(LedgerFull):
        book.admit_opening("model.request", TS, 0, fields(10), 2000)
    book.admit_closing(first, "model.error", TS, 5, fields(1900))
    drain(book, ChainVerifier())
    assert book.size <= 4096 - limits.reserve_bytes


# ---------------------------------------------------------------------------
# the book: a closing event larger than its slot


def full_book(limits: LedgerLimits, *slot_bytes: int):
    """A book with openings holding `slot_bytes` each, then ordinary events until
    the ordinary room is spent (all written)."""
    book = LedgerBook(limits)
    verifier = ChainVerifier()
    slots = [
        book.admit_opening("model.request", TS, 0, fields(10, call_id=f"c{n}"), size)[1]
        for n, size in enumerate(slot_bytes)
    ]
    for size in (500, 50, 5, 0):
        while True:
            try:
                book.admit("cache.hit", TS, 0, fields(size))
            except LedgerFull:
                break
    drain(book, verifier)
    return book, verifier, slots


def test_a_closing_event_beyond_its_slot_is_written_whole_while_there_is_room():
    book = LedgerBook(LedgerLimits(max_ledger_bytes=65536))
    verifier = ChainVerifier()
    _, slot = book.admit_opening("model.request", TS, 0, fields(10), 100)
    essential = fields(10, trimmed=True)
    book.admit_closing(slot, "model.response", TS, 0, fields(5000, body="b"), essential)
    (_, close) = drain(book, verifier)
    assert close["pad"] == "x" * 5000 and "trimmed" not in close


def test_a_closing_event_without_room_for_its_optional_fields_is_trimmed_never_dropped():
    limits = LedgerLimits(max_ledger_bytes=8192)
    book, verifier, (slot,) = full_book(limits, 300)
    essential = encode_body({"call_id": "c0", "cost_nusd": 7, "trimmed": True})
    book.admit_closing(slot, "model.response", TS, 9, fields(3000, call_id="c0"), essential)
    (close,) = drain(book, verifier)
    assert close["trimmed"] is True and close["cost_nusd"] == 7 and "pad" not in close
    assert book.size <= 8192 - limits.reserve_bytes  # the control reserve is untouched


def test_an_essential_closing_event_beyond_its_slot_may_use_the_control_reserve():
    limits = LedgerLimits(max_ledger_bytes=8192)
    book, verifier, (slot,) = full_book(limits, 40)
    room_other = 8192 - limits.reserve_bytes
    book.admit_closing(slot, "model.error", TS, 9, fields(600, call_id="c0"))
    (close,) = drain(book, verifier)
    assert close["pad"] == "x" * 600
    assert room_other < book.size <= 8192


def test_only_an_essential_closing_event_larger_than_all_the_room_is_refused():
    limits = LedgerLimits(max_ledger_bytes=8192)
    book, _, (slot,) = full_book(limits, 40)
    events = book.events
    with pytest.raises(LedgerFull) as caught:
        book.admit_closing(slot, "model.error", TS, 9, fields(9000))
    assert caught.value.reason == "max_ledger_bytes"
    assert (book.slots, book.held, book.events) == (0, 0, events - 1)  # released
    assert not slot.held


def test_slots_are_used_once_by_the_book_that_gave_them():
    book, other = LedgerBook(LedgerLimits()), LedgerBook(LedgerLimits())
    _, slot = book.admit_opening("model.request", TS, 0, fields(1), 100)
    with pytest.raises(ValueError, match="another ledger"):
        other.admit_closing(slot, "model.response", TS, 0, fields(1))
    assert other.release(slot) is False and slot.held
    with pytest.raises(ValueError, match="exempt"):
        book.admit_opening("session.start", TS, 0, fields(1), 100)
    with pytest.raises(ValueError, match="closing_bytes"):
        book.admit_opening("model.request", TS, 0, fields(1), True)
    with pytest.raises(ValueError, match="cannot close"):
        book.admit_closing(slot, "session.end", TS, 0, fields(1))
    assert not slot.held and book.slots == 0  # a refused closing event releases its slot
    assert book.events == 1


def test_under_fail_fast_evidence_a_closing_event_is_refused_and_its_slot_released():
    book = LedgerBook(LedgerLimits(fail_fast_evidence=True))
    _, slot = book.admit_opening("model.request", TS, 0, fields(1), 100)
    step = book.next_step(None)
    book.lose(step.items, "EIO: Input/output error", attempted=True)
    with pytest.raises(EvidenceLost):
        book.admit_closing(slot, "model.error", TS, 0, fields(1))
    assert (book.slots, book.held) == (0, 0)


def test_the_slot_covers_any_closing_line_of_its_bound():
    """The slot's overhead allowance covers the real overhead of the longest closing
    type at any seq and mono_ms below 10**16."""
    book = LedgerBook(LedgerLimits())
    _, slot = book.admit_opening("model.request", TS, 0, fields(1), 2)
    longest = max(line_overhead(10**16 - 1, TS, t, 10**16 - 1) for t in CLOSES)
    assert slot.bytes >= 2 + longest


# ---------------------------------------------------------------------------
# the book, property-tested

OPS = ["open", "open", "close", "close", "release", "event", "control", "write"]


@settings(deadline=None)
@given(
    ceiling=st.integers(min_value=2048, max_value=30000),
    max_events=st.one_of(st.none(), st.integers(min_value=1, max_value=30)),
    ops=st.lists(
        st.tuples(
            st.sampled_from(OPS),
            st.integers(min_value=0, max_value=3000),
            st.integers(min_value=0, max_value=600),
        ),
        max_size=80,
    ),
)
def test_every_admitted_opening_gets_its_closing_event_within_both_ceilings(
    ceiling, max_events, ops
):
    limits = LedgerLimits(max_ledger_bytes=ceiling, max_events=max_events)
    book = LedgerBook(limits)
    verifier = ChainVerifier()
    written: list[dict] = []
    held: list[tuple[object, str, int]] = []  # (slot, call_id, closing_bytes)
    opened: set[str] = set()
    released: set[str] = set()
    mono = 0

    def close(slot, call_id: str, bound: int, body_size: int, kind: str) -> None:
        # The essential form at most `bound` bytes, as a caller's bound promises.
        base = len(encode_body({"call_id": call_id, "trimmed": True, "e": ""}))
        essential = encode_body({"call_id": call_id, "trimmed": True, "e": "y" * (bound - base)})
        assert len(essential) <= bound
        full = encode_body({"call_id": call_id, "e": "y" * (bound - base), "body": "z" * body_size})
        item = book.admit_closing(slot, kind, TS, mono, full, essential)  # never refused
        if len(full) + line_overhead(10**16, TS, kind, 10**16) <= slot.bytes:
            assert item.body == full  # trimmed only when the slot could not take it

    for n, (op, a, b) in enumerate(ops):
        mono += b % 5
        call_id = f"c{n}"
        if op == "open":
            closing_bytes = 40 + b
            try:
                _, slot = book.admit_opening(
                    "model.request", TS, mono, fields(a % 700, call_id=call_id), closing_bytes
                )
            except LedgerFull as exc:
                assert exc.reason in ("max_events", "max_ledger_bytes")
            else:
                held.append((slot, call_id, closing_bytes))
                opened.add(call_id)
        elif op == "close" and held:
            slot, opened_id, bound = held.pop(a % len(held))
            close(slot, opened_id, bound, a, CLOSES[b % 2])
        elif op == "release" and held:
            slot, opened_id, _ = held.pop(a % len(held))
            assert book.release(slot) is True
            released.add(opened_id)
        elif op in ("event", "control"):
            type = "cache.hit" if op == "event" else "process.exit"
            try:
                book.admit(type, TS, mono, fields(a % 1500))
            except LedgerFull as exc:
                assert exc.reason == "max_ledger_bytes" or op == "event"
        elif op == "write":
            written += drain(book, verifier)
        assert book.size + book.reserved + book.held <= ceiling
        if max_events is not None:
            assert book.events <= max_events
    for slot, opened_id, bound in held:
        close(slot, opened_id, bound, 2000, "model.error")
    written += drain(book, verifier)

    assert book.size == verifier.offset <= ceiling
    assert (book.slots, book.held, book.reserved, book.pending) == (0, 0, 0, 0)
    if max_events is not None:
        assert len(ordinary(written)) <= max_events
    requests = [e["call_id"] for e in written if e["type"] == "model.request"]
    closings = [e["call_id"] for e in written if e["type"] in CLOSES]
    assert sorted(requests) == sorted(opened)
    assert sorted(closings) == sorted(opened - released)  # exactly one each
    for event in written:
        if event["type"] in CLOSES and event.get("trimmed"):
            assert "body" not in event


# ---------------------------------------------------------------------------
# the trio shell, on real files


async def test_concurrent_calls_under_max_events_each_get_exactly_one_closing_event(tmp_path):
    """16 callers open at once under max_events = 9; a rival appender takes every
    event left; then the admitted calls close. Each admitted call's closing event
    is written; nothing passes the ceiling."""
    path = tmp_path / "ledger.jsonl"
    opened: list[str] = []
    refused: list[str] = []
    closed: list[int | None] = []
    all_opened = trio.Event()
    with trio.fail_after(10):
        async with open_ledger(path, limits=LedgerLimits(max_events=9)) as ledger:
            await ledger.append("session.start", run_id="r")

            async def call(n: int) -> None:
                try:
                    _, slot = await ledger.append_opening(
                        "model.request", closing_bytes=200, call_id=f"c{n}"
                    )
                except LedgerFull as exc:
                    refused.append(exc.reason)
                    return
                opened.append(f"c{n}")
                await all_opened.wait()
                closed.append(
                    await ledger.append_closing(slot, "model.response", call_id=f"c{n}", ok=True)
                )

            async with trio.open_nursery() as nursery:
                for n in range(16):
                    nursery.start_soon(call, n)
                while len(opened) + len(refused) < 16:
                    await trio.sleep(0.001)
                rival = 0
                with pytest.raises(LedgerFull):
                    while True:
                        await ledger.append("cache.hit", n=rival)
                        rival += 1
                all_opened.set()
            await ledger.append("session.end", reason="done")
    assert (len(opened), refused) == (4, ["max_events"] * 12)
    assert rival == 1  # 4 pairs hold 8 of the 9 events
    assert len(closed) == 4 and all(seq is not None for seq in closed)
    events = read_chain(path)
    assert len(ordinary(events)) == 9
    requests = sorted(e["call_id"] for e in events if e["type"] == "model.request")
    closings = sorted(e["call_id"] for e in events if e["type"] == "model.response")
    assert requests == closings == sorted(opened)


async def test_a_closing_event_is_written_trimmed_when_the_file_has_no_room_for_its_body(
    tmp_path,
):
    path = tmp_path / "ledger.jsonl"
    limits = LedgerLimits(max_ledger_bytes=16384)  # 12 KiB for ordinary events
    with trio.fail_after(10):
        async with open_ledger(path, limits=limits) as ledger:
            _, roomy = await ledger.append_opening(
                "model.request", closing_bytes=300, call_id="roomy"
            )
            _, late = await ledger.append_opening(
                "model.request", closing_bytes=300, call_id="late"
            )
            await ledger.append_closing(
                roomy, "model.response", optional=("body",), call_id="roomy", body="b" * 4000
            )
            with pytest.raises(LedgerFull):
                while True:
                    await ledger.append("cache.hit", pad="x" * 200)
            seq = await ledger.append_closing(
                late, "model.response", optional=("body",), call_id="late", body="b" * 4000
            )
            assert seq is not None
    assert path.stat().st_size <= 16384 - limits.reserve_bytes
    by_call = {e["call_id"]: e for e in read_chain(path) if e["type"] == "model.response"}
    assert by_call["roomy"]["body"] == "b" * 4000 and "trimmed" not in by_call["roomy"]
    assert by_call["late"]["trimmed"] is True and "body" not in by_call["late"]


async def test_a_cancelled_opening_is_still_written_and_gives_its_slot_back(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path, limits=LedgerLimits(max_events=2)) as ledger:
            with trio.CancelScope() as scope:
                scope.cancel()
                await ledger.append_opening("model.request", closing_bytes=100, call_id="gone")
            assert scope.cancelled_caught
            ledger.check_room("cache.hit")  # the closing event's event is free again
            with pytest.raises(LedgerFull):
                ledger.check_room("model.request", closing_bytes=100)
            await ledger.append("cache.hit")
    assert [e["type"] for e in read_chain(path)] == ["model.request", "cache.hit"]


async def test_append_closing_settles_its_slot_even_when_it_refuses(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with trio.fail_after(10):
        async with open_ledger(path, limits=LedgerLimits(max_events=4)) as ledger:
            _, slot = await ledger.append_opening("model.request", closing_bytes=100, call_id="a")
            with pytest.raises(ValueError, match="'trimmed' is the ledger's"):
                await ledger.append_closing(
                    slot, "model.response", optional=("body",), body="b", trimmed=False
                )
            assert not slot.held and ledger.release(slot) is False
            with pytest.raises(ValueError, match="already taken or released"):
                await ledger.append_closing(slot, "model.response", call_id="a")
            with pytest.raises(ValueError, match="not an event type"):
                await ledger.append_opening("no.such.type", closing_bytes=100)
            # Released: three events are left, enough for one more pair.
            _, again = await ledger.append_opening("model.request", closing_bytes=100, call_id="b")
            await ledger.append_closing(again, "model.error", call_id="b", reason="connect")
    events = read_chain(path)
    assert [(e["type"], e["call_id"]) for e in events] == [
        ("model.request", "a"),
        ("model.request", "b"),
        ("model.error", "b"),
    ]


@given(
    type=st.sampled_from(sorted(EVENT_TYPES)),
    seq=st.integers(min_value=0, max_value=2**53 - 1),
    ts=st.one_of(st.just("2026-11-30T03:50:00.123Z"), st.text(max_size=30)),
    mono_ms=st.integers(min_value=0, max_value=2**53 - 1),
)
def test_the_books_overhead_arithmetic_is_the_lines_own(type, seq, ts, mono_ms):
    """The ceilings count a line's bytes beyond its body with a shortcut; it must be exact."""
    try:
        exact = line_overhead(seq, ts, type, mono_ms)
    except UnicodeEncodeError:
        return  # a lone surrogate cannot be a timestamp the writer stamps
    assert LedgerBook(LedgerLimits())._overhead(type, seq, ts, mono_ms) == exact
