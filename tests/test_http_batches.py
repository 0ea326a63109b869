"""UpstreamResponse.body_batches against raw upstreams on 127.0.0.1: chunks that
arrive together come out together, later ones wait for their read, and a failure
behind buffered chunks is raised only after those chunks are handed over."""

from __future__ import annotations

import pytest
import trio
from helpers import read_head, start_raw

from docket.http.client import ConnectionReset, ProtocolError, UpstreamPool

DEADLINE = 10
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def test_chunks_sent_together_come_out_together_and_later_ones_wait():
    release = trio.Event()

    async def upstream(stream):
        await read_head(stream)
        await stream.send_all(HEAD + chunk(b"a") + chunk(b"b") + chunk(b"c"))
        await release.wait()
        await stream.send_all(chunk(b"d") + b"0\r\n\r\n")

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            port = await start_raw(nursery, upstream)
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            async with pool.request("GET", "/") as resp:
                batches = resp.body_batches()
                first = await batches.__anext__()
                assert first == [b"a", b"b", b"c"]
                assert batches.ready() == []  # nothing more has arrived: no waiting here
                release.set()
                rest = [batch async for batch in batches]
            assert rest == [[b"d"]]
            assert resp.complete
            assert pool.idle_connections == 1  # a complete exchange keeps its connection
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def test_ready_takes_what_came_with_the_head():
    async def upstream(stream):
        await read_head(stream)
        await stream.send_all(HEAD + chunk(b"one") + chunk(b"two") + b"0\r\n\r\n")

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            port = await start_raw(nursery, upstream)
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            async with pool.request("GET", "/") as resp:
                batches = resp.body_batches()
                got = batches.ready()
                while not resp.complete:  # the body may trail the head by a read
                    got += await batches.__anext__()
                assert b"".join(got) == b"onetwo"
                assert [batch async for batch in batches] == []
            await pool.aclose()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("tail", "error"),
    [(b"zz\r\nnot a chunk", ProtocolError), (b"", ConnectionReset)],
    ids=["bad-framing", "cut"],
)
async def test_a_failure_behind_buffered_chunks_comes_after_them(tail, error):
    async def upstream(stream):
        await read_head(stream)
        await stream.send_all(HEAD + chunk(b"x") + chunk(b"y") + tail)
        await stream.aclose()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            port = await start_raw(nursery, upstream)
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            seen: list[bytes] = []
            with pytest.raises(error):
                async with pool.request("GET", "/") as resp:
                    async for batch in resp.body_batches():
                        seen += batch
            assert seen == [b"x", b"y"]
            assert pool.idle_connections == 0  # a failed exchange's connection is closed
            await pool.aclose()
            nursery.cancel_scope.cancel()
