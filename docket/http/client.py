"""A keep-alive HTTP/1.1 connection pool for one upstream origin, on trio (wire.py: llhttp).

    pool = UpstreamPool("https://api.openai.com", max_connections=32)
    async with pool.request("POST", "/v1/chat/completions", headers, body) as resp:
        resp.status, resp.headers
        async for chunk in resp.body():
            ...
    await pool.aclose()

The pool is the bulkhead: `max_connections` is the one place the number of
concurrent upstream exchanges is limited. A connection goes back to the pool
only after a complete response on a connection both sides mean to keep; on a
timeout, a cancellation, a protocol error or an early exit from the block it is
closed, which also stops the upstream's work on it.

Failures are typed so the boundary can name them in `model.error`:
ConnectTimeout, ConnectError, ReadTimeout, WriteTimeout, ConnectionReset,
ProtocolError, PoolTimeout (all UpstreamError, each with a `reason`).

Every outbound connection Docket makes is opened by `open_upstream_stream`, and
only there: the egress guard sits in front of it, and a test walks the syntax
tree to keep it that way.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from docket.http import wire
from docket.http.sockio import StreamIO

RECEIVE_SIZE = 65536
HeaderPairs = Iterable[tuple[bytes | str, bytes | str]]


class UpstreamError(Exception):
    """An upstream exchange that failed; `reason` is the name a ledger records."""

    reason = "upstream_error"


class ConnectTimeout(UpstreamError):
    reason = "connect_timeout"


class ConnectError(UpstreamError):
    """Refused, unreachable, unresolvable, or a failed TLS handshake."""

    reason = "connect_error"


class ReadTimeout(UpstreamError):
    """No bytes from the upstream within read_timeout (between any two reads)."""

    reason = "read_timeout"


class WriteTimeout(UpstreamError):
    """The upstream accepted no request bytes within write_timeout."""

    reason = "write_timeout"


class ConnectionReset(UpstreamError):
    """The upstream reset or closed the connection before the response was complete."""

    reason = "connection_reset"


class ProtocolError(UpstreamError):
    """The upstream sent something that is not HTTP/1.1."""

    reason = "protocol_error"


class PoolTimeout(UpstreamError):
    """Every connection stayed busy for longer than the caller would wait."""

    reason = "pool_timeout"


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Origin:
        """`http://host[:port]` or `https://host[:port]`; a path is ignored."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) origin: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port)

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def host_header(self) -> bytes:
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host.encode("idna").decode("ascii")
        return (host if self.port == default else f"{host}:{self.port}").encode("ascii")

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host_header.decode()}"


async def open_upstream_stream(
    host: str,
    port: int,
    *,
    tls: bool,
    connect_timeout: float,
    ssl_context: ssl.SSLContext | None = None,
) -> trio.abc.Stream:
    """Open one outbound connection (TCP, then TLS with SNI when `tls`), or raise
    ConnectTimeout / ConnectError. The only place Docket opens one."""
    where = f"{host}:{port}"
    with trio.move_on_after(connect_timeout):
        try:
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {where}: {exc.strerror or exc}") from None
        if not tls:
            return stream
        context = ssl_context or ssl.create_default_context()
        tls_stream = trio.SSLStream(stream, context, server_hostname=host, https_compatible=True)
        try:
            await tls_stream.do_handshake()
        except trio.BrokenResourceError as exc:
            await trio.aclose_forcefully(stream)
            raise ConnectError(f"TLS handshake with {where} failed: {exc.__cause__}") from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return tls_stream
    raise ConnectTimeout(f"no connection to {where} within {connect_timeout:g}s")


def _raw_socket(stream: trio.abc.Stream):
    inner = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    return inner.socket  # type: ignore[union-attr]  # a SocketStream's; the Stream ABC has none


