"""The ledger writer: group commit, fdatasync, one writer, ceilings, the evidence guard.

Three layers, each small:

- `LedgerBook` is sans-IO. It admits events (or refuses them at a ceiling),
  composes batches of lines from the durable head, and takes the verdict of
  each write (committed, or lost). It never touches a file or a clock.
- `_SyncWorker` is a dedicated thread that owns the blocking half: write a
  batch, fdatasync it, or cut a failed one back with ftruncate. The event loop
  never blocks on the disk.
- `Ledger` is the trio shell: `append` stamps and admits an event, then either
  submits the next batch and waits for its verdict itself, or parks until the
  task that does (another appender, or the flusher task) wakes it. Nobody is
  woken before an fdatasync has covered their line.

Lines are composed at flush time, from the durable head: when a batch fails its
lines are discarded and the chain continues from the last durable line, so the
file is a valid chain at every moment and a loss leaves no seq gap. The loss
is recorded, before any later line, as an `evidence.gap` event.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import stat
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import outcome
import trio

from docket.clock import Clock, rfc3339
from docket.errors import DocketError, InputError
from docket.ledger.chain import (
    CONTROL_TYPES,
    EVENT_TYPES,
    GENESIS,
    ChainError,
    ChainVerifier,
    encode_body,
    encode_line,
    line_hash,
    line_overhead,
)
from docket.ledger.faults import WriteFaults
from docket.ledger.lock import LedgerLock
from docket.ledger.reader import MAX_LINE_BYTES, LineTooLong, iter_lines

KiB = 1024
MiB = 1024 * KiB
GAP_TYPE = "evidence.gap"

# The reserve: bytes below max_ledger_bytes that only control events (and the
# writer's own evidence.gap record) may use, so the record of why a run stopped
# always fits. 64 KiB holds hundreds of session.end/process.exit lines; a small
# ceiling keeps three quarters of itself for ordinary events.
CONTROL_RESERVE_BYTES = 64 * KiB

# One write() per batch; these bound how much a single batch holds.
MAX_BATCH_BYTES = 1 * MiB
MAX_BATCH_LINES = 4096

# Written by the writer itself, never counted against max_events.
_EXEMPT_FROM_EVENT_CEILING = CONTROL_TYPES | {GAP_TYPE}


@dataclass(frozen=True)
class LedgerLimits:
    """The ledger's ceilings and what a failed write means.

    max_events counts non-control events accepted by the writer (written or
    lost); max_ledger_bytes counts the bytes in the file plus the bytes
    reserved for events accepted but not yet written, so the file can never
    pass it. Non-control events may use up to max_ledger_bytes minus the
    reserve (control_reserve_bytes, default min(64 KiB, a quarter of the
    ceiling)); control events and the evidence.gap record may use all of it.
    """

    max_ledger_bytes: int = 256 * MiB
    max_events: int | None = None
    fail_fast_evidence: bool = False
    control_reserve_bytes: int | None = None

    def __post_init__(self) -> None:
        if type(self.max_ledger_bytes) is not int or self.max_ledger_bytes <= 0:
            raise ValueError("max_ledger_bytes must be a positive integer")
        if self.max_events is not None and (
            type(self.max_events) is not int or self.max_events < 1
        ):
            raise ValueError("max_events must be a positive integer or None")
        reserve = self.control_reserve_bytes
        if reserve is not None and (
            type(reserve) is not int or not 0 <= reserve < self.max_ledger_bytes
        ):
            raise ValueError("control_reserve_bytes must be at least 0 and below max_ledger_bytes")

    @property
    def reserve_bytes(self) -> int:
        if self.control_reserve_bytes is not None:
            return self.control_reserve_bytes
        return min(CONTROL_RESERVE_BYTES, self.max_ledger_bytes // 4)


class LedgerFull(DocketError):
    """An event refused at a ceiling, before anything was queued or forwarded.

    Control events are refused only when even the reserve cannot take them.

    `reason` is "max_events" or "max_ledger_bytes" (the boundary answers 503 with it).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"ledger full ({reason}): {detail}")
        self.reason = reason


class EvidenceLost(DocketError):
    """With fail_fast_evidence, a write failed: this event and every later one is refused."""


class LedgerDamaged(InputError):
    """An existing ledger is torn or corrupt, so it cannot be continued."""


