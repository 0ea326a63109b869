"""Routes: where `/<provider>/...` goes, and with which key.

One Route per configured provider, made once when the boundary is built: the
upstream pool (sized by the bulkhead when there is one), the Host header the
provider expects, the path prefix of its base URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from docket.boundary.providers import Provider, by_kind
from docket.guards.redact import sanitize_url
from docket.http.client import UpstreamPool
from docket.policy import ProviderPolicy

# What a path's first segment must look like to be named in a route refusal's
# record; anything else (a URL's userinfo, a key pasted into a base URL) is not copied.
ROUTE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
UNKNOWN_ROUTE = "(none)"  # the provider label of a refusal for an unknown route


@dataclass
class Route:
    """One configured provider: where `/<name>/...` goes and with which key."""

    name: str
    provider: Provider  # its wire format (providers/interface.py)
    api_key: str
    pool: UpstreamPool
    host_header: str
    path_prefix: str
    # The upstream's base URL as configured, without userinfo or secret-looking query
    # values: model.request names it, so a receipt can say which endpoint answered.
    base_url: str = ""
    # Set by `docket replay` on its routes to the replay upstream it started: the key
    # that upstream's answers carry (boundary/replayed.py). None: answers are never replays.
    replay_key: str | None = None

    def target(self, rest: str, query: str) -> str:
        return f"{self.path_prefix}/{rest}" + (f"?{query}" if query else "")


def make_route(
    provider: ProviderPolicy,
    *,
    connect_timeout: float,
    read_timeout: float,
    env: Mapping[str, str],
    max_connections: int | None,
) -> Route:
    """`max_connections`: the bulkhead's slots when it has one (one limit, not two),
    else the pool's own default."""
    parts = urlsplit(provider.base_url)
    default_port = 443 if parts.scheme == "https" else 80
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # urlsplit drops an IPv6 address's brackets; the Host header keeps them
    host_header = host if (parts.port or default_port) == default_port else f"{host}:{parts.port}"
    origin = f"{parts.scheme}://{parts.netloc}"
    if max_connections is None:
        pool = UpstreamPool(origin, connect_timeout=connect_timeout, read_timeout=read_timeout)
    else:
        pool = UpstreamPool(
            origin,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_connections=max_connections,
        )
    return Route(
        name=provider.name,
        provider=by_kind(provider.kind),
        api_key=env.get(provider.key_env, ""),
        pool=pool,
        host_header=host_header,
        path_prefix=parts.path.rstrip("/"),
        base_url=sanitize_url(provider.base_url),
    )
