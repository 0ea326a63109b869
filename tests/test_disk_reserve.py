"""The ledger's disk reserve: the end of the record fits on a volume that fills.

The book's decisions are driven with facts (a simulated volume that fills at
a random moment), under hypothesis; then the real thing on a tmpfs: the blocks
are really taken at open and really given back at close.
"""

from __future__ import annotations

import errno
import os

import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from test_disk_full import tmpfs

from docket.ledger.book import LedgerBook
from docket.ledger.chain import encode_body
from docket.ledger.limits import LedgerLimits
from docket.ledger.pending import Batch, Loss
from docket.ledger.reserve import LowDiskWatch

RESERVE = 16384
TS = "2026-01-01T00:00:00.000Z"
FULL = "ENOSPC: No space left on device"


class Volume:
    """A volume with `room` bytes the ledger may still take beyond what it has allocated."""

    def __init__(self, book: LedgerBook, room: int) -> None:
        self.book = book
        self.room = room
        self.written_kinds: list[set[bool]] = []

    def drain(self) -> None:
        book = self.book
        while (step := book.next_step(None)) is not None:
            if isinstance(step, Loss):
                book.lose(step.items, step.error, attempted=step.attempted)
                continue
            self.write(step)

    def write(self, batch: Batch) -> None:
        book = self.book
        end = book.size + len(batch.data)
        extend_error = None
        if batch.extend_to is not None and batch.extend_to > book.disk.allocated:
            need = batch.extend_to - book.disk.allocated
            if need <= self.room:
                self.room -= need
            else:
                extend_error = FULL
        if extend_error is not None and batch.must_extend:  # nothing written
            book.disk_verdict(
                batch, extend_error=extend_error, unsupported=False, cut=False, free_bytes=None
            )
            book.refused(batch, FULL, ("evidence.low_disk",) if batch.has_low_disk else ())
            return
        allocated = (
            batch.extend_to if extend_error is None and batch.extend_to else book.disk.allocated
        )
        if end > allocated and end - allocated > self.room:  # the write itself runs out
            book.disk_verdict(
                batch, extend_error=extend_error, unsupported=False, cut=True, free_bytes=None
            )
            book.lose(batch.items, FULL, attempted=True)
            return
        if end > allocated:
            self.room -= end - allocated
        book.disk_verdict(
            batch, extend_error=extend_error, unsupported=False, cut=False, free_bytes=None
        )
        self.written_kinds.append({item.essential for item in batch.items})
        book.commit(batch)


ops = st.lists(st.sampled_from(["call", "call", "event", "control"]), max_size=40)


@settings(deadline=None)
@given(
    ops=ops,
    fills_at=st.integers(0, 40),
    room_left=st.integers(0, 3000),
    drain_every=st.integers(1, 4),
)
def test_the_end_of_the_record_fits_whenever_the_volume_fills(
    ops, fills_at, room_left, drain_every
):
    book = LedgerBook(LedgerLimits(disk_reserve_bytes=RESERVE))
    book.disk.allocated = book.disk.first_end(0, 1 << 30)  # as open_ledger's first leaves it
    volume = Volume(book, room=1 << 40)
    body = encode_body({"call_id": "c" * 40, "pad": "x" * 200})
    essential = []  # the run's own record, and closings of calls whose request is on disk
    for n, op in enumerate(ops):
        if n == fills_at:
            volume.room = room_left  # another process takes the rest of the volume
        mono = n
        if op == "call":
            opening, slot = book.admit_opening("model.request", TS, mono, body, 300)
            volume.drain()  # the boundary waits for the request before it forwards
            closing = book.admit_closing(slot, "model.response", TS, mono, body)
            assert slot.opening is opening
            if opening.seq is not None:
                essential.append(closing)
        elif op == "event":  # large, so that ordinary events could eat the reserve
            book.admit("policy.denied", TS, mono, encode_body({"pad": "y" * 3000}))
        else:
            essential.append(book.admit("signal.forwarded", TS, mono, encode_body({"n": n})))
        if n % drain_every == 0:  # several appenders' events in one batch
            volume.drain()
    if len(ops) <= fills_at:
        volume.room = room_left
    essential += [book.admit(t, TS, 10_000, body) for t in ("process.exit", "session.end")]
    volume.drain()
    gap_only = book.gap_step(TS, 10_000, None)
    if gap_only is not None:
        volume.write(gap_only)
    # The run's own end is on disk, whatever filled the volume, and so is the gap record.
    assert all(item.seq is not None for item in essential)
    assert book.gap is None
    stats = book.stats()
    assert stats.ledger_complete == (stats.unwritten_events == 0)
    assert stats.unrecorded_calls <= stats.unwritten_events


def test_low_disk_is_owed_once_per_crossing():
    watch = LowDiskWatch(1000)
    owed = []
    for free in (5000, 900, 800, 700, 1200, 1300, 10):
        watch.note(free)
        owed.append(watch.owed)
        watch.owed = None  # as if written
    assert owed == [
        None,
        {"free_bytes": 900, "min_free_bytes": 1000, "below": True},
        None,
        None,
        {"free_bytes": 1200, "min_free_bytes": 1000, "below": False},
        None,
        {"free_bytes": 10, "min_free_bytes": 1000, "below": True},
    ]
    never = LowDiskWatch(0)
    never.note(0)
    assert never.owed is None


