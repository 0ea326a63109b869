"""The [cache] policy table: off unless `enabled = true`.

Read by `cache_policy`, which the policy calls with its own error and its own
duration and size grammars (so this module imports neither docket.policy nor them).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NoReturn

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


Fail = Callable[[str, str], NoReturn]  # (key path, reason): raises the reader's error
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


def cache_policy(
    t: Mapping[str, object],
    fail: Fail,
    *,
    seconds: Callable[[object], float | None],
    size: Callable[[object], int | None],
) -> CachePolicy:
    """The [cache] table as a CachePolicy; `fail` names the first bad key. The grammars
    of a duration and a size are the caller's (`seconds`, `size`: None for a value they
    do not read), so that this reader says what every other config reader says."""
    for key in t:
        if key not in _KEYS:
            near = difflib.get_close_matches(key, _KEYS, n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}?)" if near else f" (known: {', '.join(_KEYS)})"
            fail(f"cache.{key}", "unknown key" + hint)
    d = CachePolicy()
    enabled = t.get("enabled", d.enabled)
    if not isinstance(enabled, bool):
        fail("cache.enabled", f"must be true or false, got {enabled!r}")
    scope = t.get("scope", d.scope)
    if not isinstance(scope, str) or not scope:
        fail("cache.scope", f'must be "run" or a store file name, got {scope!r}')
    if scope != "run":
        # A store shared between runs needs its own file format, locking and an audit
        # trail naming the run an answer came from: not built yet.
        fail("cache.scope", f'only "run" is built yet (a named store {scope!r} is not)')
    models = t.get("models")
    models_t: tuple[str, ...] = ()
    if models is not None:
        if not isinstance(models, list) or not models:
            fail("cache.models", "must be a non-empty list of model names (leave it out for all)")
        for i, m in enumerate(models):
            if not isinstance(m, str) or not m:
                fail(f"cache.models[{i}]", f"must be a model name, got {m!r}")
        models_t = tuple(models)
    anyway = t.get("serve_anyway", {})
    if not isinstance(anyway, dict):
        fail("cache.serve_anyway", 'must be a table: model = ["temperature", "n", "tools"]')
    allowed: dict[str, tuple[str, ...]] = {}
    for model, kinds in anyway.items():
        if not isinstance(kinds, list) or any(k not in SAMPLING_KINDS for k in kinds):
            fail(
                f"cache.serve_anyway.{model}",
                f"must be a list of {', '.join(SAMPLING_KINDS)}, got {kinds!r}",
            )
        allowed[model] = tuple(sorted(set(kinds)))
    ttl = d.ttl
    if "ttl" in t:
        read = seconds(t["ttl"])
        if read is None or read <= 0:
            fail("cache.ttl", f'must be a positive duration, e.g. "30s" or "10m", got {t["ttl"]!r}')
        ttl = read
    max_bytes = d.max_bytes
    if "max_bytes" in t:
        read_size = size(t["max_bytes"])
        if read_size is None or read_size < 1024:
            fail(
                "cache.max_bytes",
                f'must be at least 1024 bytes, e.g. "64MiB", got {t["max_bytes"]!r}',
            )
        max_bytes = read_size
    return CachePolicy(
        enabled=enabled,
        ttl=ttl,
        max_entries=_whole(t, "max_entries", d.max_entries, fail),
        max_bytes=max_bytes,
        max_hits=_whole(t, "max_hits", d.max_hits, fail),
        models=models_t,
        scope=scope,
        serve_anyway=MappingProxyType(allowed),
    )


def _whole(t: Mapping[str, object], key: str, default: int, fail: Fail) -> int:
    v = t.get(key, default)
    if type(v) is not int or not 1 <= v <= 2**53 - 1:
        fail(f"cache.{key}", f"must be a whole number of at least 1, got {v!r}")
    return v
