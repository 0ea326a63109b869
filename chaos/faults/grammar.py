"""The fault grammar: `target:kind(args)@trigger` text <-> `Fault` values.

spec/fault-grammar.md is the written grammar (EBNF) and the reference for every
rule here. Parsing is pure; a bad fault raises `FaultSyntaxError`, one line that
names the 1-based column and what was expected. Every `Fault` prints back
(`.text`) to the canonical text that parses to the same `Fault`.

The values live in chaos.faults.values, the table of targets and kinds in
chaos.faults.table, the per-shape value converters in chaos.faults.converters;
import them from there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from chaos.faults import FamilySpec, KindSpec, Param
from chaos.faults.converters import CONVERTERS, SHAPES
from chaos.faults.table import FAMILIES
from chaos.faults.values import (
    CONDITION_ORDER,
    Chance,
    Condition,
    Instant,
    Ordinals,
    Trigger,
    Value,
    Window,
    value_text,
)
from docket.errors import InputError
from docket.values import ValueProblem, parse_percent

__all__ = [
    "Fault",
    "FaultSyntaxError",
    "parse_fault",
    "parse_faults",
]

# ---------------------------------------------------------------- faults


@dataclass(frozen=True)
class Fault:
    target: str
    kind: str
    args: tuple[tuple[str, Value], ...]  # in the kind's parameter order, defaults dropped
    trigger: Trigger

    @property
    def spec(self) -> KindSpec:
        return FAMILIES[self.target].kinds[self.kind]

    @cached_property  # asked on every decision; a frozen value's text never changes
    def text(self) -> str:
        given = dict(self.args)
        parts = []
        by_position = True  # once a positional param is left out, later ones must be named
        for param in self.spec.params:
            if param.name not in given:
                by_position = by_position and not param.positional
                continue
            shown = value_text(given[param.name])
            by_position = by_position and param.positional
            parts.append(shown if by_position else f"{param.name}={shown}")
        call = f"({', '.join(parts)})" if parts else ""
        return f"{self.target}:{self.kind}{call}@{self.trigger.text}"

    def arg(self, name: str) -> Value | None:
        """The argument's value, or its default when the text left it out."""
        for given, value in self.args:
            if given == name:
                return value
        param = self.spec.param(name)
        if param is None:
            raise KeyError(f"{self.target}:{self.kind} has no argument {name!r}")
        return param.default  # type: ignore[return-value]

    @property
    def counter(self) -> str:
        """What this fault's ordinals count: `call` (1-based) or `seq` (0-based)."""
        ordinals = self.trigger.ordinals
        return ordinals.counter if ordinals else FAMILIES[self.target].default_counter


# ---------------------------------------------------------------- errors


class FaultSyntaxError(InputError):
    """A fault text that does not parse or that its layer cannot perform (exit 2)."""

    def __init__(self, text: str, column: int, reason: str) -> None:
        # The text is echoed cut short: a 5,000-character fault would bury the reason.
        shown = text if len(text) <= 120 else text[:120] + f"... ({len(text)} characters)"
        super().__init__(f"fault {shown!r}: column {column}: {reason}")
        self.text = text
        self.column = column  # 1-based
        self.reason = reason


# ---------------------------------------------------------------- parser

_IDENT = re.compile(r"[a-z_][a-z0-9_]*")
_WORD = re.compile(r"[a-z]+")  # trigger keywords: `call5` is `call` missing its space
# Digits are ASCII only here ([0-9], never \d or str.isdigit(), which take "５").
_PERCENT = re.compile(r"([0-9]+)(?:\.([0-9]+))?%")
_DIGITS = re.compile(r"[0-9]+")
_TDURATION = re.compile(r"[0-9]+(?:\.[0-9]+)?[A-Za-z]*")
MAX_ORDINAL_DIGITS = 15


def _digit_at(text: str, pos: int) -> bool:
    return pos < len(text) and "0" <= text[pos] <= "9"


