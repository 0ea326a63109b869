"""The harness's one way to talk to a Toxiproxy: toxiproxy-python, public API only.

The same calls drive the embedded proxy (chaos.toxiproxy.serve_toxiproxy) and a
real Toxiproxy given `--toxiproxy http://HOST:8474`. The client is synchronous
(requests): from trio, call the driver through `trio.to_thread.run_sync`.

toxiproxy-python keeps the server's address in class attributes of
`APIConsumer`, one per process. Every call here sets them under a lock before
it talks, so two drivers for two servers do not answer for each other. The
client sets no HTTP timeout; a trio caller bounds the wait with its own cancel
scope (`abandon_on_cancel=True` leaves the thread behind, it cannot be stopped).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import requests
import trio
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.faults.grammar import Fault
from chaos.faults.net import ToxicRequest, check_performable, time_window, toxic_request
from docket.errors import InputError

T = TypeVar("T")
_CONSUMER_LOCK = threading.Lock()  # APIConsumer's host/port are process-wide
LIFT_DEADLINE_S = 10  # how long a cancelled window may take to lift its fault
_CLIENT_ERRORS = (ProxyExists, NotFound, InvalidToxic, requests.RequestException)


class ToxiproxyError(InputError):
    """A Toxiproxy refused or could not be reached; one line naming the action."""


@dataclass(frozen=True)
class ProxyInfo:
    name: str
    listen: str  # host:port the proxy listens on (a port 0 is reported as bound)
    upstream: str
    enabled: bool

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


def _reason(exc: BaseException) -> str:
    text = exc.args[0] if exc.args else exc
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text).strip() or type(exc).__name__


class ToxiproxyDriver:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "http" or not parts.hostname or port is None:
            raise InputError(f"toxiproxy URL {url!r}: expected http://HOST:PORT")
        self.url = url
        self.host = parts.hostname
        self.port = port

    # -- plumbing

    def _call(self, action: str, fn: Callable[[Toxiproxy], T]) -> T:
        with _CONSUMER_LOCK:
            APIConsumer.host, APIConsumer.port = self.host, self.port
            try:
                return fn(Toxiproxy())
            except _CLIENT_ERRORS as exc:
                raise ToxiproxyError(f"toxiproxy {self.url}: {action}: {_reason(exc)}") from exc
            except (KeyError, ValueError) as exc:
                # the client reads a 500's error body as if it were a proxy
                raise ToxiproxyError(
                    f"toxiproxy {self.url}: {action}: unexpected answer ({_reason(exc)})"
                ) from exc

    def _proxy(self, server: Toxiproxy, name: str):
        proxy = server.get_proxy(name)
        if proxy is None:
            raise NotFound(f"no proxy {name!r}")
        return proxy

    # -- proxies

    def version(self) -> str:
        return self._call(
            "version",
            lambda server: (APIConsumer.get("/version").content or b"").decode("utf-8", "replace"),
        )

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> ProxyInfo:
        def create(server: Toxiproxy) -> ProxyInfo:
            proxy = server.create(upstream=upstream, name=name, listen=listen)
            return ProxyInfo(proxy.name, proxy.listen, proxy.upstream, proxy.enabled)

        return self._call(f"create proxy {name!r}", create)

    def proxy_names(self) -> list[str]:
        """The names of every proxy the server holds, whoever made them."""
        return self._call("list proxies", lambda server: sorted(server.proxies()))

    def proxy(self, name: str) -> ProxyInfo:
        def get(server: Toxiproxy) -> ProxyInfo:
            proxy = self._proxy(server, name)
            return ProxyInfo(proxy.name, proxy.listen, proxy.upstream, proxy.enabled)

        return self._call(f"get proxy {name!r}", get)

    def set_enabled(self, name: str, enabled: bool) -> None:
        def switch(server: Toxiproxy) -> None:
            proxy = self._proxy(server, name)
            if enabled:
                proxy.enable()
            else:
                proxy.disable()

        self._call(f"{'enable' if enabled else 'disable'} proxy {name!r}", switch)

    def destroy(self, name: str) -> None:
        self._call(f"destroy proxy {name!r}", lambda server: self._proxy(server, name).destroy())

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self._call("reset", lambda server: server.reset())

    # -- toxics

    def add_toxic(self, proxy_name: str, toxic: ToxicRequest) -> None:
        def add(server: Toxiproxy) -> None:
            proxy = self._proxy(server, proxy_name)
            proxy.add_toxic(**toxic.to_json())
            # the client ignores a 5xx here: read back what the server holds
            if proxy.get_toxic(toxic.name) is None:
                raise NotFound(f"toxic {toxic.name!r} absent after it was added")

        self._call(f"add toxic {toxic.name!r} to {proxy_name!r}", add)

    def toxics(self, proxy_name: str) -> dict[str, dict]:
        def listing(server: Toxiproxy) -> dict[str, dict]:
            return {
                name: {
                    "type": t.type,
                    "stream": t.stream,
                    "toxicity": t.toxicity,
                    "attributes": dict(t.attributes),
                }
                for name, t in self._proxy(server, proxy_name).toxics().items()
            }

        return self._call(f"list toxics of {proxy_name!r}", listing)

    def remove_toxic(self, proxy_name: str, toxic_name: str) -> None:
        self._call(
            f"remove toxic {toxic_name!r} from {proxy_name!r}",
            lambda server: self._proxy(server, proxy_name).destroy_toxic(toxic_name),
        )

    # -- faults

    def apply(self, proxy_name: str, fault: Fault, toxic_name: str) -> None:
        """Perform a net fault on the proxy: add its toxic, or for `down` disable it."""
        check_performable(fault)
        if fault.kind == "down":
            self.set_enabled(proxy_name, False)
        else:
            self.add_toxic(proxy_name, toxic_request(fault, toxic_name))

    def lift(self, proxy_name: str, fault: Fault, toxic_name: str) -> None:
        """Undo `apply`: remove the toxic, or re-enable the proxy."""
        if fault.kind == "down":
            self.set_enabled(proxy_name, True)
        else:
            self.remove_toxic(proxy_name, toxic_name)


async def hold_window(
    driver: ToxiproxyDriver, proxy_name: str, fault: Fault, toxic_name: str, run_started: float
) -> None:
    """Perform a `@t` net fault: apply it at the window's start, lift it at its end.

    `run_started` is the run's start on trio's clock. An open window holds the
    fault until this task is cancelled; the fault is lifted however the task
    ends, within LIFT_DEADLINE_S, so a cancelled run leaves no toxic behind.
    """
    window = time_window(fault)
    if window is None:
        raise ValueError(f"{fault.text} has no @t window")
    start_s, end_s = window
    await trio.sleep_until(run_started + start_s)
    await trio.to_thread.run_sync(
        driver.apply, proxy_name, fault, toxic_name, abandon_on_cancel=True
    )
    try:
        await trio.sleep_until(float("inf") if end_s is None else run_started + end_s)
    finally:
        with trio.move_on_after(LIFT_DEADLINE_S) as lifting:
            lifting.shield = True
            await trio.to_thread.run_sync(
                driver.lift, proxy_name, fault, toxic_name, abandon_on_cancel=True
            )
        if lifting.cancelled_caught:
            raise ToxiproxyError(
                f"toxiproxy {driver.url}: lift {toxic_name!r} from {proxy_name!r}: "
                f"no answer in {LIFT_DEADLINE_S} s"
            )
