"""Each toxic's observable effect through the embedded proxy, over real sockets on
127.0.0.1 to an echo server, held to the expectations of Toxiproxy's own toxic
tests; plus property tests of the pure parts of the toxics."""

from __future__ import annotations

import time

import toxiproxy
import trio
from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st
from toxiproxy_rig import port_of, rig

from chaos.toxiproxy.toxics import Chunk, ToxicError
from chaos.toxiproxy.toxics.limit_data import LimitData
from chaos.toxiproxy.toxics.slicer import Slicer
from chaos.toxiproxy.toxics.spec import parse_toxic

DEADLINE = 15
SLACK = 0.08  # scheduling noise allowed on this shared 2-core machine, seconds


async def connect(listen: str) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port_of(listen))


async def receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    got = b""
    while len(got) < size:
        data = await stream.receive_some(65536)
        assert data, f"closed after {len(got)} of {size} bytes"
        got += data
    return got


async def receive_until_closed(stream: trio.SocketStream) -> bytes:
    got = b""
    while data := await stream.receive_some(65536):
        got += data
    return got


async def timed_round_trip(stream: trio.SocketStream, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    await stream.send_all(payload)
    assert await receive_exactly(stream, len(payload)) == payload
    return time.monotonic() - start


async def make_proxy(r, **toxic):
    proxy = await r.call(toxiproxy.Toxiproxy().create, upstream=r.upstream, name="p")
    if toxic:
        await r.call(proxy.add_toxic, **toxic)
    return proxy


async def test_latency_adds_latency_plus_minus_jitter_to_each_round_trip():
    latency, jitter = 0.1, 0.02
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r, type="latency", attributes={"latency": 100, "jitter": 20})
            async with await connect(proxy.listen) as stream:
                for _ in range(5):
                    elapsed = await timed_round_trip(stream)
                    assert latency - jitter <= elapsed <= latency + jitter + SLACK, elapsed


async def test_latency_in_both_streams_adds_up():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r, type="latency", attributes={"latency": 60})
            await r.call(
                proxy.add_toxic, type="latency", stream="upstream", attributes={"latency": 60}
            )
            async with await connect(proxy.listen) as stream:
                elapsed = await timed_round_trip(stream)
            assert 0.12 <= elapsed <= 0.12 + SLACK


async def test_latency_delays_bytes_without_throttling_the_stream():
    """4 MB through a 50 ms latency toxic: pipelined, it takes about the transfer
    time plus 50 ms; delaying chunk after chunk would take 50 ms per chunk (> 3 s)."""
    payload = bytes(range(256)) * (4 * 4096)
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r, type="latency", attributes={"latency": 50})
            async with await connect(proxy.listen) as stream:
                start = time.monotonic()
                received = []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stream.send_all, payload)
                    received.append(await receive_exactly(stream, len(payload)))
                elapsed = time.monotonic() - start
            assert received[0] == payload
            assert 0.05 <= elapsed < 1.5, elapsed


async def test_timeout_zero_is_a_black_hole_until_removed_which_closes():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r)
            async with await connect(proxy.listen) as stream:
                assert await timed_round_trip(stream) < 1
                await r.call(proxy.add_toxic, type="timeout", attributes={"timeout": 0})
                await stream.send_all(b"into the void")
                # Nothing may come back while the toxic holds: a bounded wait for silence.
                with trio.move_on_after(0.3) as silence:
                    await stream.receive_some(100)
                assert silence.cancelled_caught, "a black hole let data through"
                await r.call(proxy.destroy_toxic, "timeout_downstream")
                assert await receive_until_closed(stream) == b""


async def test_timeout_closes_the_connection_after_timeout():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r, type="timeout", attributes={"timeout": 200})
            start = time.monotonic()
            async with await connect(proxy.listen) as stream:
                await stream.send_all(b"hello")
                assert await receive_until_closed(stream) == b""  # dropped, then closed
            elapsed = time.monotonic() - start
            assert 0.2 <= elapsed <= 0.2 + SLACK + 0.2, elapsed


async def test_reset_peer_gives_the_client_econnreset():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r, type="reset_peer", attributes={"timeout": 150})
            async with await connect(proxy.listen) as stream:
                start = time.monotonic()
                await stream.send_all(b"hello")
                try:
                    await receive_until_closed(stream)
                except trio.BrokenResourceError as exc:
                    reset = exc.__cause__
                else:
                    reset = None
                elapsed = time.monotonic() - start
            assert isinstance(reset, ConnectionResetError), reset
            assert 0.15 <= elapsed <= 0.15 + SLACK + 0.2, elapsed


async def test_limit_data_closes_after_exactly_n_bytes_per_connection():
    limit = 1000
    payload = bytes(range(256)) * 3  # 768 bytes: two sends cross the limit
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r, type="limit_data", attributes={"bytes": limit})
            first, second = await connect(proxy.listen), await connect(proxy.listen)
            async with first, second:
                await first.send_all(payload)
                assert await receive_exactly(first, len(payload)) == payload
                await first.send_all(payload)
                rest = await receive_until_closed(first)
                assert payload + rest == (payload * 2)[:limit]
                # The count is per connection: the second one starts from zero.
                await second.send_all(payload)
                assert await receive_exactly(second, len(payload)) == payload