async def test_the_reserve_takes_real_blocks_and_gives_them_back(tmp_path):
    from docket.ledger.writer import open_ledger

    with tmpfs(tmp_path / "vol", "1m") as vol:

        def free() -> int:
            vfs = os.statvfs(vol)
            return vfs.f_bavail * vfs.f_frsize

        before = free()
        path = vol / "ledger.jsonl"
        with trio.fail_after(20):
            async with open_ledger(path, limits=LedgerLimits(disk_reserve_bytes=64 << 10)) as led:
                await led.append("session.start", run_id="reserve")
                during = free()
                held = os.stat(path).st_blocks * 512
                await led.append("session.end", reason="done")
        after = free()
        size = os.stat(path).st_size
        assert held >= (64 << 10) > size  # allocated past the end, the size unchanged
        assert before - during >= 64 << 10  # and the volume's free space says so
        assert os.stat(path).st_blocks * 512 < 8192  # given back at close
        assert before - after <= 8192  # the ledger and its lock file, a page each


def test_an_ordinary_batch_is_not_written_when_the_reserve_cannot_grow(tmp_path):
    """sync.write_durably itself: with must_extend, a failed allocation writes nothing."""
    from docket.ledger import sync

    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    real = sync._fallocate

    def refuse(*args):
        import ctypes

        ctypes.set_errno(errno.ENOSPC)
        return -1

    try:
        sync._fallocate = refuse
        result = sync.write_durably(fd, b"line\n", 0, 4096, True)
        assert result.error is not None and result.error.errno == errno.ENOSPC
        assert os.fstat(fd).st_size == 0
        result = sync.write_durably(fd, b"line\n", 0, 4096, False)
        assert result.error is None and result.extend_error.startswith("ENOSPC")
        assert path.read_bytes() == b"line\n"
    finally:
        sync._fallocate = real
        os.close(fd)


def test_a_low_disk_record_that_cannot_be_written_is_counted_not_retried():
    book = LedgerBook(LedgerLimits(min_free_bytes=1000))
    book.commit(_one(book))
    book.watch.note(10)
    batch = book.gap_step(TS, 5, None)
    assert batch is not None and batch.has_low_disk and not batch.items
    book.lose(batch.items, "EIO: Input/output error", attempted=True, records=batch_records(batch))
    stats = book.stats()
    assert (stats.ledger_complete, stats.unwritten_events, stats.first_failing_seq) == (False, 1, 1)
    assert stats.unwritten_by_type == {"evidence.low_disk": 1}
    assert book.low_disk is None  # not retried: a failing volume would fail it for ever
    gap = book.gap_step(TS, 6, None)  # the loss itself is recorded once writing works
    book.commit(gap)
    assert book.gap is None and book.count == 2


def _one(book: LedgerBook) -> Batch:
    book.admit("session.start", TS, 0, encode_body({"run_id": "r"}))
    return book.next_step(None)


def batch_records(batch: Batch) -> tuple[str, ...]:
    return ("evidence.low_disk",) if batch.has_low_disk else ()


def test_the_receipt_reserve_takes_real_blocks_and_is_written_on_a_full_volume(tmp_path):
    import json

    from docket.receipts.receipt import RECEIPT_RESERVE_BYTES, reserve_receipt, write_receipt_into

    with tmpfs(tmp_path / "vol", "1m") as vol:

        def free() -> int:
            vfs = os.statvfs(vol)
            return vfs.f_bavail * vfs.f_frsize

        before = free()
        reserve = reserve_receipt(vol)
        assert before - free() >= RECEIPT_RESERVE_BYTES  # real blocks, not a sparse promise
        with open(vol / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        assert free() == 0
        receipt = {"format": "docket-receipt-1", "pad": "x" * 5000}
        write_receipt_into(reserve, vol / "receipt.json", receipt)
        assert json.loads((vol / "receipt.json").read_text()) == receipt
        assert not reserve.exists()
        assert os.stat(vol / "receipt.json").st_blocks * 512 < RECEIPT_RESERVE_BYTES  # trimmed
        assert os.stat(vol / "receipt.json").st_mode & 0o777 == 0o600


def test_while_short_a_batch_holds_one_kind_and_a_refused_mixed_batch_is_put_back():
    book = LedgerBook(LedgerLimits(disk_reserve_bytes=RESERVE))
    small = encode_body({"n": 1})
    first = book.admit("signal.forwarded", TS, 0, small)
    ordinary = book.admit("policy.denied", TS, 0, small)
    last = book.admit("process.exit", TS, 0, small)
    mixed = book.next_step(None)  # not short yet: one batch, and it must allocate
    assert mixed.items == [first, ordinary, last] and mixed.must_extend
    book.disk_verdict(mixed, extend_error=FULL, unsupported=False, cut=False, free_bytes=None)
    assert book.short == FULL
    assert book.refused(mixed, FULL) is True  # put back: it holds the run's own record
    assert list(book.queue) == [first, ordinary, last] and first.seq is None
    runs = []
    while (step := book.next_step(None)) is not None:
        runs.append((step.items, step.must_extend))
        if step.must_extend:
            book.disk_verdict(
                step, extend_error=FULL, unsupported=False, cut=False, free_bytes=None
            )
            assert book.refused(step, FULL) is False  # all ordinary: lost
        else:
            book.commit(step)
    assert runs == [([first], False), ([ordinary], True), ([last], False)]
    assert (first.seq, ordinary.seq, last.seq) == (0, None, 2)  # seq 1: the evidence.gap
    assert book.stats().unwritten_events == 1
