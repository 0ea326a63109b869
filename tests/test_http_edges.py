"""Malformed HTTP at its edges is the
client's fault, answered 4xx in the provider's own error shape, never a 500.

- A chunked body that breaks its framing (a size not in hex, a size past any
  integer, a chunk longer than its size) or stops arriving: 400 (408) in the
  provider's shape, recorded as policy.denied rule bad_request; no model.request.
- A JSON body with a lone surrogate, or not in UTF-8 (UTF-16, UTF-32, a BOM): 400
  with its policy.denied, by either JSON reader (jiter, the standard library).
- A Host header with an invalid value (RFC 9112 3.2): 400, for every request.
- The answers the HTTP server makes itself (a bad request line or header, 408,
  413, 431, 500) take the application's error shape when it gives one
  (ServerConfig.error_shape); the boundary gives the provider's.

Real sockets on 127.0.0.1, each test bounded by trio.fail_after; the ledger is
read back from its bytes.
"""

from __future__ import annotations

import functools
import json

import pytest
import trio
from conftest import TOKEN
from hypothesis import example, given
from hypothesis import strategies as st

from docket.boundary import app as boundary_app
from docket.boundary.providers import base
from docket.http.host import valid_host
from docket.http.server import serve
from docket.http.server_connection import ServerConfig

DEADLINE = 20
CHAT = b"/openai/v1/chat/completions"
MESSAGES = b"/anthropic/v1/messages"
GOOD = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

UNKNOWN_SECRET = b"sk-live-nobody-told-docket-about-this-0f3c"
BAD_CHUNKS = {
    "chunk size not hex": b"zz\r\nhello\r\n0\r\n\r\n",
    # The refused bytes are not copied into the record: the redactor knows only the
    # run's own secrets, and a chunk header can carry anything.
    "chunk header holding a secret": UNKNOWN_SECRET + b"\r\nhello\r\n0\r\n\r\n",
    "chunk size overflow": b"f" * 40 + b"\r\nhello\r\n0\r\n\r\n",
    "chunk longer than its size": b"5\r\nhelloXX\r\n0\r\n\r\n",
}


def request(
    body: bytes = b"",
    *,
    target: bytes = CHAT,
    host: bytes = b"127.0.0.1",
    method: bytes = b"POST",
    chunked: bool = False,
    extra: tuple[bytes, ...] = (),
    length: int | None = None,
) -> bytes:
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: " + host]
    lines += [b"Authorization: Bearer " + TOKEN.encode(), b"Content-Type: application/json"]
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
    elif method == b"POST":
        lines.append(b"Content-Length: %d" % (len(body) if length is None else length))
    lines += extra
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class Answer:
    def __init__(self, data: bytes) -> None:
        head, _, self.body = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split()[1]) if lines[0].startswith(b"HTTP/1.1 ") else None
        self.headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower()] = value.strip()

    def error(self) -> dict:
        assert self.headers[b"content-type"] == b"application/json", self.headers
        return json.loads(self.body)


