"""The ledger writer's sans-IO half: ceilings, admission, batches, and the evidence guard.

`LedgerBook` admits events (or refuses them at a ceiling), composes batches of
lines from the durable head, and takes the verdict of each write (committed,
or lost). It never touches a file or a clock: writer.py moves the bytes, and
tests drive the book directly with facts.

Lines are composed at flush time, from the durable head: when a batch fails its
lines are discarded and the chain continues from the last durable line, so the
file is a valid chain at every moment and a loss leaves no seq gap. The loss
is recorded, before any later line, as an `evidence.gap` event.

Paired events: `admit_opening` admits an event (a model.request) together with
a `ClosingSlot`, room held for the event that will close it (one event under
max_events, a line of at most its bound under max_ledger_bytes). The closing
event, `admit_closing`, uses that room, so no ceiling refuses it; the slot is
released if no closing event comes. The arithmetic is in the writer's docstring.

The book's values live beside it (import each from where it is defined): the ceilings,
refusals and evidence stats in limits.py (LedgerLimits, LedgerFull,
EvidenceLost, EvidenceStats, describe_os_error, CONTROL_RESERVE_BYTES), and the
pending events, closing slots, batches and losses in pending.py. The batch
tunables (MAX_BATCH_BYTES, MAX_BATCH_LINES) stay here, where they are read.
"""

from __future__ import annotations

import errno
import json
from collections import deque
from typing import Any

from docket.ledger.chain import (
    EVENT_TYPES,
    GENESIS,
    encode_body,
    encode_line,
    json_string,
    line_hash,
    line_overhead,
)
from docket.ledger.faults import TornWrite, WriteFaults
from docket.ledger.limits import (
    EXEMPT_FROM_EVENT_CEILING,
    GAP_TYPE,
    LOW_DISK_TYPE,
    EvidenceLost,
    EvidenceStats,
    LedgerFull,
    LedgerLimits,
    MiB,
    describe_os_error,
)
from docket.ledger.pending import _UNASKED, Batch, ClosingSlot, Loss, PendingEvent, Torn, _Gap
from docket.ledger.reader import MAX_LINE_BYTES
from docket.ledger.reserve import DiskReserve, LowDiskWatch
from docket.ledger.strict_json import TOO_DEEP, text_nests_deeper

# One write() per batch; these bound how much a single batch holds.
MAX_BATCH_BYTES = 1 * MiB
MAX_BATCH_LINES = 4096

