"""docket.http.client against real servers on 127.0.0.1: docket's own server for
well-behaved upstreams, raw trio sockets for misbehaving ones. Bounded in time."""

from __future__ import annotations

import socket
import ssl
import struct
from functools import partial

import pytest
import trio
from helpers import read_head, start_raw

from docket.http.client import (
    ConnectError,
    ConnectionReset,
    ConnectTimeout,
    Origin,
    PoolTimeout,
    ProtocolError,
    ReadTimeout,
    UpstreamPool,
)
from docket.http.server import serve

DEADLINE = 10


async def echo(request, respond):
    body = await request.read_body()
    await respond.simple(200, [("content-type", "text/plain")], request.target + b" " + body)


def test_origin_parsing():
    assert Origin.parse("https://api.openai.com") == Origin("https", "api.openai.com", 443)
    assert Origin.parse("http://127.0.0.1:8080/v1").port == 8080
    assert Origin.parse("http://127.0.0.1:8080").host_header == b"127.0.0.1:8080"
    assert Origin.parse("https://api.anthropic.com").host_header == b"api.anthropic.com"
    assert Origin.parse("http://[::1]:9000").host_header == b"[::1]:9000"
    assert Origin.parse("https://bücher.example").host_header == b"xn--bcher-kva.example"
    with pytest.raises(ValueError):
        Origin.parse("ftp://example.test")


async def test_keep_alive_connection_is_reused():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, echo)
            pool = UpstreamPool(server.url)
            for i in range(3):
                async with pool.request("POST", f"/n{i}", [], b"body") as resp:
                    assert resp.status == 200
                    assert await resp.read() == f"/n{i} body".encode()
            assert (pool.stats.opened, pool.stats.reused) == (1, 2)
            assert server.stats.connections_accepted == 1
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_response_body_streams_chunk_by_chunk():
    release = trio.Event()

    async def two_parts(request, respond):
        await respond.start(200, [("content-type", "text/event-stream")])
        await respond.send(b"data: a\n\n")
        await release.wait()
        await respond.send(b"data: b\n\n")
        await respond.end()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, two_parts)
            pool = UpstreamPool(server.url)
            async with pool.request("GET", "/") as resp:
                chunks = resp.body()
                assert await chunks.__anext__() == b"data: a\n\n"  # before the rest exists
                release.set()
                assert [c async for c in chunks] == [b"data: b\n\n"]
            assert pool.idle_connections == 1
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_streamed_request_body_is_sent_chunked():
    async def body():
        for part in (b"alpha-", b"beta-", b"gamma"):
            yield part

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, echo)
            pool = UpstreamPool(server.url)
            async with pool.request("POST", "/up", [], body()) as resp:
                assert await resp.read() == b"/up alpha-beta-gamma"
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_connection_close_from_upstream_is_not_reused():
    async def closing(request, respond):
        await respond.simple(200, [("connection", "close")], b"bye")

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, closing)
            pool = UpstreamPool(server.url)
            for _ in range(2):
                async with pool.request("GET", "/") as resp:
                    assert await resp.read() == b"bye"
            assert (pool.stats.opened, pool.stats.reused) == (2, 0)
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_early_exit_closes_the_connection():
    async def big(request, respond):
        await respond.start(200, [])
        for _ in range(100):
            await respond.send(b"x" * 1000)
        await respond.end()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, big)
            pool = UpstreamPool(server.url)
            async with pool.request("GET", "/") as resp:
                assert resp.status == 200  # leave without reading the body
            assert pool.idle_connections == 0
            assert pool.stats.closed == 1
            async with pool.request("GET", "/") as resp:
                assert len(await resp.read()) == 100_000
            assert pool.stats.opened == 2
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_stale_idle_connection_is_replaced_not_failed():
    from docket.http.server_connection import ServerConfig

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            config = ServerConfig(keepalive_timeout=0.1)
            server = await nursery.start(partial(serve, echo, config=config))
            pool = UpstreamPool(server.url)
            async with pool.request("GET", "/one") as resp:
                await resp.read()
            while server.stats.connections_open:  # the server drops the idle connection
                await trio.sleep(0.01)
            async with pool.request("GET", "/two") as resp:
                assert await resp.read() == b"/two "
            assert (pool.stats.opened, pool.stats.reused) == (2, 0)
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_connect_refused_is_connect_error():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    with trio.fail_after(DEADLINE):
        pool = UpstreamPool(f"http://127.0.0.1:{port}", connect_timeout=2)
        with pytest.raises(ConnectError) as caught:
            async with pool.request("GET", "/"):
                pass
        assert caught.value.reason == "connect_error"
        assert pool.stats.in_use == 0