@dataclass(frozen=True)
class EvidenceStats:
    """What the receipt discloses about events that never reached the disk."""

    ledger_complete: bool
    unwritten_events: int
    first_failing_seq: int | None  # the seq the first lost event would have had
    write_failures: int  # failed write attempts (a failed batch, or one injected fault)
    unwritten_by_type: dict[str, int]
    last_error: str | None

    def as_dict(self) -> dict:
        return {
            "ledger_complete": self.ledger_complete,
            "unwritten_events": self.unwritten_events,
            "first_failing_seq": self.first_failing_seq,
            "write_failures": self.write_failures,
            "unwritten_by_type": dict(sorted(self.unwritten_by_type.items())),
            "last_error": self.last_error,
        }


def describe_os_error(exc: OSError) -> str:
    """`ENOSPC: No space left on device`: the errno's name, then the kernel's words."""
    name = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    text = exc.strerror or str(exc)
    return f"{name}: {text}" if name else text


# ---------------------------------------------------------------------------
# The sans-IO book


_UNASKED = object()
_PLAIN_TS = frozenset("0123456789-:.TZ+")


class PendingEvent:
    """One admitted event, encoded and stamped, waiting for a seq."""

    __slots__ = (
        "type",
        "ts",
        "mono_ms",
        "body",
        "reserved",
        "control",
        "ordinal",
        "fault",
        "seq",
        "settled",
        "waiter",
    )

    def __init__(self, type: str, ts: str, mono_ms: int, body: bytes, reserved: int, ordinal: int):
        self.type = type
        self.ts = ts
        self.mono_ms = mono_ms
        self.body = body
        self.reserved = reserved  # an upper bound on its line's size, newline included
        self.control = type in _EXEMPT_FROM_EVENT_CEILING
        self.ordinal = ordinal
        self.fault: object = _UNASKED  # the fault hook's answer, asked once
        self.seq: int | None = None
        self.settled = False  # durable (seq set) or lost (seq None)
        self.waiter: object = None  # the shell's: the task parked on this event


@dataclass
class Batch:
    """Lines composed from the durable head, to be written and synced as one."""

    items: list[PendingEvent]
    lines: list[bytes]  # without newlines; lines[0] is the evidence.gap record if has_gap
    data: bytes
    head_after: str
    mono_after: int  # mono_ms of the last line
    has_gap: bool


@dataclass
class Loss:
    """Events that will not be written: an injected fault, or a broken ledger."""

    items: list[PendingEvent]
    error: str
    attempted: bool  # a write was tried (and failed); False when the ledger is broken


class _Gap:
    """Losses since the last evidence.gap record: counters, never the events."""

    __slots__ = ("first_seq", "lost", "by_type", "failures", "error")

    def __init__(self, first_seq: int, error: str) -> None:
        self.first_seq = first_seq
        self.lost = 0
        self.by_type: dict[str, int] = {}
        self.failures = 0
        self.error = error

    def fields(self) -> dict:
        return {
            "lost": self.lost,
            "first_failing_seq": self.first_seq,
            "lost_by_type": dict(sorted(self.by_type.items())),
            "write_failures": self.failures,
            "error": self.error,
        }


