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
400 (malformed HTTP, a Host header with an invalid value, a malformed body raised
as BadRequest from read_body and not caught), 408 (a request that stalls), 413
(a body over the limit, raised as BodyTooLarge), 431 (headers too big), 500 (the
handler raised, or returned without answering; one line is logged). Their body
is text/plain, unless ServerConfig.error_shape gives the application's own shape
(the boundary answers in the provider's): it is handed the status, a code naming
the fault (http_400, bad_host, bad_framing, request_timeout, body_too_large,
headers_too_large, internal_error) and the message, and the request's target
when one was read.
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

The parts: server_errors.py (ClientGone, RequestError and its kinds),
server_exchange.py (Request and Responder, what a handler holds),
server_connection.py (ServerConfig, a connection's h11 state and its reader).
This module keeps serve() and the exchange loop; import the others' names from
them (or from the `docket.http` package).
"""

from __future__ import annotations

import errno
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from docket.http.host import plain_host, valid_host
from docket.http.protocol import h11
from docket.http.server_connection import ServerConfig, _Connection
from docket.http.server_errors import (
    ClientGone,
    HeadTimeout,
    RequestError,
    RequestTimeout,
)
from docket.http.server_exchange import Request, Responder
from docket.http.server_pressure import (
    ACCEPT_FAILED,
    HEAD_TIMEOUT,
    IDLE_CLOSED,
    OVER_CAP,
    Pressure,
)

__all__ = [
    "Handler",
    "Listening",
    "ServerStats",
    "serve",
]

log = logging.getLogger("docket.http")


@dataclass
class ServerStats:
    connections_accepted: int = 0
    connections_open: int = 0
    requests: int = 0
    handler_errors: int = 0
    # Set while accept() fails for want of descriptors (the errno's name and text):
    # the application's readiness says so; cleared by the next accepted connection.
    accept_failing: str | None = None
    pressure: Pressure = field(default_factory=Pressure)
    # Connections waiting for a request head (none of it yet, or part), oldest first,
    # each with the cancel scope that closes it.
    idle: dict[object, trio.CancelScope] = field(default_factory=dict)
    pressure_noted: trio.Event = field(default_factory=trio.Event)  # set at each new episode

    def note(self, kind: str, detail: str = "") -> None:
        if self.pressure.note(kind, trio.current_time(), detail):
            self.pressure_noted.set()


@dataclass
class Listening:
    """What `nursery.start(serve, ...)` returns: where the server listens, and its counters."""

    host: str
    port: int
    tls: bool = False
    stats: ServerStats = field(default_factory=ServerStats)

    @property
    def url(self) -> str:
        # An IPv6 address ([boundary] host = "::1") is bracketed in a URL (RFC 3986 3.2.2).
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"


Handler = Callable[["Request", "Responder"], Awaitable[None]]


_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


async def _serve_connection(
    stream: trio.abc.Stream, handler: Handler, config: ServerConfig, stats: ServerStats
) -> None:
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
            idle = trio.CancelScope()
            with idle:
                # Waiting for a request head (none of it yet, or part): the connection
                # may be closed to admit a new one at the cap (_accept_loop). A real
                # client sends its head at once; one that holds a connection without a
                # whole head (idle, or trickling it) is what gives way.
                stats.idle[conn] = idle
                try:
                    event = await conn.next_event(config.keepalive_timeout, config.head_timeout)
                finally:
                    stats.idle.pop(conn, None)
            if idle.cancelled_caught:
                return  # closed to make room (counted where it was chosen)
            while not isinstance(event, h11.Request | h11.ConnectionClosed):
                event = await conn.next_event(config.request_timeout, config.head_timeout)
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            code = "headers_too_large" if status == 431 else f"http_{status}"
            await conn.answer_error(
                status, _REASONS.get(status, "Bad Request"), str(exc), code=code
            )
            return
        except RequestTimeout as exc:
            if isinstance(exc, HeadTimeout):
                stats.note(HEAD_TIMEOUT)
            elif conn.h11.their_state is h11.IDLE and not conn.h11.trailing_data[0]:
                return  # an idle keep-alive connection timed out: just close
            await conn.answer_error(
                408, _REASONS[408], "request timed out", code=RequestTimeout.code
            )
            return
        if isinstance(event, h11.ConnectionClosed):
            return
        refused = _refused_head(event, config.max_header_bytes)
        if refused is not None:
            status, code, message = refused
            await conn.answer_error(
                status, _REASONS[status], message, code=code, target=event.target
            )
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
            await conn.answer_error(
                500,
                _REASONS[500],
                "the handler gave no response",
                code="internal_error",
                target=request.target,
            )
        return False
    if conn.h11.their_state is h11.ERROR:
        # The body broke HTTP's framing and the handler answered (a 400): what the client
        # still sends is read and dropped before the close, so its answer is not reset away.
        if not conn.peer_closed:
            await conn.close_after_answer()
        return False
    try:
        if await conn.drain_request_body():
            return True
    except (h11.RemoteProtocolError, RequestTimeout):
        return False
    if (
        conn.h11.their_state is h11.SEND_BODY
        and not conn.h11.they_are_waiting_for_100_continue
        and not conn.peer_closed
    ):
        # Answered (a 413, a refusal) with the body still coming: closing now would
        # reset the connection, and the client, still sending, would lose the answer.
        await conn.close_after_answer()
    return False


def _refused_head(event: h11.Request, max_header_bytes: int) -> tuple[int, str, str] | None:
    """(status, code, message) for a request head the server refuses itself, else None.
    One pass over the headers: their size, and the Host value's validity."""
    size = 0
    for name, value in event.headers:
        size += len(name) + len(value) + 4
        if name == b"host" and plain_host(value) is None and not valid_host(value):
            # RFC 9112 3.2: a Host field with an invalid value is answered 400.
            return 400, "bad_host", f"invalid Host header {bytes(value)[:100]!r}"
    # h11 caps only a head still arriving; one read can bring a whole big one.
    if size > max_header_bytes:
        return 431, "headers_too_large", "request headers are too large"
    return None


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
        await conn.answer_error(
            exc.status, exc.reason, str(exc), code=exc.code, target=request.target
        )
        return False
    stats.handler_errors += 1
    log.error(
        "http %s %s: handler failed: %s: %s", request.method, request.path, type(exc).__name__, exc
    )
    if not respond.started:
        await conn.answer_error(
            500,
            _REASONS[500],
            "internal error in the handler",
            code="internal_error",
            target=request.target,
        )
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

    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, handler, config, listening.stats, nursery)
        task_status.started(listening)


# accept() errors that mean "no room for another descriptor now", not a broken listener.
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_BACKOFF = (0.02, 0.5)  # first and longest wait before accept() is tried again


async def _accept_loop(
    listener: trio.abc.Listener,
    handler: Handler,
    config: ServerConfig,
    stats: ServerStats,
    nursery: trio.Nursery,
) -> None:
    """Accept until cancelled (trio.serve_listeners logged a traceback per failed
    accept). Out of descriptors, accept() fails at once: that is counted as pressure,
    said on `stats.accept_failing` while it lasts, and retried: at once after closing
    the oldest connection without a whole request head (its descriptor is the one
    accept() lacked), else after a backoff that doubles up to half a second (a
    connection closing frees one). Past `config.max_connections` the oldest connection
    without a whole request head (idle, or trickling one) is closed to make room; with
    none, the new one is closed at once. Each is counted (stats.pressure)."""
    backoff = ACCEPT_BACKOFF[0]
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in CAPACITY_ERRNOS:
                raise
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            stats.accept_failing = f"{name}: {exc.strerror}"
            stats.note(ACCEPT_FAILED, name)
            if stats.idle:
                # A connection without a whole head gives its descriptor to the one
                # waiting: idle connections cannot starve a real call of descriptors.
                stats.idle.pop(next(iter(stats.idle))).cancel()
                stats.note(IDLE_CLOSED, name)
                await trio.sleep(0)  # let it close before accept() is tried again
                continue
            await trio.sleep(backoff)
            backoff = min(backoff * 2, ACCEPT_BACKOFF[1])
            continue
        stats.accept_failing = None
        backoff = ACCEPT_BACKOFF[0]
        if config.max_connections and stats.connections_open >= config.max_connections:
            if not stats.idle:  # every connection is in a request: the new one waits not
                stats.note(OVER_CAP)
                await trio.aclose_forcefully(stream)
                continue
            # The oldest connection without a whole request head makes room: a client
            # holding idle or trickling connections cannot lock a real call out.
            oldest = next(iter(stats.idle))
            stats.idle.pop(oldest).cancel()
            stats.note(IDLE_CLOSED)
        stats.connections_accepted += 1
        stats.connections_open += 1  # here, not in the task: the cap counts it at once
        nursery.start_soon(_serve_connection, stream, handler, config, stats)
