"""The net fault family: grammar -> toxic translation (pure), the seeded roll
(property-tested against the schedule), and each kind's effect on real TCP
through the embedded Toxiproxy, driven only through ToxiproxyDriver."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import pytest
import trio
from helpers import io_examples, tcp_echo
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.faults.grammar import parse_fault
from chaos.faults.net import (
    check_performable,
    schedule_roll,
    time_window,
    toxic_name,
    toxic_request,
    toxicity,
)
from chaos.faults.schedule import FaultSchedule
from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.driver import ProxyInfo, ToxiproxyDriver, ToxiproxyError, hold_window
from docket.errors import InputError

DEADLINE = 10

# ---------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("text", "type_", "stream", "attributes"),
    [
        (
            "net:latency(250ms, jitter=1s)",
            "latency",
            "downstream",
            {"latency": 250, "jitter": 1000},
        ),
        ("net:bandwidth(64KB/s, stream=upstream)", "bandwidth", "upstream", {"rate": 64}),
        ("net:slow_close(2s)", "slow_close", "downstream", {"delay": 2000}),
        ("net:timeout(0)", "timeout", "downstream", {"timeout": 0}),
        ("net:reset_peer", "reset_peer", "downstream", {"timeout": 0}),
        ("net:reset_peer(1500ms)", "reset_peer", "downstream", {"timeout": 1500}),
        (
            "net:slicer(average_size=64, size_variation=8, delay=3ms)",
            "slicer",
            "downstream",
            {"average_size": 64, "size_variation": 8, "delay": 3000},  # microseconds
        ),
        ("net:limit_data(2KiB, stream=upstream)", "limit_data", "upstream", {"bytes": 2048}),
    ],
)
def test_each_toxic_is_translated_into_toxiproxy_units(text, type_, stream, attributes):
    request = toxic_request(parse_fault(text), "t")
    assert (request.type, request.stream, request.attributes) == (type_, stream, attributes)
    assert request.toxicity == 1.0


def test_a_chance_becomes_the_toxicity_and_ordinals_leave_it_whole():
    assert toxicity(parse_fault("net:reset_peer@2.5%")) == 0.025
    assert toxicity(parse_fault("net:reset_peer@call 3..7")) == 1.0
    assert toxicity(parse_fault("net:reset_peer@call 3.. & 40%")) == 0.4


def test_down_refuses_per_connection_triggers_in_one_line():
    check_performable(parse_fault("net:down@t 1s..2s"))
    for text in ("net:down@5%", "net:down@call 2"):
        with pytest.raises(InputError, match=r"net:down disables the whole proxy") as info:
            check_performable(parse_fault(text))
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError):
        toxic_request(parse_fault("net:down"), "t")


def test_time_window_in_seconds():
    assert time_window(parse_fault("net:timeout(0)@t 1s..4500ms")) == (1.0, 4.5)
    assert time_window(parse_fault("net:timeout(0)@t 2s")) == (2.0, None)
    assert time_window(parse_fault("net:timeout(0)@10%")) is None


def test_a_timed_fault_needs_a_clock_for_the_roll():
    schedule = FaultSchedule.parse(1, ["net:latency(1s)@t 1s..2s"])
    with pytest.raises(ValueError, match="time-triggered"):
        schedule_roll(schedule)
    now = [0.5]
    roll = schedule_roll(schedule, elapsed=lambda: now[0])
    name = toxic_name(0, schedule.faults[0])
    assert roll(name, 0, "downstream") == 1.0
    now[0] = 1.5
    assert roll(name, 0, "downstream") == 0.0


@settings(max_examples=io_examples(), deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    percent=st.integers(0, 100),
    first=st.integers(1, 20),
    ordinal=st.integers(0, 60),
)
def test_the_roll_activates_a_toxic_exactly_where_the_schedule_fires(seed, percent, first, ordinal):
    fault_texts = [f"net:latency(10ms)@{percent}%", f"net:reset_peer@call {first}.. & {percent}%"]
    schedule = FaultSchedule.parse(seed, fault_texts)
    roll = schedule_roll(schedule)
    for index, fault in enumerate(schedule.faults):
        request = toxic_request(fault, toxic_name(index, fault))
        active = roll(request.name, ordinal, request.stream) < request.toxicity
        assert active == schedule.decide(fault, ordinal + 1)  # the proxy counts from 0


def test_a_toxic_the_schedule_did_not_name_still_rolls_from_the_seed():
    a = schedule_roll(FaultSchedule(7, ()))
    b = schedule_roll(FaultSchedule(7, ()))
    c = schedule_roll(FaultSchedule(8, ()))
    rolls = [a("by_hand", n, "upstream") for n in range(20)]
    assert rolls == [b("by_hand", n, "upstream") for n in range(20)]
    assert rolls != [c("by_hand", n, "upstream") for n in range(20)]
    assert all(0.0 <= r < 1.0 for r in rolls)


def test_a_bad_toxiproxy_url_is_one_line():
    for url in ("localhost:8474", "http://127.0.0.1", "ftp://127.0.0.1:8474", "http://h:99999"):
        with pytest.raises(InputError, match="expected http://HOST:PORT"):
            ToxiproxyDriver(url)


# ---------------------------------------------------------------- over TCP


@dataclass
class Rig:
    driver: ToxiproxyDriver
    proxy: ProxyInfo

    async def run(self, fn, *args, **kwargs):
        return await trio.to_thread.run_sync(partial(fn, *args, **kwargs), abandon_on_cancel=True)

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream(*self.proxy.address)


@asynccontextmanager
async def rig(roll=None) -> AsyncIterator[Rig]:
    """An embedded Toxiproxy and an echo server on 127.0.0.1, a proxy between them."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(serve_toxiproxy, "127.0.0.1", 0, roll=roll))
        listeners = await nursery.start(partial(trio.serve_tcp, tcp_echo, 0, host="127.0.0.1"))
        upstream = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        driver = ToxiproxyDriver(server.url)
        proxy = await trio.to_thread.run_sync(
            partial(driver.create_proxy, "echo", upstream), abandon_on_cancel=True
        )
        yield Rig(driver, proxy)
        nursery.cancel_scope.cancel()


