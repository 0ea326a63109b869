"""The TCP side: one Proxy per listen address, one Connection per accepted client.

A Connection owns two links, upstream (client -> server) and downstream
(server -> client). Each link is a reader task, which stamps chunks with their
arrival time and queues them, and a writer task, which runs each chunk through
the toxics active on that link and writes what comes out. Keeping the reader
apart from the writer is what lets a latency toxic delay bytes without
throttling the stream.

Toxicity is rolled once per connection and direction when a toxic meets a link
(at connect, or when the toxic is added): `roll(toxic_name, ordinal, stream)`
below the toxic's toxicity makes it active on that link.
"""

from __future__ import annotations

import logging
import random
import socket
import struct
from collections.abc import Callable

import trio

from chaos.toxiproxy.toxics import Chunk
from chaos.toxiproxy.toxics.spec import ToxicSpec

log = logging.getLogger("chaos.toxiproxy")

Roll = Callable[[str, int, str], float]
RECEIVE_SIZE = 65536
# Read-ahead per link, in bytes: what a latency toxic can hold in flight. A stream
# through latency L runs at up to READ_AHEAD_BYTES / L (32 MB / 50 ms = 640 MB/s).
READ_AHEAD_BYTES = 32 * 1024 * 1024
CONNECTION_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def default_roll(toxic: str, ordinal: int, stream: str) -> float:
    return random.random()


def split_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port); ValueError names what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bad address {address!r}: expected host:port")
    return host.strip("[]"), int(port)


class _Activation:
    """One toxic active on one link: its per-link state and its watch task."""

    __slots__ = ("spec", "state", "watch_scope")

    def __init__(self, spec: ToxicSpec) -> None:
        self.spec = spec
        self.state: dict = {}
        self.watch_scope: trio.CancelScope | None = None


