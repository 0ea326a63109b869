"""docket.http.server over real sockets on 127.0.0.1: each test starts a server in
its own nursery, talks raw bytes to it, and stops it; each is bounded in time."""

from __future__ import annotations

import logging
from functools import partial

import h11
import trio
from helpers import io_examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docket.http.client import ConnectError, open_upstream_stream
from docket.http.server import serve
from docket.http.server_connection import ServerConfig
from docket.http.server_errors import ClientGone

DEADLINE = 10


async def connect(port: int) -> trio.abc.Stream:
    return await open_upstream_stream("127.0.0.1", port, tls=False, connect_timeout=2)


async def read_response(stream: trio.abc.Stream, conn: h11.Connection):
    """One response parsed by an h11 client: (Response, body bytes)."""
    head = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return head, body
        else:
            raise AssertionError(f"unexpected {event!r}")


async def read_until_eof(stream: trio.abc.Stream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


def request_bytes(conn: h11.Connection, method="GET", target="/", body=b"", headers=()):
    pairs = [("host", "127.0.0.1"), *headers]
    if body or method == "POST":
        pairs.append(("content-length", str(len(body))))
    data = conn.send(h11.Request(method=method, target=target, headers=pairs))
    if body:
        data += conn.send(h11.Data(data=body))
    return data + conn.send(h11.EndOfMessage())


async def echo(request, respond):
    body = await request.read_body()
    reply = f"{request.method} {request.target.decode()} {len(body)}".encode()
    await respond.simple(200, [("content-type", "text/plain")], reply)


async def test_keep_alive_serves_several_requests_on_one_connection():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, echo)
            stream = await connect(server.port)
            client = h11.Connection(h11.CLIENT)
            for i in range(3):
                await stream.send_all(request_bytes(client, "POST", f"/r{i}", b"x" * i))
                head, body = await read_response(stream, client)
                assert head.status_code == 200
                assert body == f"POST /r{i} {i}".encode()
                client.start_next_cycle()
            assert server.stats.connections_accepted == 1
            assert server.stats.requests == 3
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_pipelined_requests_are_answered_in_order():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, echo)
            stream = await connect(server.port)
            first, second = h11.Connection(h11.CLIENT), h11.Connection(h11.CLIENT)
            await stream.send_all(
                request_bytes(first, "GET", "/a") + request_bytes(second, "GET", "/b")
            )
            data = b""
            while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"GET /b 0"):
                data += await stream.receive_some(65536)
            assert data.index(b"GET /a 0") < data.index(b"GET /b 0")
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_a_stream_reaches_the_client_chunk_by_chunk_as_sent():
    async def slow_events(request, respond):
        await respond.start(200, [("content-type", "text/event-stream")])
        await respond.send(b"data: one\n\n")
        await trio.sleep(0.3)
        await respond.send(b"data: two\n\n")
        await respond.end()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, slow_events)
            stream = await connect(server.port)
            client = h11.Connection(h11.CLIENT)
            started = trio.current_time()
            await stream.send_all(request_bytes(client))
            arrivals = []
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Data):
                    arrivals.append((trio.current_time(), bytes(event.data)))
                elif isinstance(event, h11.EndOfMessage):
                    break
            assert [data for _, data in arrivals] == [b"data: one\n\n", b"data: two\n\n"]
            # the first event was not held back until the handler finished
            assert arrivals[0][0] - started < 0.2
            assert arrivals[1][0] - arrivals[0][0] >= 0.28
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_a_request_body_reaches_the_handler_chunk_by_chunk():
    seen = []
    first_chunk_seen = trio.Event()

    async def collect(request, respond):
        async for chunk in request.body_chunks():
            seen.append(chunk)
            first_chunk_seen.set()
        await respond.simple(200, [], b"".join(seen))

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, collect)
            stream = await connect(server.port)
            client = h11.Connection(h11.CLIENT)
            head = h11.Request(
                method="POST",
                target="/",
                headers=[("host", "x"), ("transfer-encoding", "chunked")],
            )
            await stream.send_all(client.send(head) + client.send(h11.Data(data=b"first")))
            await first_chunk_seen.wait()  # the handler has it before the rest is even sent
            assert seen == [b"first"]
            await stream.send_all(client.send(h11.Data(data=b"second")))
            await stream.send_all(client.send(h11.EndOfMessage()))
            response, body = await read_response(stream, client)
            assert response.status_code == 200
            assert body == b"firstsecond"
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_expect_100_continue_is_honoured():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, echo)
            stream = await connect(server.port)
            await stream.send_all(
                b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n"
            )
            interim = b""
            while b"\r\n\r\n" not in interim:
                interim += await stream.receive_some(65536)
            assert interim.startswith(b"HTTP/1.1 100 ")
            await stream.send_all(b"hello")
            rest = interim.split(b"\r\n\r\n", 1)[1]
            while not rest.endswith(b"POST /up 5"):
                rest += await stream.receive_some(65536)
            assert rest.startswith(b"HTTP/1.1 200 ")
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_malformed_request_gets_400_and_the_server_keeps_serving():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, echo)
            bad = await connect(server.port)
            await bad.send_all(b"THIS IS NOT HTTP\r\n\r\n")
            answer = await read_until_eof(bad)  # answered, then closed
            assert answer.startswith(b"HTTP/1.1 400 ")
            await bad.aclose()
            good = await connect(server.port)
            client = h11.Connection(h11.CLIENT)
            await good.send_all(request_bytes(client, "GET", "/after"))
            head, body = await read_response(good, client)
            assert (head.status_code, body) == (200, b"GET /after 0")
            await good.aclose()
            nursery.cancel_scope.cancel()


