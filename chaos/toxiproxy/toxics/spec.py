"""A toxic as Toxiproxy's API takes it: `parse_toxic` reads a POSTed body into a ToxicSpec.

The kinds (one module each beside this one) implement the interface in the
package's __init__; this module knows every kind, so it imports them, and none
of them imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaos.toxiproxy.toxics import (
    STREAMS,
    Toxic,
    ToxicError,
    bandwidth,
    latency,
    limit_data,
    reset_peer,
    slicer,
    slow_close,
    timeout,
)


@dataclass
class ToxicSpec:
    """A toxic as the API names it: which stream, how often, and its behaviour."""

    name: str
    type: str
    stream: str
    toxicity: float
    behaviour: Toxic = field(repr=False)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.behaviour.attributes),
        }


def toxic_types() -> dict[str, type[Toxic]]:
    kinds = (
        latency.Latency,
        timeout.Timeout,
        reset_peer.ResetPeer,
        limit_data.LimitData,
        bandwidth.Bandwidth,
        slow_close.SlowClose,
        slicer.Slicer,
    )
    return {kind.kind: kind for kind in kinds}


def parse_toxic(body: Any) -> ToxicSpec:
    """A POST /proxies/{name}/toxics body -> ToxicSpec; ToxicError names the problem."""
    if not isinstance(body, dict):
        raise ToxicError("toxic must be a JSON object")
    kind = body.get("type")
    types = toxic_types()
    if kind not in types:
        raise ToxicError(f"Bad toxic type: {kind!r}")
    stream = body.get("stream", "downstream")
    if stream not in STREAMS:
        raise ToxicError(f"Invalid toxic stream: {stream!r}")
    name = body.get("name") or f"{kind}_{stream}"
    if not isinstance(name, str):
        raise ToxicError("toxic name must be a string")
    toxicity = body.get("toxicity", 1.0)
    if isinstance(toxicity, bool) or not isinstance(toxicity, int | float):
        raise ToxicError("toxicity must be a number")
    if not 0.0 <= toxicity <= 1.0:
        raise ToxicError("toxicity must be between 0 and 1")
    attributes = body.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise ToxicError("attributes must be a JSON object")
    return ToxicSpec(name, kind, stream, float(toxicity), types[kind](attributes))
