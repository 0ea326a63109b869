"""Toxics: one small module per kind, each behind the one interface of `Toxic`.

A toxic sees one direction of one connection (a link) and may act at three
points: on each chunk (`pipe`: delay it, cut it, drop it, pass it on with
`send`), for as long as it is active on the link (`watch`), and when the
source closes (`at_eof`). Chunks carry the monotonic time they arrived, so a
delay is measured from arrival and the reader keeps reading meanwhile: a latency
toxic delays bytes without slowing the stream (Toxiproxy's semantics).

Attribute values are integers, as in Toxiproxy (milliseconds, bytes, KB/s).
Reading a POSTed toxic (`parse_toxic`, `ToxicSpec`) is spec.py's, which knows every kind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

STREAMS = ("upstream", "downstream")  # upstream: client -> server; downstream: server -> client


@dataclass(frozen=True)
class Chunk:
    data: bytes
    arrived: float  # trio.current_time() when the proxy read it


Send = Callable[[Chunk], Awaitable[None]]


class LinkControl(Protocol):
    """What a toxic may do to the connection it sits on."""

    def close(self, reason: str) -> None:
        """Close both sides gracefully (FIN), after what was sent so far."""

    def reset(self, reason: str) -> None:
        """Close both sides with a TCP RST (SO_LINGER 0)."""


class ToxicError(ValueError):
    """A toxic description the API refuses (answered 400)."""


class Toxic:
    """Base of every toxic kind: validated integer attributes and no-op hooks."""

    kind: ClassVar[str]
    defaults: ClassVar[dict[str, int]] = {}
    closes_on_removal: ClassVar[bool] = False  # removing it closes the links it held

    def __init__(self, attributes: dict[str, Any]) -> None:
        unknown = sorted(set(attributes) - set(self.defaults))
        if unknown:
            raise ToxicError(f"{self.kind}: unknown attribute {unknown[0]!r}")
        values = dict(self.defaults)
        for key, value in attributes.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ToxicError(f"{self.kind}: attribute {key!r} must be a number")
            if value < 0 or value != int(value):
                raise ToxicError(f"{self.kind}: attribute {key!r} must be a whole number >= 0")
            values[key] = int(value)
        self.attributes = values
        self.check()

    def check(self) -> None:
        """Raise ToxicError for a combination of attributes that makes no sense."""

    async def pipe(self, chunk: Chunk, send: Send, link: LinkControl, state: dict) -> None:
        await send(chunk)

    async def watch(self, link: LinkControl) -> None:
        return None

    async def at_eof(self, link: LinkControl, state: dict) -> None:
        return None
