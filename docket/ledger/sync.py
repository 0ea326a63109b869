"""The ledger writer's blocking half: write a batch, fdatasync it, or cut a failed one back.

A dedicated thread (`SyncWorker`) owns these syscalls so the event loop never
blocks on the disk; it rings an eventfd (`Doorbell`) when a verdict is ready.
docket/ledger/writer.py is the trio shell that hands it batches.
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from docket.ledger.limits import describe_os_error


@dataclass(frozen=True)
class WriteResult:
    error: OSError | None  # None: the batch is durable
    broken: str | None = None  # set when the file could not be cut back after a failure
    seconds: float = 0.0  # the write and fdatasync of a durable batch, for on_sync
    extend_error: str | None = None  # why allocating the disk reserve failed
    unsupported: bool = False  # the filesystem cannot allocate ahead (no reserve there)
    cut: bool = False  # a failed write was cut back (which frees the blocks past the end)
    free_bytes: int | None = None  # the volume's free space after a durable write
    skipped: bool = False  # nothing written: the allocation failed and must_extend was set


FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
_NO_FALLOCATE = (errno.EOPNOTSUPP, errno.ENOSYS)


def _load_fallocate() -> Callable[..., int] | None:
    # fallocate(2) with flags: os.posix_fallocate cannot keep the size, and a
    # ledger whose size grew with zeros would end in a line that is not a line.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return None  # not glibc/Linux: no reserve (allocate() says unsupported)
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    return fallocate


_fallocate = _load_fallocate()


def allocate(fd: int, offset: int, length: int, *, punch: bool = False) -> None:
    """Allocate (or, with `punch`, free) the file's blocks in [offset, offset+length)
    without changing its size. OSError as the kernel says (ENOSPC, EROFS, EIO,
    EOPNOTSUPP where the filesystem cannot)."""
    if length <= 0:
        return
    if _fallocate is None:
        raise OSError(errno.ENOSYS, "fallocate is not available here")
    mode = FALLOC_FL_KEEP_SIZE | (FALLOC_FL_PUNCH_HOLE if punch else 0)
    while _fallocate(fd, mode, offset, length) != 0:
        code = ctypes.get_errno()
        if code != errno.EINTR:
            raise OSError(code, os.strerror(code))


def free_bytes(fd: int) -> int | None:
    try:
        vfs = os.fstatvfs(fd)
    except OSError:
        return None  # the writes succeeded; the low-disk check simply has no figure
    return vfs.f_bavail * vfs.f_frsize


def write_durably(
    fd: int,
    data: bytes,
    good_size: int,
    extend_to: int | None = None,
    must_extend: bool = False,
    *,
    report_free: bool = False,
) -> WriteResult:
    """Allocate ahead, append and fdatasync; on failure, cut the file back to `good_size`.

    `extend_to`: first allocate the file's blocks up to that offset (the disk
    reserve); if that fails and `must_extend`, nothing is written and the
    allocation's error is the batch's. fdatasync is enough for an appended
    file: it flushes the size change with the data. After a failed fdatasync
    the page cache cannot be trusted, so those bytes are cut back and their
    events counted lost, never assumed safe.
    """
    extend_error: str | None = None
    unsupported = False
    if extend_to is not None and extend_to > good_size:
        try:
            allocate(fd, good_size, extend_to - good_size)
        except OSError as exc:
            if exc.errno in _NO_FALLOCATE:
                unsupported = True
            else:
                extend_error = describe_os_error(exc)
                if must_extend:
                    return WriteResult(exc, extend_error=extend_error, skipped=True)
    written = 0
    started = time.perf_counter()
    try:
        view = memoryview(data)
        while written < len(data):
            n = os.write(fd, view[written:])
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            written += n
        os.fdatasync(fd)
        return WriteResult(
            None,
            seconds=time.perf_counter() - started,
            extend_error=extend_error,
            unsupported=unsupported,
            free_bytes=free_bytes(fd) if report_free else None,
        )
    except OSError as exc:
        error = exc
    if written == 0:  # the first write failed: nothing reached the file
        return WriteResult(error, extend_error=extend_error, unsupported=unsupported)
    try:
        os.ftruncate(fd, good_size)
        os.fdatasync(fd)
    except OSError as cut:
        return WriteResult(
            error,
            f"the ledger could not be cut back to byte {good_size} after a failed write "
            f"({describe_os_error(cut)}); nothing more is written to it",
            extend_error=extend_error,
            cut=True,
        )
    return WriteResult(error, extend_error=extend_error, unsupported=unsupported, cut=True)


class Doorbell:
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


# What the writer thread is asked: (data, good_size, doorbell, extend_to, must_extend,
# report_free), write_durably's arguments and the doorbell to ring when done.
_WriteRequest = tuple[bytes, int, Doorbell, int | None, bool, bool]


class SyncWorker:
    """A dedicated thread that owns write+fdatasync, one batch at a time.

    A thread of our own rather than trio.to_thread: on this kind of machine a
    to_thread round trip costs more than the fdatasync it carries, and an
    eventfd wakes the loop faster than run_sync_soon. It rings the doorbell
    named with each batch when the verdict is ready.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._requests: queue.SimpleQueue[_WriteRequest | None] = queue.SimpleQueue()
        self._result: WriteResult | BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="docket-ledger-sync", daemon=True)
        self._thread.start()

    def submit(
        self,
        data: bytes,
        good_size: int,
        doorbell: Doorbell,
        extend_to: int | None = None,
        must_extend: bool = False,
        report_free: bool = False,
    ) -> None:
        """Start writing a batch; no waiting here, so any task may call it.
        The rest as write_durably's."""
        self._requests.put((data, good_size, doorbell, extend_to, must_extend, report_free))

    @property
    def done(self) -> bool:
        return self._result is not None

    def take_result(self) -> WriteResult:
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
            data, good_size, doorbell, extend_to, must_extend, report_free = request
            try:
                self._result = write_durably(
                    self._fd, data, good_size, extend_to, must_extend, report_free=report_free
                )
            except Exception as exc:  # noqa: BLE001 - handed to the trio side and re-raised there
                self._result = exc
            doorbell.ring()

    def close(self) -> None:
        """Stop the thread; once nothing is in flight, so the join is immediate."""
        self._requests.put(None)
        self._thread.join()
