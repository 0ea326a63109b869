"""The ledger writer: group commit, fdatasync, one writer, ceilings, the evidence guard.

Three layers, each small:

- `LedgerBook` (book.py) is sans-IO. It admits events (or refuses them at a
  ceiling), composes batches of lines from the durable head, and takes the
  verdict of each write (committed, or lost). It never touches a file or a clock.
- `SyncWorker` (sync.py) is a dedicated thread that owns the blocking half: write a
  batch, fdatasync it, or cut a failed one back with ftruncate. The event loop
  never blocks on the disk.
- `Ledger` is the trio shell: `append` stamps and admits an event, then either
  submits the next batch and waits for its verdict itself, or parks until the
  task that does (another appender, or the flusher task) wakes it. Nobody is
  woken before an fdatasync has covered their line.

Paired events: a call's closing event always fits. `append_opening` writes an
opening event (a model.request) and holds a `ClosingSlot` for the event that
will close it; `append_closing(slot, ...)` writes that event (model.response or
model.error) into the held room, so no ceiling refuses it; `release(slot)`
gives the room back when no closing event will come (a call that never left).

    seq, slot = await ledger.append_opening("model.request", closing_bytes=N, **fields)
    ...
    await ledger.append_closing(slot, "model.response", optional=("response_body",), **fields)

The arithmetic. max_events counts non-control events accepted (written or lost)
plus slots held: an opening counts 2 the moment it is admitted (itself and its
closing event), its closing event counts nothing more, and a released slot gives
its 1 back. So a ledger of max_events = N holds at most N non-control lines, and
an opening is refused (LedgerFull "max_events") when fewer than 2 remain: with
only calls, N // 2 of them; N = 1 admits none. max_ledger_bytes counts the file,
the lines queued, and the bytes slots hold: the opening's line plus its
slot (closing_bytes, plus the largest line overhead a closing can have) must fit
the room ordinary events may use, or the opening is refused ("max_ledger_bytes").
A closing event larger than its slot (optional fields, a response body, that
the caller chose not to hold room for) is written whole if the ordinary room
left covers the difference; otherwise without its `optional` fields and with
`trimmed: true`. That essential form may also use the control reserve; only one
larger than its slot and all the room left is refused, and the caller's
closing_bytes, a bound on the essential fields, rules that out. The file never
passes max_ledger_bytes in any case.

The book and its values are imported from where they are defined: LedgerBook and
the batch tunables (MAX_BATCH_LINES, MAX_BATCH_BYTES) in book.py, the ceilings and
refusals (LedgerLimits, LedgerFull, EvidenceLost, CONTROL_RESERVE_BYTES) in
limits.py, the pending events and batches in pending.py; this module exports the
writer itself.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import outcome
import trio

from docket.clock import Clock, rfc3339
from docket.errors import InputError
from docket.ledger.book import LedgerBook
from docket.ledger.chain import EVENT_TYPES, GENESIS, ChainError, ChainVerifier, encode_body
from docket.ledger.faults import WriteFaults
from docket.ledger.limits import (
    EXEMPT_FROM_EVENT_CEILING,
    GAP_TYPE,
    LOW_DISK_TYPE,
    EvidenceLost,
    EvidenceStats,
    LedgerFull,
    LedgerLimits,
    describe_os_error,
)
from docket.ledger.lock import LedgerLock
from docket.ledger.pending import Batch, ClosingSlot, Loss, PendingEvent, Torn
from docket.ledger.reader import Lines, LineTooLong
from docket.ledger.reserve import DiskReserve
from docket.ledger.sync import Doorbell, SyncWorker, allocate

__all__ = [
    "Ledger",
    "LedgerDamaged",
    "Observer",
    "open_ledger",
]


class LedgerDamaged(InputError):
    """An existing ledger is torn or corrupt, so it cannot be continued."""


# ---------------------------------------------------------------------------
# The trio shell


Observer = Callable[[dict[str, Any]], object]


class Ledger:
    """An open ledger. Get one from `open_ledger`; append from any task in its run.

    One batch is in flight at a time, and whoever submits it waits for its
    verdict. An appender submits when no other appender is due this round
    (it is alone, or the last of those the previous batch woke), so the disk
    starts at once; it then leads the batch: waits for the fdatasync, wakes
    the others in it, and returns. Otherwise it rings the flusher, which
    submits once the round of running tasks is over, so one batch takes all
    of them and the worker thread never contends for the GIL with a busy loop.
    """

    def __init__(
        self,
        path: Path,
        book: LedgerBook,
        fd: int,
        clock: Clock,
        observers: Iterable[Observer],
        faults: WriteFaults | None,
    ) -> None:
        self.path = path
        self._book = book
        self._worker = SyncWorker(fd)
        self._clock = clock
        self._observers = tuple(observers)
        self._faults = faults
        # mono_ms continues from the file's last line, in this session's clock.
        self._mono_base_ms = book.last_mono_ms
        self._start_mono = clock.mono()
        self._ts_ms = -1
        self._ts = ""
        self._ts_second = -1
        self._ts_prefix = ""
        self._lead_bell = Doorbell()  # rung for a batch an appender leads
        self._flush_bell = Doorbell()  # rung for the flusher: a verdict, or "submit"
        self._in_flight: Batch | Torn | None = None
        self._in_flight_bell: Doorbell | None = None
        self._leader_done = trio.lowlevel.ParkingLot()
        self._awaited = 0  # appenders the last verdict woke that have not appended since
        self._nudged = False
        self._closing = False
        self._crashed: str | None = None
        self.fsyncs = 0  # fdatasync calls that made a batch durable
        self.reserve_kept: str | None = None  # spare blocks the close could not free, and why
        # Called with the seconds each durable batch's write and fdatasync took (metrics).
        self.on_sync: Callable[[float], object] | None = None

    @property
    def head(self) -> str:
        """Hash of the last durable line (64 zeros for an empty ledger)."""
        return self._book.head

    @property
    def count(self) -> int:
        """Durable lines (events, including evidence.gap records); also the next seq."""
        return self._book.count

    @property
    def bytes(self) -> int:
        """Durable bytes in the file."""
        return self._book.size

    @property
    def stats(self) -> EvidenceStats:
        return self._book.stats()

    @property
    def reserve_problem(self) -> str | None:
        """Why the disk reserve past the ledger's end could not be kept (the volume is
        full or failing), or None while it holds."""
        return self._book.short

    def _stamp(self) -> tuple[str, int]:
        clock = self._clock
        ms = int(clock.wall() * 1000)
        if ms != self._ts_ms:
            # Formatting a date costs more than the rest of an append: the date and
            # time are formatted once a second, the milliseconds added to them.
            second, millis = divmod(ms, 1000)
            if second != self._ts_second:
                self._ts_second = second
                self._ts_prefix = rfc3339(second)[:-4]  # without "000Z"
            self._ts_ms, self._ts = ms, f"{self._ts_prefix}{millis:03d}Z"
        return self._ts, self._mono_base_ms + int((clock.mono() - self._start_mono) * 1000)

    def check_room(
        self, type: str, body_bytes: int = 2, *, closing_bytes: int | None = None
    ) -> None:
        """Raise LedgerFull (or EvidenceLost) if an event of this type would be refused
        now; with `closing_bytes`, if an opening with that closing bound would be."""
        ts, mono_ms = self._stamp()
        self._book.check_room(type, ts, mono_ms, body_bytes, closing_bytes=closing_bytes)

    async def append(self, type: str, /, **fields: object) -> int | None:
        """Record an event; return its seq once its line is durable.

        Returns None if the write failed and the event went on the unwritten
        list (the stats disclose it). Raises LedgerFull at a ceiling and
        EvidenceLost under fail_fast_evidence, before anything is queued. A
        cancelled append withdraws nothing: the event is still written.
        """
        self._check_appendable(type)
        body = encode_body(fields)
        ts, mono_ms = self._stamp()
        try:
            item = self._book.admit(type, ts, mono_ms, body)
        except (LedgerFull, EvidenceLost):
            await trio.lowlevel.checkpoint()
            raise
        return await self._durable(item)

    async def append_opening(
        self, type: str, /, *, closing_bytes: int, shield: bool = False, **fields: object
    ) -> tuple[int | None, ClosingSlot]:
        """Record an event and hold room for the event that will close it.

        `closing_bytes` bounds the closing event's fields, JSON-encoded (the
        ledger adds its common fields). Returns (seq, slot) as `append` returns
        seq; pass the slot to `append_closing`, or to `release` if no closing
        event will come. Refused (LedgerFull, before anything is queued) unless
        both fit. If this raises after admission (EvidenceLost, or cancelled:
        the event is still written), the slot is released: pass `shield=True`
        if its closing event matters. Shielded, the append cannot be cancelled:
        it returns once the line is durable, and a cancellation that came
        meanwhile is delivered at the caller's next checkpoint (as if the call
        were in a shielded cancel scope, without the cost of one).
        """
        self._check_appendable(type)
        body = encode_body(fields)
        ts, mono_ms = self._stamp()
        try:
            item, slot = self._book.admit_opening(type, ts, mono_ms, body, closing_bytes)
        except (LedgerFull, EvidenceLost):
            await _checkpoint(shield)
            raise
        try:
            seq = await self._durable(item, shield)
        except BaseException:
            self._book.release(slot)
            raise
        return seq, slot

    async def append_closing(
        self,
        slot: ClosingSlot,
        type: str,
        /,
        *,
        optional: Iterable[str] = (),
        shield: bool = False,
        **fields: object,
    ) -> int | None:
        """Record the event that closes `slot`'s opening, in the room held for it.

        No ceiling refuses it. If its line is larger than its slot and the
        room ordinary events may still use, it is written without the fields
        named in `optional` and with `trimmed: true` (the essential form, which
        may also use the control reserve). It raises LedgerFull only if even
        that does not fit, which a correct closing_bytes rules out; and
        EvidenceLost under fail_fast_evidence. Returns as `append` does. The
        slot is settled either way: taken, or released if this raises.
        `shield` as for append_opening.
        """
        try:
            self._check_appendable(type)
            body = encode_body(fields)
            essential = None
            left_out = [name for name in optional if name in fields]
            if left_out:
                if "trimmed" in fields:
                    raise ValueError("'trimmed' is the ledger's field in a closing event")
                essential = encode_body(
                    {k: v for k, v in fields.items() if k not in left_out} | {"trimmed": True}
                )
        except BaseException:
            self._book.release(slot)
            raise
        ts, mono_ms = self._stamp()
        try:
            item = self._book.admit_closing(slot, type, ts, mono_ms, body, essential)
        except (LedgerFull, EvidenceLost):
            await _checkpoint(shield)
            raise
        return await self._durable(item, shield)

    def release(self, slot: ClosingSlot) -> bool:
        """Give back a slot whose closing event will not be written (its opening's
        call never went anywhere); False, and nothing done, if it was already settled."""
        return self._book.release(slot)

    def _check_appendable(self, type: str) -> None:
        if self._crashed is not None:
            raise RuntimeError(f"ledger {self.path} stopped after {self._crashed}")
        if self._closing:
            raise RuntimeError(f"ledger {self.path} is closed")
        if type not in EVENT_TYPES or type in (GAP_TYPE, LOW_DISK_TYPE):
            raise ValueError(f"{type!r} is not an event type an appender may write")

    async def _durable(self, item: PendingEvent, shield: bool = False) -> int | None:
        """Submit or await the batch holding an admitted event; its seq once durable.
        `shield`: not cancellable (a cancellation waits for the caller's next checkpoint)."""
        if self._awaited > 0:
            self._awaited -= 1
        led = False
        if self._awaited == 0 and self._pump(self._lead_bell):
            await self._lead()
            led = True
        elif self._in_flight is None and not self._nudged:
            # (With a batch in flight, whoever settles it sees to the queue.)
            self._nudged = True
            self._flush_bell.ring()  # the flusher submits once this round has run
        if item.settled:  # durable in the batch we led, or lost at once
            if not led:
                await _checkpoint(shield)
            elif not shield:  # the wait for the verdict was the schedule point
                await trio.lowlevel.checkpoint_if_cancelled()
            if item.seq is None and self._book.evidence_lost is not None:
                raise EvidenceLost(self._book.evidence_lost)
            return item.seq
        item.waiter = trio.lowlevel.current_task()

        def abandon(_: object) -> trio.lowlevel.Abort:
            if shield:
                return trio.lowlevel.Abort.FAILED  # woken by _release as usual
            item.waiter = None  # stays queued and is written; nobody waits for it now
            return trio.lowlevel.Abort.SUCCEEDED

        seq: int | None = await trio.lowlevel.wait_task_rescheduled(abandon)
        return seq

    def _pump(self, doorbell: Doorbell) -> bool:
        """If no batch is in flight: settle queued losses, submit the next batch.

        True if a batch was submitted, whose verdict will ring `doorbell`.
        """
        book = self._book
        while self._in_flight is None and book.queue:
            try:
                step = book.next_step(self._faults)
            except Exception as exc:
                self._crash(exc)  # a fault hook's bug: raised to whoever pumped
                raise
            if isinstance(step, Loss):
                book.lose(step.items, step.error, attempted=step.attempted)
                self._release(step.items)
            elif isinstance(step, Batch):
                self._submit(step, doorbell)
                self._in_flight, self._in_flight_bell = step, doorbell
                return True
            elif step is not None:  # a Torn write: its bytes go out the same way, unchecked
                self._worker.submit(step.data, book.size, doorbell)
                self._in_flight, self._in_flight_bell = step, doorbell
                return True
        if self._in_flight is None and book.low_disk is not None and not self._closing:
            # The volume crossed min_free_bytes: say so now, while there is room,
            # not at the next event (which may come after the disk is full).
            ts, mono_ms = self._stamp()
            owed = book.gap_step(ts, mono_ms, None)
            if owed is not None:
                self._submit(owed, doorbell)
                self._in_flight, self._in_flight_bell = owed, doorbell
                return True
        return False

    def _submit(self, batch: Batch, doorbell: Doorbell) -> None:
        self._worker.submit(
            batch.data,
            self._book.size,
            doorbell,
            batch.extend_to,
            batch.must_extend,
            report_free=self._book.limits.min_free_bytes > 0,
        )

    async def _lead(self) -> None:
        """Wait for the verdict on the batch this task submitted, and settle it."""
        try:
            await self._verdict()
        finally:
            self._leader_done.unpark_all()
            if self._closing:  # a closing flusher waits for no batch in flight to end
                self._flush_bell.ring()
        self._awaited += 1  # this task is due back too
        if (self._book.queue or self._book.low_disk is not None) and not self._nudged:
            # Events queued meanwhile: if the appenders just woken do not come
            # back to submit them, the flusher will.
            self._nudged = True
            self._flush_bell.ring()

    async def _verdict(self) -> int:
        # Shielded: once bytes are handed over, the verdict must be taken or the
        # book could not move on. The wait is one write+fdatasync at most.
        bell = self._in_flight_bell
        assert bell is not None
        with trio.CancelScope(shield=True):
            while not self._worker.done:
                await bell.wait()
        return self._settle_in_flight()

    def _crash(self, exc: BaseException, unsettled: list[PendingEvent] | None = None) -> None:
        """A bug (in an observer, a fault hook, the writer): write nothing past it.

        Every event not yet settled is counted lost, and its appender gets the
        reason rather than waiting for ever.
        """
        if self._crashed is not None:
            return
        self._crashed = f"an internal error ({type(exc).__name__}: {exc})"
        book = self._book
        items = (unsettled or []) + list(book.queue)
        book.queue.clear()
        if items:
            # Counted as a write failure: the receipt must not claim events lost without one.
            book.lose(items, f"the ledger stopped after {self._crashed}", attempted=True)
        stopped = f"ledger {self.path} stopped after {self._crashed}"
        for item in items:
            if item.waiter is not None:
                task, item.waiter = item.waiter, None
                trio.lowlevel.reschedule(task, outcome.Error(RuntimeError(stopped)))
        self._flush_bell.ring()

    async def _flush_loop(self) -> None:
        # Shielded, and ended by the ledger's closing (open_ledger sets it once its block
        # is over), never by a cancellation: appenders of closing events wait for the
        # flusher shielded, so a cancellation that reached both the ledger and its
        # boundary (a deadline round a whole rig) left thirty-two closing events waiting
        # on a flusher that had gone, and the block never ended (found in the suite,
        # 2026-12-03; tests/test_ledger_writer.py holds it). Once closing, it ends when no
        # batch is in flight: a batch an appender leads rings it as it settles (_lead),
        # or it would wait on for that ring (the selftest's egress check hung so).
        with trio.CancelScope(shield=True):
            await self._flush_until_closed()

    async def _flush_until_closed(self) -> None:
        try:
            while self._crashed is None:
                if self._in_flight is None:
                    if self._awaited > 0 and self._book.queue:
                        # Appenders just woken are due in the next round: let
                        # them append first, so one batch takes them all.
                        await trio.lowlevel.checkpoint()
                        await trio.lowlevel.checkpoint()
                    # Whoever was due has come, or is busy elsewhere (a call to a
                    # model, say): from now on an appender submits at once.
                    self._awaited = 0
                    if self._pump(self._flush_bell):
                        await self._verdict()
                        continue
                    if self._closing:
                        return
                self._nudged = False  # from here on, an appender that queues rings again
                await self._flush_bell.wait()
        except Exception as exc:
            self._crash(exc)
            raise

    def _settle_in_flight(self) -> int:
        """Take the worker's verdict on the batch in flight; return how many appenders woke."""
        batch, self._in_flight, self._in_flight_bell = self._in_flight, None, None
        assert batch is not None
        try:
            result = self._worker.take_result()
        except Exception as exc:
            self._crash(exc, batch.items)
            raise
        book = self._book
        if isinstance(batch, Batch):
            book.disk_verdict(
                batch,
                extend_error=result.extend_error,
                unsupported=result.unsupported,
                cut=result.cut,
                free_bytes=result.free_bytes,
            )
        if result.error is not None:
            error = describe_os_error(result.error)
            records = (LOW_DISK_TYPE,) if getattr(batch, "has_low_disk", False) else ()
            if result.skipped and isinstance(batch, Batch) and book.refused(batch, error, records):
                self._awaited = 0  # nobody woken: its events are queued again
                return 0
            book.lose(batch.items, error, attempted=True, broken=result.broken, records=records)
            self._awaited = self._release(batch.items)
            return self._awaited
        if isinstance(batch, Torn):
            batch.crash()  # the harness's crash: normally this process ends here
            book.lose(
                batch.items,
                Torn.TORN,
                attempted=True,
                broken="the ledger ends in a torn line (a torn write was injected): "
                "nothing may follow it",
            )
            self._awaited = self._release(batch.items)
            return self._awaited
        self.fsyncs += 1
        book.commit(batch)
        try:
            if self.on_sync is not None:
                self.on_sync(result.seconds)
            if self._observers:
                for line in batch.lines:
                    event = json.loads(line)
                    for observer in self._observers:
                        observer(event)
        except Exception as exc:
            self._crash(exc)  # the observers' view is incomplete from here on
            raise
        finally:
            self._awaited = self._release(batch.items)
        return self._awaited

    def _release(self, items: list[PendingEvent]) -> int:
        lost = self._book.evidence_lost
        woken = 0
        for item in items:
            task = item.waiter
            if task is None:
                continue
            woken += 1
            item.waiter = None
            if item.seq is None and lost is not None:
                trio.lowlevel.reschedule(task, outcome.Error(EvidenceLost(lost)))
            else:
                trio.lowlevel.reschedule(task, outcome.Value(item.seq))
        return woken

    async def _finish(self) -> None:
        """After the flusher: a batch still in flight, what is still queued, an owed gap."""
        if self._crashed is not None:
            return
        while True:
            if self._in_flight is not None:
                if self._in_flight_bell is self._lead_bell:
                    await self._leader_done.park()  # its leader settles it
                else:
                    await self._verdict()  # the flusher's, left when it was cancelled
                continue
            if not self._pump(self._flush_bell):
                break
        ts, mono_ms = self._stamp()
        gap_only = self._book.gap_step(ts, mono_ms, self._faults)
        if gap_only is not None:
            self._submit(gap_only, self._flush_bell)
            self._in_flight, self._in_flight_bell = gap_only, self._flush_bell
            await self._verdict()

    def _give_back_reserve(self, fd: int) -> None:
        """At close: free the blocks allocated past the file's end (the disk reserve)."""
        allocated = self._book.disk.allocated
        try:
            size = os.fstat(fd).st_size
            allocate(fd, size, allocated - size, punch=True)
        except OSError as exc:
            # The file is whole; only its spare blocks stay allocated until it is removed.
            spare = allocated - self._book.size
            self.reserve_kept = f"{spare} bytes ({describe_os_error(exc)})"

    def _close(self) -> None:
        """Stop the worker (nothing is in flight by now, so at once) and the doorbells."""
        self._worker.close()
        self._lead_bell.close()
        self._flush_bell.close()


async def _checkpoint(shield: bool) -> None:
    if shield:
        await trio.lowlevel.cancel_shielded_checkpoint()
    else:
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def open_ledger(
    path: str | os.PathLike[str],
    *,
    limits: LedgerLimits = LedgerLimits(),  # noqa: B008 - frozen, so one shared default is safe
    clock: Clock | None = None,
    observers: Iterable[Observer] = (),
    faults: WriteFaults | None = None,
) -> AsyncIterator[Ledger]:
    """Open (or create) a ledger for appending, holding its lock until the block ends.

    An existing file is continued only if it is a clean chain. Leaving the
    block writes everything pending, then releases the lock and the file; no
    thread or task outlives it.
    """
    path = Path(path)
    lock = LedgerLock(path)
    try:
        lock.acquire()
    except OSError as exc:
        raise InputError(
            f"ledger {path}: cannot take its lock {lock.path} ({exc.strerror})"
        ) from None
    try:
        fd = _open_for_append(path)
        try:
            position = await trio.to_thread.run_sync(_resume_position, path, fd)
            book = LedgerBook(limits, **position)
            await trio.to_thread.run_sync(
                _first_reserve, fd, book.disk, book.size, limits.max_ledger_bytes
            )
            ledger = Ledger(path, book, fd, clock or Clock(), observers, faults)
            try:
                body_error: Exception | None = None
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(ledger._flush_loop)
                        try:
                            yield ledger
                        except Exception as exc:  # noqa: BLE001 - re-raised below
                            # Re-raised below, outside the nursery, so the caller gets
                            # its own exception rather than one wrapped in a group.
                            body_error = exc
                        finally:
                            ledger._closing = True
                            ledger._flush_bell.ring()
                finally:
                    with trio.CancelScope(shield=True):
                        await ledger._finish()
                        if book.disk.allocated > book.size:
                            await trio.to_thread.run_sync(ledger._give_back_reserve, fd)
                if body_error is not None:
                    raise body_error
            finally:
                ledger._close()
        finally:
            os.close(fd)
    finally:
        lock.release()


def _open_for_append(path: Path) -> int:
    try:
        # Owner only whatever the umask: prompts and answers may be in it (record_bodies).
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except IsADirectoryError:
        raise InputError(f"ledger {path}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"ledger {path}: cannot open for writing ({exc.strerror})") from None


def _resume_position(path: Path, fd: int) -> dict[str, Any]:
    """Where the chain stands in an existing file (runs in a worker thread: it reads it all)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"ledger {path}: not a regular file")
    if st.st_size == 0:
        _fsync_directory(path.parent)  # so the new file's name is as durable as its lines
        return {"count": 0, "head": GENESIS, "size": 0, "last_mono_ms": 0, "events": 0}
    verifier = ChainVerifier()
    events = 0
    advice = f"run `docket doctor {path}`"
    lines = Lines(path)
    try:
        for line in lines:
            if verifier.feed(line)["type"] not in EXEMPT_FROM_EVENT_CEILING:
                events += 1
    except ChainError as exc:
        raise LedgerDamaged(f"ledger {path}: {exc}; {advice}") from None
    except LineTooLong as exc:
        raise LedgerDamaged(f"ledger {path}: {exc}; {advice}") from None
    if lines.tail:
        raise LedgerDamaged(
            f"ledger {path}: torn tail at byte {verifier.offset} (a line with no newline); {advice}"
        )
    if verifier.offset != os.fstat(fd).st_size:
        raise LedgerDamaged(f"ledger {path}: changed while it was being read; {advice}")
    return {
        "count": verifier.count,
        "head": verifier.head,
        "size": verifier.offset,
        "last_mono_ms": verifier.last_mono_ms,
        "events": events,
    }


def _first_reserve(fd: int, disk: DiskReserve, size: int, cap: int) -> None:
    """Allocate the disk reserve past the end at open (in a worker thread); the
    outcome goes to `disk` as any later allocation's does."""
    if not disk.bytes:
        return
    end = disk.first_end(size, cap)
    try:
        allocate(fd, size, end - size)
    except OSError as exc:
        unsupported = exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS)  # no reserve there
        disk.verdict(
            end,
            extend_error=None if unsupported else describe_os_error(exc),
            unsupported=unsupported,
            cut=False,
            size=size,
        )
        return
    disk.verdict(end, extend_error=None, unsupported=False, cut=False, size=size)


def _fsync_directory(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