async def receive_all(stream: trio.SocketStream, limit: int) -> bytes:
    """Everything until EOF or `limit` bytes."""
    got = b""
    while len(got) < limit and (data := await stream.receive_some(65536)):
        got += data
    return got


async def round_trip(r: Rig, payload: bytes = b"ping") -> float:
    start = trio.current_time()
    async with await r.connect() as stream:
        await stream.send_all(payload)
        assert await receive_all(stream, len(payload)) == payload
    return trio.current_time() - start


async def test_latency_adds_its_delay():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            assert r.proxy.listen.startswith("127.0.0.1:") and r.proxy.address[1] != 0
            baseline = await round_trip(r)
            fault = parse_fault("net:latency(300ms)")
            await r.run(r.driver.apply, "echo", fault, "slow")
            assert (await r.run(r.driver.toxics, "echo"))["slow"]["attributes"]["latency"] == 300
            assert await round_trip(r) >= 0.3 > baseline
            await r.run(r.driver.lift, "echo", fault, "slow")
            assert await r.run(r.driver.toxics, "echo") == {}
            assert await round_trip(r) < 0.3


async def test_timeout_zero_is_a_black_hole_until_lifted():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            fault = parse_fault("net:timeout(0)")
            await r.run(r.driver.apply, "echo", fault, "hole")
            async with await r.connect() as stream:
                await stream.send_all(b"anyone?")
                with trio.move_on_after(0.5) as waited:
                    got = await stream.receive_some(100)
                    pytest.fail(f"a black hole answered {got!r}")
                assert waited.cancelled_caught
                await r.run(r.driver.lift, "echo", fault, "hole")
                # removing a timeout toxic closes the connection it held
                try:
                    after = await stream.receive_some(100)
                except trio.BrokenResourceError:
                    after = b""  # closed with our bytes unread: a reset is also a close
                assert after == b""


async def test_reset_peer_resets_the_connection():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            await r.run(r.driver.apply, "echo", parse_fault("net:reset_peer(50ms)"), "rst")
            async with await r.connect() as stream:
                await stream.send_all(b"hello")
                with pytest.raises(trio.BrokenResourceError) as info:
                    await receive_all(stream, 100)
                assert isinstance(info.value.__cause__, ConnectionResetError)


