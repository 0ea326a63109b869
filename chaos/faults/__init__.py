"""What a fault family is: the kinds one layer can perform and the arguments each takes.

One module per family (upstream, net, ledger, clock, process) implements a
`FaultFamily`. The grammar validates a fault against the same `FamilySpec`
table (chaos.faults.table.FAMILIES) before a run starts, so a fault its layer
cannot perform is refused with a column, never discovered mid-run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

# The value shapes an argument may take; chaos.faults.grammar parses and prints each one.
VALUE_TYPES = frozenset(
    {"int", "duration", "signed_duration", "size", "rate", "http_date", "choice"}
)


@dataclass(frozen=True)
class Param:
    """One argument of a fault kind.

    `positional` params may be given by position or by name and print by
    position; the others must be named. A value equal to `default` is dropped
    from the canonical form, so `net:reset_peer(0)` and `net:reset_peer` are one fault.
    """

    name: str
    types: tuple[str, ...]
    required: bool = False
    default: object = None
    positional: bool = False
    choices: tuple[str, ...] = ()
    minimum: int | None = None  # on the int value, or milliseconds, or bytes
    maximum: int | None = None
    nonzero: bool = False


@dataclass(frozen=True)
class KindSpec:
    params: tuple[Param, ...] = ()

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


@dataclass(frozen=True)
class FamilySpec:
    """A target's kinds and the ordinal counters its layer can see.

    `counters` is what `@call`/`@seq` may name for this target; `default_counter`
    is what a bare `@N%` counts.
    """

    target: str
    kinds: Mapping[str, KindSpec] = field(default_factory=dict)
    counters: tuple[str, ...] = ("call",)
    default_counter: str = "call"


class FaultFamily(Protocol):
    """What each chaos.faults.<family> module provides (implemented per layer later)."""

    target: str
    kinds: Mapping[str, KindSpec]