async def test_bandwidth_paces_at_rate_kb_per_second():
    size, rate_kb = 100_000, 200  # 0.5 s at 200 000 bytes/s
    payload = b"b" * size
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r, type="bandwidth", attributes={"rate": rate_kb})
            async with await connect(proxy.listen) as stream:
                start = time.monotonic()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stream.send_all, payload)
                    assert await receive_exactly(stream, size) == payload
                elapsed = time.monotonic() - start
            expected = size / (rate_kb * 1000)
            assert expected * 0.9 <= elapsed <= expected + 0.3, elapsed


async def test_slow_close_delays_the_close():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(r, type="slow_close", attributes={"delay": 300})
            async with await connect(proxy.listen) as stream:
                assert await timed_round_trip(stream) < 0.3  # data is not delayed
                start = time.monotonic()
                await stream.send_eof()
                assert await receive_until_closed(stream) == b""
                elapsed = time.monotonic() - start
            assert 0.3 <= elapsed <= 0.3 + SLACK + 0.2, elapsed


async def test_slicer_cuts_writes_into_small_delayed_pieces():
    payload = bytes(range(100))
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await make_proxy(
                r,
                type="slicer",
                attributes={"average_size": 10, "size_variation": 3, "delay": 5000},
            )
            async with await connect(proxy.listen) as stream:
                start = time.monotonic()
                await stream.send_all(payload)
                reads, got = 0, b""
                while len(got) < len(payload):
                    data = await stream.receive_some(65536)
                    assert data
                    got += data
                    reads += 1
                elapsed = time.monotonic() - start
            assert got == payload
            assert reads >= 3, reads  # one write arrived as many
            assert elapsed >= 7 * 0.005  # at least 8 pieces, 5 ms apart


async def test_toxicity_is_rolled_per_connection_and_direction():
    calls = []

    def roll(toxic: str, ordinal: int, stream: str) -> float:
        calls.append((toxic, ordinal, stream))
        return 0.0 if ordinal % 2 == 0 else 0.99

    with trio.fail_after(DEADLINE):
        async with rig(roll=roll) as r:
            proxy = await make_proxy(
                r, name="lag", type="latency", toxicity=0.5, attributes={"latency": 200}
            )
            # toxicity 0 never fires, whatever the roll: this black hole never opens.
            await r.call(
                proxy.add_toxic,
                name="never",
                type="timeout",
                stream="upstream",
                toxicity=0.0,
                attributes={"timeout": 0},
            )
            async with await connect(proxy.listen) as even:
                assert await timed_round_trip(even) >= 0.2
            async with await connect(proxy.listen) as odd:
                assert await timed_round_trip(odd) < 0.2
            assert ("lag", 0, "downstream") in calls
            assert ("lag", 1, "downstream") in calls
            assert ("never", 1, "upstream") in calls


class FakeLink:
    def __init__(self) -> None:
        self.closed: list[str] = []

    def close(self, reason: str) -> None:
        self.closed.append(reason)

    def reset(self, reason: str) -> None:
        raise AssertionError("not expected")


def run_pipe(toxic, chunks: list[bytes]) -> tuple[list[bytes], FakeLink]:
    out: list[bytes] = []
    link = FakeLink()

    async def send(chunk: Chunk) -> None:
        out.append(chunk.data)

    async def main() -> None:
        state: dict = {}
        for data in chunks:
            await toxic.pipe(Chunk(data, trio.current_time()), send, link, state)

    trio.run(main)
    return out, link


@settings(max_examples=io_examples(), deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=50), max_size=8), st.integers(0, 300))
def test_limit_data_passes_exactly_the_limit(chunks, limit):
    out, link = run_pipe(LimitData({"bytes": limit}), chunks)
    total = b"".join(chunks)
    assert b"".join(out) == total[:limit]
    assert bool(link.closed) == (bool(chunks) and len(total) >= limit)


@settings(max_examples=io_examples(), deadline=None)
@given(st.binary(min_size=1, max_size=400), st.integers(1, 40), st.integers(0, 39))
def test_slicer_pieces_rejoin_and_stay_within_variation(data, average, variation):
    variation = min(variation, average - 1)
    out, _ = run_pipe(
        Slicer({"average_size": average, "size_variation": variation, "delay": 0}), [data]
    )
    assert b"".join(out) == data
    assert all(len(piece) <= average + variation for piece in out)
    assert all(len(piece) >= average - variation for piece in out[:-1])


@settings(deadline=None)
@given(
    st.sampled_from(["latency", "timeout", "bandwidth", "limit_data"]),
    st.sampled_from(["upstream", "downstream"]),
    st.floats(0, 1),
    st.integers(-5, 10_000),
)
def test_parse_toxic_round_trips_or_names_the_problem(kind, stream, toxicity, value):
    key = {"latency": "latency", "timeout": "timeout", "bandwidth": "rate"}.get(kind, "bytes")
    body = {"type": kind, "stream": stream, "toxicity": toxicity, "attributes": {key: value}}
    valid = value >= 0 and not (kind == "bandwidth" and value == 0)
    try:
        spec = parse_toxic(body)
    except ToxicError as exc:
        assert not valid, exc
        assert kind in str(exc)
        return
    assert valid
    shown = spec.to_json()
    assert shown["name"] == f"{kind}_{stream}"
    assert (shown["type"], shown["stream"], shown["toxicity"]) == (kind, stream, toxicity)
    assert shown["attributes"][key] == value