async def exchange(port: int, data: bytes, *, keep_open: bool = False) -> Answer:
    """Send raw bytes; read one whole answer (to its content-length, or to the close)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        got = b""
        while True:
            head, sep, rest = got.partition(b"\r\n\r\n")
            if sep:
                answer = Answer(got)
                size = answer.headers.get(b"content-length")
                if size is not None and len(rest) >= int(size):
                    return answer
            chunk = await stream.receive_some(65536)
            if not chunk:
                return Answer(got)
            got += chunk


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def no_internal_error(events: list[dict]) -> bool:
    return not any(
        e.get("reason") == "internal_error" or e.get("rule") == "internal_error" for e in events
    )


# ---------------------------------------------------------------- 1. a body that breaks framing


async def test_a_body_that_breaks_chunked_framing_is_a_400_in_the_providers_shape(
    stub_server, boundary_rig
):
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as up, boundary_rig({"openai": up}) as rig:
            port = port_of(rig.url)
            answers = {
                name: await exchange(port, request(body, chunked=True))
                for name, body in BAD_CHUNKS.items()
            }
            served = await exchange(port, request(json.dumps(GOOD).encode()))
            forwarded = len(up.log)
        events = rig.events()
        raw = rig.raw()
    assert served.status == 200
    assert forwarded == 1  # only the well-formed call went upstream
    assert UNKNOWN_SECRET not in raw
    for name, answer in answers.items():
        assert answer.status == 400, (name, answer.status, answer.body)
        assert answer.headers[b"connection"] == b"close"
        error = answer.error()["error"]
        assert error["type"] == "docket_bad_request" and error["code"] == "bad_framing", name
        assert "malformed request body" in error["message"]
    denied = [e for e in events if e["type"] == "policy.denied"]
    assert len(denied) == len(BAD_CHUNKS)
    for event in denied:
        assert event["rule"] == "bad_request" and event["code"] == "bad_framing"
        assert event["error_type"] == "docket_bad_request"
        assert "malformed request body" in event["reason"]
    assert [e["type"] for e in events].count("model.request") == 1
    assert no_internal_error(events)


async def test_a_body_that_stops_arriving_is_a_408_in_the_providers_shape(
    stub_server, boundary_rig, monkeypatch
):
    """The request timeout, shortened for the test, cuts a body that stalls: the
    client's fault too (408), recorded, never an internal error."""
    monkeypatch.setattr(
        boundary_app, "ServerConfig", functools.partial(ServerConfig, request_timeout=0.5)
    )
    body = json.dumps(GOOD).encode()
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as up, boundary_rig({"openai": up}) as rig:
            answer = await exchange(port_of(rig.url), request(body, length=len(body) + 50))
            forwarded = len(up.log)
        events = rig.events()
    assert answer.status == 408, answer.body
    error = answer.error()["error"]
    assert error["type"] == "docket_bad_request" and error["code"] == "request_timeout"
    assert forwarded == 0
    calls = [e for e in events if e["type"] in ("policy.denied", "model.request")]
    assert [(e["type"], e.get("rule"), e.get("code")) for e in calls] == [
        ("policy.denied", "bad_request", "request_timeout")
    ]


# ---------------------------------------------------------------- 2, 3. JSON text that is not


NOT_TEXT = {
    # name: (body, the refusal's code)
    "lone surrogate": (
        b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"\\ud800"}]}',
        "bad_unicode",
    ),
    "lone low surrogate in a name": (
        b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi","\\uDC01":1}]}',
        "bad_unicode",
    ),
    "UTF-16": (json.dumps(GOOD).encode("utf-16"), "not_utf8"),
    "UTF-16-LE, no BOM": (json.dumps(GOOD).encode("utf-16-le"), "not_utf8"),
    "UTF-32": (json.dumps(GOOD).encode("utf-32"), "not_utf8"),
    "UTF-8 with a BOM": (b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), "byte_order_mark"),
}


@pytest.fixture(params=["jiter", "stdlib"])
def request_parser(request, monkeypatch):
    """Each reader of request bodies in turn: jiter (when installed), the standard library."""
    if request.param == "jiter" and base.jiter is None:
        pytest.skip("jiter is not installed")
    if request.param == "stdlib":
        monkeypatch.setattr(base, "jiter", None)
    return request.param


async def test_json_that_is_not_utf8_text_is_refused_in_the_providers_shape(
    request_parser, stub_server, boundary_rig
):
    # A proper surrogate pair, escaped, is text: it is read and forwarded.
    paired = json.dumps(GOOD).replace("hi", "\\ud83d\\ude00").encode()
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as up, boundary_rig({"openai": up}) as rig:
            port = port_of(rig.url)
            answers = {name: await exchange(port, request(b)) for name, (b, _) in NOT_TEXT.items()}
            served = await exchange(port, request(paired))
            forwarded = len(up.log)
        events = rig.events()
    assert served.status == 200, served.body
    assert forwarded == 1
    denied = [e for e in events if e["type"] == "policy.denied"]
    assert len(denied) == len(NOT_TEXT)
    for (name, (_, code)), event in zip(NOT_TEXT.items(), denied, strict=True):
        answer = answers[name]
        assert answer.status == 400, (name, answer.status, answer.body)
        error = answer.error()["error"]
        assert error["type"] == "docket_bad_request" and error["code"] == code, (name, error)
        assert event["rule"] == "bad_request" and event["code"] == code, (name, event)
    assert [e["type"] for e in events].count("model.request") == 1
    assert no_internal_error(events)


