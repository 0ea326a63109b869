"""The ledger's volume, as the book sees it: the disk reserve and the low-disk watch.

Pure decisions, no I/O (sync.py carries them out, the book asks and records):

- `DiskReserve`: real blocks kept allocated past the ledger's end
  (fallocate with FALLOC_FL_KEEP_SIZE, limits.DISK_RESERVE_BYTES), so the end
  of the record (process.exit, session.end, an evidence.gap, the closing
  events of calls whose request is on disk) still fits when another process
  has filled the volume. Before a batch the book asks `plan` whether to
  allocate first; after it, `verdict` takes what the write said. While the
  volume cannot top the reserve up (`short`), a batch holding an ordinary
  event is written only if its allocation succeeds: ordinary events never take
  the reserve's blocks.
- `LowDiskWatch`: below limits.min_free_bytes free, an evidence.low_disk record
  is owed, once per crossing (and once more when the volume comes back), so the
  ledger says the disk is running out while it still has room to say so.
"""

from __future__ import annotations

from typing import Any


class DiskReserve:
    """The allocation past the ledger's end, and whether it can still be kept."""

    __slots__ = ("bytes", "allocated", "short")

    def __init__(self, nbytes: int, allocated: int) -> None:
        self.bytes = nbytes  # 0: no reserve (limits said so, or the filesystem cannot)
        self.allocated = allocated  # the file's blocks are allocated up to this offset
        self.short: str | None = None  # why the last allocation failed, until one succeeds

    def first_end(self, size: int, cap: int) -> int:
        """Where the allocation made at open should end (half a reserve ahead, as `plan`)."""
        return max(min(size + self.bytes + self.bytes // 2, cap), size)

    def plan(self, end: int, held: int, cap: int) -> int | None:
        """Allocate up to this offset before writing a batch, or None: no need.

        `end`: where the file will end after the batch; `held`: the bytes closing
        slots hold (their events are part of the end of the record); `cap`:
        max_ledger_bytes, past which the file never goes. Allocation runs half a
        reserve ahead, so most batches need no syscall for it; while short,
        every batch tries again, which is how the reserve learns the volume has
        room again. A batch holding an ordinary event is written only if the
        allocation succeeds (the book sets Batch.must_extend).
        """
        if not self.bytes:
            return None
        wanted = min(end + self.bytes + held, cap)
        if self.short is None and wanted <= self.allocated:
            return None
        return max(min(wanted + self.bytes // 2, cap), end)

    def verdict(
        self,
        extend_to: int | None,
        *,
        extend_error: str | None,
        unsupported: bool,
        cut: bool,
        size: int,
    ) -> None:
        """What a write said: the allocation's error (or none), a filesystem without
        fallocate (no reserve from now on), a failed write cut back to `size` (a cut
        frees the blocks past the end)."""
        if unsupported:
            self.bytes = 0
            self.short = None
        elif extend_to is not None:
            if extend_error is None:
                self.allocated = max(self.allocated, extend_to)
                self.short = None
            else:
                self.short = extend_error
        if cut:
            self.allocated = size


class LowDiskWatch:
    """Owes an evidence.low_disk record each time free space crosses `floor` (0: never)."""

    __slots__ = ("floor", "below", "owed")

    def __init__(self, floor: int) -> None:
        self.floor = floor
        self.below = False
        self.owed: dict[str, Any] | None = None  # the record's fields, until it is written or lost

    def note(self, free_bytes: int) -> None:
        if not self.floor:
            return
        below = free_bytes < self.floor
        if below is not self.below:
            self.below = below
            self.owed = {"free_bytes": free_bytes, "min_free_bytes": self.floor, "below": below}
