"""Family `http`: malformed HTTP on raw sockets against a live boundary.

Each probe opens a fresh connection to a real `docket run`'s boundary on
127.0.0.1, sends bytes no well-behaved client would (a bad request line,
broken framing, hostile JSON, bad proxy targets), reads what comes back, and
then checks on a new connection that the boundary still answers
/docket/healthz. Good: the answer wanted (a 4xx for a bad request; for a
socket closed before a request, no answer), a 4xx in the provider's error shape
(a JSON `error` object: a client's SDK parses only that, so a text/plain 400 is
not good), and the boundary still serving. A control request (the template the
probes spoil, unspoiled) must be answered 200 first.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from chaos.attack import Figures
from chaos.attack.rig import live_run

ROUTE = b"/openai/v1/chat/completions"
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")

FOUR_XX = "4xx"
FOUR_XX_OR_CLOSE = "4xx or closed without an answer"
CLOSE = "closed without an answer"
ANY = "any answer or none"  # only `still serving` is judged
ANSWERED = "any answer"  # a request RFC 9112 lets a server accept or refuse
FOUR_XX_OR_501 = "4xx or 501"  # an unknown transfer coding: RFC 9112 6.1 says 501


@dataclass
class RequestProbe:
    name: str
    data: bytes
    expect: str = FOUR_XX
    half_close: bool = False  # shut our write side after sending: the request ends in EOF
    reset: bool = False  # close with SO_LINGER 0 (an RST) right after sending
    answers: int = 1  # how many answers to wait for (pipelined requests)
    timeout: float = 8.0  # seconds to wait for them


def chat(**extra) -> dict:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8, **extra}  # fmt: skip


def request(token: str, body: bytes = b"", *, method: bytes = b"POST", target: bytes = ROUTE,
            headers: list[bytes] | None = None, length: bool = True,
            ctype: bytes = b"application/json") -> bytes:  # fmt: skip
    """A request head (and body) as bytes; `headers` replace the defaults' extras."""
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1"]
    if token:
        lines.append(b"Authorization: Bearer " + token.encode())
    if ctype:
        lines.append(b"Content-Type: " + ctype)
    if length:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    lines += headers or []
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def probes(token: str, port: int, quick: bool) -> list[RequestProbe]:
    ok = json.dumps(chat()).encode()
    r = lambda *a, **k: request(token, *a, **k)  # noqa: E731 - a short alias keeps the table readable
    basic = base64.b64encode(f"docket:{token}".encode())
    proxy_auth = b"Proxy-Authorization: Basic " + basic
    deep = b'{"model":"gpt-4o-mini","max_tokens":8,"messages":' + b"[" * 3000 + b"]" * 3000 + b"}"
    table = [
        RequestProbe("bad request line", b"GARBAGE\r\n\r\n"),
        RequestProbe("request line, extra spaces", b"POST  " + ROUTE + b"  HTTP/1.1\r\nHost: x\r\n\r\n"),
        RequestProbe("HTTP/2.0 version", b"POST " + ROUTE + b" HTTP/2.0\r\nHost: x\r\n\r\n"),
        RequestProbe("HTTP/0.9 request", b"GET /docket/healthz\r\n\r\n"),
        RequestProbe("binary junk", bytes(range(256)) * 4 + b"\r\n\r\n"),
        RequestProbe("NUL in target", b"GET /docket/healthz\x00x HTTP/1.1\r\nHost: x\r\n\r\n"),
        RequestProbe("non-ASCII in target", b"GET /openai/v1/\xe9\xff HTTP/1.1\r\nHost: x\r\n\r\n"),
        RequestProbe("header without colon", r(ok, headers=[b"X-Broken header"])),
        RequestProbe("space before colon", r(ok, headers=[b"X-Bad : 1"])),
        RequestProbe("obs-fold continuation", r(ok, headers=[b"X-Fold: a", b" folded"]), expect=ANSWERED),
        RequestProbe("NUL in header value", r(ok, headers=[b"X-Nul: a\x00b"])),
        RequestProbe("bare CR in header value", r(ok, headers=[b"X-Cr: a\rb"])),
        RequestProbe("header name with space", r(ok, headers=[b"Bad Name: 1"])),
        RequestProbe("one 100 KiB header", r(ok, headers=[b"X-Big: " + b"a" * 100_000])),
        RequestProbe("9000 headers", r(ok, headers=[b"X-H%d: v" % i for i in range(9000)])),
        RequestProbe("huge bearer token", request("x" * 70_000, ok)),
        RequestProbe("no Host on HTTP/1.1", b"GET /docket/healthz HTTP/1.1\r\n\r\n"),
        RequestProbe("two Host headers", b"GET /docket/healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
        RequestProbe("Host with a space", b"GET /docket/healthz HTTP/1.1\r\nHost: a b\r\n\r\n"),
        RequestProbe("two different Content-Length", r(ok, headers=[b"Content-Length: 3"])),
        RequestProbe("Content-Length -1", r(ok, length=False, headers=[b"Content-Length: -1"])),
        RequestProbe("Content-Length abc", r(ok, length=False, headers=[b"Content-Length: abc"])),
        RequestProbe("Content-Length +10", r(ok, length=False, headers=[b"Content-Length: +10"])),
        RequestProbe("Content-Length 10^20", r(ok, length=False, headers=[b"Content-Length: 1" + b"0" * 20])),
        RequestProbe("Content-Length and chunked",
              r(b"5\r\nhello\r\n0\r\n\r\n", headers=[b"Transfer-Encoding: chunked"])),
        RequestProbe("chunk size not hex", r(b"zz\r\nhello\r\n0\r\n\r\n", length=False,
                                      headers=[b"Transfer-Encoding: chunked"])),
        RequestProbe("chunk size overflow", r(b"f" * 40 + b"\r\nhello\r\n0\r\n\r\n", length=False,
                                       headers=[b"Transfer-Encoding: chunked"])),
        RequestProbe("chunked, no last chunk, then EOF", r(b"5\r\nhello\r\n", length=False,
              headers=[b"Transfer-Encoding: chunked"]), expect=FOUR_XX_OR_CLOSE, half_close=True),
        RequestProbe("chunk longer than its size", r(b"5\r\nhelloXX\r\n0\r\n\r\n", length=False,
                                              headers=[b"Transfer-Encoding: chunked"])),
        RequestProbe("chunk extension with NUL", r(b"5;\x00\r\nhello\r\n0\r\n\r\n", length=False,
                                            headers=[b"Transfer-Encoding: chunked"])),
        RequestProbe("unknown transfer-coding", r(ok, length=False, headers=[b"Transfer-Encoding: gzip"]),
              expect=FOUR_XX_OR_501),
        RequestProbe("truncated body, then EOF", r(ok, length=False, headers=[b"Content-Length: %d"
              % (len(ok) + 50)]), expect=FOUR_XX_OR_CLOSE, half_close=True),
        RequestProbe("pipelined junk after a request",
              b"GET /docket/healthz HTTP/1.1\r\nHost: x\r\n\r\n\x16\x03\x01\x02\x00junk\r\n\r\n",
              answers=2),
        RequestProbe("pipelined request then bad line",
              r(ok) + b"GET /docket/healthz HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP AT ALL\r\n\r\n",
              answers=3),
        RequestProbe("non-JSON body", r(b"model=gpt-4o-mini&max_tokens=8",
                                 ctype=b"application/x-www-form-urlencoded")),
        RequestProbe("JSON array body", r(b"[" + ok + b"]")),
        RequestProbe("JSON string body", r(b'"hello"')),
        RequestProbe("empty body", r(b"")),
        RequestProbe("JSON nested 3000 deep", r(deep)),
        RequestProbe("duplicate model key", r(b'{"model":"gpt-4o-mini","model":"gpt-4o","max_tokens":8,'
                                       b'"messages":[{"role":"user","content":"hi"}]}')),
        RequestProbe("duplicate max_tokens key", r(b'{"model":"gpt-4o-mini","max_tokens":1,"max_tokens":'
                                            b'9999999,"messages":[{"role":"user","content":"hi"}]}')),
        RequestProbe("invalid UTF-8 in JSON", r(ok.replace(b"hi", b"h\xff\xfe"))),
        RequestProbe("lone surrogate in JSON", r(ok.replace(b"hi", b"\\ud800"))),
        RequestProbe("NaN in JSON", r(ok.replace(b'"max_tokens": 8', b'"max_tokens": NaN'))),
        RequestProbe("max_tokens 1e999", r(ok.replace(b'"max_tokens": 8', b'"max_tokens": 1e999'))),
        RequestProbe("max_tokens negative", r(ok.replace(b'"max_tokens": 8', b'"max_tokens": -5'))),
        RequestProbe("UTF-16 JSON", r(ok.decode().encode("utf-16"))),
        RequestProbe("wrong content-type, multipart",
              r(b"--x\r\nContent-Disposition: form-data; name=model\r\n\r\ngpt\r\n--x--\r\n",
                ctype=b"multipart/form-data; boundary=x")),
        RequestProbe("unknown method BREW", r(ok, method=b"BREW")),
        RequestProbe("absolute-form, bad IPv6", b"GET http://user:pw@[::1/ HTTP/1.1\r\nHost: x\r\n"
              + proxy_auth + b"\r\n\r\n"),
        RequestProbe("absolute-form, port 99999", b"GET http://example.com:99999/ HTTP/1.1\r\nHost: x\r\n"
              + proxy_auth + b"\r\n\r\n"),
        RequestProbe("absolute-form, no host", b"GET http:/// HTTP/1.1\r\nHost: x\r\n" + proxy_auth
              + b"\r\n\r\n"),
        RequestProbe("absolute-form, port abc", b"GET http://example.com:abc/ HTTP/1.1\r\nHost: x\r\n"
              + proxy_auth + b"\r\n\r\n"),
        RequestProbe("CONNECT without port", b"CONNECT example.com HTTP/1.1\r\nHost: x\r\n" + proxy_auth
              + b"\r\n\r\n"),
        RequestProbe("CONNECT port 99999", b"CONNECT example.com:99999 HTTP/1.1\r\nHost: x\r\n"
              + proxy_auth + b"\r\n\r\n"),
        RequestProbe("CONNECT port -1", b"CONNECT example.com:-1 HTTP/1.1\r\nHost: x\r\n" + proxy_auth
              + b"\r\n\r\n"),
        RequestProbe("CONNECT unbracketed IPv6", b"CONNECT ::1:443 HTTP/1.1\r\nHost: x\r\n" + proxy_auth
              + b"\r\n\r\n"),
        RequestProbe("CONNECT with userinfo", b"CONNECT u:p@[::1:443 HTTP/1.1\r\nHost: x\r\n" + proxy_auth
              + b"\r\n\r\n"),
        RequestProbe("CONNECT to the boundary itself", b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n"
              % port + proxy_auth + b"\r\n\r\n"),
        RequestProbe("CONNECT without the token", b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n"),
        RequestProbe("half-closed before a byte", b"", expect=CLOSE, half_close=True),
        RequestProbe("half-closed mid-head", b"POST " + ROUTE + b" HTTP/1.1\r\nHost: x\r\nContent-Le",
              expect=FOUR_XX_OR_CLOSE, half_close=True),
        RequestProbe("half-closed after a whole request", r(ok), expect=ANY, half_close=True),
        RequestProbe("reset right after a request", r(ok), expect=ANY, half_close=False, reset=True),
        RequestProbe("Expect: 100-continue, 50 MB declared",
              r(b"", length=False, headers=[b"Content-Length: 50000000", b"Expect: 100-continue"]),
              half_close=False),
    ]  # fmt: skip
    if not quick:
        big = b'{"model":"gpt-4o-mini","max_tokens":8,"pad":"' + b"a" * 50_000_000 + b'"}'
        table.append(RequestProbe("50 MB body sent whole", r(big)))
        # A body that stops arriving, the connection kept open: the request timeout (30 s).
        table.append(
            RequestProbe(
                "body stalls, socket open",
                r(ok, length=False, headers=[b"Content-Length: %d" % (len(ok) + 50)]),
                timeout=45.0,
            )
        )
    return table


def exchange(port: int, probe: RequestProbe) -> tuple[list[int], bytes]:
    """Send the probe; the statuses of the answers read back (in order) and the bytes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=probe.timeout)
    try:
        try:
            sock.sendall(probe.data)
            if probe.reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return [], b""
            if probe.half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may refuse before taking everything: its answer is what counts
        data = b""
        deadline = time.monotonic() + probe.timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                break  # reset: what arrived before is what the client got
            if not chunk:
                break
            data += chunk
            if len(complete_answers(data)) >= probe.answers:
                break  # a kept-alive connection would wait here: we have what we came for
        return [int(s) for s in _STATUS.findall(data)], data
    finally:
        sock.close()


def complete_answers(data: bytes) -> list[int]:
    """The statuses of the whole answers (head and Content-Length body) in `data`."""
    statuses: list[int] = []
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        match = _STATUS.match(head)
        if not sep or not match:
            return statuses
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        size = int(length.group(1)) if length else 0
        if len(rest) < size:
            return statuses
        statuses.append(int(match.group(1)))
        data = rest[size:]


def provider_shaped(data: bytes) -> bool:
    """True when the last answer's body is a JSON object with an `error` object."""
    body = data.rpartition(b"\r\n\r\n")[2]
    try:
        obj = json.loads(body)
    except ValueError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("error"), dict)


def serving(port: int) -> bool:
    try:
        statuses, _ = exchange(
            port, RequestProbe("", b"GET /docket/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        )
    except OSError:
        return False
    return statuses[:1] == [200]


def judge(expect: str, statuses: list[int]) -> bool:
    last = statuses[-1] if statuses else None
    four = last is not None and 400 <= last < 500
    return {
        FOUR_XX: four,
        FOUR_XX_OR_CLOSE: four or last is None,
        CLOSE: last is None,
        ANY: True,
        ANSWERED: last is not None,
        FOUR_XX_OR_501: four or last == 501,
    }[expect]


def good_answer(expect: str, statuses: list[int], data: bytes) -> bool:
    """The answer wanted, and a 4xx (when it is one) in the provider's shape."""
    last = statuses[-1] if statuses else None
    four = last is not None and 400 <= last < 500
    return judge(expect, statuses) and (not four or provider_shaped(data))


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("http")
    answered = shaped = still = 0
    plain: list[str] = []
    with live_run(folder / "http") as live:
        port = live.port
        # The control: the template every probe spoils, unspoiled, must be answered 200, so
        # a probe's 4xx is the answer to its own flaw (not to the route or the token).
        control = RequestProbe("control", request(live.token, json.dumps(chat()).encode()))
        if exchange(port, control)[0] != [200]:
            raise RuntimeError(
                f"the control request was not answered 200: {exchange(port, control)}"
            )
        for probe in probes(live.token, port, quick):
            try:
                statuses, data = exchange(port, probe)
            except OSError as exc:
                statuses, data = [], f"[connect failed: {exc}]".encode()
            alive = serving(port)
            good = good_answer(probe.expect, statuses, data)
            answered += bool(statuses) and 400 <= statuses[-1] < 500
            still += alive
            if statuses and 400 <= statuses[-1] < 500:
                if provider_shaped(data):
                    shaped += 1
                else:
                    plain.append(probe.name)
            got = "/".join(map(str, statuses)) or "no answer"
            if statuses and 400 <= statuses[-1] < 500 and not provider_shaped(data):
                got += " (not in the provider's shape)"
            figures.add(
                good and alive,
                f"http {probe.name!r}: sent {_show(probe.data)} to 127.0.0.1:PORT"
                f" (half_close={probe.half_close}, reset={probe.reset}) -> {got};"
                f" wanted {probe.expect}; boundary still serving: {alive}",
            )
    figures.extra = {
        "answered_4xx": answered,
        "provider_shape_4xx": shaped,
        "still_serving": still,
        "4xx_not_in_provider_shape": plain,
        "run_exit": live.result.get("exit"),
    }
    return figures


def _show(data: bytes) -> str:
    text = repr(data[:100])
    return text + (f"...(+{len(data) - 100} bytes)" if len(data) > 100 else "")