async def test_limit_data_cuts_the_stream_at_n_bytes():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            await r.run(r.driver.apply, "echo", parse_fault("net:limit_data(10B)"), "cut")
            async with await r.connect() as stream:
                await stream.send_all(b"x" * 100)
                assert await receive_all(stream, 1000) == b"x" * 10


async def test_down_refuses_connections_and_lifting_it_restores_them():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            fault = parse_fault("net:down")
            await r.run(r.driver.apply, "echo", fault, "down")
            assert (await r.run(r.driver.proxy, "echo")).enabled is False
            with pytest.raises(OSError):
                await r.connect()
            await r.run(r.driver.lift, "echo", fault, "down")
            assert (await r.run(r.driver.proxy, "echo")).enabled is True
            await round_trip(r)  # asserts the echo came back whole


async def test_the_server_s_refusals_are_one_line_errors():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            with pytest.raises(ToxiproxyError, match="create proxy 'echo'"):
                await r.run(r.driver.create_proxy, "echo", "127.0.0.1:1")
            bad = parse_fault("net:slicer(average_size=4, size_variation=9)")
            with pytest.raises(ToxiproxyError, match="size_variation") as info:
                await r.run(r.driver.apply, "echo", bad, "s")
            assert "\n" not in str(info.value)
            with pytest.raises(ToxiproxyError, match="no proxy 'nope'"):
                await r.run(r.driver.remove_toxic, "nope", "x")
            await r.run(r.driver.destroy, "echo")
            with pytest.raises(ToxiproxyError):
                await r.run(r.driver.proxy, "echo")


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_an_unreachable_toxiproxy_is_one_line():
    with trio.fail_after(DEADLINE):
        driver = ToxiproxyDriver(f"http://127.0.0.1:{_unused_port()}")
        with pytest.raises(ToxiproxyError, match="reset") as info:
            await trio.to_thread.run_sync(driver.reset, abandon_on_cancel=True)
        assert "\n" not in str(info.value)


async def affected_connections(seed: int, count: int) -> set[int]:
    """Which of `count` sequential connections a 50% limit_data(1B) cut, by their bytes."""
    schedule = FaultSchedule.parse(seed, ["net:limit_data(1B)@50%"])
    fault = schedule.faults[0]
    affected = set()
    async with rig(roll=schedule_roll(schedule)) as r:
        await r.run(r.driver.apply, "echo", fault, toxic_name(0, fault))
        for call in range(1, count + 1):
            async with await r.connect() as stream:
                await stream.send_all(b"hello")
                got = await receive_all(stream, 5)
            assert got in (b"h", b"hello")
            if got == b"h":
                affected.add(call)
    return affected


async def test_the_same_seed_affects_the_same_connections():
    with trio.fail_after(DEADLINE * 2):
        first = await affected_connections(2026, 40)
        second = await affected_connections(2026, 40)
        other = await affected_connections(2027, 40)
    assert first == second
    assert 0 < len(first) < 40
    planned = FaultSchedule.parse(2026, ["net:limit_data(1B)@50%"]).resolve(40)
    assert first == {ordinal for ordinal, _ in planned}
    assert other != first


async def wait_enabled(r: Rig, enabled: bool) -> float:
    """Poll the proxy's state until it is `enabled`; the trio time it was seen."""
    while (await r.run(r.driver.proxy, "echo")).enabled is not enabled:
        await trio.sleep(0.02)
    return trio.current_time()


async def test_a_time_window_applies_the_fault_at_its_start_and_lifts_it_at_its_end():
    fault = parse_fault("net:down@t 200ms..600ms")
    with trio.fail_after(DEADLINE):
        async with rig() as r, trio.open_nursery() as nursery:
            started = trio.current_time()
            nursery.start_soon(hold_window, r.driver, "echo", fault, "down", started)
            went_down = await wait_enabled(r, False)
            came_back = await wait_enabled(r, True)
            assert went_down - started >= 0.2
            assert came_back - started >= 0.6
            await round_trip(r)


async def test_an_open_window_is_lifted_when_its_task_is_cancelled():
    fault = parse_fault("net:timeout(0)@t 0..")
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    hold_window, r.driver, "echo", fault, "hole", trio.current_time()
                )
                while "hole" not in await r.run(r.driver.toxics, "echo"):
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
            assert await r.run(r.driver.toxics, "echo") == {}