# What a closing event's line adds to its fields, held at its opening before the
# closing's type, seq and mono_ms are known: the longest ordinary type in the
# vocabulary, and a seq and mono_ms of 17 digits (mono_ms: three thousand centuries).
_LONGEST_ORDINARY_TYPE = max(sorted(EVENT_TYPES - EXEMPT_FROM_EVENT_CEILING), key=len)
_LARGE_NUMBER = 10**16


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
        self.events = events  # non-control events admitted and slots held, toward max_events
        self.slots = 0  # closing slots held
        self.held = 0  # bytes held by those slots
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
        self.unrecorded_calls = 0  # closings admitted for openings that were lost
        self.unverified_tail = False  # bytes past `size` the writer could not cut back
        # The ledger's volume (reserve.py): while the disk reserve is short,
        # batches are of one kind, and only the essential kind may use the reserve.
        self.disk = DiskReserve(limits.disk_reserve, size)
        self.watch = LowDiskWatch(limits.min_free_bytes)
        self._overhead_by_type: dict[str, int] = {}

    # -- admission

    def check_room(
        self, type: str, ts: str, mono_ms: int, body_bytes: int, *, closing_bytes: int | None = None
    ) -> int:
        """The line's size bound if an event like this would be admitted; else raise.

        With `closing_bytes`, as an opening: it must also have room for a
        closing event whose fields encode to at most that many bytes.
        """
        return self._room(type, ts, mono_ms, body_bytes, closing_bytes)[0]

    def _room(
        self, type: str, ts: str, mono_ms: int, body_bytes: int, closing_bytes: int | None
    ) -> tuple[int, int]:
        """(the line's size bound, the bytes its closing slot holds), or raise."""
        if self.evidence_lost is not None:
            raise EvidenceLost(self.evidence_lost)
        control = type in EXEMPT_FROM_EVENT_CEILING
        if control and closing_bytes is not None:
            raise ValueError(f"a {type} event is exempt from max_events: it has no closing slot")
        wanted = 1 if closing_bytes is None else 2
        limit = self.limits.max_events
        if not control and limit is not None and self.events + wanted > limit:
            held = f" ({self.slots} of them held for closing events)" if self.slots else ""
            raise LedgerFull(
                "max_events",
                f"{self.events} of {limit} events accepted{held}; "
                + ("an event needs 1" if wanted == 1 else "an event and its closing event need 2"),
            )
        # A safe bound on the seq this event can get: every pending event ahead of
        # it, plus one evidence.gap record (each further gap needs a loss ahead).
        seq_bound = self.count + self.pending + 1
        size = body_bytes + self._overhead(type, seq_bound, ts, mono_ms)
        if size - 1 > MAX_LINE_BYTES:
            raise ValueError(f"a {type} event of {body_bytes} bytes is too large for a ledger line")
        hold = 0
        if closing_bytes is not None:
            if isinstance(closing_bytes, bool) or not isinstance(closing_bytes, int):
                raise ValueError(f"closing_bytes must be an integer, not {closing_bytes!r}")
            if closing_bytes < 2:  # "{}", the smallest body there is
                raise ValueError(f"closing_bytes must be at least 2, not {closing_bytes}")
            hold = closing_bytes + self._overhead(
                _LONGEST_ORDINARY_TYPE, _LARGE_NUMBER, ts, _LARGE_NUMBER
            )
            if hold - 1 > MAX_LINE_BYTES:
                raise ValueError(
                    f"a closing event of {closing_bytes} bytes is too large for a line"
                )
        used = self.size + self.reserved + self.held
        room = (self._room_control if control else self._room_other) - used
        if size + hold > room:
            cap = self.limits.max_ledger_bytes
            wanted_bytes = (
                f"a {size}-byte line and {hold} bytes for its closing event do not fit"
                if hold
                else f"a {size}-byte line does not fit"
            )
            raise LedgerFull(
                "max_ledger_bytes",
                f"{wanted_bytes}: {self.size} of {cap} bytes written, "
                f"{self.reserved + self.held} promised, {cap - self._room_other} kept for control events",
            )
        return size, hold

    def _admissible(
        self, type: str, ts: str, mono_ms: int, body_bytes: int, closing_bytes: int | None
    ) -> tuple[int, int]:
        """`_room` for an event really offered (not a probe): one refused because
        evidence was lost is itself an event that never reaches the disk."""
        if self.evidence_lost is not None:
            self._refused_after_loss(type)
        return self._room(type, ts, mono_ms, body_bytes, closing_bytes)

    def _refused_after_loss(self, type: str) -> None:
        # Under fail_fast_evidence nothing is written after the first loss, yet
        # the run still has things to say (how calls ended, session.end): the
        # receipt's unwritten_events counts them, so it never reads as if the
        # record stopped at one missing line.
        self.unwritten += 1
        self.unwritten_by_type[type] = self.unwritten_by_type.get(type, 0) + 1
        if self.gap is not None:
            self.gap.lost += 1
            self.gap.by_type[type] = self.gap.by_type.get(type, 0) + 1

    def admit(self, type: str, ts: str, mono_ms: int, body: bytes) -> PendingEvent:
        """Queue an event, or raise LedgerFull / EvidenceLost without changing anything.

        ValueError for a body the chain's verifier would refuse: nested deeper
        than strict JSON allows (encode_body has already refused NaN and the
        rest of what is not JSON), or too large for a line.
        """
        _check_nesting(type, body)
        size, _ = self._admissible(type, ts, mono_ms, len(body), None)
        item = self._queue(type, ts, mono_ms, body, size)
        if not item.control:
            self.events += 1
        return item

    def admit_opening(
        self, type: str, ts: str, mono_ms: int, body: bytes, closing_bytes: int
    ) -> tuple[PendingEvent, ClosingSlot]:
        """Queue an event and hold room for its closing event (fields of at most
        `closing_bytes` encoded bytes), or raise as `admit` does without changing anything."""
        _check_nesting(type, body)
        size, hold = self._admissible(type, ts, mono_ms, len(body), closing_bytes)
        item = self._queue(type, ts, mono_ms, body, size)
        self.events += 2
        self.slots += 1
        self.held += hold
        return item, ClosingSlot(self, hold, item)

    def admit_closing(
        self,
        slot: ClosingSlot,
        type: str,
        ts: str,
        mono_ms: int,
        body: bytes,
        essential: bytes | None = None,
    ) -> PendingEvent:
        """Queue the event that closes `slot`'s opening, in the room the slot holds.

        No ceiling refuses it. `body` is written if it fits the slot or the room
        ordinary events may still use; otherwise `essential` (the same event
        without its optional fields, saying so) is written, and it may use the
        control reserve as well: how a call ended is evidence the receipt is
        built from. Only an `essential` larger than all of that, which a
        caller's bound on its fields rules out, is refused (LedgerFull). The
        slot is settled either way: taken, or released when this raises.
        """
        if slot.book is not self:
            raise ValueError("this closing slot belongs to another ledger")
        if not slot.held:
            raise ValueError("this closing slot was already taken or released")
        try:
            if type in EXEMPT_FROM_EVENT_CEILING:
                raise ValueError(f"a {type} event cannot close a slot")
            if self.evidence_lost is not None:
                self._refused_after_loss(type)
                raise EvidenceLost(self.evidence_lost)
            # The room as it would be with this slot given back: by the invariant
            # size + reserved + held <= max_ledger_bytes, the slot's own bytes fit.
            used = self.size + self.reserved + self.held - slot.bytes
            ordinary = max(slot.bytes, self._room_other - used)
            everything = self._room_control - used
            overhead = self._overhead(type, self.count + self.pending + 1, ts, mono_ms)
            size = len(body) + overhead
            if size > ordinary or size - 1 > MAX_LINE_BYTES:
                fallback = body if essential is None else essential
                size = len(fallback) + overhead
                if size > everything or size - 1 > MAX_LINE_BYTES:
                    raise LedgerFull(
                        "max_ledger_bytes",
                        f"a {size}-byte closing event does not fit: {slot.bytes} bytes were "
                        f"held for it and {max(everything - slot.bytes, 0)} more are left",
                    )
                body = fallback
            _check_nesting(type, body)
        except BaseException:
            self.release(slot)
            raise
        slot.held = False
        self.slots -= 1
        self.held -= slot.bytes
        item = self._queue(type, ts, mono_ms, body, size)  # its event was counted at the opening
        opening = slot.opening
        if opening is not None and opening.settled and opening.seq is None:
            # The call went on without its request on disk (fail-open): its closing
            # event is evidence, but not the end of the record the reserve is for.
            item.essential = False
            self.unrecorded_calls += 1
        else:
            item.essential = True
        return item

    def release(self, slot: ClosingSlot) -> bool:
        """Give back a slot no closing event will take; False if it was already settled."""
        if slot.book is not self or not slot.held:
            return False
        slot.held = False
        self.slots -= 1
        self.held -= slot.bytes
        self.events -= 1
        return True

    def _queue(self, type: str, ts: str, mono_ms: int, body: bytes, size: int) -> PendingEvent:
        item = PendingEvent(type, ts, mono_ms, body, size, self.next_ordinal)
        self.next_ordinal += 1
        self.queue.append(item)
        self.pending += 1
        self.reserved += size
        return item

    def _overhead(self, type: str, seq: int, ts: str, mono_ms: int) -> int:
        """chain.line_overhead, with the part that depends on the type computed once."""
        base = self._overhead_by_type.get(type)
        if base is None:
            base = self._overhead_by_type[type] = line_overhead(0, "", type, 0)
        # Over the base (seq 0, ts "", mono_ms 0): the digits beyond one each for seq
        # and mono_ms, and the bytes of ts as the line encodes it beyond its two quotes.
        ts_bytes = len(json_string(ts).encode())
        return base + len(str(seq)) + ts_bytes + len(str(mono_ms)) - 4

    # -- composing

    def next_step(self, faults: WriteFaults | None) -> Batch | Torn | Loss | None:
        """What to do with the queue's head: write a batch, record a loss, or nothing."""
        if not self.queue:
            return None
        if self.broken is not None:
            items = list(self.queue)
            self.queue.clear()
            return Loss(items, self.broken, attempted=False)
        torn = None
        if faults is not None:
            injected = self._fault(self.queue[0], faults)
            if isinstance(injected, TornWrite):
                torn, faults = injected, None  # compose this one event, then cut it short
            elif injected is not None:
                return Loss([self.queue.popleft()], describe_os_error(injected), attempted=True)
        first = self.queue[0]
        lines: list[bytes] = []
        if self.gap is not None:
            gap_line = self._gap_line(first.ts, first.mono_ms)
            if gap_line is None:
                return self.next_step(faults)  # no room for the record: now broken
            lines.append(gap_line)
        low_disk = self._low_disk_line(lines, first.ts, first.mono_ms)
        if low_disk is not None:
            lines.append(low_disk)
        if torn is None:
            return self._compose(lines, faults, has_low_disk=low_disk is not None)
        whole = self._compose(lines, None, limit=len(lines) + 1)
        last = whole.lines[-1]
        keep = max(0, min(torn.keep, len(last)))  # never its newline: the line stays torn
        return Torn(whole.items, whole.data[: len(whole.data) - len(last) - 1 + keep], torn.crash)

    def gap_step(self, ts: str, mono_ms: int, faults: WriteFaults | None) -> Batch | None:
        """With nothing else to write (at close, or when an evidence.low_disk is
        owed): a batch holding only the owed records (evidence.gap, evidence.low_disk).

        The fault hook is asked about it as the next ordinal, so a disk that is
        failing for good fails this write too.
        """
        if self.gap is None and self.low_disk is None:
            return None
        if self.broken is not None or self.queue:
            return None
        mono_ms = max(mono_ms, self.last_mono_ms)
        if self.gap is None:  # only an evidence.low_disk
            line = self._low_disk_line([], ts, mono_ms)
            if line is None:
                return None
            batch = self._compose([line], None, has_low_disk=True)
            return batch
        if faults is not None:
            injected = faults.before_write(self.next_ordinal, GAP_TYPE)
            if isinstance(injected, TornWrite):  # a tear at close: the gap is simply not written
                injected = OSError(errno.EIO, Torn.TORN)
            if injected is not None:
                self.lose([], describe_os_error(injected), attempted=True)
                return None
        gap_line = self._gap_line(ts, mono_ms)
        if gap_line is None:
            return None
        low_disk = self._low_disk_line([gap_line], ts, mono_ms)
        lines = [gap_line] + ([] if low_disk is None else [low_disk])
        return self._compose(lines, None, has_low_disk=low_disk is not None)

    def _fault(self, item: PendingEvent, faults: WriteFaults) -> OSError | TornWrite | None:
        if item.fault is _UNASKED:
            answer = faults.before_write(item.ordinal, item.type)
            if answer is not None and not isinstance(answer, OSError | TornWrite):
                raise TypeError(
                    f"before_write must return an OSError, a TornWrite or None, not {answer!r}"
                )
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
        if len(line) + 1 > self._room_control - self.size - self.reserved - self.held:
            self.broken = "no room left under max_ledger_bytes to record an evidence.gap"
            return None
        return line

    def _low_disk_line(self, before: list[bytes], ts: str, mono_ms: int) -> bytes | None:
        """The owed evidence.low_disk record, chained after `before` (or the head)."""
        owed = self.watch.owed
        if owed is None:
            return None
        line = encode_line(
            seq=self.count + len(before),
            ts=ts,
            mono_ms=mono_ms,
            type=LOW_DISK_TYPE,
            prev=line_hash(before[-1]) if before else self.head,
            body=encode_body(owed),
        )
        used = self.size + self.reserved + self.held + sum(len(x) + 1 for x in before)
        if len(line) + 1 > self._room_control - used:
            self.watch.owed = None  # no room under the ceiling: readiness still says so
            return None
        return line

    def _compose(
        self,
        lines: list[bytes],
        faults: WriteFaults | None,
        limit: int | None = None,
        *,
        has_low_disk: bool = False,
    ) -> Batch:
        limit = MAX_BATCH_LINES if limit is None else limit
        seq = self.count + len(lines)
        prev = line_hash(lines[-1]) if lines else self.head
        nbytes = sum(len(line) + 1 for line in lines)
        items: list[PendingEvent] = []
        queue_ = self.queue
        # With the disk reserve short, a batch holds one kind: the essential kind
        # may be written into the reserve, the other only once the volume has room.
        kind = queue_[0].essential if (queue_ and self.short is not None) else None
        while queue_ and len(lines) < limit and nbytes < MAX_BATCH_BYTES:
            item = queue_[0]
            if kind is not None and item.essential is not kind:
                break
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
        data = b"\n".join(lines) + b"\n"
        batch = Batch(items, lines, data, prev, mono_after, has_gap, has_low_disk=has_low_disk)
        self._plan_reserve(batch)
        return batch

    def _plan_reserve(self, batch: Batch) -> None:
        """Whether the worker allocates blocks before writing `batch` (reserve.py)."""
        # An ordinary event may not take the reserve's blocks; the run's own record,
        # and a gap or low-disk record alone, may.
        batch.extend_to = self.disk.plan(
            self.size + len(batch.data), self.held, self.limits.max_ledger_bytes
        )
        if batch.extend_to is not None:
            batch.must_extend = any(not item.essential for item in batch.items)

    def disk_verdict(
        self,
        batch: Batch,
        *,
        extend_error: str | None,
        unsupported: bool,
        cut: bool,
        free_bytes: int | None,
    ) -> None:
        """What writing `batch` said about the volume (sync.WriteResult's facts).

        Call before commit or lose. `extend_error`: why the allocation failed;
        `unsupported`: the filesystem has no fallocate, so there is no reserve;
        `cut`: a failed write was cut back, which frees the blocks past the end;
        `free_bytes`: the volume's free space after a durable write.
        """
        self.disk.verdict(
            batch.extend_to,
            extend_error=extend_error,
            unsupported=unsupported,
            cut=cut,
            size=self.size,
        )
        if free_bytes is not None:
            self.watch.note(free_bytes)

    @property
    def short(self) -> str | None:
        """Why the disk reserve cannot be kept (the volume is full or failing), or None."""
        return self.disk.short

    @property
    def low_disk(self) -> dict[str, Any] | None:
        """The evidence.low_disk record owed, or None."""
        return self.watch.owed

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
            item.body = b""  # a closing slot keeps its opening for its seq, not its bytes
        self.pending -= len(batch.items)
        if batch.has_gap:
            self.gap = None
        if batch.has_low_disk:
            self.watch.owed = None

    def refused(self, batch: Batch, error: str, records: tuple[str, ...] = ()) -> bool:
        """The worker wrote nothing: the volume refused the allocation a batch holding
        an ordinary event needs (reserve.DiskReserve.plan).

        A batch of ordinary events only is lost. One that also holds the run's own
        record (the first batch after the volume filled) is put back, its events in
        order at the head of the queue: the reserve is short now, so the next
        batches are of one kind, and the essential ones are written into it.
        Returns True if the events were put back (nobody is woken).
        """
        if all(not item.essential for item in batch.items):
            self.lose(batch.items, error, attempted=True, records=records)
            return False
        for item in reversed(batch.items):
            item.seq = None
            self.queue.appendleft(item)
        return True

    def lose(
        self,
        items: list[PendingEvent],
        error: str,
        *,
        attempted: bool,
        broken: str | None = None,
        records: tuple[str, ...] = (),
    ) -> None:
        """These events will never be written: count them, keep nothing of them.

        `records`: the writer's own records in the failed batch that are not
        retried (an evidence.low_disk), counted as lost events of their type."""
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
            item.body = b""
            self.unwritten += 1
            self.unwritten_by_type[item.type] = self.unwritten_by_type.get(item.type, 0) + 1
            gap.by_type[item.type] = gap.by_type.get(item.type, 0) + 1
            self.reserved -= item.reserved
        for kind in records:
            if kind == LOW_DISK_TYPE:
                self.watch.owed = (
                    None  # said once; a volume failing for good would fail it for ever
                )
            self.unwritten += 1
            self.unwritten_by_type[kind] = self.unwritten_by_type.get(kind, 0) + 1
            gap.by_type[kind] = gap.by_type.get(kind, 0) + 1
        gap.lost += len(items) + len(records)
        self.pending -= len(items)
        if broken is not None and self.broken is None:
            self.broken = broken
            # The failed write's bytes could not be cut back (a read-only or failing
            # volume, or a torn write): the file may go on past the durable record.
            self.unverified_tail = True
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
            unrecorded_calls=self.unrecorded_calls,
            unverified_tail=self.unverified_tail,
        )


def _check_nesting(type: str, body: bytes) -> None:
    if text_nests_deeper(body):
        raise ValueError(f"a {type} event's fields are {TOO_DEEP}: verify would refuse the line")
