"""The boundary as the agent's forward proxy: CONNECT tunnels and absolute-form HTTP.

The supervisor puts `proxy_env(boundary_url, token)` in the child's
environment, so an HTTP client that honours HTTP(S)_PROXY sends its other
traffic here: `CONNECT host:443` for https, `GET http://host/path` for plain
http. Calls to the boundary's own routes are excluded by NO_PROXY. Each proxy
request passes, in order: auth (the run token, as the proxy password), the
egress rule (docket.guards.egress), then the one outbound door
(docket.http.client.open_upstream_stream, reached directly for a tunnel and
through a one-connection UpstreamPool for plain http), always to the host as
the rule canonicalised it, never to the text the client sent.

What is recorded:
- A refusal is a 403 (407 without the token, 400 for a target that is not one)
  with a JSON body naming the rule, and a `net.denied` event: host, port,
  method, rule, reason. A target that does not parse is recorded as its
  `target_sha256` and `target_bytes` only (host "(unparseable)", port 0), never
  as text: what a client put in it cannot be told from a secret.
- An allowed request is one `net.connect` event, written when it ends: host,
  port, method, mode ("tunnel" | "forward"), the rule that allowed it, status,
  bytes_up and bytes_down (tunnel: every byte each way; forward: the request
  and response bodies), duration_ms (connect included), `url` (forward only,
  sanitised), and `ended`: "client_closed" / "upstream_closed" (the first side
  to close), "client_reset" / "upstream_reset", "idle_timeout", "complete"
  (forward), "client_gone", "cancelled" (the run is stopping), "bad_request",
  "internal_error", or the upstream failure's reason ("connect_error",
  "connect_timeout", "read_timeout", ...; then status is 502 and `detail` says
  more). One event per connection, written when it ends, so counting them
  counts connections. Before connecting, the proxy checks that the ledger has
  room for that event, so a full ledger refuses the connection rather than
  losing its record.

Proxied traffic is opaque: a tunnel carries TLS the boundary cannot read, so it
is recorded as a connection, never as a model call, and no cap or price
applies to it. An agent that bypasses its base URL and tunnels to a provider
shows up as `net.connect` to that host (the providers' hosts are in the rule,
as the policy says; the agent holds only the run token, which no provider
takes); a tunnel anywhere not listed is stopped by the egress rule. And the
proxy sees only the traffic a client chooses to send it: a process that
ignores HTTP(S)_PROXY is not stopped here (that takes a network namespace or a
firewall, outside Docket).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, urlsplit

import trio

from docket.boundary.ports import ProxyHost
from docket.boundary.providers import token_matches
from docket.boundary.wiring import egress_rule_for
from docket.guards.egress import Allowed, Denied
from docket.guards.redact import sanitize_url
from docket.http.client import Origin, UpstreamError, UpstreamPool, open_upstream_stream
from docket.http.server_errors import ClientGone, RequestError
from docket.http.server_exchange import Request, Responder
from docket.ledger.limits import EvidenceLost, LedgerFull

PROXY_USER = "docket"  # the user name in the proxy URL; only the password (the token) counts
RECEIVE_SIZE = 65536
MAX_RECORDED_URL = 2048
RECORD_ROOM = MAX_RECORDED_URL + 1024  # a net.connect body at most, checked before connecting
UNPARSEABLE_HOST = "(unparseable)"  # net.denied's host for a target that does not parse

# Headers that describe one hop, never passed through a proxy (RFC 9110 7.6.1),
# plus the client's Host (set from the checked target) and its proxy credential.
_HOP_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    }
)


def proxy_env(boundary_url: str, token: str) -> dict[str, str]:
    """The child's proxy variables: every http(s) request goes through the
    boundary, authenticated with the run token, except those to the boundary
    itself. Both spellings are set (curl reads only the lower-case http_proxy).
    NO_PROXY names the boundary's host:port only, replacing any inherited
    value: other local services go through the proxy, and are checked."""
    parts = urlsplit(boundary_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ValueError(f"not a boundary URL (scheme://host:port): {boundary_url!r}")
    authority = parts.netloc.rpartition("@")[2]
    proxy = f"{parts.scheme}://{PROXY_USER}:{quote(token, safe='')}@{authority}"
    return {
        "HTTP_PROXY": proxy,
        "HTTPS_PROXY": proxy,
        "http_proxy": proxy,
        "https_proxy": proxy,
        "NO_PROXY": authority,
        "no_proxy": authority,
    }


# ---------------------------------------------------------------- pure parts


@dataclass(frozen=True)
class ProxyTarget:
    """Where a proxy request asks to go, as the client wrote it."""

    method: str
    host: str  # IPv6 without brackets; not yet canonical (the egress rule does that)
    port: int
    scheme: str | None = None  # "http" | "https" for absolute form; None for CONNECT
    path: str = ""  # origin-form target to send upstream (absolute form only)
    url: str = ""  # the absolute URL as sent (absolute form only)

    @property
    def mode(self) -> str:
        return "tunnel" if self.method == "CONNECT" else "forward"


def _absolute(target: bytes) -> bool:
    return target[:7].lower() == b"http://" or target[:8].lower() == b"https://"


def parse_target(method: str, target: bytes) -> ProxyTarget:
    """A CONNECT's authority form (host:port, [v6]:port) or an absolute-form
    http(s) URL; ValueError saying why `target` is neither. The message never
    quotes the target: it goes into the record, and a target that does not parse
    may carry anything (a password in its userinfo, say)."""
    text = target.decode("latin-1")
    if method == "CONNECT":
        if "@" in text:
            raise ValueError("a CONNECT target is host:port, with no userinfo")
        if text.startswith("["):
            host, sep, port = text[1:].partition("]:")
        else:
            host, sep, port = text.rpartition(":")
            if ":" in host:
                raise ValueError("an IPv6 address in a CONNECT target needs [brackets]")
        if not sep or not host:
            raise ValueError("a CONNECT target is host:port")
        return ProxyTarget(method, host, _port(port))
    if not _absolute(target):
        raise ValueError("a proxy request's target is an absolute http(s) URL")
    try:
        parts = urlsplit(text)
        given = parts.port
    except ValueError:
        raise ValueError("not a URL (its host or port does not parse)") from None
    if not parts.hostname:
        raise ValueError("the URL names no host")
    scheme = parts.scheme.lower()
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    number = given if given is not None else (443 if scheme == "https" else 80)
    return ProxyTarget(method, parts.hostname, _port(str(number)), scheme, path, text)


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise ValueError("the port must be 1-65535")
    return int(text)


def is_proxy_request(method: str, target: bytes, own_url: str) -> bool:
    """True for a CONNECT, and for an absolute-form request to anywhere but the
    boundary itself (a client that proxies everything sends the boundary's own
    routes that way too; those stay with the boundary's router)."""
    if method == "CONNECT":
        return True
    if not _absolute(target):
        return False
    own = urlsplit(own_url)
    try:
        asked = parse_target(method, target)
    except ValueError:
        return True  # a malformed proxy request: the proxy refuses it by name
    return (asked.host.lower(), asked.port) != ((own.hostname or "").lower(), own.port)


def proxy_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The password of `Proxy-Authorization: Basic` (any user name), or a Bearer token."""
    for name, value in headers:
        if name.lower() != b"proxy-authorization":
            continue
        scheme, _, credential = value.strip().partition(b" ")
        credential = credential.strip()
        if scheme.lower() == b"bearer" and credential:
            return credential.decode("latin-1")
        if scheme.lower() == b"basic":
            try:
                decoded = base64.b64decode(credential, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return decoded.partition(":")[2] or None
        return None
    return None


def hop_filtered(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Headers without the hop-by-hop ones, nor any the Connection header names."""
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    return [(k, v) for k, v in headers if k.lower() not in _HOP_HEADERS and k.lower() not in named]


# ---------------------------------------------------------------- the handler


@dataclass(frozen=True)
class ProxyConfig:
    """idle_timeout: a tunnel (or a forwarded exchange) with no bytes either way
    for this long is closed; None takes the policy's boundary.upstream_timeout."""

    idle_timeout: float | None = None


@dataclass
class _Connection:
    """What one allowed proxy request has done; the net.connect event's fields."""

    target: ProxyTarget
    allowed: Allowed
    started: float
    status: int | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    ended: str = "internal_error"
    detail: str | None = None


async def handle_proxy(
    boundary: ProxyHost, request: Request, respond: Responder, config: ProxyConfig | None = None
) -> None:
    """Serve one proxy request (a CONNECT or an absolute-form request) for
    `boundary` (ports.ProxyHost: its policy, token, clock, scrub, record and stop)."""
    config = config or ProxyConfig()
    try:
        target = parse_target(request.method, request.target)
    except ValueError as exc:
        # Recorded as its hash and length only: unparsed, nothing in it can be told
        # from a secret (the userinfo of a URL whose port is bad, say).
        denied = Denied(UNPARSEABLE_HOST, 0, "proxy.target", str(exc))
        unparsed = {
            "target_sha256": hashlib.sha256(request.target).hexdigest(),
            "target_bytes": len(request.target),
        }
        await _deny(boundary, request, respond, denied, 400, url="", extra=unparsed)
        return
    url = _recorded_url(boundary, target)
    if not token_matches(proxy_token(request.headers), boundary.token):
        reason = "this proxy needs the run's token as the proxy password (see HTTPS_PROXY)"
        denied = Denied(target.host[:255], target.port, "auth", reason)
        await _deny(boundary, request, respond, denied, 407, url=url)
        return
    try:
        decision = egress_rule_for(boundary.policy).check(target.host, target.port)
    except ValueError as exc:  # an entry the policy loader let through but the rule cannot use
        decision = Denied(target.host[:255], target.port, "egress.policy", str(exc))
    if isinstance(decision, Denied):
        await _deny(boundary, request, respond, decision, 403, url=url)
        return
    if target.mode == "tunnel" and not request.body_complete:
        denied = Denied(decision.host, decision.port, "proxy.target", "a CONNECT has no body")
        await _deny(boundary, request, respond, denied, 400, url=url)
        return
    try:
        boundary.recorder.check_room("net.connect", RECORD_ROOM)
    except LedgerFull as full:  # the recorder has stopped the run
        boundary.recorder.refusal_unrecorded(None, "ledger." + full.reason)
        await _answer(respond, 503, "docket_ledger_full", str(full), "ledger." + full.reason)
        return
    except EvidenceLost as lost:
        boundary.recorder.refusal_unrecorded(None, "ledger.fail_fast_evidence")
        await _answer(respond, 503, "docket_evidence_lost", str(lost), "ledger")
        return
    idle = config.idle_timeout
    if idle is None:
        idle = boundary.policy.boundary.upstream_timeout
    conn = _Connection(target, decision, boundary.clock.mono())
    try:
        if target.mode == "tunnel":
            await _tunnel(boundary, respond, conn, idle)
        else:
            await _forward(boundary, request, respond, conn, idle)
    except BaseException as exc:
        conn.ended = _ended_by(exc)
        conn.detail = (
            # Not cut here: _record_connect scrubs, then cuts (a cut first could split a secret).
            f"{type(exc).__name__}: {exc}" if conn.ended == "internal_error" else None
        )
        raise
    finally:
        await _record_connect(boundary, conn, url)


def _ended_by(exc: BaseException) -> str:
    if isinstance(exc, trio.Cancelled) or (
        isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None
    ):
        return "cancelled"  # the run is stopping
    if isinstance(exc, ClientGone):
        return "client_gone"
    if isinstance(exc, RequestError):
        return "bad_request"
    return "internal_error"


def _recorded_url(boundary: ProxyHost, target: ProxyTarget) -> str:
    return boundary.scrub(sanitize_url(target.url))[:MAX_RECORDED_URL] if target.url else ""


async def _deny(
    boundary: ProxyHost,
    request: Request,
    respond: Responder,
    denied: Denied,
    status: int,
    *,
    url: str,
    extra: dict[str, object] | None = None,
) -> None:
    fields = {
        "host": boundary.scrub(denied.host),
        "port": denied.port,
        "method": request.method,
        "rule": denied.rule,
        "reason": boundary.scrub(denied.reason),
    }
    if url:
        fields["url"] = url
    fields.update(extra or {})
    message = boundary.scrub(denied.reason)
    try:
        await boundary.recorder.record("net.denied", **fields)
    except (LedgerFull, EvidenceLost) as exc:
        message = f"{message} (the refusal itself could not be recorded: {exc})"
        boundary.recorder.refusal_unrecorded("net.denied", denied.rule)
    error_type = {407: "docket_proxy_auth", 400: "docket_bad_request"}.get(
        status, "docket_egress_denied"
    )
    headers = [(b"proxy-authenticate", b'Basic realm="docket"')] if status == 407 else []
    # An unread body (or a CONNECT, which has none to reuse the connection for) ends it.
    close = request.method == "CONNECT" or not request.body_complete
    await _answer(respond, status, error_type, message, denied.rule, headers, close=close)


async def _answer(
    respond: Responder,
    status: int,
    error_type: str,
    message: str,
    rule: str,
    headers: Iterable[tuple[bytes, bytes]] = (),
    *,
    close: bool = True,
) -> None:
    body = json.dumps({"error": {"type": error_type, "message": message, "rule": rule}}).encode()
    pairs = [(b"content-type", b"application/json"), *headers]
    if close:
        pairs.append((b"connection", b"close"))
    await respond.simple(status, pairs, body)


async def _record_connect(boundary: ProxyHost, conn: _Connection, url: str) -> None:
    """The connection's one event, finished even when the run is stopping."""
    fields = {
        "host": conn.allowed.host,
        "port": conn.allowed.port,
        "method": conn.target.method,
        "mode": conn.target.mode,
        "rule": conn.allowed.rule,
        "status": conn.status,
        "bytes_up": conn.bytes_up,
        "bytes_down": conn.bytes_down,
        "duration_ms": int((boundary.clock.mono() - conn.started) * 1000),
        "ended": conn.ended,
    }
    if url:
        fields["url"] = url
    if conn.detail:
        fields["detail"] = boundary.scrub(conn.detail)[:300]
    with trio.CancelScope(shield=True):
        try:
            await boundary.recorder.record("net.connect", **fields)
        except (LedgerFull, EvidenceLost):
            # Room was checked before connecting; another writer took it meanwhile. The
            # recorder has asked the run to stop, saying why: nobody is left to answer.
            return


async def _tunnel(boundary: ProxyHost, respond: Responder, conn: _Connection, idle: float) -> None:
    allowed = conn.allowed
    try:
        upstream = await open_upstream_stream(
            allowed.host,
            allowed.port,
            tls=False,
            connect_timeout=boundary.policy.boundary.connect_timeout,
        )
    except UpstreamError as exc:
        conn.status, conn.ended, conn.detail = 502, exc.reason, str(exc)
        await _answer(respond, 502, "docket_upstream_" + exc.reason, str(exc), allowed.rule)
        return
    try:
        client, leftover = await respond.tunnel(200)
        conn.status = 200
        conn.ended = await splice(client, upstream, conn, idle, leftover=leftover)
    finally:
        await trio.aclose_forcefully(upstream)


class ByteTally(Protocol):
    """What splice adds to: the bytes written to each far side (a _Connection)."""

    bytes_up: int
    bytes_down: int


async def splice(
    client: trio.abc.Stream,
    upstream: trio.abc.Stream,
    tally: ByteTally,
    idle_timeout: float,
    *,
    leftover: bytes = b"",
) -> str:
    """Move bytes both ways until both directions have ended (an EOF is passed on
    as a half-close), either side breaks, or nothing moves for idle_timeout.
    `leftover` goes upstream first. Adds to tally.bytes_up / tally.bytes_down
    what was written to the far side; returns how it ended."""
    ended: list[str] = []  # each direction's end, in order

    def up(n: int) -> None:
        tally.bytes_up += n

    def down(n: int) -> None:
        tally.bytes_down += n

    async def pump(
        src: trio.abc.ReceiveStream,
        dst: trio.abc.SendStream,
        names: tuple[str, str],
        count: Callable[[int], None],
        stop: trio.CancelScope,
    ) -> None:
        src_name, dst_name = names
        while True:
            try:
                data = await src.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                ended.append(f"{src_name}_reset")
                break
            if not data:
                ended.append(f"{src_name}_closed")
                if not isinstance(dst, trio.abc.HalfCloseableStream):
                    break  # a half-close cannot be passed on: end both ways
                try:
                    await dst.send_eof()
                    return  # the other direction carries on
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    ended.append(f"{dst_name}_reset")
                    break
            idle.deadline = trio.current_time() + idle_timeout
            try:
                await dst.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                ended.append(f"{dst_name}_reset")
                break
            count(len(data))
            idle.deadline = trio.current_time() + idle_timeout
        stop.cancel()

    with trio.CancelScope(deadline=trio.current_time() + idle_timeout) as idle:
        try:
            if leftover:
                await upstream.send_all(leftover)
                up(len(leftover))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return "upstream_reset"
        async with trio.open_nursery() as nursery:
            stop = nursery.cancel_scope
            nursery.start_soon(pump, client, upstream, ("client", "upstream"), up, stop)
            nursery.start_soon(pump, upstream, client, ("upstream", "client"), down, stop)
    resets = [end for end in ended if end.endswith("_reset")]
    if resets:
        return resets[0]
    if idle.cancelled_caught:
        return "idle_timeout"
    return ended[0]


class _CountedBody:
    """The client's request body, streamed upstream and counted."""

    def __init__(self, request: Request, conn: _Connection) -> None:
        self._chunks = request.body_chunks()
        self._conn = conn

    def __aiter__(self) -> _CountedBody:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._chunks.__anext__()
        self._conn.bytes_up += len(chunk)
        return chunk


async def _forward(
    boundary: ProxyHost, request: Request, respond: Responder, conn: _Connection, idle: float
) -> None:
    allowed, target = conn.allowed, conn.target
    pool = UpstreamPool(
        Origin(target.scheme or "http", allowed.host, allowed.port),
        max_connections=1,
        connect_timeout=boundary.policy.boundary.connect_timeout,
        read_timeout=idle,
        write_timeout=idle,
    )
    body = b"" if request.body_complete else _CountedBody(request, conn)
    try:
        async with pool.request(
            request.method, target.path, hop_filtered(request.headers), body
        ) as resp:
            conn.status = resp.status
            await respond.start(resp.status, hop_filtered(resp.headers), resp.reason)
            async for chunk in resp.body():
                await respond.send(chunk)
                conn.bytes_down += len(chunk)
            await respond.end()
        conn.ended = "complete"
    except UpstreamError as exc:
        conn.ended, conn.detail = exc.reason, str(exc)
        if respond.started:
            await respond.abort()  # the client sees the answer cut short, as it was
        else:
            conn.status = 502
            await _answer(respond, 502, "docket_upstream_" + exc.reason, str(exc), allowed.rule)
    finally:
        with trio.CancelScope(shield=True):
            await pool.aclose()