async def test_oversized_headers_get_431():
    config = ServerConfig(max_header_bytes=1024)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve, echo, config=config))
            stream = await connect(server.port)
            await stream.send_all(
                b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4096 + b"\r\n\r\n"
            )
            answer = await read_until_eof(stream)
            assert answer.startswith(b"HTTP/1.1 431 ")
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_body_over_the_limit_gets_413():
    async def small(request, respond):
        await request.read_body(limit=100)
        await respond.simple(200, [], b"unreachable")

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, small)
            for declared in (True, False):  # refused from content-length, and while reading
                stream = await connect(server.port)
                client = h11.Connection(h11.CLIENT)
                framing = (
                    ("content-length", "500") if declared else ("transfer-encoding", "chunked")
                )
                head = h11.Request(method="POST", target="/", headers=[("host", "x"), framing])
                await stream.send_all(client.send(head) + client.send(h11.Data(data=b"z" * 500)))
                answer = await read_until_eof(stream)
                assert answer.startswith(b"HTTP/1.1 413 "), answer
                await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_handler_crash_gets_500_one_log_line_and_the_server_keeps_serving(caplog):
    async def fragile(request, respond):
        if request.path == "/boom":
            raise ValueError("kaput")
        await echo(request, respond)

    caplog.set_level(logging.ERROR, logger="docket.http")
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, fragile)
            stream = await connect(server.port)
            await stream.send_all(request_bytes(h11.Connection(h11.CLIENT), "GET", "/boom"))
            answer = await read_until_eof(stream)
            assert answer.startswith(b"HTTP/1.1 500 ")
            assert b"kaput" not in answer  # internals stay in the log
            await stream.aclose()
            records = [r for r in caplog.records if r.name == "docket.http"]
            assert len(records) == 1
            assert "/boom" in records[0].getMessage()
            assert "ValueError: kaput" in records[0].getMessage()
            assert server.stats.handler_errors == 1
            again = await connect(server.port)
            client = h11.Connection(h11.CLIENT)
            await again.send_all(request_bytes(client, "GET", "/fine"))
            head, _ = await read_response(again, client)
            assert head.status_code == 200
            await again.aclose()
            nursery.cancel_scope.cancel()


async def test_handler_that_never_answers_gets_500():
    async def silent(request, respond):
        return None

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, silent)
            stream = await connect(server.port)
            await stream.send_all(request_bytes(h11.Connection(h11.CLIENT)))
            assert (await read_until_eof(stream)).startswith(b"HTTP/1.1 500 ")
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_client_disconnect_mid_stream_surfaces_as_client_gone():
    outcome = []
    done = trio.Event()

    async def endless(request, respond):
        await respond.start(200, [("content-type", "text/event-stream")])
        try:
            while True:
                await respond.send(b"data: tick\n\n")
                await trio.sleep(0.01)
        except ClientGone as exc:
            outcome.append(exc)
            raise
        finally:
            done.set()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, endless)
            stream = await connect(server.port)
            await stream.send_all(request_bytes(h11.Connection(h11.CLIENT)))
            received = b""
            while b"data: tick" not in received:
                received += await stream.receive_some(65536)
            await stream.aclose()
            await done.wait()
            assert len(outcome) == 1 and isinstance(outcome[0], ClientGone)
            assert server.stats.handler_errors == 0  # leaving is not a server error
            nursery.cancel_scope.cancel()


