"""The embedded fault proxy's HTTP API, driven by toxiproxy-python (the client the
harness uses against a real Toxiproxy too) over real sockets on 127.0.0.1.

toxiproxy-python is synchronous: each call runs in a worker thread while the
servers run in the test's trio loop.
"""

from __future__ import annotations

import socket

import pytest
import toxiproxy
import trio
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists
from toxiproxy_rig import port_of, rig

from chaos.toxiproxy.api import VERSION

DEADLINE = 10


async def round_trip(listen: str, payload: bytes = b"ping") -> bytes:
    async with await trio.open_tcp_stream("127.0.0.1", port_of(listen)) as stream:
        await stream.send_all(payload)
        got = b""
        while len(got) < len(payload):
            data = await stream.receive_some(65536)
            assert data, f"connection closed after {got!r}"
            got += data
        return got


async def test_create_list_get_delete_proxy():
    client = toxiproxy.Toxiproxy()
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await r.call(client.create, upstream=r.upstream, name="echo")
            assert proxy.enabled is True
            assert port_of(proxy.listen) != 0  # the bound port, not the requested :0
            assert await round_trip(proxy.listen, b"hello") == b"hello"

            listed = await r.call(client.proxies)
            assert list(listed) == ["echo"]
            assert listed["echo"].upstream == r.upstream

            shown = await r.http("GET", "/proxies/echo")
            assert shown.status_code == 200
            assert shown.json() == {
                "name": "echo",
                "listen": proxy.listen,
                "upstream": r.upstream,
                "enabled": True,
                "toxics": [],
            }

            assert await r.call(client.destroy, proxy) is True
            assert await r.call(client.proxies) == {}
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port_of(proxy.listen))


async def test_create_answers_201_and_duplicate_409():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            body = {"name": "p", "upstream": r.upstream, "listen": "127.0.0.1:0"}
            first = await r.http("POST", "/proxies", json=body)
            assert first.status_code == 201
            assert first.json()["name"] == "p"
            again = await r.http("POST", "/proxies", json=body)
            assert again.status_code == 409
            assert again.json() == {"error": "proxy already exists", "status": 409}
            # The client surfaces the same answer as its ProxyExists.
            with pytest.raises(ProxyExists):
                await r.call(APIConsumer.post, "/proxies", json=body)


async def test_unknown_proxy_and_toxic_are_404():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            for method, path in [
                ("GET", "/proxies/nope"),
                ("DELETE", "/proxies/nope"),
                ("GET", "/proxies/nope/toxics"),
                ("POST", "/proxies/nope"),
            ]:
                answer = await r.http(method, path, json={})
                assert answer.status_code == 404, (method, path)
                assert answer.json() == {"error": "proxy not found", "status": 404}
            await r.http("POST", "/proxies", json={"name": "p", "upstream": r.upstream})
            gone = await r.http("DELETE", "/proxies/p/toxics/nope")
            assert gone.status_code == 404
            assert gone.json()["error"] == "toxic not found"
            with pytest.raises(NotFound):
                await r.call(APIConsumer.get, "/proxies/nope")


async def test_bad_toxics_are_400_and_duplicate_toxic_409():
    client = toxiproxy.Toxiproxy()
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await r.call(client.create, upstream=r.upstream, name="p")
            bad = [
                {"type": "nonsense"},
                {"type": "latency", "stream": "sideways"},
                {"type": "latency", "attributes": {"latency": -5}},
                {"type": "latency", "attributes": {"latency": "slow"}},
                {"type": "latency", "attributes": {"lag": 5}},
                {"type": "latency", "toxicity": 1.5},
                {"type": "bandwidth", "attributes": {"rate": 0}},
                {"type": "slicer", "attributes": {"average_size": 0}},
            ]
            for body in bad:
                answer = await r.http("POST", "/proxies/p/toxics", json=body)
                assert answer.status_code == 400, body
                assert answer.json()["status"] == 400
            malformed = await r.http("POST", "/proxies/p/toxics", data=b"{not json")
            assert malformed.status_code == 400
            assert "bad request body" in malformed.json()["error"]
            with pytest.raises(InvalidToxic):
                await r.call(proxy.add_toxic, type="nonsense")

            await r.call(proxy.add_toxic, type="latency", attributes={"latency": 5})
            again = await r.http("POST", "/proxies/p/toxics", json={"type": "latency"})
            assert again.status_code == 409
            assert await r.call(proxy.toxics) != {}
            assert r.server.proxies["p"].toxics.keys() == {"latency_downstream"}


