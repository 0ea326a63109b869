"""The embedded fault proxy on a free port with toxiproxy-python pointed at it,
and an echo server for its proxies to forward to: the rig the Toxiproxy API tests
(test_toxiproxy_api.py) and the toxic tests (test_toxics.py) share.

toxiproxy-python is synchronous: each call runs in a worker thread while the
servers run in the test's trio loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import requests
import toxiproxy
import trio
from helpers import tcp_echo

from chaos.toxiproxy import ToxiproxyServer, serve_toxiproxy


@dataclass
class Rig:
    server: ToxiproxyServer
    upstream: str  # the echo server, host:port
    api: str  # the API's base URL

    async def call(self, fn, *args, **kwargs):
        return await trio.to_thread.run_sync(partial(fn, *args, **kwargs), abandon_on_cancel=True)

    async def http(self, method: str, path: str, **kwargs) -> requests.Response:
        return await self.call(requests.request, method, self.api + path, timeout=5, **kwargs)


@asynccontextmanager
async def rig(roll=None) -> AsyncIterator[Rig]:
    """The API on a free port with toxiproxy-python pointed at it, and an echo
    server for proxies to forward to."""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(partial(serve_toxiproxy, port=0, roll=roll))
        listeners = await nursery.start(partial(trio.serve_tcp, tcp_echo, 0, host="127.0.0.1"))
        echo_port = listeners[0].socket.getsockname()[1]
        toxiproxy.Toxiproxy().update_api_consumer("127.0.0.1", server.listening.port)
        yield Rig(server, f"127.0.0.1:{echo_port}", server.url)
        nursery.cancel_scope.cancel()


def port_of(listen: str) -> int:
    return int(listen.rpartition(":")[2])