class LedgerBook:
    """The writer's state and decisions, with no I/O.

    Memory is bounded: the queue holds only events whose appenders are still
    waiting, and losses are counters.
    """

    def __init__(
        self,
        limits: LedgerLimits,
        *,
        count: int = 0,
        head: str = GENESIS,
        size: int = 0,
        last_mono_ms: int = 0,
        events: int = 0,
    ) -> None:
        self.limits = limits
        self._room_control = limits.max_ledger_bytes
        self._room_other = limits.max_ledger_bytes - limits.reserve_bytes
        # The durable file.
        self.count = count  # lines; also the next seq
        self.head = head
        self.size = size
        self.last_mono_ms = last_mono_ms
        # Admitted, not yet settled.
        self.queue: deque[PendingEvent] = deque()
        self.pending = 0  # queued plus in flight
        self.reserved = 0  # bytes promised to pending events
        self.events = events  # non-control events admitted, toward max_events
        self.next_ordinal = count
        # The evidence guard.
        self.unwritten = 0
        self.unwritten_by_type: dict[str, int] = {}
        self.first_failing_seq: int | None = None
        self.write_failures = 0
        self.last_error: str | None = None
        self.gap: _Gap | None = None  # losses not yet recorded in the file
        self.broken: str | None = None  # why nothing more will be written
        self.evidence_lost: str | None = None  # set once fail_fast_evidence trips
        self._overhead_by_type: dict[str, int] = {}

    # -- admission

    def check_room(self, type: str, ts: str, mono_ms: int, body_bytes: int) -> int:
        """The line's size bound if an event like this would be admitted; else raise."""
        if self.evidence_lost is not None:
            raise EvidenceLost(self.evidence_lost)
        control = type in _EXEMPT_FROM_EVENT_CEILING
        limit = self.limits.max_events
        if not control and limit is not None and self.events >= limit:
            raise LedgerFull("max_events", f"{limit} events already accepted")
        # A safe bound on the seq this event can get: every pending event ahead of
        # it, plus one evidence.gap record (each further gap needs a loss ahead).
        seq_bound = self.count + self.pending + 1
        size = body_bytes + self._overhead(type, seq_bound, ts, mono_ms)
        if size - 1 > MAX_LINE_BYTES:
            raise ValueError(f"a {type} event of {body_bytes} bytes is too large for a ledger line")
        room = (self._room_control if control else self._room_other) - self.size - self.reserved
        if size > room:
            cap = self.limits.max_ledger_bytes
            raise LedgerFull(
                "max_ledger_bytes",
                f"a {size}-byte line does not fit: {self.size} of {cap} bytes written, "
                f"{self.reserved} promised, {cap - self._room_other} kept for control events",
            )
        return size

    def admit(self, type: str, ts: str, mono_ms: int, body: bytes) -> PendingEvent:
        """Queue an event, or raise LedgerFull / EvidenceLost without changing anything."""
        size = self.check_room(type, ts, mono_ms, len(body))
        item = PendingEvent(type, ts, mono_ms, body, size, self.next_ordinal)
        self.next_ordinal += 1
        self.queue.append(item)
        self.pending += 1
        self.reserved += size
        if not item.control:
            self.events += 1
        return item

    def _overhead(self, type: str, seq: int, ts: str, mono_ms: int) -> int:
        """chain.line_overhead, with the part that depends on the type computed once."""
        base = self._overhead_by_type.get(type)
        if base is None:
            base = self._overhead_by_type[type] = line_overhead(0, "", type, 0)
        if not _PLAIN_TS.issuperset(ts):
            return line_overhead(seq, ts, type, mono_ms)
        # Over the base: the digits beyond one each for seq and mono_ms, and ts
        # (a string needing no escape, so its JSON is itself plus two quotes).
        return base + len(str(seq)) + len(ts) + len(str(mono_ms)) - 2

    # -- composing

    def next_step(self, faults: WriteFaults | None) -> Batch | Loss | None:
        """What to do with the queue's head: write a batch, record a loss, or nothing."""
        if not self.queue:
            return None
        if self.broken is not None:
            items = list(self.queue)
            self.queue.clear()
            return Loss(items, self.broken, attempted=False)
        if faults is not None:
            injected = self._fault(self.queue[0], faults)
            if injected is not None:
                return Loss([self.queue.popleft()], describe_os_error(injected), attempted=True)
        first = self.queue[0]
        lines: list[bytes] = []
        if self.gap is not None:
            gap_line = self._gap_line(first.ts, first.mono_ms)
            if gap_line is None:
                return self.next_step(faults)  # no room for the record: now broken
            lines.append(gap_line)
        return self._compose(lines, faults)

    def gap_step(self, ts: str, mono_ms: int, faults: WriteFaults | None) -> Batch | None:
        """At close, with nothing else to write: a batch holding only the owed gap record.

        The fault hook is asked about it as the next ordinal, so a disk that is
        failing for good fails this write too.
        """
        if self.gap is None or self.broken is not None or self.queue:
            return None
        if faults is not None:
            injected = faults.before_write(self.next_ordinal, GAP_TYPE)
            if injected is not None:
                self.lose([], describe_os_error(injected), attempted=True)
                return None
        gap_line = self._gap_line(ts, max(mono_ms, self.last_mono_ms))
        return None if gap_line is None else self._compose([gap_line], None)

    def _fault(self, item: PendingEvent, faults: WriteFaults) -> OSError | None:
        if item.fault is _UNASKED:
            answer = faults.before_write(item.ordinal, item.type)
            if answer is not None and not isinstance(answer, OSError):
                raise TypeError(f"before_write must return an OSError or None, not {answer!r}")
            item.fault = answer
        return item.fault  # type: ignore[return-value]

    def _gap_line(self, ts: str, mono_ms: int) -> bytes | None:
        assert self.gap is not None
        line = encode_line(
            seq=self.count,
            ts=ts,
            mono_ms=mono_ms,
            type=GAP_TYPE,
            prev=self.head,
            body=encode_body(self.gap.fields()),
        )
        if len(line) + 1 > self._room_control - self.size - self.reserved:
            self.broken = "no room left under max_ledger_bytes to record an evidence.gap"
            return None
        return line

    def _compose(self, lines: list[bytes], faults: WriteFaults | None) -> Batch:
        seq = self.count + len(lines)
        prev = line_hash(lines[0]) if lines else self.head
        nbytes = sum(len(line) + 1 for line in lines)
        items: list[PendingEvent] = []
        queue_ = self.queue
        while queue_ and len(lines) < MAX_BATCH_LINES and nbytes < MAX_BATCH_BYTES:
            item = queue_[0]
            if faults is not None and self._fault(item, faults) is not None:
                break  # written next time round, as a loss of its own
            queue_.popleft()
            line = encode_line(
                seq=seq, ts=item.ts, mono_ms=item.mono_ms, type=item.type, prev=prev, body=item.body
            )
            item.seq = seq
            items.append(item)
            lines.append(line)
            prev = line_hash(line)
            seq += 1
            nbytes += len(line) + 1
        has_gap = self.gap is not None
        mono_after = items[-1].mono_ms if items else json.loads(lines[-1])["mono_ms"]
        return Batch(items, lines, b"\n".join(lines) + b"\n", prev, mono_after, has_gap)

    # -- verdicts

    def commit(self, batch: Batch) -> None:
        """The batch is durable."""
        self.count += len(batch.lines)
        self.head = batch.head_after
        self.size += len(batch.data)
        self.last_mono_ms = batch.mono_after
        for item in batch.items:
            self.reserved -= item.reserved
            item.settled = True
        self.pending -= len(batch.items)
        if batch.has_gap:
            self.gap = None

    def lose(
        self, items: list[PendingEvent], error: str, *, attempted: bool, broken: str | None = None
    ) -> None:
        """These events will never be written: count them, keep nothing of them."""
        if self.gap is None:
            self.gap = _Gap(self.count, error)
            if self.first_failing_seq is None:
                self.first_failing_seq = self.count
        gap = self.gap
        if attempted:
            self.write_failures += 1
            gap.failures += 1
        self.last_error = error
        for item in items:
            item.seq = None
            item.settled = True
            self.unwritten += 1
            self.unwritten_by_type[item.type] = self.unwritten_by_type.get(item.type, 0) + 1
            gap.by_type[item.type] = gap.by_type.get(item.type, 0) + 1
            self.reserved -= item.reserved
        gap.lost += len(items)
        self.pending -= len(items)
        if broken is not None and self.broken is None:
            self.broken = broken
        if self.limits.fail_fast_evidence and self.evidence_lost is None:
            self.evidence_lost = f"a ledger write failed ({error}) and fail_fast_evidence is set"
            self.broken = self.evidence_lost

    def stats(self) -> EvidenceStats:
        return EvidenceStats(
            ledger_complete=self.unwritten == 0,
            unwritten_events=self.unwritten,
            first_failing_seq=self.first_failing_seq,
            write_failures=self.write_failures,
            unwritten_by_type=dict(self.unwritten_by_type),
            last_error=self.last_error,
        )