@pytest.mark.parametrize("name", list(NOT_TEXT))
def test_the_request_reader_refuses_what_is_not_utf8_text(request_parser, name):
    body, code = NOT_TEXT[name]
    with pytest.raises(base.BadRequest) as caught:
        base.parse_json_object(body, "request body")
    assert caught.value.code == code
    assert "\n" not in caught.value.message


# ---------------------------------------------------------------- 4. Host


_REG_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;="
_BAD_CHARS = [chr(c) for c in range(0x20)] + list(' "<>\\^`{|}@/?#\x7f') + ["\x80", "\xe9", "\xff"]
_ports = st.none() | st.integers(0, 99999).map(str) | st.just("")
_reg_names = st.text(_REG_CHARS, max_size=30) | st.ip_addresses(v=4).map(str)
_ipv6 = st.ip_addresses(v=6).map(lambda a: f"[{a}]")


def _with_port(host: str, port: str | None) -> bytes:
    return (host if port is None else f"{host}:{port}").encode("latin-1")


@given(host=_reg_names | _ipv6, port=_ports)
@example(host="", port=None)  # RFC 9112 3.2: a target without an authority sends Host empty
@example(host="[v1.fe80::a+en1]", port="80")  # an IPvFuture literal
@example(host="caf%C3%A9.example", port=None)
def test_a_valid_host_is_taken(host, port):
    assert valid_host(_with_port(host, port))


@given(host=_reg_names | _ipv6, port=_ports, bad=st.sampled_from(_BAD_CHARS), at=st.integers(0))
@example(host="a b", port=None, bad=" ", at=0)
def test_a_host_with_a_character_it_may_not_hold_is_refused(host, port, bad, at):
    value = _with_port(host, port).decode("latin-1")
    at %= len(value) + 1
    assert not valid_host((value[:at] + bad + value[at:]).encode("latin-1"))


@pytest.mark.parametrize(
    "value",
    [b"[::1", b"::1", b"::1:443", b"[::1]:x", b"[1.2.3.4]", b"[:::]", b"example.com:8o",
     b"a:1:2", b"%zz", b"%4", b"user@host", b"[::1]]", b"[]"],
)  # fmt: skip
def test_a_malformed_host_is_refused(value):
    assert not valid_host(value)


async def _hello(request, respond):
    await respond.simple(200, [(b"content-type", b"text/plain")], b"hello")


async def test_every_request_with_an_invalid_host_is_a_400_and_reaches_no_handler():
    seen = []

    async def handler(request, respond):
        seen.append(request.header(b"host"))
        await _hello(request, respond)

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(serve, handler)
            refused = [
                await exchange(server.port, request(target=b"/x", host=h, method=b"GET"))
                for h in (b"a b", b"a@b", b"[::1", b"x/y", b"a\x80")
            ]
            taken = [
                await exchange(server.port, request(target=b"/x", host=h, method=b"GET"))
                for h in (b"", b"example.com:8080", b"[::1]:80", b"127.0.0.1")
            ]
            nursery.cancel_scope.cancel()
    for answer in refused:
        assert answer.status == 400
        assert answer.headers[b"content-type"].startswith(b"text/plain")  # the default shape
        assert answer.body.startswith(b"invalid Host header")
    assert [a.status for a in taken] == [200] * 4
    assert seen == [b"", b"example.com:8080", b"[::1]:80", b"127.0.0.1"]


# ---------------------------------------------------------------- 5. the server's own answers


