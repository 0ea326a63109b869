"""The values a fault text carries: argument values and trigger conditions.

Each is a frozen value that prints (`.text`) its canonical spelling in the
grammar of spec/fault-grammar.md; chaos.faults.grammar parses text into them.
"""

from __future__ import annotations

from dataclasses import dataclass

from docket.values import format_percent

# ---------------------------------------------------------------- values


@dataclass(frozen=True)
class Duration:
    ms: int  # exact integer milliseconds; negative only for clock:step

    @property
    def text(self) -> str:
        if self.ms == 0:
            return "0"
        sign, n = ("-" if self.ms < 0 else ""), abs(self.ms)
        if n % 60_000 == 0:
            return f"{sign}{n // 60_000}m"
        if n % 1000 == 0:
            return f"{sign}{n // 1000}s"
        return f"{sign}{n}ms"


@dataclass(frozen=True)
class Size:
    bytes: int

    @property
    def text(self) -> str:
        for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
            if self.bytes and self.bytes % factor == 0:
                return f"{self.bytes // factor}{unit}"
        return f"{self.bytes}B"


@dataclass(frozen=True)
class Rate:
    kb_per_s: int  # Toxiproxy's bandwidth unit

    @property
    def text(self) -> str:
        return f"{self.kb_per_s}KB/s"


@dataclass(frozen=True)
class HttpDate:
    value: str  # an IMF-fixdate, as Retry-After carries it

    @property
    def text(self) -> str:
        return f'"{self.value}"'


Value = int | str | Duration | Size | Rate | HttpDate


def value_text(value: Value) -> str:
    if isinstance(value, int | str):
        return str(value)
    return value.text


# ---------------------------------------------------------------- triggers


@dataclass(frozen=True)
class Ordinals:
    """`call A..B` / `seq A..B`, both ends inclusive; `last=None` is open-ended."""

    counter: str  # "call" (1-based) or "seq" (the ledger's seq, 0-based)
    first: int
    last: int | None

    @property
    def text(self) -> str:
        if self.last == self.first:
            return f"{self.counter} {self.first}"
        return f"{self.counter} {self.first}..{'' if self.last is None else self.last}"


@dataclass(frozen=True)
class Window:
    """`t A..B`: from A (inclusive) to B (exclusive) after the run's start, or, with
    `after call N`, after the moment the run's boundary recorded its N-th request."""

    start_ms: int
    end_ms: int | None
    after_call: int | None = None  # the anchor: None is the run's start

    @property
    def text(self) -> str:
        end = "" if self.end_ms is None else Duration(self.end_ms).text
        return f"t {Duration(self.start_ms).text}..{end}{_anchor_text(self.after_call)}"


@dataclass(frozen=True)
class Instant:
    """`t A`: the moment A after the run's start, or after call N with `after call N`
    (a timer fires once; ordinals see A..)."""

    at_ms: int
    after_call: int | None = None

    @property
    def text(self) -> str:
        return f"t {Duration(self.at_ms).text}{_anchor_text(self.after_call)}"


def _anchor_text(after_call: int | None) -> str:
    return "" if after_call is None else f" after call {after_call}"


@dataclass(frozen=True)
class Chance:
    """`N%`: each ordinal fires with this probability, decided by the seeded schedule."""

    basis_points: int  # hundredths of a percent, 0..10000

    @property
    def text(self) -> str:
        return format_percent(self.basis_points)


Condition = Ordinals | Window | Instant | Chance
CONDITION_ORDER = {Ordinals: 0, Window: 1, Instant: 1, Chance: 2}


@dataclass(frozen=True)
class Trigger:
    """All conditions must hold; none at all is `always`. Kept in canonical order."""

    conditions: tuple[Condition, ...] = ()

    @property
    def text(self) -> str:
        if not self.conditions:
            return "always"
        return " & ".join(c.text for c in self.conditions)

    def _find(self, *kinds: type) -> Condition | None:
        return next((c for c in self.conditions if isinstance(c, kinds)), None)

    @property
    def ordinals(self) -> Ordinals | None:
        return self._find(Ordinals)  # type: ignore[return-value]

    @property
    def chance(self) -> Chance | None:
        return self._find(Chance)  # type: ignore[return-value]

    @property
    def timed(self) -> Window | Instant | None:
        return self._find(Window, Instant)  # type: ignore[return-value]
