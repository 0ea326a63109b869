"""The forward proxy over real sockets on 127.0.0.1: `respond.tunnel` in the h11
server, then the boundary's proxy handler driven by httpx configured with the
boundary as its proxy and by raw CONNECT clients, with every event read back
from the ledger's bytes on disk. Each test starts its servers in a nursery of
its own, stops them, and is bounded by trio.fail_after."""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from conftest import TOKEN
from helpers import read_events, serving

from docket.boundary.app import Boundary
from docket.boundary.proxy import (
    ProxyConfig,
    handle_proxy,
    hop_filtered,
    is_proxy_request,
    parse_target,
    proxy_env,
    proxy_token,
)
from docket.clock import Clock
from docket.http.server import serve
from docket.ledger.writer import open_ledger
from docket.policy import policy_from_dict

DEADLINE = 15


# ---------------------------------------------------------------- rigs


@dataclass
class TcpServer:
    port: int
    accepted: int = 0
    received: int = 0
    resets: int = 0
    closed: trio.Event = field(default_factory=trio.Event)  # a connection has ended


@asynccontextmanager
async def echo_server() -> AsyncIterator[TcpServer]:
    """A TCP server that echoes what it receives until EOF, then closes; it counts."""
    server = TcpServer(0)

    async def echo(stream: trio.SocketStream) -> None:
        server.accepted += 1
        try:
            while data := await stream.receive_some(65536):
                server.received += len(data)
                await stream.send_all(data)
        except trio.BrokenResourceError:
            server.resets += 1  # the tunnel was torn down mid-stream
        finally:
            server.closed.set()

    async with serving(partial(trio.serve_tcp, echo, 0, host="127.0.0.1")) as (listeners, _):
        server.port = listeners[0].socket.getsockname()[1]
        yield server


