"""Connection exhaustion. Idle connections past the cap, a head
trickled byte by byte, accept() out of descriptors: a real call is still answered
and recorded, nothing reaches stderr as a traceback, and each episode is one
connection.pressure event with its count (read from the ledger on disk)."""

from __future__ import annotations

import logging
import os
import resource

import trio
from test_boundary import CHAT, DEADLINE, chat

from docket.http.server_pressure import Pressure
from docket.run.hardening import raise_nofile


async def until(condition, what: str, timeout: float = 5.0) -> None:
    """Wait for `condition()` to hold, polling; fail after `timeout` seconds."""
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


def pressure(rig) -> dict[str, dict]:
    return {e["kind"]: e for e in rig.events("connection.pressure")}


async def test_idle_connections_past_the_cap_do_not_lock_a_real_call_out(
    stub_server, boundary_rig, caplog
):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as stub,
            boundary_rig({"openai": stub}, {"boundary": {"max_connections": 8}}) as rig,
        ):
            port = int(rig.url.rsplit(":", 1)[1])
            idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(20)]
            stats = rig.boundary.server_stats
            await until(lambda: stats.connections_accepted == 20, "all 20 accepted")
            await until(lambda: stats.connections_open <= 8, "the cap held")
            async with rig.client() as http:
                r = await http.post(CHAT, json=chat(max_tokens=5))
            assert r.status_code == 200
            for stream in idle:
                await stream.aclose()
    assert len(rig.events("model.response")) == 1
    (episode,) = rig.events("connection.pressure")  # one event for the whole flood
    assert episode["kind"] == "idle_closed" and episode["count"] >= 13
    assert episode["max_connections"] == 8
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_trickled_head_is_cut_at_its_total_deadline(stub_server, boundary_rig):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as stub,
            boundary_rig({"openai": stub}, {"boundary": {"request_head_timeout": 0.3}}) as rig,
        ):
            port = int(rig.url.rsplit(":", 1)[1])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            started = trio.current_time()
            await stream.send_all(b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            answer = b""
            # A header every 50 ms: each read comes well inside request_timeout (30 s),
            # so only the head's total deadline can end it.
            with trio.move_on_after(5):
                for n in range(100):
                    with trio.move_on_after(0.05):
                        data = await stream.receive_some(65536)
                        answer += data
                        if not data:
                            break
                    try:
                        await stream.send_all(b"X-Slow-%d: y\r\n" % n)
                    except trio.BrokenResourceError:
                        break
            elapsed = trio.current_time() - started
            await stream.aclose()
            async with rig.client() as http:
                r = await http.post(CHAT, json=chat(max_tokens=5))
            assert r.status_code == 200
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert b"request_timeout" in answer  # in the provider's shape
    assert 0.3 <= elapsed < 5  # the head's deadline, not request_timeout's 30 s per read
    (episode,) = rig.events("connection.pressure")
    assert episode["kind"] == "head_timeout" and episode["count"] == 1


async def test_accept_out_of_descriptors_is_an_event_and_readiness_not_a_traceback(
    stub_server, boundary_rig, caplog
):
    caplog.set_level(logging.DEBUG)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as stub,
            boundary_rig({"openai": stub}) as rig,
            rig.client() as http,
        ):
            port = int(rig.url.rsplit(":", 1)[1])
            stats = rig.boundary.server_stats
            used = len(os.listdir("/proc/self/fd"))
            resource.setrlimit(resource.RLIMIT_NOFILE, (used + 16, hard))
            try:
                while True:  # every descriptor taken...
                    try:
                        fillers.append(os.open("/dev/null", os.O_RDONLY))
                    except OSError:
                        break
                os.close(fillers.pop())  # ...but one, for the client's end
                client = await trio.open_tcp_stream("127.0.0.1", port)
                await until(lambda: stats.accept_failing is not None, "accept to fail")
                problems = rig.boundary.ops.readiness_problems()
                assert any(p.startswith("accepting connections: EMFILE") for p in problems)
            finally:
                for fd in fillers:
                    os.close(fd)
                fillers.clear()
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            await until(lambda: stats.accept_failing is None, "accept to recover")
            r = await http.post(CHAT, json=chat(max_tokens=5))
            assert r.status_code == 200
            assert not [p for p in rig.boundary.ops.readiness_problems() if "accepting" in p]
            await client.aclose()
    assert len(rig.events("model.response")) == 1
    episode = pressure(rig)["accept_failed"]
    assert episode["detail"] == "EMFILE" and episode["count"] >= 1
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_pressure_episodes_coalesce_and_end_when_quiet():
    p = Pressure(quiet=1.0, longest=10.0)
    assert p.note("over_cap", 0.0) is True
    assert [p.note("over_cap", t / 10) for t in range(1, 10)] == [False] * 9
    assert p.due(1.5) == [] and abs(p.next_end() - 1.9) < 1e-9
    (episode,) = p.due(2.0)
    assert episode.as_fields() == {"kind": "over_cap", "count": 10, "seconds": 0.9}
    reported = []
    for t in range(30):  # a flood with no pause is still reported every `longest`
        reported += p.due(20 + t * 0.5)
        p.note("head_timeout", 20 + t * 0.5)
    assert [e.count for e in reported] == [20]


def test_nofile_is_raised_to_the_hard_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        assert raise_nofile() == (256, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
