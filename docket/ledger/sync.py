"""The ledger writer's blocking half: write a batch, fdatasync it, or cut a failed one back.

A dedicated thread (`SyncWorker`) owns these syscalls so the event loop never
blocks on the disk; it rings an eventfd (`Doorbell`) when a verdict is ready.
docket/ledger/writer.py is the trio shell that hands it batches.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
import time
from dataclasses import dataclass

import trio

from docket.ledger.book import describe_os_error


@dataclass(frozen=True)
class WriteResult:
    error: OSError | None  # None: the batch is durable
    broken: str | None = None  # set when the file could not be cut back after a failure
    seconds: float = 0.0  # the write and fdatasync of a durable batch, for on_sync


def write_durably(fd: int, data: bytes, good_size: int) -> WriteResult:
    """Append and fdatasync; on failure, cut the file back to `good_size`.

    fdatasync is enough for an appended file: it flushes the size change with
    the data. After a failed fdatasync the page cache cannot be trusted, so
    those bytes are cut back and their events counted lost, never assumed safe.
    """
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
        return WriteResult(None, seconds=time.perf_counter() - started)
    except OSError as exc:
        error = exc
    if written == 0:
        return WriteResult(error)  # the first write failed: nothing reached the file
    try:
        os.ftruncate(fd, good_size)
        os.fdatasync(fd)
    except OSError as cut:
        return WriteResult(
            error,
            f"the ledger could not be cut back to byte {good_size} after a failed write "
            f"({describe_os_error(cut)}); nothing more is written to it",
        )
    return WriteResult(error)


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


class SyncWorker:
    """A dedicated thread that owns write+fdatasync, one batch at a time.

    A thread of our own rather than trio.to_thread: on this kind of machine a
    to_thread round trip costs more than the fdatasync it carries, and an
    eventfd wakes the loop faster than run_sync_soon. It rings the doorbell
    named with each batch when the verdict is ready.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._requests: queue.SimpleQueue[tuple[bytes, int, Doorbell] | None] = queue.SimpleQueue()
        self._result: WriteResult | BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="docket-ledger-sync", daemon=True)
        self._thread.start()

    def submit(self, data: bytes, good_size: int, doorbell: Doorbell) -> None:
        """Start writing a batch; no waiting here, so any task may call it."""
        self._requests.put((data, good_size, doorbell))

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
            data, good_size, doorbell = request
            try:
                self._result = write_durably(self._fd, data, good_size)
            except Exception as exc:  # noqa: BLE001 - handed to the trio side and re-raised there
                self._result = exc
            doorbell.ring()

    def close(self) -> None:
        """Stop the thread; once nothing is in flight, so the join is immediate."""
        self._requests.put(None)
        self._thread.join()
