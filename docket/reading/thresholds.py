"""The named thresholds `docket explain` judges a run by, with their defaults.

Overridable in the policy file's [explain] table (docket.toml), one key per
field below, e.g. `[explain]` then `retry_min_recalls = 20`. They tune what is
*named*, never what is recorded, so they are not part of the policy's digest.
docs/reading.md says why each default is what it is.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace

from docket.errors import InputError
from docket.fields import Fields, show
from docket.inputs import read_text


@dataclass(frozen=True)
class Thresholds:
    # runaway-loop: near-same calls (same provider, model and endpoint, request size
    # within loop_size_tolerance of the first) in a row...
    loop_min_calls: int = 10  # ...that ran into a cap (a cap refused one of them)
    loop_min_calls_uncapped: int = 50  # ...or ran this long with no cap to stop them
    loop_size_tolerance: float = 0.10
    # retry-storm: a re-call on the same provider this soon after a failed or refused
    # call (and before any Retry-After it was given) is an immediate re-call...
    retry_window_ms: int = 100
    retry_min_recalls: int = 10  # ...and this many of them make a storm
    # retry-budget: a client's marked retries on one provider over this share of its
    # marked first attempts, plus this floor (the reference agent's own budget)
    retry_budget_ratio: float = 0.1
    retry_budget_floor: int = 3
    # cache-miss: one identical request (same request_sha256) paid for this many times
    cache_min_repeats: int = 3
    # fat-context: this many calls in a row to one model whose input only grows...
    fat_growth_calls: int = 5
    fat_growth_ratio: float = 2.0  # ...to this multiple of the first
    fat_dwarf_ratio: float = 20.0  # or input tokens per output token over the run
    fat_min_input_tokens: int = 10_000  # a run with fewer input tokens is never fat
    # premium-for-small-calls: calls answering at most this many tokens...
    premium_max_output_tokens: int = 64
    premium_min_calls: int = 5  # ...this many of them...
    premium_price_ratio: float = (
        4.0  # ...on a model this many times dearer than its provider's cheapest
    )
    # concentration: one model or provider with this share of the spend (or failures)...
    concentration_share: float = 0.9  # nearly all
    concentration_lift: float = 2.0  # ...and this multiple of its share of the calls
    concentration_min_failures: int = 5
    # policy-denials: one rule refusing the agent this many times
    denial_min_repeats: int = 5
    # write-scope: the path prefixes the run may change (relative to the snapshot's root);
    # empty: not judged
    write_scope: tuple[str, ...] = ()


DEFAULTS = Thresholds()
_TYPES = {f.name: type(getattr(DEFAULTS, f.name)) for f in fields(Thresholds)}


MAX_THRESHOLD = 10**12
KEYS = tuple(_TYPES)


def read_thresholds(f: Fields) -> Thresholds:
    """The defaults with an [explain] table's overrides, read like every other table
    (docket/fields.py): the policy checks it at load, `docket explain` reads it here."""
    f.known(KEYS)
    changes: dict[str, object] = {}
    for name, kind in _TYPES.items():
        if not f.has(name):
            continue
        if kind is tuple:
            paths = f.listing(name)
            if not all(type(p) is str and p for p in paths):
                f.fail(name, f"must be a list of paths, got {show(paths)}")
            changes[name] = tuple(paths)
        elif kind is int:
            changes[name] = f.integer(name, 0, maximum=MAX_THRESHOLD)
        else:
            changes[name] = f.number(name, 0.0, minimum=0, maximum=MAX_THRESHOLD)
    return replace(DEFAULTS, **changes)  # type: ignore[arg-type]  # keys checked above


def thresholds_from_table(table: object, source: str) -> Thresholds:
    """The [explain] table of the policy at `source`; a bad key or value is an InputError."""
    if table is None:
        return DEFAULTS
    if not isinstance(table, dict):
        raise InputError(f"policy {source}: explain must be a table")
    return read_thresholds(
        Fields(table, lambda key, reason: InputError(f"policy {source}: explain.{key}: {reason}"))
    )


def load_thresholds(policy_path: str | None) -> Thresholds:
    """The thresholds of a docket.toml's [explain] table (the defaults without one)."""
    if policy_path is None:
        return DEFAULTS
    text = read_text(policy_path, "policy")
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise InputError(f"policy {policy_path}: malformed TOML: {exc}") from None
    return thresholds_from_table(data.get("explain"), policy_path)