_VALUE_CHARS = re.compile(r"[^,()\s\"]+")
# targets a timer performs, so a window may count from a call instead of the run's start
ANCHORED_TARGETS = ("net", "clock", "process")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # -- low level
    def fail(self, reason: str, pos: int | None = None) -> FaultSyntaxError:
        return FaultSyntaxError(self.text, (self.pos if pos is None else pos) + 1, reason)

    def found(self, pos: int | None = None) -> str:
        pos = self.pos if pos is None else pos
        return "end of text" if pos >= len(self.text) else repr(self.text[pos])

    def expected(self, what: str, pos: int | None = None) -> FaultSyntaxError:
        return self.fail(f"expected {what}, found {self.found(pos)}", pos)

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self, s: str) -> bool:
        return self.text.startswith(s, self.pos)

    def ident(self, what: str) -> tuple[str, int]:
        m = _IDENT.match(self.text, self.pos)
        if not m:
            raise self.expected(what)
        self.pos = m.end()
        return m.group(), m.start()

    # -- fault
    def fault(self) -> Fault:
        self.skip_ws()
        target, target_at = self.ident("a target (" + ", ".join(FAMILIES) + ")")
        if not self.peek(":"):
            raise self.expected("':' after the target")
        family = FAMILIES.get(target)
        if family is None:
            raise self.fail(
                f"unknown target {target!r} (expected one of: {', '.join(FAMILIES)})", target_at
            )
        self.pos += 1
        kind, kind_at = self.ident(f"a {target} fault kind")
        spec = family.kinds.get(kind)
        if spec is None:
            raise self.fail(
                f"unknown {target} kind {kind!r} (expected one of: {', '.join(family.kinds)})",
                kind_at,
            )
        args = self.arguments(f"{target}:{kind}", spec)
        self.skip_ws()
        if self.peek("@"):
            self.pos += 1
            trigger = self.trigger(family)
        elif self.pos >= len(self.text):
            trigger = Trigger()
        else:
            raise self.expected("'@' or end of text")
        self.skip_ws()
        if self.pos < len(self.text):
            raise self.expected("'&' or end of text")
        return Fault(target, kind, args, trigger)

    # -- arguments
    def arguments(self, name: str, spec: KindSpec) -> tuple[tuple[str, Value], ...]:
        given: list[tuple[str | None, int, str, int]] = []  # (name, its position, token, position)
        close_at = self.pos
        if self.peek("("):
            self.pos += 1
            self.skip_ws()
            if self.peek(")"):
                close_at = self.pos
                self.pos += 1
            else:
                while True:
                    given.append(self.argument())
                    self.skip_ws()
                    if self.peek(","):
                        self.pos += 1
                        continue
                    if self.peek(")"):
                        close_at = self.pos
                        self.pos += 1
                        break
                    raise self.expected("',' or ')'")
        return self.bind(name, spec, given, close_at)

    def argument(self) -> tuple[str | None, int, str, int]:
        self.skip_ws()
        named: str | None = None
        named_at = self.pos
        m = _IDENT.match(self.text, self.pos)
        if m:
            after = m.end()
            while after < len(self.text) and self.text[after] in " \t":
                after += 1
            if self.text.startswith("=", after):
                named, self.pos = m.group(), after + 1
                self.skip_ws()
        start = self.pos
        if self.peek('"'):
            end = self.text.find('"', self.pos + 1)
            if end < 0:
                raise self.fail("unclosed '\"'", start)
            self.pos = end + 1
        else:
            m = _VALUE_CHARS.match(self.text, self.pos)
            if not m:
                raise self.expected("an argument value")
            self.pos = m.end()
        return named, named_at, self.text[start : self.pos], start

    def bind(
        self, name: str, spec: KindSpec, given: list, close_at: int
    ) -> tuple[tuple[str, Value], ...]:
        positional = [p for p in spec.params if p.positional]
        values: dict[str, Value] = {}
        index = 0
        for arg_name, name_at, token, at in given:
            if arg_name is None:
                if index >= len(positional):
                    limit = len(positional)
                    raise self.fail(
                        f"{name} takes {limit} positional argument{'s' if limit != 1 else ''}"
                        + (
                            ""
                            if not spec.params
                            else f" (named: {', '.join(p.name for p in spec.params)})"
                        ),
                        at,
                    )
                param = positional[index]
                index += 1
            else:
                named = spec.param(arg_name)
                if named is None:
                    allowed = ", ".join(p.name for p in spec.params) or "none"
                    raise self.fail(
                        f"unknown argument {arg_name!r} for {name} (expected: {allowed})",
                        name_at,
                    )
                param = named
            if param.name in values:
                raise self.fail(f"argument {param.name!r} given twice", at)
            values[param.name] = self.value(param, token, at)
        for p in spec.params:
            if p.required and p.name not in values:
                raise self.fail(f"{name} needs its {p.name!r} argument", close_at)
        return tuple(
            (p.name, values[p.name])
            for p in spec.params
            if p.name in values and values[p.name] != p.default
        )

    def value(self, param: Param, token: str, at: int) -> Value:
        for kind in param.types:
            parsed = CONVERTERS[kind](self, param, token, at)
            if parsed is not None:
                return parsed
        shapes = " or ".join(SHAPES[k] for k in param.types)
        raise self.fail(f"expected {shapes} for {param.name!r}, found {token!r}", at)

    # -- triggers
    def trigger(self, family: FamilySpec) -> Trigger:
        conditions: list[tuple[Condition, int]] = []
        always_at: list[int] = []
        while True:
            self.skip_ws()
            at = self.pos
            if _digit_at(self.text, self.pos):
                conditions.append((self.chance(), at))
            else:
                word = _WORD.match(self.text, self.pos)
                if not word or word.group() not in ("always", "call", "seq", "t"):
                    raise self.expected("a percentage, 'call', 'seq', 't' or 'always'")
                self.pos = word.end()
                if word.group() == "always":
                    always_at.append(at)
                elif word.group() == "t":
                    conditions.append((self.window(), at))
                else:
                    if word.group() not in family.counters:
                        counters = " or ".join(f"@{c}" for c in family.counters)
                        raise self.fail(
                            f"{family.target} faults cannot count {word.group()!r}: use {counters}",
                            at,
                        )
                    conditions.append((self.ordinals(word.group()), at))
            self.skip_ws()
            if not self.peek("&"):
                break
            self.pos += 1
        if always_at and (conditions or len(always_at) > 1):
            raise self.fail("'always' cannot be combined with other conditions", always_at[0])
        for condition, at in conditions:
            if getattr(condition, "after_call", None) is None:
                continue
            # An anchored window is performed by a timer started at the anchor (net, clock,
            # process); upstream and ledger faults are decided per call or seq instead.
            if family.target not in ANCHORED_TARGETS:
                raise self.fail(
                    f"{family.target} faults are decided per ordinal: an 'after call' window "
                    f"is for {', '.join(ANCHORED_TARGETS)} faults (use @call or @seq)",
                    at,
                )
            if len(conditions) > 1:
                raise self.fail("an 'after call' window stands alone in its trigger", at)
        seen: dict[int, int] = {}
        for condition, at in conditions:
            rank = CONDITION_ORDER[type(condition)]
            if rank in seen:
                raise self.fail("a trigger takes at most one condition of each kind", at)
            seen[rank] = at
        ordered = sorted((c for c, _ in conditions), key=lambda c: CONDITION_ORDER[type(c)])
        return Trigger(tuple(ordered))

    def chance(self) -> Chance:
        at = self.pos
        m = _PERCENT.match(self.text, self.pos)
        if not m:
            number = re.compile(r"[0-9]+(?:\.[0-9]+)?").match(self.text, self.pos)
            raise self.expected("'%' after the percentage", number.end() if number else at)
        try:
            basis_points = parse_percent(m.group())  # docket.values' percentage grammar
        except ValueProblem as exc:
            raise self.fail(exc.reason, at) from None
        self.pos = m.end()
        return Chance(basis_points)

    def whole_number(self, what: str) -> tuple[int, int]:
        m = _DIGITS.match(self.text, self.pos)
        if not m:
            raise self.expected(what)
        if len(m.group()) > MAX_ORDINAL_DIGITS:
            raise self.fail(f"{what} has more than {MAX_ORDINAL_DIGITS} digits", m.start())
        self.pos = m.end()
        return int(m.group()), m.start()

    def ordinals(self, counter: str) -> Ordinals:
        self.require_space(counter)
        lowest = 1 if counter == "call" else 0
        first, first_at = self.whole_number(f"a {counter} number")
        if first < lowest:
            raise self.fail(f"{counter} numbers start at {lowest}", first_at)
        last: int | None = first
        if self.peek(".."):
            self.pos += 2
            last = None
            if _digit_at(self.text, self.pos):
                last, last_at = self.whole_number(f"a {counter} number")
                if last < first:
                    raise self.fail(f"range end {last} is before its start {first}", last_at)
        return Ordinals(counter, first, last)

    def window(self) -> Window | Instant:
        self.require_space("t")
        start = self.trigger_duration()
        if not self.peek(".."):
            return Instant(start, self.anchor())
        self.pos += 2
        end: int | None = None
        if _digit_at(self.text, self.pos):
            end_at = self.pos
            end = self.trigger_duration()
            if end <= start:
                raise self.fail("window end must be after its start", end_at)
        return Window(start, end, self.anchor())

    def anchor(self) -> int | None:
        """An optional ` after call N`: the time counts from the run's N-th request."""
        back = self.pos
        self.skip_ws()
        word = _WORD.match(self.text, self.pos)
        if back == self.pos or not word or word.group() != "after":
            self.pos = back  # not an anchor: the caller reads what follows
            return None
        self.pos = word.end()
        self.require_space("after")
        at = self.pos
        word = _WORD.match(self.text, self.pos)
        if not word or word.group() != "call":
            raise self.expected("'call' after 'after'", at)
        self.pos = word.end()
        self.require_space("call")
        ordinal, ordinal_at = self.whole_number("a call number")
        if ordinal < 1:
            raise self.fail("call numbers start at 1", ordinal_at)
        return ordinal

    def trigger_duration(self) -> int:
        at = self.pos
        m = _TDURATION.match(self.text, self.pos)
        if not m:
            raise self.expected("a duration (e.g. 2s)")
        self.pos = m.end()
        return CONVERTERS["duration"](self, Param("t", ("duration",)), m.group(), at).ms  # type: ignore[union-attr]

    def require_space(self, word: str) -> None:
        if not self.peek(" ") and not self.peek("\t"):
            raise self.expected(f"a space after {word!r}")
        self.skip_ws()


def parse_fault(text: str) -> Fault:
    """Parse one fault; raise FaultSyntaxError naming the column on any problem."""
    return _Parser(text).fault()


def parse_faults(texts: list[str] | tuple[str, ...]) -> tuple[Fault, ...]:
    return tuple(parse_fault(t) for t in texts)