async def test_the_servers_own_answers_take_the_applications_shape():
    shaped = []

    def shape(status, code, message, target):
        shaped.append((status, code, target))
        return b"application/x-test", json.dumps({"status": status, "code": code}).encode()

    async def handler(request, respond):
        if request.target == b"/read":
            await request.read_body()  # a framing error raises, uncaught: the server answers
        if request.target == b"/raise":
            raise RuntimeError("a bug")
        await _hello(request, respond)

    config = ServerConfig(error_shape=shape, request_timeout=0.5, max_header_bytes=4096)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(functools.partial(serve, handler, config=config))
            port = server.port
            answers = [
                await exchange(port, b"GARBAGE\r\n\r\n"),
                await exchange(port, request(target=b"/h", extra=(b"Bad Name: 1",))),
                await exchange(port, request(target=b"/h", host=b"a b")),
                await exchange(port, request(target=b"/h", extra=(b"X-Big: " + b"a" * 5000,))),
                await exchange(port, request(b"zz\r\n", target=b"/read", chunked=True)),
                await exchange(port, request(b"{}", target=b"/read", length=50)),
                await exchange(port, request(target=b"/raise", method=b"GET")),
            ]
            nursery.cancel_scope.cancel()
    assert [(a.status, json.loads(a.body)["code"]) for a in answers] == [
        (400, "http_400"),
        (400, "http_400"),
        (400, "bad_host"),
        (431, "headers_too_large"),
        (400, "bad_framing"),
        (408, "request_timeout"),
        (500, "internal_error"),
    ]
    assert all(a.headers[b"content-type"] == b"application/x-test" for a in answers)
    # The target of each, where a request line was read (a refused head: from its bytes).
    assert [t for _, _, t in shaped] == [None, b"/h", b"/h", b"/h", b"/read", b"/read", b"/raise"]


async def test_a_shape_that_fails_still_gets_the_answer_out_in_plain_text():
    def broken(status, code, message, target):
        raise ValueError("no shape today")

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(
                functools.partial(serve, _hello, config=ServerConfig(error_shape=broken))
            )
            answer = await exchange(server.port, b"GARBAGE\r\n\r\n")
            nursery.cancel_scope.cancel()
    assert answer.status == 400
    assert answer.headers[b"content-type"].startswith(b"text/plain")


async def test_the_boundary_answers_malformed_http_in_the_providers_shape(
    stub_server, boundary_rig
):
    with trio.fail_after(DEADLINE):
        async with (
            stub_server("openai") as oa,
            stub_server("anthropic") as an,
            boundary_rig({"openai": oa, "anthropic": an}) as rig,
        ):
            port = port_of(rig.url)
            bad_line = await exchange(port, b"GARBAGE\r\n\r\n")
            bad_header = await exchange(port, request(target=MESSAGES, extra=(b"Bad Name: 1",)))
            bad_host = await exchange(port, request(target=b"/docket/healthz", host=b"a b"))
            big_head = await exchange(port, request(extra=(b"X-Big: " + b"a" * 70_000,)))
            healthy = await exchange(port, request(target=b"/docket/healthz", method=b"GET"))
            forwarded = len(oa.log) + len(an.log)
        events = rig.events()
    assert healthy.status == 200
    for answer, status, code in (
        (bad_line, 400, "http_400"),
        (bad_host, 400, "bad_host"),
        (big_head, 431, "headers_too_large"),
    ):
        assert answer.status == status
        error = answer.error()["error"]  # OpenAI's shape: no route named, or openai's
        assert error["type"] == "docket_bad_request" and error["code"] == code
        assert error["message"]
    assert bad_header.status == 400
    body = bad_header.error()  # the anthropic route's: Anthropic's own shape
    assert body["type"] == "error" and body["error"]["type"] == "docket_bad_request"
    assert body["error"]["code"] == "http_400"
    assert forwarded == 0
    # Refused before any request was parsed: nothing is recorded (a flood of broken
    # requests would otherwise fill the ledger), and nothing failed inside.
    assert [e for e in events if e["type"] == "policy.denied"] == []


# ---------------------------------------------------------------- the attack probe's judge


def test_the_attack_probe_takes_a_4xx_as_good_only_in_the_providers_shape():
    from chaos.attack import http as attack_http

    shaped = (
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 27\r\n\r\n" + b'{"error": {"message": "x"}}'
    )
    plain = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\nbad request\n"
    assert attack_http.good_answer(attack_http.FOUR_XX, [400], shaped)
    assert not attack_http.good_answer(attack_http.FOUR_XX, [400], plain)
    assert not attack_http.good_answer(attack_http.FOUR_XX, [200], b"HTTP/1.1 200 OK\r\n\r\n")
    # An answer that is not a 4xx is judged by what was wanted alone (a 501, a close).
    assert attack_http.good_answer(attack_http.FOUR_XX_OR_501, [501], b"HTTP/1.1 501 x\r\n\r\n")
    assert attack_http.good_answer(attack_http.CLOSE, [], b"")