class _UpstreamConnection:
    """One connection: the stream, and the response being read on it (a
    wire.ResponseReader per exchange; None between exchanges)."""

    __slots__ = ("stream", "io", "reader", "closing", "idle_since")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.io = StreamIO(stream)
        self.reader: wire.ResponseReader | None = None
        self.closing = False  # our request said `connection: close`
        self.idle_since = 0.0

    def looks_alive(self) -> bool:
        """A kept connection the upstream has not closed meanwhile: nothing is
        readable on it (a readable idle socket means EOF, a reset or garbage)."""
        if self.reader is not None or self.closing:
            return False
        try:
            return not _raw_socket(self.stream).is_readable()
        except OSError:
            return False

    async def send(self, data: bytes | None, write_timeout: float) -> None:
        if not data:
            return
        try:
            await self.io.send_all(data, write_timeout)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionReset(
                f"upstream closed the connection while the request was sent ({_cause(exc)})"
            ) from None
        except trio.TooSlowError:
            raise WriteTimeout(f"upstream took no request bytes for {write_timeout:g}s") from None

    async def next_event(self, read_timeout: float):
        """The response's next event (a wire.ResponseHead, body bytes, wire.END),
        reading as needed."""
        while True:
            event = self.buffered_event()
            if event is not wire.NEED_DATA:
                return event
            try:
                data = await self.io.receive(RECEIVE_SIZE, read_timeout)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ConnectionReset(f"upstream connection broke ({_cause(exc)})") from None
            except trio.TooSlowError:
                raise ReadTimeout(f"upstream sent nothing for {read_timeout:g}s") from None
            reader = self.reader
            assert reader is not None  # send_request sets it before any response is read
            reader.receive_data(data)

    def buffered_event(self):
        """The next event from bytes already received (no I/O), or wire.NEED_DATA;
        the upstream's failures raised as UpstreamErrors."""
        reader = self.reader
        try:
            return reader.next_event()
        except wire.WireError as exc:
            if reader.eof:
                raise ConnectionReset(str(exc).replace("the upstream", "upstream")) from None
            raise ProtocolError(str(exc).replace("the upstream", "upstream")) from None


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause else str(exc) or type(exc).__name__


