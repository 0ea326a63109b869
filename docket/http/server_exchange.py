"""One exchange of docket.http.server as its handler sees it: the Request (its
head now, its body streamed on demand) and the Responder (`simple`, or `start` /
`send` ... / `end`; `tunnel` for a CONNECT; the disconnect watch).

Both are thin: every byte goes through the connection (server_connection.py).
How a handler uses them is told in server.py's docstring; server.py re-exports
them.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from docket.http.protocol import h11
from docket.http.server_connection import _Connection
from docket.http.server_errors import BadRequest, BodyTooLarge, ClientGone

HeaderPairs = Iterable[tuple[bytes | str, bytes | str]]


class Request:
    """One request: its head now, its body on demand (streamed from the socket)."""

    __slots__ = ("method", "target", "headers", "http_version", "_conn", "_body_read")

    def __init__(self, conn: _Connection, event: h11.Request) -> None:
        self.method: str = event.method.decode("ascii")
        self.target: bytes = event.target
        self.headers: list[tuple[bytes, bytes]] = list(event.headers)  # names lower-cased by h11
        self.http_version: bytes = event.http_version
        self._conn = conn
        self._body_read = 0

    @property
    def path(self) -> str:
        """The target without its query string, as text."""
        return self.target.partition(b"?")[0].decode("latin-1")

    @property
    def query(self) -> str:
        return self.target.partition(b"?")[2].decode("latin-1")

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (name lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def body_complete(self) -> bool:
        return self._conn.h11.their_state is not h11.SEND_BODY

    def body_chunks(self, limit: int | None = None) -> _BodyChunks:
        """`async for chunk in request.body_chunks():` the body as it arrives."""
        return _BodyChunks(self, self._conn.config.max_body_bytes if limit is None else limit)

    async def read_body(self, limit: int | None = None) -> bytes:
        """The whole body; BodyTooLarge (the server answers 413) past `limit` bytes."""
        parts = [chunk async for chunk in self.body_chunks(limit)]
        return parts[0] if len(parts) == 1 else b"".join(parts)


class _BodyChunks:
    """An async iterator over body chunks (a class, not an async generator, so an
    iteration abandoned half way needs no finaliser)."""

    __slots__ = ("_request", "_limit")

    def __init__(self, request: Request, limit: int) -> None:
        self._request = request
        self._limit = limit
        declared = request.header(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(limit)

    def __aiter__(self) -> _BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        request = self._request
        conn = request._conn
        if conn.h11.their_state is not h11.SEND_BODY:
            raise StopAsyncIteration
        if conn.h11.they_are_waiting_for_100_continue:
            await conn.write(conn.h11.send(h11.InformationalResponse(status_code=100, headers=[])))
        try:
            event = await conn.next_event(conn.config.request_timeout)
        except h11.RemoteProtocolError as exc:
            if conn.peer_closed:
                raise ClientGone("client closed the connection during the request body") from None
            # h11 quotes the bytes it refused ("illegal chunk header: b'...'"): only its
            # words are kept, since a handler may record this message and the bytes may
            # carry anything the client sent.
            raise BadRequest(f"malformed request body: {str(exc).partition(': ')[0]}") from None
        if isinstance(event, h11.Data):
            request._body_read += len(event.data)
            if request._body_read > self._limit:
                raise BodyTooLarge(self._limit)
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            conn.body_done.set()
            raise StopAsyncIteration
        raise ClientGone("client closed the connection during the request body")


class Responder:
    """The answer to one request: `simple(...)`, or `start`, `send`..., `end`."""

    __slots__ = ("_conn", "_method", "status", "started", "ended", "bytes_sent")

    def __init__(self, conn: _Connection, method: str) -> None:
        self._conn = conn
        self._method = method
        self.status: int | None = None
        self.started = False
        self.ended = False
        self.bytes_sent = 0

    @property
    def client_gone(self) -> bool:
        """Seen to have closed or reset the connection (by a read or a failed write)."""
        return self._conn.peer_closed

    def cancel_on_disconnect(self, scope: trio.CancelScope | None) -> None:
        """Cancel `scope` when the client goes away (its end of the stream or a reset
        is read), until called again with None: how a handler that waits on
        something else (the boundary, on an upstream) stops that work when nobody
        is left to answer. At once if the client has already gone. Bytes that
        arrive instead are a pipelined next request, kept for later; after them
        the client's leaving is seen when the next request is read."""
        conn = self._conn
        conn.watch = scope
        if scope is None:
            return
        if conn.peer_closed:
            scope.cancel()
            return
        conn.start_reader()

    async def wait_disconnected(self) -> None:
        """Return once the client has gone; the waiting form of cancel_on_disconnect,
        to run in a nursery beside the work it should interrupt. It watches only
        after the request body has been read; bytes arriving instead are a
        pipelined next request, kept for later, and end the watch (it then waits
        until cancelled)."""
        conn = self._conn
        await conn.body_done.wait()
        if conn.peer_closed:
            return
        await conn.start_reader().gone.wait()

    async def start(
        self, status: int, headers: HeaderPairs = (), reason: bytes = b"", body: bytes = b""
    ) -> None:
        """Send the status line and headers now, with `body`, the first of the body
        when there is some already, in the same write. Without content-length the
        body is chunked (or, to an HTTP/1.0 client, delimited by closing)."""
        if self.started:
            raise RuntimeError("response already started")
        conn = self._conn
        head = conn.h11.send(h11.Response(status_code=status, headers=list(headers), reason=reason))
        self.started = True
        self.status = status
        if body:
            head += conn.h11.send(h11.Data(data=body))
            self.bytes_sent += len(body)
        await conn.write(head)

    async def send(self, data: bytes) -> None:
        """One chunk of body, written at once; ClientGone if the client went away."""
        if not self.started:
            raise RuntimeError("send() before start()")
        if not data:
            return
        conn = self._conn
        if conn.peer_closed:
            raise ClientGone("client closed the connection")
        self.bytes_sent += len(data)
        await conn.write(conn.h11.send(h11.Data(data=data)))

    async def end(self) -> None:
        """Finish the body (the terminating chunk, when chunked)."""
        if not self.started:
            raise RuntimeError("end() before start()")
        if self.ended:
            return
        self.ended = True
        await self._conn.write(self._conn.h11.send(h11.EndOfMessage()))

    async def simple(self, status: int, headers: HeaderPairs = (), body: bytes = b"") -> None:
        """A whole response in one write; content-length is added when missing."""
        if self.started:
            raise RuntimeError("response already started")
        pairs = list(headers)
        bodiless = status in (204, 304) or status < 200
        if not bodiless and not _has_content_length(pairs):
            pairs.append((b"content-length", str(len(body)).encode()))
        conn = self._conn
        data = conn.h11.send(h11.Response(status_code=status, headers=pairs))
        self.started = True
        self.status = status
        if body and self._method != "HEAD":
            data += conn.h11.send(h11.Data(data=body))
            self.bytes_sent = len(body)
        data += conn.h11.send(h11.EndOfMessage())
        self.ended = True
        await conn.write(data)

    async def tunnel(
        self,
        status: int = 200,
        headers: HeaderPairs = (),
        reason: bytes = b"Connection Established",
    ) -> tuple[trio.abc.Stream, bytes]:
        """Accept a CONNECT: send the 2xx head, then hand over the raw connection.

        Returns the client's stream and the bytes it already sent past the
        request head (h11 buffered them; they belong to the tunnel). From here
        the handler owns the stream's bytes both ways and HTTP is over on this
        connection: the server closes it when the handler returns. Do not call
        `wait_disconnected` after this (it would read tunnel bytes).
        """
        if self._method != "CONNECT":
            raise RuntimeError(f"tunnel() answers a CONNECT, not a {self._method}")
        if not 200 <= status < 300:
            raise ValueError(f"a tunnel is accepted with a 2xx status, not {status}")
        conn = self._conn
        if conn.h11.their_state is not h11.MIGHT_SWITCH_PROTOCOL:
            raise RuntimeError("the CONNECT request is not complete (its body is unread)")
        await conn.stop_reader()  # what it read is in h11's buffer: the leftover below
        await self.start(status, headers, reason)
        if conn.h11.our_state is not h11.SWITCHED_PROTOCOL:  # h11 decides; never guess
            raise RuntimeError(f"h11 did not switch protocols (state {conn.h11.our_state})")
        self.ended = True  # the HTTP response is complete; what follows is not HTTP
        conn.tunnelled = True
        leftover, _ = conn.h11.trailing_data
        return conn.stream, bytes(leftover)

    async def abort(self) -> None:
        """Close the connection now, mid-response if need be: the client sees a
        truncated body (how a stub cuts a stream short)."""
        self._conn.aborted = True
        await trio.aclose_forcefully(self._conn.stream)


def _has_content_length(pairs: list) -> bool:
    # One inlined loop rather than any() over a helper: a relayed answer's headers pass
    # here on every call.
    for name, _ in pairs:
        if (name if type(name) is bytes else name.encode("latin-1")).lower() == b"content-length":
            return True
    return False