async def test_connect_timeout_against_a_listener_that_never_accepts():
    """A listen backlog of 0, filled: the kernel drops further SYNs, so the
    connect hangs exactly as against a black-holed host, on 127.0.0.1."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        with trio.fail_after(DEADLINE):
            for _ in range(16):
                filler = trio.socket.socket()
                with trio.move_on_after(0.2) as scope:
                    await filler.connect(("127.0.0.1", port))
                if scope.cancelled_caught:
                    filler.close()
                    break
                fillers.append(filler)
            else:
                pytest.skip("this kernel accepted every connection: cannot fill the backlog")
            pool = UpstreamPool(f"http://127.0.0.1:{port}", connect_timeout=0.3, read_timeout=5)
            started = trio.current_time()
            with pytest.raises(ConnectTimeout) as caught:
                async with pool.request("GET", "/"):
                    pass
            elapsed = trio.current_time() - started
            assert caught.value.reason == "connect_timeout"
            assert 0.28 <= elapsed < 2
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_read_timeout_waiting_for_the_head_closes_the_upstream_connection():
    upstream_saw_close = trio.Event()

    async def stalls(request, respond):
        await request.read_body()
        await respond.wait_disconnected()
        upstream_saw_close.set()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, stalls)
            pool = UpstreamPool(server.url, connect_timeout=5, read_timeout=0.3)
            started = trio.current_time()
            with pytest.raises(ReadTimeout) as caught:
                async with pool.request("POST", "/", [], b"work"):
                    pass
            assert caught.value.reason == "read_timeout"
            assert 0.28 <= trio.current_time() - started < 2
            await upstream_saw_close.wait()  # the timeout stopped the upstream's work
            assert pool.stats.closed == 1
            nursery.cancel_scope.cancel()


async def test_read_timeout_mid_body():
    async def stalls_after_one_chunk(request, respond):
        await respond.start(200, [])
        await respond.send(b"first")
        await trio.sleep_forever()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, stalls_after_one_chunk)
            pool = UpstreamPool(server.url, read_timeout=0.3)
            received = []
            with pytest.raises(ReadTimeout):
                async with pool.request("GET", "/") as resp:
                    async for chunk in resp.body():
                        received.append(chunk)
            assert received == [b"first"]
            nursery.cancel_scope.cancel()


async def test_cancelling_a_request_closes_its_connection():
    upstream_saw_close = trio.Event()

    async def slow(request, respond):
        await respond.start(200, [])
        await respond.send(b"partial")
        await respond.wait_disconnected()
        upstream_saw_close.set()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, slow)
            pool = UpstreamPool(server.url)
            with trio.move_on_after(0.2) as scope:
                async with pool.request("GET", "/") as resp:
                    async for _ in resp.body():
                        pass
            assert scope.cancelled_caught
            await upstream_saw_close.wait()
            assert (pool.stats.closed, pool.idle_connections, pool.stats.in_use) == (1, 0, 0)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("how", ["eof", "rst"])
async def test_upstream_hanging_up_mid_body_is_connection_reset(how):
    async def hangs_up(stream):
        await read_head(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
        if how == "rst":  # SO_LINGER 0: close() sends a reset, not a FIN
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            port = await start_raw(nursery, hangs_up)
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            received = b""
            with pytest.raises(ConnectionReset) as caught:
                async with pool.request("GET", "/") as resp:
                    async for chunk in resp.body():
                        received += chunk
            assert caught.value.reason == "connection_reset"
            assert received in (b"", b"0123456789")  # a reset may discard what was unread
            assert pool.stats.closed == 1
            nursery.cancel_scope.cancel()


async def test_upstream_closing_before_any_response_is_connection_reset():
    async def hangs_up(stream):
        await read_head(stream)
        await stream.aclose()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            port = await start_raw(nursery, hangs_up)
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            with pytest.raises(ConnectionReset):
                async with pool.request("GET", "/"):
                    pass
            nursery.cancel_scope.cancel()


async def test_garbage_from_upstream_is_protocol_error():
    async def babbles(stream):
        await read_head(stream)
        await stream.send_all(b"SMTP READY\r\n\r\n")
        await trio.sleep_forever()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            port = await start_raw(nursery, babbles)
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            with pytest.raises(ProtocolError) as caught:
                async with pool.request("GET", "/"):
                    pass
            assert caught.value.reason == "protocol_error"
            nursery.cancel_scope.cancel()


async def test_pool_never_exceeds_max_connections():
    release = trio.Event()
    in_flight = 0
    peak = 0

    async def held(request, respond):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await release.wait()
        in_flight -= 1
        await respond.simple(200, [], b"ok")

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, held)
            pool = UpstreamPool(server.url, max_connections=2)
            results = []

            async def call():
                async with pool.request("GET", "/") as resp:
                    results.append(await resp.read())

            async with trio.open_nursery() as callers:
                for _ in range(5):
                    callers.start_soon(call)
                while not (in_flight == 2 and pool.stats.waiting == 3):
                    await trio.sleep(0.01)
                assert pool.stats.in_use == 2
                release.set()
            assert results == [b"ok"] * 5
            assert peak == 2
            assert server.stats.connections_accepted == 2
            assert pool.stats.opened == 2
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_waiting_for_a_busy_pool_can_time_out():
    release = trio.Event()

    async def held(request, respond):
        await release.wait()
        await respond.simple(200, [], b"ok")

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, held)
            pool = UpstreamPool(server.url, max_connections=1)
            holding = trio.Event()

            async def occupy():
                async with pool.request("GET", "/") as resp:
                    holding.set()
                    await resp.read()

            nursery.start_soon(occupy)
            while pool.stats.in_use < 1:
                await trio.sleep(0.01)
            with pytest.raises(PoolTimeout):
                async with pool.request("GET", "/", wait_timeout=0.1):
                    pass
            release.set()
            await holding.wait()
            nursery.cancel_scope.cancel()


async def test_https_upstream_with_certificate_verification(tls_files):
    cert, key = tls_files
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve, echo, ssl_context=server_context))
            assert server.url.startswith("https://")
            trusting = ssl.create_default_context(cafile=str(cert))
            pool = UpstreamPool(server.url, ssl_context=trusting)
            for _ in range(2):
                async with pool.request("POST", "/tls", [], b"secret") as resp:
                    assert await resp.read() == b"/tls secret"
            assert (pool.stats.opened, pool.stats.reused) == (1, 1)
            await pool.aclose()
            # the default context does not trust a self-signed certificate
            with pytest.raises(ConnectError, match="TLS handshake"):
                async with UpstreamPool(server.url).request("GET", "/"):
                    pass
            nursery.cancel_scope.cancel()


async def test_raw_answers_the_pool_reads_whole():
    """A HEAD's answer (a length, no body) keeps the connection for the next call; an
    informational 100 before the answer is passed over; a body without a length
    runs to the close (and that connection is not kept)."""
    heads: list[bytes] = []

    async def upstream(stream):
        while True:
            head = await read_head(stream)
            if not head:
                return
            heads.append(head.split(b"\r\n", 1)[0])
            if head.startswith(b"HEAD"):
                await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 512\r\n\r\n")
            elif head.startswith(b"GET /hints"):
                await stream.send_all(
                    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                )
            else:
                await stream.send_all(b"HTTP/1.1 200 OK\r\n\r\nto the end")
                await stream.aclose()
                return

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            port = await start_raw(nursery, upstream)
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            async with pool.request("HEAD", "/size") as resp:
                assert (resp.status, resp.header(b"content-length")) == (200, b"512")
                assert await resp.read() == b""
            async with pool.request("GET", "/hints") as resp:
                assert (resp.status, await resp.read()) == (200, b"ok")
            async with pool.request("GET", "/rest") as resp:
                assert await resp.read() == b"to the end"
            assert heads == [b"HEAD /size HTTP/1.1", b"GET /hints HTTP/1.1", b"GET /rest HTTP/1.1"]
            assert (pool.stats.opened, pool.stats.reused, pool.idle_connections) == (1, 2, 0)
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_a_header_that_would_split_the_request_is_refused_before_a_byte_goes():
    received = []
    heard = trio.Event()

    async def upstream(stream):
        received.append(await stream.receive_some(65536))
        heard.set()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            port = await start_raw(nursery, upstream)
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            with pytest.raises(ValueError, match="control character"):
                async with pool.request("POST", "/", [("x-note", "a\r\nx-evil: 1")], b"{}"):
                    pass
            await pool.aclose()  # the connection opened for it closes unused
            with trio.fail_after(2):
                await heard.wait()
            assert received == [b""]  # the upstream saw the connection close, and nothing else
            nursery.cancel_scope.cancel()
