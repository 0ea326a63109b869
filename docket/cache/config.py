"""The [cache] policy table: off unless `enabled = true`.

Read by `cache_policy` through the policy's own Fields (docket/fields.py), so its
errors read like every other table's: `policy FILE: cache.ttl: REASON`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from docket.fields import Fields, show

MAX_INT = 2**53 - 1

MiB = 1 << 20
# What a request may carry and still be served, when the policy says so per model.
SAMPLING_KINDS = ("temperature", "n", "tools")
# scope "run", or the name of a store shared between runs (docket/cache/shared.py): also
# its file's name under `dir`.
_SCOPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z", re.ASCII)


@dataclass(frozen=True)
class CachePolicy:
    enabled: bool = False
    ttl: float = 300.0  # seconds an entry may be served after it was stored
    max_entries: int = 1000
    max_bytes: int = 64 * MiB  # the answers' bytes, headers and all, over every entry
    max_hits: int = 100  # a brake per entry: served this often, then dropped
    models: tuple[str, ...] = ()  # empty: every model
    scope: str = "run"
    dir: str | None = None  # a shared store's folder (resolved against the policy file's)
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
            **({"dir": self.dir} if self.dir is not None else {}),
            "serve_anyway": {m: list(k) for m, k in sorted(self.serve_anyway.items())},
        }


CACHE_KEYS = (
    "enabled",
    "ttl",
    "max_entries",
    "max_bytes",
    "max_hits",
    "models",
    "scope",
    "dir",
    "serve_anyway",
)


def cache_policy(f: Fields) -> CachePolicy:
    """The [cache] table as a CachePolicy, read like every other table of the policy
    (docket/fields.py: its keys declared, docket.values' grammars, one wording)."""
    f.known(CACHE_KEYS)
    d = CachePolicy()
    scope = f.string("scope", d.scope)
    if not _SCOPE_NAME.match(scope):
        f.fail(
            "scope",
            f'must be "run" or a store\'s name (letters, digits, - and _), got {show(scope)}',
        )
    folder = f.string("dir", None)
    if scope == "run" and folder is not None:
        f.fail("dir", 'names a shared store\'s folder: give it with a scope other than "run"')
    if scope != "run" and not folder:
        f.fail(
            "dir",
            f"must name the folder of the shared store {scope!r} (relative to the policy file)",
        )
    if folder is not None and "\x00" in folder:
        f.fail("dir", "must not hold a NUL byte")
    models: tuple[str, ...] = ()
    if f.has("models"):
        listed = f.listing("models")
        if not listed:
            f.fail("models", "must be a non-empty list of model names (leave it out for all)")
        for i, m in enumerate(listed):
            if not isinstance(m, str) or not m:
                f.fail(f"models[{i}]", f"must be a model name, got {show(m)}")
        models = tuple(str(m) for m in listed)
    allowed: dict[str, tuple[str, ...]] = {}
    for model, kinds in f.mapping("serve_anyway").items():
        if not isinstance(kinds, list) or any(k not in SAMPLING_KINDS for k in kinds):
            f.fail(
                f"serve_anyway.{model}",
                f"must be a list of {', '.join(SAMPLING_KINDS)}, got {show(kinds)}",
            )
        allowed[model] = tuple(sorted(set(kinds)))
    return CachePolicy(
        enabled=f.boolean("enabled", d.enabled),
        ttl=f.duration("ttl", d.ttl),
        max_entries=f.integer("max_entries", d.max_entries, minimum=1, maximum=MAX_INT),
        max_bytes=f.size("max_bytes", d.max_bytes, minimum=1024),
        max_hits=f.integer("max_hits", d.max_hits, minimum=1, maximum=MAX_INT),
        models=models,
        scope=scope,
        dir=folder,
        serve_anyway=MappingProxyType(allowed),
    )
