"""The [cache] policy table: off unless `enabled = true`.

Parsed with the policy's own checker (docket.policy._Checker, passed in, so this
module does not import docket.policy and the policy can import it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

MiB = 1 << 20
# What a request may carry and still be served, when the policy says so per model.
SAMPLING_KINDS = ("temperature", "n", "tools")
SCOPES = ("run",)


@dataclass(frozen=True)
class CachePolicy:
    enabled: bool = False
    ttl: float = 300.0  # seconds an entry may be served after it was stored
    max_entries: int = 1000
    max_bytes: int = 64 * MiB  # the answers' bytes, headers and all, over every entry
    max_hits: int = 100  # a brake per entry: served this often, then dropped
    models: tuple[str, ...] = ()  # empty: every model
    scope: str = "run"
    # model -> which of SAMPLING_KINDS its requests may carry and still be served
    serve_anyway: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )

    def to_dict(self) -> dict:
        return {
            "enabled": self.enabled,
            "ttl": self.ttl,
            "max_entries": self.max_entries,
            "max_bytes": self.max_bytes,
            "max_hits": self.max_hits,
            "models": list(self.models),
            "scope": self.scope,
            "serve_anyway": {m: list(k) for m, k in sorted(self.serve_anyway.items())},
        }


class Checker(Protocol):
    def fail(self, path: str, reason: str) -> Any: ...
    def table(self, t: dict, path: str, known: tuple[str, ...]) -> None: ...
    def boolean(self, t: dict, path: str, default: bool) -> bool: ...
    def integer(
        self, t: dict, path: str, default: int | None, minimum: int = 0, maximum: int | None = None
    ) -> int | None: ...
    def duration(self, t: dict, path: str, default: float | None) -> float | None: ...
    def size(self, t: dict, path: str, default: int, minimum: int) -> int: ...


_KEYS = (
    "enabled",
    "ttl",
    "max_entries",
    "max_bytes",
    "max_hits",
    "models",
    "scope",
    "serve_anyway",
)


def cache_policy(c: Checker, t: dict) -> CachePolicy:
    """The [cache] table as a CachePolicy; PolicyError (via c.fail) naming the key."""
    c.table(t, "cache", _KEYS)
    d = CachePolicy()
    scope = t.get("scope", "run")
    if not isinstance(scope, str) or not scope:
        c.fail("cache.scope", f'must be "run" or a store file name, got {scope!r}')
    if scope != "run":
        # A store shared between runs needs its own file format, locking and audit trail.
        c.fail("cache.scope", f'only "run" is built yet (a named store {scope!r} is not)')
    models = t.get("models")
    if models is None:
        models_t: tuple[str, ...] = ()
    else:
        if not isinstance(models, list) or not models:
            c.fail("cache.models", "must be a non-empty list of model names (leave it out for all)")
        for i, m in enumerate(models):
            if not isinstance(m, str) or not m:
                c.fail(f"cache.models[{i}]", f"must be a model name, got {m!r}")
        models_t = tuple(models)
    anyway = t.get("serve_anyway", {})
    if not isinstance(anyway, dict):
        c.fail("cache.serve_anyway", 'must be a table: model = ["temperature", "n", "tools"]')
    allowed: dict[str, tuple[str, ...]] = {}
    for model, kinds in anyway.items():
        path = f"cache.serve_anyway.{model}"
        if not isinstance(kinds, list) or any(k not in SAMPLING_KINDS for k in kinds):
            c.fail(path, f"must be a list of {', '.join(SAMPLING_KINDS)}, got {kinds!r}")
        allowed[model] = tuple(sorted(set(kinds)))
    ttl = c.duration(t, "cache.ttl", d.ttl)
    assert ttl is not None
    entries = c.integer(t, "cache.max_entries", d.max_entries, minimum=1)
    hits = c.integer(t, "cache.max_hits", d.max_hits, minimum=1)
    assert entries is not None and hits is not None
    return CachePolicy(
        enabled=c.boolean(t, "cache.enabled", d.enabled),
        ttl=ttl,
        max_entries=entries,
        max_bytes=c.size(t, "cache.max_bytes", d.max_bytes, minimum=1024),
        max_hits=hits,
        models=models_t,
        scope=scope,
        serve_anyway=MappingProxyType(allowed),
    )