async def test_client_disconnect_interrupts_a_handler_racing_wait_disconnected():
    """The boundary's pattern: wait on the upstream and on the client at once."""
    upstream_cancelled = trio.Event()
    handler_done = trio.Event()
    waiting = trio.Event()
    outcome = []

    async def upstream_call():
        try:
            waiting.set()
            await trio.sleep_forever()
        finally:
            upstream_cancelled.set()

    async def boundary_like(request, respond):
        await request.read_body()
        async with trio.open_nursery() as race:

            async def watch():
                await respond.wait_disconnected()
                outcome.append("client abort")
                race.cancel_scope.cancel()

            race.start_soon(watch)
            await upstream_call()
        assert respond.client_gone
        handler_done.set()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, boundary_like)
            stream = await connect(server.port)
            await stream.send_all(request_bytes(h11.Connection(h11.CLIENT), "POST", "/", b"abc"))
            await waiting.wait()
            assert not upstream_cancelled.is_set()
            await stream.aclose()
            await handler_done.wait()
            assert upstream_cancelled.is_set()
            assert outcome == ["client abort"]
            assert server.stats.handler_errors == 0  # an abort is not a server error
            nursery.cancel_scope.cancel()


async def test_idle_keep_alive_connection_is_closed_after_the_timeout():
    config = ServerConfig(keepalive_timeout=0.2)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve, echo, config=config))
            stream = await connect(server.port)
            client = h11.Connection(h11.CLIENT)
            await stream.send_all(request_bytes(client))
            await read_response(stream, client)
            answered = trio.current_time()
            assert await stream.receive_some(65536) == b""  # closed by the server, silently
            assert trio.current_time() - answered >= 0.18
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_cancelling_the_server_stops_handlers_and_connections():
    handler_running = trio.Event()
    handler_cancelled = trio.Event()

    async def forever(request, respond):
        handler_running.set()
        try:
            await trio.sleep_forever()
        finally:
            handler_cancelled.set()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as outer:
            stopped = trio.Event()

            async def run_server(task_status=trio.TASK_STATUS_IGNORED):
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        listening = await nursery.start(serve, forever)
                        task_status.started((scope, listening.port))
                stopped.set()

            scope, port = await outer.start(run_server)
            stream = await connect(port)
            await stream.send_all(request_bytes(h11.Connection(h11.CLIENT)))
            await handler_running.wait()
            scope.cancel()
            await stopped.wait()
            assert handler_cancelled.is_set()
            assert await stream.receive_some(65536) == b""
            await stream.aclose()
            refused = False
            try:
                await connect(port)
            except ConnectError:
                refused = True
            assert refused, "the listener should be closed"


@settings(
    max_examples=io_examples(),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(garbage=st.binary(min_size=1, max_size=300))
def test_arbitrary_bytes_never_stop_the_server(garbage):
    """Whatever a client sends, it gets an HTTP answer or a close, and the
    server still answers the next client."""

    async def main():
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                server = await nursery.start(
                    partial(serve, echo, config=ServerConfig(request_timeout=0.2))
                )
                stream = await connect(server.port)
                await stream.send_all(garbage)
                await stream.send_eof()
                try:
                    answer = await read_until_eof(stream)
                except trio.BrokenResourceError:
                    answer = b""  # reset by the server: also a clean refusal
                assert answer == b"" or answer.startswith(b"HTTP/1.1 ")
                await stream.aclose()
                probe = await connect(server.port)
                client = h11.Connection(h11.CLIENT)
                await probe.send_all(request_bytes(client, "GET", "/probe"))
                head, body = await read_response(probe, client)
                assert (head.status_code, body) == (200, b"GET /probe 0")
                await probe.aclose()
                assert server.stats.handler_errors == 0
                nursery.cancel_scope.cancel()

    trio.run(main)