async def test_add_update_list_remove_toxics():
    client = toxiproxy.Toxiproxy()
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await r.call(client.create, upstream=r.upstream, name="p")
            await r.call(
                proxy.add_toxic,
                name="slow",
                type="latency",
                stream="upstream",
                toxicity=0.5,
                attributes={"latency": 30, "jitter": 5},
            )
            toxics = await r.call(proxy.toxics)
            assert list(toxics) == ["slow"]
            slow = toxics["slow"]
            assert (slow.type, slow.stream, slow.toxicity) == ("latency", "upstream", 0.5)
            assert slow.attributes == {"latency": 30, "jitter": 5}

            updated = await r.http(
                "POST", "/proxies/p/toxics/slow", json={"attributes": {"jitter": 0}}
            )
            assert updated.status_code == 200
            assert updated.json()["attributes"] == {"latency": 30, "jitter": 0}
            shown = await r.http("GET", "/proxies/p/toxics/slow")
            assert shown.json() == updated.json()

            assert await r.call(proxy.destroy_toxic, "slow") is True
            assert await r.call(proxy.toxics) == {}
            assert (await r.http("GET", "/proxies/p")).json()["toxics"] == []


async def test_reset_enables_every_proxy_and_removes_every_toxic():
    client = toxiproxy.Toxiproxy()
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            a = await r.call(client.create, upstream=r.upstream, name="a")
            b = await r.call(client.create, upstream=r.upstream, name="b")
            await r.call(a.add_toxic, type="timeout", attributes={"timeout": 0})
            await r.call(b.disable)
            assert (await r.http("GET", "/proxies/b")).json()["enabled"] is False

            answer = await r.http("POST", "/reset")
            assert answer.status_code == 204
            listed = (await r.http("GET", "/proxies")).json()
            assert {name: (p["enabled"], p["toxics"]) for name, p in listed.items()} == {
                "a": (True, []),
                "b": (True, []),
            }
            assert await round_trip(a.listen) == b"ping"
            assert await round_trip(b.listen) == b"ping"  # listening again, same port


async def test_populate_creates_and_keeps_identical_proxies():
    client = toxiproxy.Toxiproxy()
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            body = [
                {"name": "one", "upstream": r.upstream, "listen": "127.0.0.1:0"},
                {"name": "two", "upstream": r.upstream, "listen": "127.0.0.1:0"},
            ]
            answer = await r.http("POST", "/populate", json=body)
            assert answer.status_code == 201
            created = answer.json()["proxies"]
            assert [p["name"] for p in created] == ["one", "two"]
            for p in created:
                assert await round_trip(p["listen"]) == b"ping"

            # Same name and upstream, listen as bound: kept as is, same port.
            kept = [{"name": "one", "upstream": r.upstream, "listen": created[0]["listen"]}]
            again = await r.http("POST", "/populate", json=kept)
            assert again.json()["proxies"][0]["listen"] == created[0]["listen"]

            populated = await r.call(
                client.populate, [{"name": "three", "upstream": r.upstream, "listen": None}]
            )
            assert [p.name for p in populated] == ["three"]
            assert sorted(await r.call(client.proxies)) == ["one", "three", "two"]
            assert (await r.http("POST", "/populate", json={"name": "x"})).status_code == 400


async def test_version():
    client = toxiproxy.Toxiproxy()
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            assert await r.call(client.version) == VERSION.encode()
            assert await r.call(client.running) is True
            unknown = await r.http("GET", "/nothing-here")
            assert unknown.status_code == 404


