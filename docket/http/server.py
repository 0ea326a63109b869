"""An HTTP/1.1 server on trio and h11: keep-alive, bodies streamed both ways.

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve, handler)   # server.port, server.url
        ...
        nursery.cancel_scope.cancel()                   # stops every connection

A handler is `async def handler(request: Request, respond: Responder)`. It reads
the body with `request.read_body(limit)` or `request.body_chunks()`, and answers
with `respond.simple(...)` or `start` / `send` ... / `end`. Each `send` is one
write to the socket (TCP_NODELAY is on), so a server-sent-event stream reaches
the client chunk by chunk, as the handler produces it.

What the server answers by itself, always closing the connection afterwards:
400 (malformed HTTP), 408 (a request that stalls), 413 (a body over the limit,
raised as BodyTooLarge from read_body and not caught), 431 (headers too big),
500 (the handler raised, or returned without answering; one line is logged).
A client that goes away surfaces as ClientGone from `send` and from body
reads. A handler that waits on something else first (the boundary, on an
upstream) hands `respond.cancel_on_disconnect(scope)` the cancel scope of that
wait (or races it against `respond.wait_disconnected()`), so it can stop the
work and record the abort. From the first such request on, the connection's
reads are done by a reader task of its own, which is also what watches the
client; handlers that do not ask pay nothing for the watch.

A CONNECT is answered like any request (a refusal with `simple`), or accepted
with `stream, leftover = await respond.tunnel()`: the 2xx head goes out, h11
steps aside, and the handler moves the raw bytes itself (`leftover` is what the
client sent past the request head) until it returns and the server closes.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import trio

from docket.http.protocol import h11
from docket.http.sockio import StreamIO

log = logging.getLogger("docket.http")

RECEIVE_SIZE = 65536
HeaderPairs = Iterable[tuple[bytes | str, bytes | str]]


class ClientGone(Exception):
    """The client closed or reset the connection, or stopped reading, mid-exchange."""


class RequestError(Exception):
    """A request the server itself refuses; raised from body reads. Uncaught, the
    server answers `status` with the message and closes the connection."""

    status = 400
    reason = "Bad Request"


class BadRequest(RequestError):
    """The request's framing is malformed (a bad chunk, a body cut short)."""


class RequestTimeout(RequestError):
    """No bytes of a request under way arrived within the request timeout."""

    status = 408
    reason = "Request Timeout"


class BodyTooLarge(RequestError):
    """The request body is larger than the handler's limit."""

    status = 413
    reason = "Content Too Large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class ServerConfig:
    """Connection-level limits. Times are seconds."""

    max_header_bytes: int = 64 * 1024  # request line + headers (h11's incomplete-event cap)
    max_body_bytes: int = 32 * 1024 * 1024  # read_body's default limit
    keepalive_timeout: float = 30.0  # idle wait for the next request on a kept-alive connection
    request_timeout: float = 30.0  # max wait for the next bytes of a request under way
    send_timeout: float = 60.0  # a client that stops reading for this long is gone
    drain_bytes: int = 64 * 1024  # unread request body we read and drop to keep a connection
    linger_timeout: float = 1.0  # after an error answer: wait for the client to read it


@dataclass
class ServerStats:
    connections_accepted: int = 0
    connections_open: int = 0
    requests: int = 0
    handler_errors: int = 0


@dataclass
class Listening:
    """What `nursery.start(serve, ...)` returns: where the server listens, and its counters."""

    host: str
    port: int
    tls: bool = False
    stats: ServerStats = field(default_factory=ServerStats)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


Handler = Callable[["Request", "Responder"], Awaitable[None]]


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
            raise BadRequest(f"malformed request body: {exc}") from None
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


def _lower(name: bytes | str) -> bytes:
    return (name.encode("latin-1") if isinstance(name, str) else name).lower()


