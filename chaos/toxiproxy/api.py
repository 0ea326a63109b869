"""The Toxiproxy HTTP API over docket's trio + h11 server.

Routes, status codes and JSON shapes follow Toxiproxy 2.x, so toxiproxy-python
(or any Toxiproxy client) drives this server as it drives the real one:

    GET  /proxies                       200 {name: proxy}
    POST /proxies                       201 proxy     409 exists, 400 bad body
    POST /populate                      201 {"proxies": [proxy, ...]}
    GET  /proxies/{p}                   200 proxy     404
    POST /proxies/{p}                   200 proxy     (enabled, upstream, listen)
    DELETE /proxies/{p}                 204
    GET  /proxies/{p}/toxics            200 [toxic]
    POST /proxies/{p}/toxics            200 toxic     409 exists, 400 bad toxic
    GET|POST|DELETE /proxies/{p}/toxics/{t}   200 / 200 / 204
    POST /reset                         204 (every proxy enabled, every toxic removed)
    GET  /version                       200 text

Errors are `{"error": message, "status": code}`. A proxy whose address cannot be
bound is answered 500 with the OS's reason, as Toxiproxy does.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any
from urllib.parse import unquote

import trio

from chaos.toxiproxy.proxy import Proxy, Roll, default_roll, split_address
from chaos.toxiproxy.toxics import ToxicError
from chaos.toxiproxy.toxics.spec import parse_toxic
from docket.http.server import Listening, serve
from docket.http.server_exchange import Request, Responder

log = logging.getLogger("chaos.toxiproxy")

VERSION = "2.9.0-docket"  # the Toxiproxy API version this speaks, marked as ours
MAX_BODY = 1024 * 1024


def _required_text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"missing required field: {key}")
    return value


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ToxiproxyServer:
    """The proxies and their toxics; every proxy's tasks live in `nursery`."""

    def __init__(self, nursery: trio.Nursery, roll: Roll | None = None) -> None:
        self.nursery = nursery
        self.roll = roll or default_roll
        self.proxies: dict[str, Proxy] = {}
        self.listening: Listening | None = None

    @property
    def url(self) -> str:
        assert self.listening is not None, "not serving yet"
        return self.listening.url

    def proxy(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError(404, "proxy not found")
        return proxy

    async def create_proxy(self, body: Any) -> Proxy:
        if not isinstance(body, dict):
            raise ApiError(400, "proxy must be a JSON object")
        name = _required_text("name", body.get("name"))
        upstream = _required_text("upstream", body.get("upstream"))
        listen = _required_text("listen", body.get("listen") or "127.0.0.1:0")
        enabled = body.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ApiError(400, "enabled must be true or false")
        if name in self.proxies:
            raise ApiError(409, "proxy already exists")
        try:
            proxy = Proxy(name, listen, upstream, self.roll)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if enabled:
            await self._start(proxy)
        self.proxies[name] = proxy
        return proxy

    async def _start(self, proxy: Proxy) -> None:
        try:
            await proxy.start(self.nursery)
        except OSError as exc:
            raise ApiError(500, f"listen {proxy.listen}: {exc.strerror or exc}") from None

    async def update_proxy(self, proxy: Proxy, body: Any) -> None:
        if not isinstance(body, dict):
            raise ApiError(400, "proxy must be a JSON object")
        enabled = body.get("enabled", proxy.enabled)
        if not isinstance(enabled, bool):
            raise ApiError(400, "enabled must be true or false")
        changed = False
        for key in ("upstream", "listen"):
            if key in body and body[key] != getattr(proxy, key):
                if not isinstance(body[key], str):
                    raise ApiError(400, f"{key} must be a host:port string")
                try:
                    split_address(body[key])
                except ValueError as exc:
                    raise ApiError(400, f"{key}: {exc}") from None
                setattr(proxy, key, body[key])
                changed = True
        if changed or not enabled:
            await proxy.stop()
        if enabled:
            await self._start(proxy)

    async def delete_proxy(self, name: str) -> None:
        proxy = self.proxy(name)
        await proxy.stop()
        del self.proxies[name]

    async def reset(self) -> None:
        for proxy in self.proxies.values():
            for name in list(proxy.toxics):
                proxy.remove_toxic(name)
            await self._start(proxy)

    async def populate(self, body: Any) -> list[Proxy]:
        if not isinstance(body, list):
            raise ApiError(400, "populate expects a JSON list of proxies")
        result = []
        for item in body:
            named = item.get("name") if isinstance(item, dict) else None
            existing = self.proxies.get(named) if isinstance(named, str) else None
            if existing is not None:
                same = existing.upstream == item.get("upstream") and item.get("listen") in (
                    None,
                    existing.listen,
                )
                if same:
                    result.append(existing)
                    continue
                await self.delete_proxy(existing.name)
            result.append(await self.create_proxy(item))
        return result

    async def handle(self, request: Request, respond: Responder) -> None:
        try:
            status, payload = await self._route(request)
        except ApiError as exc:
            status, payload = exc.status, {"error": exc.message, "status": exc.status}
        if status == 204:
            await respond.simple(204)
        elif isinstance(payload, str):
            await respond.simple(status, [("content-type", "text/plain")], payload.encode())
        else:
            body = json.dumps(payload).encode()
            await respond.simple(status, [("content-type", "application/json")], body)

    async def _route(self, request: Request) -> tuple[int, Any]:
        parts = [unquote(part) for part in request.path.strip("/").split("/") if part]
        method = request.method
        if parts == ["version"] and method == "GET":
            return 200, VERSION
        if parts == ["reset"] and method == "POST":
            await self.reset()
            return 204, None
        if parts == ["populate"] and method == "POST":
            proxies = await self.populate(await _json_body(request))
            return 201, {"proxies": [proxy.to_json() for proxy in proxies]}
        if parts == ["proxies"]:
            if method == "GET":
                return 200, {name: proxy.to_json() for name, proxy in self.proxies.items()}
            if method == "POST":
                return 201, (await self.create_proxy(await _json_body(request))).to_json()
        if len(parts) == 2 and parts[0] == "proxies":
            if method == "GET":
                return 200, self.proxy(parts[1]).to_json()
            if method == "POST":
                proxy = self.proxy(parts[1])
                await self.update_proxy(proxy, await _json_body(request))
                return 200, proxy.to_json()
            if method == "DELETE":
                await self.delete_proxy(parts[1])
                return 204, None
        if len(parts) in (3, 4) and parts[0] == "proxies" and parts[2] == "toxics":
            return await self._toxics(request, self.proxy(parts[1]), parts[3:])
        raise ApiError(404, f"no route for {method} {request.path}")

    async def _toxics(self, request: Request, proxy: Proxy, rest: list[str]) -> tuple[int, Any]:
        method = request.method
        if not rest:
            if method == "GET":
                return 200, [spec.to_json() for spec in proxy.toxics.values()]
            if method == "POST":
                try:
                    spec = parse_toxic(await _json_body(request))
                except ToxicError as exc:
                    raise ApiError(400, str(exc)) from None
                if spec.name in proxy.toxics:
                    raise ApiError(409, "toxic already exists")
                proxy.add_toxic(spec)
                return 200, spec.to_json()
            raise ApiError(405, f"method {method} not allowed")
        current = proxy.toxics.get(rest[0])
        if current is None:
            raise ApiError(404, "toxic not found")
        if method == "GET":
            return 200, current.to_json()
        if method == "DELETE":
            proxy.remove_toxic(current.name)
            return 204, None
        if method == "POST":
            update = await _json_body(request)
            if not isinstance(update, dict):
                raise ApiError(400, "toxic must be a JSON object")
            merged = current.to_json()
            merged["attributes"] = {**merged["attributes"], **(update.get("attributes") or {})}
            merged["toxicity"] = update.get("toxicity", merged["toxicity"])
            try:
                spec = parse_toxic(merged)
            except ToxicError as exc:
                raise ApiError(400, str(exc)) from None
            proxy.update_toxic(spec)
            return 200, spec.to_json()
        raise ApiError(405, f"method {method} not allowed")


async def _json_body(request: Request) -> Any:
    raw = await request.read_body(MAX_BODY)
    try:
        return json.loads(raw or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"bad request body: {exc}") from None


async def serve_toxiproxy(
    host: str = "127.0.0.1",
    port: int = 8474,
    *,
    roll: Roll | None = None,
    task_status: trio.TaskStatus[ToxiproxyServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the Toxiproxy API until cancelled; `await nursery.start(serve_toxiproxy,
    port=0)` returns the ToxiproxyServer (its `.url`, `.proxies`). The proxies'
    listeners and connections live in this function's nursery."""
    async with trio.open_nursery() as nursery:
        server = ToxiproxyServer(nursery, roll)
        server.listening = await nursery.start(partial(serve, server.handle, host=host, port=port))
        log.info("toxiproxy API listening on %s", server.url)
        task_status.started(server)
