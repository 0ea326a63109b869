"""Amounts of the three counted caps: nano-USD, tokens and model calls."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Amounts:
    nusd: int = 0
    tokens: int = 0
    calls: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(self.nusd + other.nusd, self.tokens + other.tokens, self.calls + other.calls)

    def __sub__(self, other: Amounts) -> Amounts:
        return Amounts(self.nusd - other.nusd, self.tokens - other.tokens, self.calls - other.calls)

    def covers(self, other: Amounts) -> bool:
        """Whether every amount here is at least other's."""
        return self.nusd >= other.nusd and self.tokens >= other.tokens and self.calls >= other.calls

    def as_dict(self) -> dict[str, int]:
        return {"nusd": self.nusd, "tokens": self.tokens, "calls": self.calls}


ZERO = Amounts()


@dataclass(frozen=True)
class Caps:
    """A budget's caps; None: that dimension is not capped."""

    nusd: int | None
    tokens: int | None = None
    calls: int | None = None

    def room(self, used: Amounts) -> Amounts:
        """What is left under each cap once `used` is counted (a very large number for
        a dimension without a cap: nothing there ever runs short)."""
        return Amounts(
            _room(self.nusd, used.nusd),
            _room(self.tokens, used.tokens),
            _room(self.calls, used.calls),
        )


UNCAPPED = 1 << 62  # the room of a dimension without a cap


def _room(cap: int | None, used: int) -> int:
    return UNCAPPED if cap is None else cap - used


def least(a: Amounts, b: Amounts) -> Amounts:
    return Amounts(
        max(0, min(a.nusd, b.nusd)), max(0, min(a.tokens, b.tokens)), max(0, min(a.calls, b.calls))
    )