class Link:
    """One direction of one connection."""

    def __init__(
        self,
        connection: Connection,
        stream: str,
        source: trio.SocketStream,
        sink: trio.SocketStream,
    ) -> None:
        self.connection = connection
        self.stream = stream
        self.source = source
        self.sink = sink
        self.active: dict[str, _Activation] = {}
        self._buffered = 0  # bytes read and not yet taken by the writer
        self._drained = trio.Event()

    def close(self, reason: str) -> None:
        self.connection.close(reason)

    def reset(self, reason: str) -> None:
        self.connection.reset(reason)

    async def run(self) -> None:
        # Unbounded in chunks, bounded in bytes by the reader (small reads stay cheap).
        send_channel, receive_channel = trio.open_memory_channel[Chunk](float("inf"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, send_channel)
            nursery.start_soon(self._write, receive_channel)

    async def _read(self, queue: trio.MemorySendChannel[Chunk]) -> None:
        async with queue:
            try:
                while True:
                    while self._buffered >= READ_AHEAD_BYTES:
                        self._drained = trio.Event()
                        await self._drained.wait()
                    data = await self.source.receive_some(RECEIVE_SIZE)
                    if not data:
                        break
                    self._buffered += len(data)
                    queue.send_nowait(Chunk(data, trio.current_time()))
            except CONNECTION_ERRORS as exc:
                self.connection.close(f"{self.stream} read failed: {exc!r}")

    async def _write(self, queue: trio.MemoryReceiveChannel[Chunk]) -> None:
        async with queue:
            try:
                async for chunk in queue:
                    self._buffered -= len(chunk.data)
                    self._drained.set()
                    await self._through(list(self.active.values()), 0, chunk)
                for activation in list(self.active.values()):
                    await activation.spec.behaviour.at_eof(self, activation.state)
                await self.sink.send_eof()
            except CONNECTION_ERRORS as exc:
                self.connection.close(f"{self.stream} write failed: {exc!r}")

    async def _through(self, chain: list[_Activation], index: int, chunk: Chunk) -> None:
        if index == len(chain):
            if chunk.data:
                await self.sink.send_all(chunk.data)
            return
        activation = chain[index]

        async def send(out: Chunk) -> None:
            await self._through(chain, index + 1, out)

        await activation.spec.behaviour.pipe(chunk, send, self, activation.state)


class Connection:
    def __init__(self, proxy: Proxy, ordinal: int, client: trio.SocketStream) -> None:
        self.proxy = proxy
        self.ordinal = ordinal
        self.client = client
        self.upstream: trio.SocketStream | None = None
        self.links: dict[str, Link] = {}
        self.close_reason: str | None = None
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._reset = False

    def close(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self._scope.cancel()

    def reset(self, reason: str) -> None:
        self._reset = True
        self.close(reason)

    async def run(self) -> None:
        host, port = split_address(self.proxy.upstream)
        try:
            with self._scope:
                try:
                    self.upstream = await trio.open_tcp_stream(host, port)
                except OSError as exc:
                    self.close_reason = f"upstream {self.proxy.upstream} refused: {exc!r}"
                    return
                self.links = {
                    "upstream": Link(self, "upstream", self.client, self.upstream),
                    "downstream": Link(self, "downstream", self.upstream, self.client),
                }
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    for spec in self.proxy.toxics.values():
                        self.toxic_added(spec)
                    links_done = trio.Event()
                    running = [len(self.links)]
                    for link in self.links.values():
                        nursery.start_soon(self._run_link, link, running, links_done)
                    # The body outlives the links and clears `_nursery` before it ends.
                    # Trio closes a nursery when its last task ends, before this task
                    # runs again: a toxic added through the API in that gap found
                    # `_nursery` set and closed ("Nursery is closed to new arrivals",
                    # a 500 to the client). Once the links are done no byte flows, so a
                    # toxic added later has nothing to act on.
                    try:
                        await links_done.wait()
                    finally:
                        self._nursery = None
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self._close_streams()
            log.debug(
                "proxy %s connection %d closed: %s",
                self.proxy.name,
                self.ordinal,
                self.close_reason or "both sides finished",
            )

    async def _run_link(self, link: Link, running: list[int], links_done: trio.Event) -> None:
        try:
            await link.run()
        finally:
            running[0] -= 1
            if running[0] == 0:
                links_done.set()

    async def _close_streams(self) -> None:
        for stream in (self.client, self.upstream):
            if stream is None:
                continue
            if self._reset:
                # SO_LINGER with a zero timeout turns close() into a RST.
                stream.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            await stream.aclose()

    def toxic_added(self, spec: ToxicSpec) -> None:
        link = self.links.get(spec.stream)
        if link is None or self._nursery is None:
            return
        if self.proxy.roll(spec.name, self.ordinal, spec.stream) >= spec.toxicity:
            return
        activation = _Activation(spec)
        link.active[spec.name] = activation
        self._start_watch(link, activation)

    def toxic_updated(self, spec: ToxicSpec) -> None:
        link = self.links.get(spec.stream)
        activation = link.active.get(spec.name) if link else None
        if link is None or activation is None:
            return
        if activation.watch_scope is not None:
            activation.watch_scope.cancel()
        activation.spec = spec
        self._start_watch(link, activation)

    def toxic_removed(self, spec: ToxicSpec) -> None:
        link = self.links.get(spec.stream)
        activation = link.active.pop(spec.name, None) if link else None
        if activation is None:
            return
        if activation.watch_scope is not None:
            activation.watch_scope.cancel()
        if spec.behaviour.closes_on_removal:
            self.close(f"{spec.type} toxic {spec.name!r} removed")

    def _start_watch(self, link: Link, activation: _Activation) -> None:
        if self._nursery is None:
            return
        scope = trio.CancelScope()
        activation.watch_scope = scope

        async def watch() -> None:
            with scope:
                await activation.spec.behaviour.watch(link)

        self._nursery.start_soon(watch)


class Proxy:
    """A named listener forwarding to `upstream`, with its toxics in order."""

    def __init__(self, name: str, listen: str, upstream: str, roll: Roll) -> None:
        split_address(listen)
        split_address(upstream)
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.roll = roll
        self.toxics: dict[str, ToxicSpec] = {}
        self.connections: set[Connection] = set()
        self.accepted = 0
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self._stopped.set()

    @property
    def enabled(self) -> bool:
        return self._scope is not None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [spec.to_json() for spec in self.toxics.values()],
        }

    async def start(self, nursery: trio.Nursery) -> None:
        """Bind and serve in `nursery`; OSError if the address cannot be bound."""
        if self.enabled:
            return
        await nursery.start(self._serve)

    async def stop(self) -> None:
        """Stop listening and drop every connection (Toxiproxy's `enabled: false`)."""
        if self._scope is not None:
            self._scope.cancel()
        await self._stopped.wait()

    async def _serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = split_address(self.listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()
        self.listen = f"{bound[0]}:{bound[1]}"  # port 0 becomes the port bound
        self._stopped = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as nursery:
                    for listener in listeners:
                        nursery.start_soon(self._accept, listener, nursery)
                    task_status.started()
        finally:
            self._scope = None
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()
            self._stopped.set()

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            client = await listener.accept()
            connection = Connection(self, self.accepted, client)
            self.accepted += 1
            nursery.start_soon(self._run_connection, connection)

    async def _run_connection(self, connection: Connection) -> None:
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)

    def add_toxic(self, spec: ToxicSpec) -> None:
        self.toxics[spec.name] = spec
        for connection in list(self.connections):
            connection.toxic_added(spec)

    def update_toxic(self, spec: ToxicSpec) -> None:
        self.toxics[spec.name] = spec
        for connection in list(self.connections):
            connection.toxic_updated(spec)

    def remove_toxic(self, name: str) -> None:
        spec = self.toxics.pop(name)
        for connection in list(self.connections):
            connection.toxic_removed(spec)
