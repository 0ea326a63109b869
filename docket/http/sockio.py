"""Bytes in and out of a connection, waiting only when the kernel says it would block.

trio's SocketStream makes every `receive_some` and `send_all` a full trip through
the scheduler, plus a few context managers, even when the kernel has the bytes
(or the room) at once: about 35 us an operation on this machine, and a proxied
call makes four of them. `StreamIO` does the syscall first, and only when it
would block waits for the socket (`wait_readable` / `wait_writable`) inside a
deadline scope, so the common case pays neither the wait nor the scope. One
exception: after a read that emptied the socket, the next receive waits first,
as the bytes it wants (an answer, the peer's next request) are still to come.

What trio's contract needs is kept: each operation raises Cancelled when its task
is cancelled (`checkpoint_if_cancelled`), and a run of operations that never
block yields to the scheduler every FAST_RUN operations, so a task that always
finds bytes waiting cannot starve the others. The descriptor is read from the
socket for every operation, never cached: after a close, a cached number could
name another connection's socket.

Any other stream (TLS) goes through its own methods, with the same interface.
"""

from __future__ import annotations

import math
import os

import trio

FAST_RUN = 16  # operations that did not block, between two schedule points


class StreamIO:
    """`receive(max_bytes, timeout)` and `send_all(data, timeout)` on one stream.

    Both raise trio.TooSlowError when `timeout` seconds pass without progress,
    trio.BrokenResourceError when the peer reset or the connection failed, and
    trio.ClosedResourceError when the stream was closed (by us). `receive`
    returns b"" at the end of the stream.
    """

    __slots__ = ("stream", "_socket", "_unyielded", "_drained")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        # Only a plain TCP stream's socket is used directly; TLS has records to frame.
        self._socket = stream.socket if type(stream) is trio.SocketStream else None
        self._unyielded = 0
        # The last read took less than it asked for: the kernel had nothing more.
        # The next bytes are an answer still to come (the peer's next request, the
        # upstream's response), so the next receive waits first rather than paying
        # for a read that fails (a syscall and an exception) before it waits anyway.
        self._drained = False

    async def receive(self, max_bytes: int, timeout: float) -> bytes | bytearray:
        sock = self._socket
        if sock is None:
            with trio.move_on_after(timeout):
                return await self.stream.receive_some(max_bytes)
            raise trio.TooSlowError
        if not self._drained:
            await trio.lowlevel.checkpoint_if_cancelled()
            data = _read(sock, max_bytes)
            if data is not None:
                self._drained = 0 < len(data) < max_bytes
                await self._ran_fast()
                return data
        if timeout == math.inf:  # a scope with no deadline would only cost time
            return await self._wait_and_read(sock, max_bytes)
        with trio.move_on_after(timeout):
            return await self._wait_and_read(sock, max_bytes)
        raise trio.TooSlowError

    async def _wait_and_read(self, sock, max_bytes: int) -> bytes:
        while True:
            await trio.lowlevel.wait_readable(_fileno(sock))
            self._unyielded = 0
            data = _read(sock, max_bytes)
            if data is not None:
                self._drained = 0 < len(data) < max_bytes
                return data

    async def send_all(self, data: bytes | bytearray | memoryview, timeout: float) -> None:
        sock = self._socket
        if sock is None:
            with trio.move_on_after(timeout):
                await self.stream.send_all(data)
                return
            raise trio.TooSlowError
        await trio.lowlevel.checkpoint_if_cancelled()
        sent = _write(sock, data)
        if sent == len(data):
            await self._ran_fast()
            return
        view = memoryview(data)[sent:]
        with trio.move_on_after(timeout):
            while view:
                await trio.lowlevel.wait_writable(sock)
                self._unyielded = 0
                view = view[_write(sock, view) :]
            return
        raise trio.TooSlowError

    async def _ran_fast(self) -> None:
        self._unyielded += 1
        if self._unyielded >= FAST_RUN:
            self._unyielded = 0
            await trio.lowlevel.checkpoint()


def _fileno(sock) -> int:
    fd = sock.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the connection was closed")
    return fd


def _read(sock, max_bytes: int) -> bytes | None:
    """What the socket holds now (b"" at its end), or None if reading would block."""
    try:
        return os.read(_fileno(sock), max_bytes)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise trio.BrokenResourceError(f"receive failed: {exc}") from exc


def _write(sock, data) -> int:
    """Bytes the kernel took now (0 if writing would block)."""
    try:
        return os.write(_fileno(sock), data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"send failed: {exc}") from exc