class Watch:
    """A ledger observer: lets a test wait until an event is durable."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self._changed = trio.Event()

    def __call__(self, event: dict) -> None:
        self.events.append(event)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, type: str, count: int = 1) -> None:
        while sum(e["type"] == type for e in self.events) < count:
            await self._changed.wait()


@dataclass
class ProxyRig:
    port: int
    url: str
    ledger_path: Path
    watch: Watch
    cancel: Callable[[], None]
    direct_targets: list[bytes]  # targets of requests the boundary's own router served
    stops: list

    def proxy_url(self, token: str | None = TOKEN) -> str:
        return f"http://docket:{token}@127.0.0.1:{self.port}" if token else self.url

    def events(self, type: str) -> list[dict]:
        return [e for e in read_events(self.ledger_path) if e["type"] == type]


@asynccontextmanager
async def proxy_rig(tmp_path: Path, allow: list[str], *, idle: float | None = None):
    """A Boundary whose proxy handler is served the way app.py routes to it."""
    policy = policy_from_dict({"egress": {"allow": allow}}, source="<test>")
    path = tmp_path / "ledger.jsonl"
    watch = Watch()
    direct: list[bytes] = []
    stops: list = []
    config = ProxyConfig(idle_timeout=idle)
    async with open_ledger(path, limits=policy.ledger_limits(), observers=[watch]) as ledger:
        boundary = Boundary(policy, ledger, token=TOKEN, clock=Clock(), stop=stops.append, env={})

        async def handler(request, respond):
            if is_proxy_request(request.method, request.target, boundary.url):
                await handle_proxy(boundary, request, respond, config)
            else:
                direct.append(request.target)
                await boundary.handle(request, respond)

        async with serving(partial(serve, handler)) as (listening, cancel):
            boundary.url = listening.url
            yield ProxyRig(listening.port, listening.url, path, watch, cancel, direct, stops)


def basic(token: str) -> str:
    return base64.b64encode(f"docket:{token}".encode()).decode()


async def open_tunnel(proxy_port: int, target: str, *, early: bytes = b"", token: str = TOKEN):
    """A raw CONNECT (with `early` bytes in the same write as its head): the
    stream, the response head, and any bytes after it."""
    stream = await trio.open_tcp_stream("127.0.0.1", proxy_port)
    head = (
        f"CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n"
        f"proxy-authorization: Basic {basic(token)}\r\n\r\n"
    ).encode()
    await stream.send_all(head + early)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, f"the proxy closed before answering: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return stream, head, rest


async def read_exactly(stream: trio.abc.Stream, n: int, already: bytes = b"") -> bytes:
    data = already
    while len(data) < n:
        chunk = await stream.receive_some(65536)
        assert chunk, f"EOF after {len(data)} of {n} bytes"
        data += chunk
    return data


async def read_to_eof(stream: trio.abc.Stream) -> bytes:
    data = bytearray()
    while chunk := await stream.receive_some(65536):
        data += chunk
    return bytes(data)


def unused_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- respond.tunnel


async def test_tunnel_hands_over_the_raw_stream_with_the_bytes_sent_early():
    async def upper(request, respond):
        stream, leftover = await respond.tunnel()
        await stream.send_all(leftover.upper())
        while data := await stream.receive_some(65536):
            await stream.send_all(data.upper())

    with trio.fail_after(DEADLINE):
        async with serving(partial(serve, upper)) as (server, _):
            stream, head, rest = await open_tunnel(server.port, "x.test:443", early=b"early;")
            assert head.startswith(b"HTTP/1.1 200 ")
            assert b"content-length" not in head.lower() and b"transfer-encoding" not in head
            assert await read_exactly(stream, 6, rest) == b"EARLY;"
            await stream.send_all(b"then more")
            assert await read_exactly(stream, 9) == b"THEN MORE"
            await stream.send_eof()
            assert await read_to_eof(stream) == b""  # the server closed after the handler
            await stream.aclose()
            assert server.stats.handler_errors == 0


async def test_tunnel_is_only_for_a_connect_and_only_with_2xx():
    seen: list[str] = []

    async def misuse(request, respond):
        for status in (200, 403) if request.method == "CONNECT" else (200,):
            try:
                await respond.tunnel(status) if status != 200 else await respond.tunnel()
            except (RuntimeError, ValueError) as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
                continue
        await respond.simple(418, body=b"no tunnel")

    with trio.fail_after(DEADLINE):
        async with serving(partial(serve, misuse)) as (server, _):
            async with httpx.AsyncClient() as http:
                r = await http.get(f"{server.url}/")
            assert r.status_code == 418
    assert seen == ["RuntimeError: tunnel() answers a CONNECT, not a GET"]


async def test_a_refused_connect_leaves_the_connection_usable_for_the_next_request():
    async def refuse_then_serve(request, respond):
        if request.method == "CONNECT":
            await respond.simple(403, body=b"not here")
        else:
            await respond.simple(200, body=b"served " + request.target)

    with trio.fail_after(DEADLINE):
        async with serving(partial(serve, refuse_then_serve)) as (server, _):
            stream, head, rest = await open_tunnel(server.port, "x.test:443")
            assert head.startswith(b"HTTP/1.1 403")
            assert await read_exactly(stream, 8, rest) == b"not here"
            await stream.send_all(b"GET /next HTTP/1.1\r\nhost: x\r\n\r\n")
            data = b""
            while not data.endswith(b"served /next"):
                chunk = await stream.receive_some(65536)
                assert chunk
                data += chunk
            assert data.startswith(b"HTTP/1.1 200")
            await stream.aclose()
            assert server.stats.connections_accepted == 1


# ---------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    "method, target, expected",
    [
        ("CONNECT", b"api.example.com:443", ("api.example.com", 443, None, "")),
        ("CONNECT", b"[::1]:8443", ("::1", 8443, None, "")),
        ("GET", b"http://Example.com/a/b?c=d", ("example.com", 80, "http", "/a/b?c=d")),
        ("POST", b"HTTP://example.com:8080", ("example.com", 8080, "http", "/")),
        ("GET", b"https://[::1]/x", ("::1", 443, "https", "/x")),
        ("GET", b"http://user:pw@example.com/", ("example.com", 80, "http", "/")),
    ],
)
def test_parse_target(method, target, expected):
    t = parse_target(method, target)
    assert (t.host, t.port, t.scheme, t.path) == expected


@pytest.mark.parametrize(
    "method, target, message",
    [
        ("CONNECT", b"api.example.com", "host:port"),
        ("CONNECT", b":443", "host:port"),
        ("CONNECT", b"::1:443", "needs [brackets]"),
        ("CONNECT", b"example.com:0", "1-65535"),
        ("CONNECT", b"example.com:https", "1-65535"),
        ("GET", b"/relative", "absolute http(s) URL"),
        ("GET", b"ftp://example.com/", "absolute http(s) URL"),
        ("GET", b"http:///nohost", "no host"),
        ("GET", b"http://example.com:99999/", "not a URL"),
    ],
)
def test_parse_target_refuses_what_is_not_a_target(method, target, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_target(method, target)


def test_is_proxy_request_leaves_the_boundarys_own_routes_to_its_router():
    own = "http://127.0.0.1:7000"
    assert is_proxy_request("CONNECT", b"127.0.0.1:7000", own)
    assert is_proxy_request("GET", b"http://127.0.0.1:7001/openai/v1", own)
    assert is_proxy_request("GET", b"http://example.com/", own)
    assert is_proxy_request("GET", b"http://127.0.0.1:bad/", own)  # refused by the proxy, by name
    assert not is_proxy_request("GET", b"http://127.0.0.1:7000/openai/v1/chat", own)
    assert not is_proxy_request("POST", b"http://u:pw@127.0.0.1:7000/openai/v1", own)
    assert not is_proxy_request("POST", b"/openai/v1/chat/completions", own)


def test_proxy_token_reads_basic_and_bearer_credentials():
    assert proxy_token([(b"proxy-authorization", f"Basic {basic('t0k')}".encode())]) == "t0k"
    assert proxy_token([(b"proxy-authorization", b"Bearer t0k")]) == "t0k"
    assert proxy_token([(b"proxy-authorization", b"Basic !!notbase64")]) is None
    assert proxy_token([(b"proxy-authorization", b"Basic " + base64.b64encode(b"nocolon"))]) is None
    assert proxy_token([(b"authorization", b"Bearer t0k")]) is None  # the origin's, not ours


def test_hop_filtered_drops_hop_headers_and_those_connection_names():
    headers = [
        (b"host", b"a"),
        (b"connection", b"keep-alive, x-secret-hop"),
        (b"x-secret-hop", b"1"),
        (b"proxy-authorization", b"Basic abc"),
        (b"transfer-encoding", b"chunked"),
        (b"content-length", b"3"),
        (b"authorization", b"Bearer origin-credential"),
    ]
    assert hop_filtered(headers) == [
        (b"content-length", b"3"),
        (b"authorization", b"Bearer origin-credential"),
    ]


def test_proxy_env_points_every_client_at_the_boundary_but_the_boundary_itself():
    env = proxy_env("http://127.0.0.1:7000", "tok/en")
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://docket:tok%2Fen@127.0.0.1:7000"
    assert env["HTTP_PROXY"] == env["http_proxy"] == env["HTTPS_PROXY"]
    assert env["NO_PROXY"] == env["no_proxy"] == "127.0.0.1:7000"
    with pytest.raises(ValueError, match="boundary URL"):
        proxy_env("127.0.0.1:7000", "t")


# ---------------------------------------------------------------- the proxy over sockets


async def test_an_allowed_connect_tunnels_both_ways_and_records_what_crossed(tmp_path):
    payload = os.urandom(300_000)
    early = b"sent with the CONNECT head;"
    with trio.fail_after(DEADLINE):
        async with echo_server() as echo, proxy_rig(tmp_path, [f"127.0.0.1:{echo.port}"]) as rig:
            stream, head, rest = await open_tunnel(rig.port, f"127.0.0.1:{echo.port}", early=early)
            assert head.startswith(b"HTTP/1.1 200 ")

            async def send():
                await stream.send_all(payload)
                await stream.send_eof()  # half-close: the echo still owes us the rest

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                echoed = rest + await read_to_eof(stream)
            assert echoed == early + payload
            await stream.aclose()
            await rig.watch.wait_for("net.connect")
    (event,) = rig.events("net.connect")
    crossed = len(early) + len(payload)
    assert echo.received == crossed
    assert event["bytes_up"] == crossed and event["bytes_down"] == crossed
    assert {k: event[k] for k in ("host", "port", "method", "mode", "rule", "status", "ended")} == {
        "host": "127.0.0.1",
        "port": echo.port,
        "method": "CONNECT",
        "mode": "tunnel",
        "rule": "egress.allow[0]",
        "status": 200,
        "ended": "client_closed",
    }
    assert event["duration_ms"] >= 0
    assert rig.events("net.denied") == []


async def test_httpx_is_refused_a_tunnel_to_a_port_not_allowed_and_nothing_connects(tmp_path):
    with trio.fail_after(DEADLINE):
        async with (
            echo_server() as allowed,
            echo_server() as other,
            proxy_rig(tmp_path, [f"127.0.0.1:{allowed.port}"]) as rig,
        ):
            async with httpx.AsyncClient(proxy=rig.proxy_url()) as http:
                with pytest.raises(httpx.ProxyError, match="403"):
                    await http.get(f"https://127.0.0.1:{other.port}/")
            await rig.watch.wait_for("net.denied")
    assert other.accepted == 0 and allowed.accepted == 0
    (event,) = rig.events("net.denied")
    assert {k: event[k] for k in ("host", "port", "method", "rule")} == {
        "host": "127.0.0.1",
        "port": other.port,
        "method": "CONNECT",
        "rule": "egress.allow",
    }
    assert event["reason"] == (
        f"127.0.0.1:{other.port}: only 127.0.0.1:{allowed.port} is allowed for this host"
    )
    assert rig.events("net.connect") == []


async def test_httpx_reaches_an_allowed_https_server_through_the_tunnel(tmp_path, tls_files):
    """What an agent that bypasses its base URL looks like: TLS the boundary cannot
    read, recorded as a connection to that host, not as a model call."""
    cert, key = tls_files
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def secret(request, respond):
        await respond.simple(200, body=b"over TLS: " + await request.read_body())

    with trio.fail_after(DEADLINE):
        async with (
            serving(partial(serve, secret, ssl_context=server_context)) as (upstream, _),
            proxy_rig(tmp_path, [f"127.0.0.1:{upstream.port}"]) as rig,
        ):
            client_context = ssl.create_default_context(cafile=str(cert))
            async with httpx.AsyncClient(proxy=rig.proxy_url(), verify=client_context) as http:
                r = await http.post(f"https://127.0.0.1:{upstream.port}/v1/x", content=b"hi")
            assert (r.status_code, r.content) == (200, b"over TLS: hi")
            await rig.watch.wait_for("net.connect")
    (event,) = rig.events("net.connect")
    assert (event["host"], event["port"], event["mode"]) == ("127.0.0.1", upstream.port, "tunnel")
    # A TLS handshake and one exchange: more bytes each way than the plaintext carried.
    assert event["bytes_up"] > 100 and event["bytes_down"] > 100
    assert event["ended"] in ("client_closed", "client_reset")
    assert rig.events("model.request") == []


async def test_an_absolute_form_request_is_forwarded_and_recorded(tmp_path):
    seen: list = []
    answer = os.urandom(5000)

    async def upstream_handler(request, respond):
        body = await request.read_body()
        seen.append((request.method, request.target, dict(request.headers), body))
        await respond.simple(200, [(b"x-upstream", b"yes")], answer)

    with trio.fail_after(DEADLINE):
        async with serving(partial(serve, upstream_handler)) as (upstream, _):
            async with proxy_rig(tmp_path, [f"127.0.0.1:{upstream.port}"]) as rig:
                async with httpx.AsyncClient(proxy=rig.proxy_url()) as http:
                    r = await http.post(
                        f"http://127.0.0.1:{upstream.port}/p/q?token=abc&x=1",
                        content=b"b" * 1234,
                        headers={"authorization": "Bearer origin-key"},
                    )
                assert r.status_code == 200 and r.content == answer
                assert r.headers["x-upstream"] == "yes"
                await rig.watch.wait_for("net.connect")
            raw = rig.ledger_path.read_bytes()
    ((method, target, headers, body),) = seen
    assert (method, target, body) == ("POST", b"/p/q?token=abc&x=1", b"b" * 1234)
    assert headers[b"host"] == f"127.0.0.1:{upstream.port}".encode()
    assert headers[b"authorization"] == b"Bearer origin-key"  # the agent's own, passed on
    assert b"proxy-authorization" not in headers  # the run token stops at the proxy
    (event,) = rig.events("net.connect")
    assert {k: event[k] for k in ("method", "mode", "status", "bytes_up", "bytes_down")} == {
        "method": "POST",
        "mode": "forward",
        "status": 200,
        "bytes_up": 1234,
        "bytes_down": len(answer),
    }
    assert event["ended"] == "complete"
    assert event["url"].startswith(f"http://127.0.0.1:{upstream.port}/p/q?")
    assert "abc" not in event["url"]  # a secret-looking query value is not copied
    assert TOKEN.encode() not in raw


async def test_an_absolute_form_request_to_a_host_not_allowed_gets_403_naming_the_rule(tmp_path):
    with trio.fail_after(DEADLINE):
        async with echo_server() as other, proxy_rig(tmp_path, ["pypi.org"]) as rig:
            async with httpx.AsyncClient(proxy=rig.proxy_url()) as http:
                r = await http.get(f"http://127.0.0.1:{other.port}/x")
            await rig.watch.wait_for("net.denied")
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["type"] == "docket_egress_denied" and error["rule"] == "egress.allow"
    assert other.accepted == 0
    (event,) = rig.events("net.denied")
    assert (event["method"], event["port"], event["rule"]) == ("GET", other.port, "egress.allow")
    assert event["url"] == f"http://127.0.0.1:{other.port}/x"


async def test_the_proxy_wants_the_run_token(tmp_path):
    with trio.fail_after(DEADLINE):
        async with echo_server() as echo, proxy_rig(tmp_path, [f"127.0.0.1:{echo.port}"]) as rig:
            async with httpx.AsyncClient(proxy=rig.proxy_url(token=None)) as http:
                r = await http.get(f"http://127.0.0.1:{echo.port}/")
            assert r.status_code == 407
            assert r.headers["proxy-authenticate"] == 'Basic realm="docket"'
            stream, head, _ = await open_tunnel(rig.port, f"127.0.0.1:{echo.port}", token="wrong")
            assert head.startswith(b"HTTP/1.1 407")
            await stream.aclose()
            await rig.watch.wait_for("net.denied", 2)
    assert echo.accepted == 0
    assert [(e["method"], e["rule"]) for e in rig.events("net.denied")] == [
        ("GET", "auth"),
        ("CONNECT", "auth"),
    ]


async def test_an_idle_tunnel_is_closed_after_the_bound(tmp_path):
    with trio.fail_after(DEADLINE):
        async with (
            echo_server() as echo,
            proxy_rig(tmp_path, [f"127.0.0.1:{echo.port}"], idle=0.3) as rig,
        ):
            stream, head, _ = await open_tunnel(rig.port, f"127.0.0.1:{echo.port}")
            assert head.startswith(b"HTTP/1.1 200")
            await stream.send_all(b"ping")
            assert await read_exactly(stream, 4) == b"ping"
            started = trio.current_time()
            assert await read_to_eof(stream) == b""  # nothing moves: the proxy hangs up
            assert trio.current_time() - started >= 0.25
            await stream.aclose()
            await rig.watch.wait_for("net.connect")
    (event,) = rig.events("net.connect")
    assert (event["ended"], event["bytes_up"], event["bytes_down"]) == ("idle_timeout", 4, 4)


async def test_an_allowed_port_with_nothing_listening_gets_502_and_a_record(tmp_path):
    port = unused_port()
    with trio.fail_after(DEADLINE):
        async with proxy_rig(tmp_path, [f"127.0.0.1:{port}"]) as rig:
            stream, head, rest = await open_tunnel(rig.port, f"127.0.0.1:{port}")
            assert head.startswith(b"HTTP/1.1 502")
            await stream.aclose()
            await rig.watch.wait_for("net.connect")
    (event,) = rig.events("net.connect")
    assert (event["status"], event["ended"], event["bytes_up"]) == (502, "connect_error", 0)
    assert f"127.0.0.1:{port}" in event["detail"]


async def test_a_tunnel_open_when_the_boundary_stops_is_still_recorded(tmp_path):
    with trio.fail_after(DEADLINE):
        async with echo_server() as echo, proxy_rig(tmp_path, [f"127.0.0.1:{echo.port}"]) as rig:
            stream, head, _ = await open_tunnel(rig.port, f"127.0.0.1:{echo.port}")
            await stream.send_all(b"12345")
            assert await read_exactly(stream, 5) == b"12345"
            rig.cancel()  # the run is stopping
            assert await read_to_eof(stream) == b""
            await stream.aclose()
            await rig.watch.wait_for("net.connect")
    (event,) = rig.events("net.connect")
    assert (event["ended"], event["bytes_up"], event["bytes_down"]) == ("cancelled", 5, 5)


async def test_proxy_env_sends_other_traffic_through_the_proxy_and_not_the_boundarys_own(
    tmp_path, monkeypatch
):
    async def hello(request, respond):
        await respond.simple(200, body=b"hello")

    with trio.fail_after(DEADLINE):
        async with (
            serving(partial(serve, hello)) as (upstream, _),
            proxy_rig(tmp_path, [f"127.0.0.1:{upstream.port}"]) as rig,
        ):
            for name, value in proxy_env(rig.url, TOKEN).items():
                monkeypatch.setenv(name, value)
            async with httpx.AsyncClient() as http:  # trust_env: reads the variables
                own = await http.get(f"{rig.url}/docket/healthz")
                other = await http.get(f"{upstream.url}/elsewhere")
            assert (own.status_code, json.loads(own.content)) == (200, {"status": "alive"})
            assert (other.status_code, other.content) == (200, b"hello")
            await rig.watch.wait_for("net.connect")
    assert rig.direct_targets == [b"/docket/healthz"]  # origin form: not through the proxy
    (event,) = rig.events("net.connect")
    assert (event["port"], event["url"]) == (upstream.port, f"{upstream.url}/elsewhere")


def test_an_allow_entry_the_rule_cannot_use_is_refused_when_the_policy_loads():
    # "127.1" is an address in disguise: the loader uses the rule's own parser, so the
    # policy is refused by key path before any proxy could meet the entry.
    from docket.errors import InputError
    from docket.policy import policy_from_dict

    with pytest.raises(InputError, match=r"egress\.allow\[0\]"):
        policy_from_dict({"egress": {"allow": ["127.1"]}}, source="p.toml")