def _has_content_length(pairs: list) -> bool:
    # Inlined rather than any(_lower(...)): a relayed answer's headers pass here on every call.
    for name, _ in pairs:
        if (name if type(name) is bytes else name.encode("latin-1")).lower() == b"content-length":
            return True
    return False


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

    async def next_event(self, timeout: float):
        """The next h11 event, reading as needed; RequestTimeout after `timeout` idle."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self.reader is not None:
                await self.reader.wait_for_bytes(timeout)
                continue
            try:
                data = await self.io.receive(RECEIVE_SIZE, timeout)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""  # a reset (or our own abort) reads as the end of the stream
            except trio.TooSlowError:
                raise RequestTimeout(f"no request bytes for {timeout:g}s") from None
            self.received(data)

    def received(self, data: bytes) -> None:
        if not data:
            self.peer_closed = True
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

    async def answer_error(self, status: int, reason: str, message: str) -> None:
        """A server-made error answer, then close. Written raw: h11's own state may
        be the thing that broke. The client's unread bytes are drained first so
        the kernel does not answer them with a reset that would eat our reply."""
        body = (message + "\n").encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode()
        try:
            await self.write(head + body)
            if isinstance(self.stream, trio.abc.HalfCloseableStream):
                await self.stream.send_eof()
        except (ClientGone, trio.BrokenResourceError, trio.ClosedResourceError):
            return  # nobody left to tell
        await self.stop_reader()
        with trio.move_on_after(self.config.linger_timeout):
            drained = 0
            while drained < 1024 * 1024:
                try:
                    chunk = await self.stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not chunk:
                    return
                drained += len(chunk)

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


_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause else str(exc) or type(exc).__name__


async def _serve_connection(
    stream: trio.abc.Stream, handler: Handler, config: ServerConfig, stats: ServerStats
) -> None:
    stats.connections_accepted += 1
    stats.connections_open += 1
    try:
        async with trio.open_nursery() as nursery:
            conn = _Connection(stream, config, nursery)
            try:
                await _exchange_loop(conn, handler, stats)
            finally:
                nursery.cancel_scope.cancel()  # the reader, if it was started
    except Exception as exc:  # noqa: BLE001 - a bug here must not stop the server: log it
        log.error("http connection failed: %s: %s", type(exc).__name__, exc)
    finally:
        stats.connections_open -= 1
        await trio.aclose_forcefully(stream)


async def _exchange_loop(conn: _Connection, handler: Handler, stats: ServerStats) -> None:
    config = conn.config
    while True:
        try:
            event = await conn.next_event(config.keepalive_timeout)
            while not isinstance(event, h11.Request | h11.ConnectionClosed):
                event = await conn.next_event(config.request_timeout)
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            await conn.answer_error(status, _REASONS.get(status, "Bad Request"), str(exc))
            return
        except RequestTimeout:
            if conn.h11.their_state is h11.IDLE and not conn.h11.trailing_data[0]:
                return  # an idle keep-alive connection timed out: just close
            await conn.answer_error(408, _REASONS[408], "request timed out")
            return
        if isinstance(event, h11.ConnectionClosed):
            return
        # h11 caps only a head still arriving; one read can bring a whole big one.
        if (
            sum(len(name) + len(value) + 4 for name, value in event.headers)
            > config.max_header_bytes
        ):
            await conn.answer_error(431, _REASONS[431], "request headers are too large")
            return
        stats.requests += 1
        if not await _run_handler(conn, handler, event, stats):
            return
        if conn.h11.our_state is not h11.DONE or conn.h11.their_state is not h11.DONE:
            return  # connection: close, HTTP/1.0, or an unread body
        conn.h11.start_next_cycle()
        conn.body_done = trio.Event()


async def _run_handler(
    conn: _Connection, handler: Handler, event: h11.Request, stats: ServerStats
) -> bool:
    """Run the handler for one request; True if the connection may carry another."""
    request = Request(conn, event)
    respond = Responder(conn, request.method)
    # A body-less request: h11 still owes us its EndOfMessage. Taking it now needs
    # no I/O, and lets wait_disconnected() start watching at once.
    if _declares_no_body(request) and isinstance(conn.h11.next_event(), h11.EndOfMessage):
        conn.body_done.set()
    try:
        await handler(request, respond)
    except Exception as exc:  # noqa: BLE001 - each kind is answered or logged there
        return await _handler_failed(conn, request, respond, exc, stats)
    if conn.aborted or conn.peer_closed or conn.tunnelled:
        return False  # cut on purpose, nobody left to answer, or no longer HTTP
    if not respond.ended:
        stats.handler_errors += 1
        log.error(
            "http %s %s: handler returned without %s the response",
            request.method,
            request.path,
            "ending" if respond.started else "starting",
        )
        if not respond.started:
            await conn.answer_error(500, _REASONS[500], "the handler gave no response")
        return False
    try:
        return await conn.drain_request_body()
    except (h11.RemoteProtocolError, RequestTimeout):
        return False


def _declares_no_body(request: Request) -> bool:
    length = request.header(b"content-length")
    if length is not None:
        return length == b"0"
    return request.header(b"transfer-encoding") is None


def _only(exc: BaseException, kind: type[BaseException]) -> bool:
    """True if exc is a `kind`, or a group (from the handler's nurseries) of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(kind)[1] is None
    return isinstance(exc, kind)


async def _handler_failed(
    conn: _Connection, request: Request, respond: Responder, exc: Exception, stats: ServerStats
) -> bool:
    if _only(exc, ClientGone) or conn.aborted:
        return False  # the handler saw the client leave (or cut the response on purpose)
    if isinstance(exc, RequestError) and not respond.started:
        await conn.answer_error(exc.status, exc.reason, str(exc))
        return False
    stats.handler_errors += 1
    log.error(
        "http %s %s: handler failed: %s: %s", request.method, request.path, type(exc).__name__, exc
    )
    if not respond.started:
        await conn.answer_error(500, _REASONS[500], "internal error in the handler")
    return False


async def serve(
    handler: Handler,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    config: ServerConfig | None = None,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled. `await nursery.start(serve, handler)` returns a
    Listening (host, port, url, stats) once the socket is bound; port 0 picks a
    free one. With an ssl_context it serves HTTPS. Every connection's task lives
    in this function's nursery."""
    config = config or ServerConfig()
    tcp_listeners = await trio.open_tcp_listeners(port, host=host)
    bound = tcp_listeners[0].socket.getsockname()
    listening = Listening(host=bound[0], port=bound[1], tls=ssl_context is not None)
    listeners: list[trio.abc.Listener] = list(tcp_listeners)
    if ssl_context is not None:
        listeners = [
            trio.SSLListener(listener, ssl_context, https_compatible=True)
            for listener in tcp_listeners
        ]

    async def on_connection(stream: trio.abc.Stream) -> None:
        await _serve_connection(stream, handler, config, listening.stats)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, on_connection, listeners)
        task_status.started(listening)