async def test_disabled_proxy_refuses_and_drops_connections():
    client = toxiproxy.Toxiproxy()
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            proxy = await r.call(client.create, upstream=r.upstream, name="p")
            held = await trio.open_tcp_stream("127.0.0.1", port_of(proxy.listen))
            await held.send_all(b"x")
            assert await held.receive_some(10) == b"x"

            await r.call(proxy.disable)
            # The live connection is closed and nobody listens any more.
            try:
                rest = await held.receive_some(10)
            except trio.BrokenResourceError:
                rest = b""
            assert rest == b""
            await held.aclose()
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port_of(proxy.listen))

            await r.call(proxy.enable)
            assert await round_trip(proxy.listen) == b"ping"


async def test_unbindable_listen_address_is_500_and_not_registered():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            taken = r.upstream  # the echo server holds this port
            answer = await r.http(
                "POST", "/proxies", json={"name": "p", "upstream": r.upstream, "listen": taken}
            )
            assert answer.status_code == 500
            assert "listen" in answer.json()["error"]
            assert (await r.http("GET", "/proxies")).json() == {}


async def test_upstream_that_refuses_closes_the_client():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            with socket.socket() as placeholder:  # a port that is bound but not listening
                placeholder.bind(("127.0.0.1", 0))
                dead = f"127.0.0.1:{placeholder.getsockname()[1]}"
                answer = await r.http("POST", "/proxies", json={"name": "p", "upstream": dead})
                assert answer.status_code == 201
                async with await trio.open_tcp_stream(
                    "127.0.0.1", port_of(answer.json()["listen"])
                ) as stream:
                    assert await stream.receive_some(10) == b""


async def test_update_proxy_upstream_and_bad_values():
    with trio.fail_after(DEADLINE):
        async with rig() as r:
            body = {"name": "p", "upstream": "127.0.0.1:1"}
            created = (await r.http("POST", "/proxies", json=body)).json()
            moved = await r.http("POST", "/proxies/p", json={"upstream": r.upstream})
            assert moved.status_code == 200
            assert moved.json()["upstream"] == r.upstream
            assert await round_trip(moved.json()["listen"]) == b"ping"
            assert moved.json()["listen"] == created["listen"]
            for bad in ({"upstream": 5}, {"upstream": "no-port"}, {"enabled": "yes"}):
                answer = await r.http("POST", "/proxies/p", json=bad)
                assert answer.status_code == 400, bad


async def test_a_toxic_added_while_connections_end_is_never_a_500():
    """A connection whose last byte has gone has a nursery trio is about to close;
    a toxic added in that gap used to raise "Nursery is closed to new arrivals" in
    the API's handler, a 500 with a text body (seen in the partition phase as a
    `toxic_failed` under load). Short connections churn through the proxy while
    toxics are swapped; every API answer must be the documented one."""
    client = toxiproxy.Toxiproxy()
    with trio.fail_after(60):
        async with rig() as r, trio.open_nursery() as churn:
            await r.call(client.create, upstream=r.upstream, name="p")
            port = port_of((await r.http("GET", "/proxies/p")).json()["listen"])

            async def connect_and_leave() -> None:
                while True:
                    try:
                        stream = await trio.open_tcp_stream("127.0.0.1", port)
                    except OSError:
                        await trio.sleep(0.001)
                        continue
                    async with stream:
                        with trio.move_on_after(0.02):
                            try:
                                await stream.send_all(b"x" * 64)
                                await stream.receive_some(64)
                            except trio.BrokenResourceError:
                                resets.append(1)  # reset_peer at work: the toxic's effect

            resets: list[int] = []
            for _ in range(6):
                churn.start_soon(connect_and_leave)
            statuses = []
            for i in range(60):
                for kind, name in (("timeout", f"t{i}"), ("reset_peer", f"r{i}")):
                    added = await r.http(
                        "POST",
                        "/proxies/p/toxics",
                        json={"name": name, "type": kind, "attributes": {"timeout": 0}},
                    )
                    statuses.append(added.status_code)
                    assert added.status_code == 200, (i, kind, added.text)
                    assert added.json()["name"] == name
                await trio.sleep(0.005)
                for name in (f"t{i}", f"r{i}"):
                    removed = await r.http("DELETE", f"/proxies/p/toxics/{name}")
                    assert removed.status_code == 204, (i, name, removed.text)
            churn.cancel_scope.cancel()
    assert statuses.count(200) == 120
