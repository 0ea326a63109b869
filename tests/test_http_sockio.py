"""docket.http.sockio over real TCP connections on 127.0.0.1 (and, for its fallback,
trio's in-memory streams): bytes the kernel has are taken without a wait, a wait
is bounded by its timeout, and trio's contract (cancellation, fairness) holds."""

from __future__ import annotations

import struct
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from docket.http.sockio import FAST_RUN, StreamIO

DEADLINE = 10


@asynccontextmanager
async def tcp_pair():
    """(our end, the peer's end) of one TCP connection on 127.0.0.1."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        port = listener.socket.getsockname()[1]
        ours = await trio.open_tcp_stream("127.0.0.1", port)
        peer = await listener.accept()
        async with ours, peer:
            yield ours, peer


async def test_bytes_already_there_are_read_and_sent_as_they_are():
    with trio.fail_after(DEADLINE):
        async with tcp_pair() as (ours, peer):
            io = StreamIO(ours)
            await peer.send_all(b"hello")
            await trio.testing.wait_all_tasks_blocked()
            while (got := await io.receive(65536, timeout=5)) != b"hello":
                assert b"hello".startswith(got)  # the kernel may split it; it cannot change it
            await io.send_all(b"x" * 100_000, timeout=5)  # more than one write's worth
            received = b""
            while len(received) < 100_000:
                received += await peer.receive_some(65536)
            assert received == b"x" * 100_000


async def test_a_read_waits_for_bytes_and_the_end_of_the_stream_reads_empty():
    with trio.fail_after(DEADLINE):
        async with tcp_pair() as (ours, peer):
            io = StreamIO(ours)
            async with trio.open_nursery() as nursery:

                async def later():
                    await trio.testing.wait_all_tasks_blocked()  # the read is waiting
                    await peer.send_all(b"late")
                    await peer.send_eof()

                nursery.start_soon(later)
                assert await io.receive(65536, timeout=5) == b"late"
                assert await io.receive(65536, timeout=5) == b""


async def test_a_read_that_gets_nothing_in_time_raises_too_slow():
    with trio.fail_after(DEADLINE):
        async with tcp_pair() as (ours, _peer):
            io = StreamIO(ours)
            started = trio.current_time()
            with pytest.raises(trio.TooSlowError):
                await io.receive(65536, timeout=0.2)
            assert 0.2 <= trio.current_time() - started < 2


async def test_a_closed_stream_raises_closed_and_a_reset_one_broken():
    with trio.fail_after(DEADLINE):
        async with tcp_pair() as (ours, peer):
            io = StreamIO(ours)
            async with trio.open_nursery() as nursery:

                async def close_soon():
                    await trio.testing.wait_all_tasks_blocked()  # the read is waiting
                    await ours.aclose()  # while the read waits: it is woken, not left hanging

                nursery.start_soon(close_soon)
                with pytest.raises(trio.ClosedResourceError):
                    await io.receive(65536, timeout=5)
            with pytest.raises(trio.ClosedResourceError):
                await io.send_all(b"after close", timeout=5)
        async with tcp_pair() as (ours, peer):
            io = StreamIO(ours)
            linger_0 = struct.pack("ii", 1, 0)
            peer.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, linger_0)
            await peer.aclose()  # linger 0: the kernel answers with a reset at once
            with pytest.raises(trio.BrokenResourceError):
                await io.send_all(b"x", timeout=5)


async def test_a_cancelled_task_is_cancelled_even_when_bytes_are_there():
    with trio.fail_after(DEADLINE):
        async with tcp_pair() as (ours, peer):
            io = StreamIO(ours)
            await peer.send_all(b"waiting")
            with trio.CancelScope() as scope:
                scope.cancel()
                await io.receive(65536, timeout=5)
                raise AssertionError("a cancelled receive returned")
            assert scope.cancelled_caught
            assert await io.receive(65536, timeout=5) == b"waiting"  # nothing was taken


async def test_operations_that_never_block_still_let_other_tasks_run():
    """A reader that always finds bytes waiting yields every FAST_RUN operations."""
    with trio.fail_after(DEADLINE):
        async with tcp_pair() as (ours, peer):
            io = StreamIO(ours)
            ran = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_note, ran)  # runnable from now on
                done = 0
                while not ran and done <= 2 * FAST_RUN:
                    await io.send_all(b"x", timeout=5)  # the kernel takes these at once
                    done += 1
                # The FAST_RUN-th operation yields; trio may run this task again before
                # the other in that round, which then runs at the next yield at the latest.
                assert ran, f"{done} operations that did not block never yielded"
                assert done in (FAST_RUN, 2 * FAST_RUN)  # no schedule point in between
                nursery.cancel_scope.cancel()
            del peer


async def _note(ran: list) -> None:
    ran.append(True)
    await trio.sleep_forever()


async def test_other_streams_go_through_their_own_methods():
    with trio.fail_after(DEADLINE):
        ours, peer = trio.testing.memory_stream_pair()
        io = StreamIO(ours)
        await peer.send_all(b"memory")
        assert await io.receive(65536, timeout=5) == b"memory"
        await io.send_all(b"back", timeout=5)
        assert await peer.receive_some(65536) == b"back"
        with pytest.raises(trio.TooSlowError):
            await io.receive(65536, timeout=0.1)
