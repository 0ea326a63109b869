"""One accepted connection of docket.http.server: its h11 state machine, the
socket's bytes, and the reader task that watches for the client leaving.

server.py's exchange loop drives a _Connection from request to request; the
Request and Responder a handler holds (server_exchange.py) read and write
through it. ServerConfig, the connection-level limits, is defined here and
re-exported by server.py.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import trio

from docket.http.protocol import h11
from docket.http.server_errors import ClientGone, HeadTimeout, RequestTimeout
from docket.http.sockio import StreamIO

RECEIVE_SIZE = 65536
log = logging.getLogger("docket.http")

# An application's shape for the answers the server makes itself (see ServerConfig):
# (status, code, message, the request's target or None) -> (content-type, body).
ErrorShape = Callable[[int, str, str, bytes | None], tuple[bytes, bytes]]
# A request line in the bytes last read: how a head h11 refused still names its target.
_REQUEST_LINE = re.compile(rb"(?:\A|\n)[!#$%&'*+.^_`|~0-9A-Za-z-]+ ([!-~]+) HTTP/")


@dataclass(frozen=True)
class ServerConfig:
    """Connection-level limits. Times are seconds."""

    max_header_bytes: int = 64 * 1024  # request line + headers (h11's incomplete-event cap)
    max_body_bytes: int = 32 * 1024 * 1024  # read_body's default limit
    keepalive_timeout: float = 30.0  # idle wait for the next request on a kept-alive connection
    request_timeout: float = 30.0  # max wait for the next bytes of a request under way
    send_timeout: float = 60.0  # a client that stops reading for this long is gone
    drain_bytes: int = 64 * 1024  # unread request body we read and drop to keep a connection
    linger_timeout: float = 1.0  # after an error answer: the longest silence from the client
    # After an error answer, the request's unread rest is read and dropped, within these
    # bounds, before the socket closes: closing with bytes unread sends a reset, and a
    # client still sending its body would lose the answer it has not read yet.
    linger_bytes: int = 256 * 1024 * 1024
    linger_max_seconds: float = 10.0
    # The body of the answers the server makes itself (400 for malformed HTTP, 408, 413,
    # 431, 500): None is text/plain with the message; an application whose clients parse
    # only their own error shape (the boundary: the provider's) supplies an ErrorShape.
    error_shape: ErrorShape | None = None
    # Connections open at once (0: no cap). Past it a new connection is closed at once,
    # counted in ServerStats.pressure (one episode, not one line per connection).
    max_connections: int = 0
    # The longest a request head may take in total from its first byte (a client that
    # trickles a header every few seconds never trips request_timeout): 408.
    head_timeout: float = 10.0


class _Reader:
    """The connection's reader, once a handler has asked to hear of the client
    leaving. From then on every read of the connection is its own: it feeds h11,
    wakes the handler waiting for bytes, and meanwhile stays on the socket, so a
    client that goes away mid-call is seen by the one wait the socket needed
    anyway. (A watcher task per call, cancelled when the call ended, cost about
    200 us a call: the nursery, the cancellation, the socket registered anew.)

    It reads ahead of the handler by one read at most: after bytes nobody asked
    for (a pipelined request, body the handler has not asked for yet), it waits
    until the handler asks again.
    """

    __slots__ = ("conn", "asking", "arrived", "paused", "resume", "ended", "gone", "scope", "done")

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.asking = False  # the handler waits for bytes
        self.arrived = trio.Event()  # set when bytes (or the end) came for it
        self.paused = False
        self.resume = trio.Event()
        self.ended = False  # the end of the stream (or a failure) was fed to h11
        self.gone = trio.Event()
        self.scope = trio.CancelScope()
        self.done = trio.Event()

    async def run(self) -> None:
        try:
            with self.scope:
                await self._read()
        finally:
            self.done.set()

    async def _read(self) -> None:
        conn = self.conn
        while not self.ended:
            if self.paused:
                await self.resume.wait()
            try:
                data = await conn.io.receive(RECEIVE_SIZE, math.inf)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""  # a reset (or our own abort) reads as the end of the stream
            conn.received(data)
            asked, self.asking = self.asking, False
            if asked:
                self.arrived.set()
            if not data:
                self.ended = True
                self.gone.set()
                if conn.watch is not None:
                    conn.watch.cancel()
            elif not asked:
                self.paused, self.resume = True, trio.Event()

    async def wait_for_bytes(self, timeout: float) -> None:
        """Until more bytes (or the end) have been fed to h11; RequestTimeout after `timeout`."""
        if self.ended:
            return  # h11 has the end of the stream: it says so itself
        self.asking = True
        self.arrived = arrived = trio.Event()
        self.conn.start_reader()
        with trio.move_on_after(timeout):
            await arrived.wait()
            return
        self.asking = False
        raise RequestTimeout(f"no request bytes for {timeout:g}s")


class _Connection:
    """One accepted connection: its h11 state machine and the socket's bytes."""

    def __init__(
        self, stream: trio.abc.Stream, config: ServerConfig, nursery: trio.Nursery
    ) -> None:
        self.stream = stream
        self.io = StreamIO(stream)
        self.config = config
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=config.max_header_bytes)
        self.peer_closed = False  # EOF or reset seen from the client
        self.last_read: bytes | bytearray = (
            b""  # the latest bytes read: a refused head's target is looked up there
        )
        self.aborted = False
        self.tunnelled = False  # a CONNECT was accepted: the handler owns the raw stream
        self.body_done = trio.Event()
        self.nursery = nursery  # the connection's own, for its reader
        self.reader: _Reader | None = None
        self.watch: trio.CancelScope | None = None  # cancelled when the client goes away

    def start_reader(self) -> _Reader:
        """The reader, started, or woken if it paused after reading ahead: what it
        read (the rest of a request, say) is in h11 now, and it must watch again."""
        reader = self.reader
        if reader is None:
            reader = self.reader = _Reader(self)
            self.nursery.start_soon(reader.run)
        elif reader.paused:
            reader.paused = False
            reader.resume.set()
        return reader

    async def stop_reader(self) -> None:
        """Take the reads back from the reader (before reading the stream directly)."""
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.scope.cancel()
            await reader.done.wait()  # it leaves its wait (or finishes a read) at once

    async def next_event(self, timeout: float, head_timeout: float | None = None):
        """The next h11 event, reading as needed; RequestTimeout after `timeout` idle.
        With `head_timeout` (waiting for a request head): HeadTimeout once that long
        has passed since the head's first byte, however steadily bytes trickle in."""
        deadline = None
        if head_timeout is not None and self.h11.trailing_data[0]:
            deadline = trio.current_time() + head_timeout  # a head already under way
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            wait = timeout
            if deadline is not None:
                wait = min(timeout, deadline - trio.current_time())
                if wait <= 0:
                    raise HeadTimeout(f"request head not complete in {head_timeout:g}s")
            if self.reader is not None:
                try:
                    await self.reader.wait_for_bytes(wait)
                except RequestTimeout:
                    if wait < timeout:
                        raise HeadTimeout(
                            f"request head not complete in {head_timeout:g}s"
                        ) from None
                    raise
            else:
                try:
                    data = await self.io.receive(RECEIVE_SIZE, wait)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""  # a reset (or our own abort) reads as the end of the stream
                except trio.TooSlowError:
                    if wait < timeout:
                        raise HeadTimeout(
                            f"request head not complete in {head_timeout:g}s"
                        ) from None
                    raise RequestTimeout(f"no request bytes for {timeout:g}s") from None
                self.received(data)
            if head_timeout is not None and deadline is None:
                deadline = trio.current_time() + head_timeout  # the head's first bytes came

    def received(self, data: bytes | bytearray) -> None:
        if not data:
            self.peer_closed = True
        else:
            self.last_read = data  # a reference, not a copy: nothing to pay per read
        self.h11.receive_data(data)

    async def write(self, data: bytes | None) -> None:
        if not data:
            return
        if self.aborted:
            raise ClientGone("connection was aborted")
        try:
            await self.io.send_all(data, self.config.send_timeout)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.peer_closed = True
            raise ClientGone(f"client went away ({_cause(exc)})") from None
        except trio.TooSlowError:
            self.peer_closed = True
            raise ClientGone(f"client read nothing for {self.config.send_timeout:g}s") from None

    async def answer_error(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        code: str | None = None,
        target: bytes | None = None,
    ) -> None:
        """A server-made error answer, then close. Written raw: h11's own state may
        be the thing that broke. The client's unread bytes are drained first so
        the kernel does not answer them with a reset that would eat our reply.
        `code` names the fault (http_400 when not given) and `target` the request it
        answers, for the application's error_shape; a head h11 refused has no target,
        so the last bytes read are searched for its request line."""
        ctype, body = self._error_body(status, code or f"http_{status}", message, target)
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype.decode('latin-1')}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode("latin-1")
        try:
            await self.write(head + body)
        except ClientGone:
            return  # nobody left to tell
        await self.close_after_answer()

    def _error_body(
        self, status: int, code: str, message: str, target: bytes | None
    ) -> tuple[bytes, bytes]:
        shape = self.config.error_shape
        if shape is not None:
            if target is None:
                found = _REQUEST_LINE.findall(self.last_read)
                target = found[-1] if found else None
            try:
                return shape(status, code, message, target)
            except Exception as exc:  # noqa: BLE001 - the answer still goes out, in plain text
                log.error("http error_shape failed: %s: %s", type(exc).__name__, exc)
        return b"text/plain; charset=utf-8", (message + "\n").encode()

    async def close_after_answer(self) -> None:
        """The answer is written; the request's body may still be arriving. Half-close
        (the client reads our answer, then end of stream), then linger."""
        try:
            if isinstance(self.stream, trio.abc.HalfCloseableStream):
                await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # nobody left to tell
        await self.stop_reader()
        await self._linger()

    async def _linger(self) -> None:
        """Read and drop what the client still sends, until it closes, falls silent
        for linger_timeout, or passes linger_bytes or linger_max_seconds; then the
        close is a FIN, not a reset that would discard our answer on its side."""
        config = self.config
        drained = 0
        with trio.move_on_after(config.linger_max_seconds):
            while drained < config.linger_bytes:
                with trio.move_on_after(config.linger_timeout):
                    try:
                        chunk = await self.stream.receive_some(RECEIVE_SIZE)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return
                    if not chunk:
                        return
                    drained += len(chunk)
                    continue
                return  # silent for linger_timeout: it has read the answer, or never will

    async def drain_request_body(self) -> bool:
        """Read and drop what the handler left of the request body, if it is
        small, so the connection can be kept; False when it must close."""
        if self.h11.their_state is not h11.SEND_BODY:
            return True
        if self.h11.they_are_waiting_for_100_continue or self.peer_closed:
            return False  # the body will never come: the client waits for a 100 we never sent
        dropped = 0
        with trio.move_on_after(self.config.linger_timeout):
            while dropped <= self.config.drain_bytes:
                event = await self.next_event(self.config.linger_timeout)
                if not isinstance(event, h11.Data):
                    return isinstance(event, h11.EndOfMessage)
                dropped += len(event.data)
        return False


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause else str(exc) or type(exc).__name__
