"""Hostile input at the boundary's HTTP server: an oversized request gets its 413.

A client that sends a whole 50 MB body before it reads (what requests, httpx and
curl without Expect do) must read the server's answer, not a connection reset:
the server answers first, then reads and drops the rest of the body, then closes.
Real sockets on 127.0.0.1, a blocking client in a thread, bounded in time.
"""

from __future__ import annotations

import socket

import trio
from conftest import TOKEN

from docket.boundary.rules.body import MAX_REQUEST_BYTES
from docket.http.server import serve

DEADLINE = 30
FIFTY_MB = 50 * 1000 * 1000


def _send_all_then_read(
    port: int, size: int, framing: str, target: str = "/v1/chat", extra: str = ""
) -> bytes:
    """A plain blocking client: the whole request, then the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        if framing == "content-length":
            head = f"POST {target} HTTP/1.1\r\nhost: x\r\n{extra}content-length: {size}\r\n\r\n"
            sock.sendall(head.encode())
            chunk = b"z" * (1 << 20)
            sent = 0
            while sent < size:
                piece = chunk[: size - sent]
                sock.sendall(piece)
                sent += len(piece)
        else:
            head = f"POST {target} HTTP/1.1\r\nhost: x\r\n{extra}transfer-encoding: chunked\r\n\r\n"
            sock.sendall(head.encode())
            chunk = b"%x\r\n%s\r\n" % (1 << 20, b"z" * (1 << 20))
            for _ in range(size >> 20):
                sock.sendall(chunk)
            sock.sendall(b"0\r\n\r\n")
        answer = b""
        while data := sock.recv(65536):
            answer += data
        return answer


async def _refuse_big(request, respond):
    await request.read_body(limit=MAX_REQUEST_BYTES)
    await respond.simple(200, [], b"unreachable")


async def test_a_50_mb_request_reads_its_413_not_a_reset():
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, _refuse_big)
            for framing in ("content-length", "chunked"):
                answer = await trio.to_thread.run_sync(
                    _send_all_then_read, server.port, FIFTY_MB, framing
                )
                assert answer.startswith(b"HTTP/1.1 413 "), (framing, answer[:200])
                assert b"connection: close" in answer
            nursery.cancel_scope.cancel()


async def test_the_boundary_answers_a_50_mb_call_in_the_providers_shape(stub_server, boundary_rig):
    """The agent's side: its SDK sends 50 MB, then reads a 400-class answer it can
    parse, and the refusal is in the ledger; nothing went upstream."""
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as up, boundary_rig({"openai": up}) as rig:
            port = int(rig.url.rsplit(":", 1)[1])
            answer = await trio.to_thread.run_sync(
                _send_all_then_read,
                port,
                FIFTY_MB,
                "content-length",
                "/openai/v1/chat/completions",
                f"authorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\n",
            )
            assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]  # the provider's shape
            assert b'"docket_bad_request"' in answer and b"request body over" in answer
            denied = rig.events("policy.denied")
            assert [e["rule"] for e in denied] == ["max_request_bytes"], denied
            assert up.log == []