# ---------------------------------------------------------------------------
# The blocking half


@dataclass(frozen=True)
class _WriteResult:
    error: OSError | None  # None: the batch is durable
    broken: str | None = None  # set when the file could not be cut back after a failure


def _write_durably(fd: int, data: bytes, good_size: int) -> _WriteResult:
    """Append and fdatasync; on failure, cut the file back to `good_size`.

    fdatasync is enough for an appended file: it flushes the size change with
    the data. After a failed fdatasync the page cache cannot be trusted, so
    those bytes are cut back and their events counted lost, never assumed safe.
    """
    written = 0
    try:
        view = memoryview(data)
        while written < len(data):
            n = os.write(fd, view[written:])
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            written += n
        os.fdatasync(fd)
        return _WriteResult(None)
    except OSError as exc:
        error = exc
    if written == 0:
        return _WriteResult(error)  # the first write failed: nothing reached the file
    try:
        os.ftruncate(fd, good_size)
        os.fdatasync(fd)
    except OSError as cut:
        return _WriteResult(
            error,
            f"the ledger could not be cut back to byte {good_size} after a failed write "
            f"({describe_os_error(cut)}); nothing more is written to it",
        )
    return _WriteResult(error)


class _Doorbell:
    """An eventfd a task waits on and anyone (the worker thread included) rings.

    A ring made before the wait is not lost. Linux only, like fdatasync itself.
    """

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def ring(self) -> None:
        os.eventfd_write(self._fd, 1)

    async def wait(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                os.eventfd_read(self._fd)
                return
            except BlockingIOError:
                continue  # woken for nothing; wait again

    def close(self) -> None:
        trio.lowlevel.notify_closing(self._fd)
        os.close(self._fd)


class _SyncWorker:
    """A dedicated thread that owns write+fdatasync, one batch at a time.

    A thread of our own rather than trio.to_thread: on this kind of machine a
    to_thread round trip costs more than the fdatasync it carries, and an
    eventfd wakes the loop faster than run_sync_soon. It rings the doorbell
    named with each batch when the verdict is ready.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._requests: queue.SimpleQueue[tuple[bytes, int, _Doorbell] | None] = queue.SimpleQueue()
        self._result: _WriteResult | BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="docket-ledger-sync", daemon=True)
        self._thread.start()

    def submit(self, data: bytes, good_size: int, doorbell: _Doorbell) -> None:
        """Start writing a batch; no waiting here, so any task may call it."""
        self._requests.put((data, good_size, doorbell))

    @property
    def done(self) -> bool:
        return self._result is not None

    def take_result(self) -> _WriteResult:
        result, self._result = self._result, None
        if isinstance(result, BaseException):
            raise result  # a bug in the writer, not a disk failure: say so loudly
        assert result is not None
        return result

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            data, good_size, doorbell = request
            try:
                self._result = _write_durably(self._fd, data, good_size)
            except Exception as exc:  # noqa: BLE001 - handed to the trio side and re-raised there
                self._result = exc
            doorbell.ring()

    def close(self) -> None:
        """Stop the thread; once nothing is in flight, so the join is immediate."""
        self._requests.put(None)
        self._thread.join()


# ---------------------------------------------------------------------------
# The trio shell


Observer = Callable[[dict], object]


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
        self._worker = _SyncWorker(fd)
        self._clock = clock
        self._observers = tuple(observers)
        self._faults = faults
        # mono_ms continues from the file's last line, in this session's clock.
        self._mono_base_ms = book.last_mono_ms
        self._start_mono = clock.mono()
        self._ts_ms = -1
        self._ts = ""
        self._lead_bell = _Doorbell()  # rung for a batch an appender leads
        self._flush_bell = _Doorbell()  # rung for the flusher: a verdict, or "submit"
        self._in_flight: Batch | None = None
        self._in_flight_bell: _Doorbell | None = None
        self._leader_done = trio.lowlevel.ParkingLot()
        self._awaited = 0  # appenders the last verdict woke that have not appended since
        self._nudged = False
        self._closing = False
        self._crashed: str | None = None
        self.fsyncs = 0  # fdatasync calls that made a batch durable

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

    def _stamp(self) -> tuple[str, int]:
        clock = self._clock
        wall = clock.wall()
        ms = int(wall * 1000)
        if ms != self._ts_ms:  # formatting a date costs more than the rest of an append
            self._ts_ms, self._ts = ms, rfc3339(wall)
        return self._ts, self._mono_base_ms + int((clock.mono() - self._start_mono) * 1000)

    def check_room(self, type: str, body_bytes: int = 2) -> None:
        """Raise LedgerFull (or EvidenceLost) if an event of this type would be refused now."""
        ts, mono_ms = self._stamp()
        self._book.check_room(type, ts, mono_ms, body_bytes)

    async def append(self, type: str, /, **fields: object) -> int | None:
        """Record an event; return its seq once its line is durable.

        Returns None if the write failed and the event went on the unwritten
        list (the stats disclose it). Raises LedgerFull at a ceiling and
        EvidenceLost under fail_fast_evidence, before anything is queued. A
        cancelled append withdraws nothing: the event is still written.
        """
        if self._crashed is not None:
            raise RuntimeError(f"ledger {self.path} stopped after {self._crashed}")
        if self._closing:
            raise RuntimeError(f"ledger {self.path} is closed")
        if type not in EVENT_TYPES or type == GAP_TYPE:
            raise ValueError(f"{type!r} is not an event type an appender may write")
        body = encode_body(fields)
        ts, mono_ms = self._stamp()
        try:
            item = self._book.admit(type, ts, mono_ms, body)
        except (LedgerFull, EvidenceLost):
            await trio.lowlevel.checkpoint()
            raise
        if self._awaited > 0:
            self._awaited -= 1
        if self._awaited == 0 and self._pump(self._lead_bell):
            await self._lead()
        elif self._in_flight is None and not self._nudged:
            # (With a batch in flight, whoever settles it sees to the queue.)
            self._nudged = True
            self._flush_bell.ring()  # the flusher submits once this round has run
        if item.settled:  # durable in the batch we led, or lost at once
            await trio.lowlevel.checkpoint()
            if item.seq is None and self._book.evidence_lost is not None:
                raise EvidenceLost(self._book.evidence_lost)
            return item.seq
        item.waiter = trio.lowlevel.current_task()

        def abandon(_: object) -> trio.lowlevel.Abort:
            item.waiter = None  # stays queued and is written; nobody waits for it now
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abandon)

    def _pump(self, doorbell: _Doorbell) -> bool:
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
            elif step is not None:
                self._worker.submit(step.data, book.size, doorbell)
                self._in_flight, self._in_flight_bell = step, doorbell
                return True
        return False

    async def _lead(self) -> None:
        """Wait for the verdict on the batch this task submitted, and settle it."""
        try:
            await self._verdict()
        finally:
            self._leader_done.unpark_all()
        self._awaited += 1  # this task is due back too
        if self._book.queue and not self._nudged:
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
            book.lose(items, f"the ledger stopped after {self._crashed}", attempted=False)
        stopped = f"ledger {self.path} stopped after {self._crashed}"
        for item in items:
            if item.waiter is not None:
                task, item.waiter = item.waiter, None
                trio.lowlevel.reschedule(task, outcome.Error(RuntimeError(stopped)))
        self._flush_bell.ring()

    async def _flush_loop(self) -> None:
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
        if result.error is not None:
            error = describe_os_error(result.error)
            book.lose(batch.items, error, attempted=True, broken=result.broken)
            self._awaited = self._release(batch.items)
            return self._awaited
        self.fsyncs += 1
        book.commit(batch)
        try:
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
            self._worker.submit(gap_only.data, self._book.size, self._flush_bell)
            self._in_flight, self._in_flight_bell = gap_only, self._flush_bell
            await self._verdict()

    def _close(self) -> None:
        """Stop the worker (nothing is in flight by now, so at once) and the doorbells."""
        self._worker.close()
        self._lead_bell.close()
        self._flush_bell.close()


@asynccontextmanager
async def open_ledger(
    path: str | os.PathLike,
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
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except IsADirectoryError:
        raise InputError(f"ledger {path}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"ledger {path}: cannot open for writing ({exc.strerror})") from None


def _resume_position(path: Path, fd: int) -> dict:
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
    try:
        for line in iter_lines(path):
            if not line.complete:
                raise LedgerDamaged(
                    f"ledger {path}: torn tail at byte {line.offset} (a line with no newline); {advice}"
                )
            event = verifier.feed(line.data)
            if event["type"] not in _EXEMPT_FROM_EVENT_CEILING:
                events += 1
    except ChainError as exc:
        raise LedgerDamaged(f"ledger {path}: {exc}; {advice}") from None
    except LineTooLong as exc:
        raise LedgerDamaged(f"ledger {path}: {exc}; {advice}") from None
    if verifier.offset != os.fstat(fd).st_size:
        raise LedgerDamaged(f"ledger {path}: changed while it was being read; {advice}")
    return {
        "count": verifier.count,
        "head": verifier.head,
        "size": verifier.offset,
        "last_mono_ms": verifier.last_mono_ms,
        "events": events,
    }


def _fsync_directory(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