class UpstreamResponse:
    """A response head, and its body streamed on demand (one pass)."""

    __slots__ = ("status", "reason", "headers", "http_version", "complete", "_conn", "_timeout")

    def __init__(self, event: wire.ResponseHead, conn: _UpstreamConnection, read_timeout: float):
        self.status: int = event.status
        self.reason: bytes = event.reason
        self.headers: list[tuple[bytes, bytes]] = event.headers
        self.http_version: bytes = event.http_version
        self.complete = False
        self._conn = conn
        self._timeout = read_timeout

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def body(self) -> _ResponseBody:
        """`async for chunk in resp.body():` each chunk as it arrives."""
        return _ResponseBody(self)

    def body_batches(self) -> _ResponseBatches:
        """`async for chunks in resp.body_batches():` the body as lists of chunks: each
        list is what arrived together (at least one chunk; waiting only for the first),
        so a relay can pass on in one write what one read brought."""
        return _ResponseBatches(self)

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; ProtocolError if it is longer than `limit`."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.body():
            size += len(chunk)
            if limit is not None and size > limit:
                raise ProtocolError(f"upstream body is longer than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)


class _ResponseBody:
    __slots__ = ("_response",)

    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response

    def __aiter__(self) -> _ResponseBody:
        return self

    async def __anext__(self) -> bytes:
        response = self._response
        if response.complete:
            raise StopAsyncIteration
        event = await response._conn.next_event(response._timeout)
        if event is wire.END:
            response.complete = True
            raise StopAsyncIteration
        return event  # after the head, the reader gives only body bytes and END


class _ResponseBatches:
    __slots__ = ("_response", "_failure")

    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response
        # A failure found while taking buffered chunks: raised on the next step, once
        # the chunks before it have been handed over, as one-by-one reading would.
        self._failure: UpstreamError | None = None

    def __aiter__(self) -> _ResponseBatches:
        return self

    async def __anext__(self) -> list[bytes]:
        self._raise_failure()
        response = self._response
        if response.complete:
            raise StopAsyncIteration
        batch = self._take(await response._conn.next_event(response._timeout))
        if batch:
            return batch
        self._raise_failure()
        raise StopAsyncIteration

    def ready(self) -> list[bytes]:
        """The chunks already received, without waiting (possibly none)."""
        response = self._response
        if response.complete or self._failure is not None:
            return []
        try:
            event = response._conn.buffered_event()
        except UpstreamError as exc:
            self._failure = exc
            return []
        return [] if event is wire.NEED_DATA else self._take(event)

    def _take(self, event) -> list[bytes]:
        """`event` and every event already buffered after it, as chunks, up to the end
        of the body; a failure on the way is kept for the next step."""
        response = self._response
        batch: list[bytes] = []
        while True:
            if event is wire.END:
                response.complete = True
                return batch
            batch.append(event)  # after the head, the reader gives only body bytes and END
            try:
                event = response._conn.buffered_event()
            except UpstreamError as exc:
                self._failure = exc
                return batch
            if event is wire.NEED_DATA:
                return batch

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure


@dataclass
class PoolStats:
    opened: int = 0  # connections made
    reused: int = 0  # exchanges on a kept connection
    closed: int = 0  # connections closed (by either side, for any reason)
    in_use: int = 0
    waiting: int = 0  # callers queued for a slot


class UpstreamPool:
    """Keep-alive connections to one origin, at most `max_connections` at once.

    connect_timeout bounds TCP + TLS setup; read_timeout bounds each wait for
    the next bytes of a response; write_timeout each wait to send request bytes;
    idle_timeout how long a kept connection may sit unused (kept short of
    typical server keep-alive timeouts, so we close first).
    """

    def __init__(
        self,
        origin: str | Origin,
        *,
        max_connections: int = 32,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        write_timeout: float = 60.0,
        idle_timeout: float = 15.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.origin = origin if isinstance(origin, Origin) else Origin.parse(origin)
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.idle_timeout = idle_timeout
        self.ssl_context = ssl_context
        self.stats = PoolStats()
        self._slots = trio.Semaphore(max_connections)
        self._idle: deque[_UpstreamConnection] = deque()
        self._closed = False

    def request(
        self,
        method: str,
        target: str | bytes,
        headers: HeaderPairs = (),
        body: bytes | AsyncIterable[bytes] = b"",
        *,
        wait_timeout: float | None = None,
    ) -> _Exchange:
        """One exchange, `async with pool.request(...) as resp:`. `body` is bytes
        (content-length is added) or an async iterable of chunks (sent chunked). A
        host header is added if missing."""
        return _Exchange(self, method, target, headers, body, wait_timeout)

    async def _acquire_slot(self, wait_timeout: float | None) -> None:
        self.stats.waiting += 1
        try:
            if self._slots.value > 0:
                # Free now: no deadline scope, and no schedule point (the exchange
                # that follows has its own) to pay for on every call.
                self._slots.acquire_nowait()
            elif wait_timeout is None:
                await self._slots.acquire()
            else:
                with trio.move_on_after(wait_timeout) as scope:
                    await self._slots.acquire()
                if scope.cancelled_caught:
                    raise PoolTimeout(
                        f"all {self.max_connections} connections to {self.origin} stayed busy "
                        f"for {wait_timeout:g}s"
                    )
        finally:
            self.stats.waiting -= 1
        self.stats.in_use += 1

    async def _checkout(self) -> _UpstreamConnection:
        """The most recently used live idle connection, else a new one."""
        now = trio.current_time()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < self.idle_timeout and conn.looks_alive():
                self.stats.reused += 1
                return conn
            await self._discard(conn)
        stream = await open_upstream_stream(
            self.origin.host,
            self.origin.port,
            tls=self.origin.tls,
            connect_timeout=self.connect_timeout,
            ssl_context=self.ssl_context,
        )
        self.stats.opened += 1
        return _UpstreamConnection(stream)

    async def _send_request(
        self,
        conn: _UpstreamConnection,
        method: str,
        target: str | bytes,
        headers: HeaderPairs,
        body: bytes | AsyncIterable[bytes],
    ) -> None:
        pairs = list(headers)
        names = {(n if isinstance(n, bytes) else n.encode("latin-1")).lower() for n, _ in pairs}
        if b"host" not in names:
            pairs.insert(0, (b"host", self.origin.host_header))
        fixed = isinstance(body, bytes | bytearray | memoryview)
        # The body is chunked when the caller says so, or when it streams with no length.
        chunked = b"transfer-encoding" in names or (not fixed and b"content-length" not in names)
        if b"content-length" not in names and b"transfer-encoding" not in names:
            if chunked:
                pairs.append((b"transfer-encoding", b"chunked"))
            elif isinstance(body, bytes | bytearray | memoryview) and (
                body or method not in ("GET", "HEAD", "DELETE", "OPTIONS")
            ):  # (not chunked here means a fixed body: the isinstance is for the checker)
                pairs.append((b"content-length", str(len(body)).encode()))
        try:
            head, conn.closing = wire.encode_request(method, target, pairs)
        except ValueError as exc:
            raise ValueError(f"cannot send {method} {target!r} as HTTP/1.1: {exc}") from None
        conn.reader = wire.ResponseReader(head_only=method == "HEAD")
        if isinstance(body, bytes | bytearray | memoryview):
            if chunked:
                body = (wire.encode_chunk(body) if body else b"") + wire.LAST_CHUNK
            await conn.send(head + body if body else head, self.write_timeout)
            return
        await conn.send(head, self.write_timeout)
        async for chunk in body:
            if chunk:
                await conn.send(wire.encode_chunk(chunk) if chunked else chunk, self.write_timeout)
        if chunked:
            await conn.send(wire.LAST_CHUNK, self.write_timeout)

    async def _discard(self, conn: _UpstreamConnection) -> None:
        self.stats.closed += 1
        await trio.aclose_forcefully(conn.stream)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def aclose(self) -> None:
        """Close the kept connections; exchanges under way close theirs when done."""
        self._closed = True
        while self._idle:
            await self._discard(self._idle.pop())


class _Exchange:
    """`pool.request(...)`: a slot and a connection for one exchange, given back on
    leaving. A class rather than an @asynccontextmanager: this is on every call's
    path, and the generator machinery cost more than the exchange's own bookkeeping."""

    __slots__ = ("_pool", "_request", "_wait_timeout", "_conn", "_response")

    def __init__(self, pool: UpstreamPool, method, target, headers, body, wait_timeout) -> None:
        self._pool = pool
        self._request = (method, target, headers, body)
        self._wait_timeout = wait_timeout
        self._conn: _UpstreamConnection | None = None
        self._response: UpstreamResponse | None = None

    async def __aenter__(self) -> UpstreamResponse:
        pool = self._pool
        if pool._closed:
            raise RuntimeError("the upstream pool is closed")
        await pool._acquire_slot(self._wait_timeout)
        try:
            conn = self._conn = await pool._checkout()
            await pool._send_request(conn, *self._request)
            # The reader has passed over any informational (1xx) answer already.
            event = await conn.next_event(pool.read_timeout)
            self._response = UpstreamResponse(event, conn, pool.read_timeout)
            return self._response
        except BaseException:
            await self._give_back(completed=False)
            raise

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._give_back(completed=exc_type is None)

    async def _give_back(self, *, completed: bool) -> None:
        """Keep the connection if the block ended normally with the exchange complete on
        a connection both sides keep; else close it. Free the slot either way."""
        pool, conn, response = self._pool, self._conn, self._response
        try:
            if conn is None:
                return
            reusable = (
                completed
                and response is not None
                and response.complete
                and conn.reader is not None
                and conn.reader.reusable
                and not conn.closing
                and not pool._closed
            )
            if reusable:
                conn.reader = None
                conn.idle_since = trio.current_time()
                pool._idle.append(conn)
            else:
                await pool._discard(conn)
        finally:
            pool.stats.in_use -= 1
            pool._slots.release()
