"""One way to read a config mapping: every key declared, every value checked, one line each.

The config readers (docket.policy for docket.toml, chaos.scenario for a scenario,
chaos.gameday.phase for a phase file, docket.agent.config for the reference
agent's settings) read each mapping through a `Fields`: the keys it
knows, then each key with its default and its check. The values themselves are
docket.values' grammars; this module adds the mechanics (absent means the
default, an unknown key names its nearest known one) and one wording for every
reason. Where a problem is is the reader's business: `fail(key, reason)` builds
the error, e.g. `policy FILE: caps.max_usd: REASON` or `FILE:LINE: at agents[0].calls
REASON`, so each format keeps the location its users know.

Pure: no I/O; `fail` returns the exception and Fields raises it.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import NoReturn, TypeVar, overload

from docket.values import (
    DURATION_SHAPE,
    ValueProblem,
    duration_text,
    parse_duration,
    parse_fraction,
    parse_size,
    parse_usd,
    parse_whole,
)

T = TypeVar("T")
Fail = Callable[[str, str], Exception]


def show(value: object) -> str:
    """A value as the user typed it (TOML or YAML): strings quoted, tables and lists named."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return str(value)


def alternatives(options: Sequence[str]) -> str:
    return " or ".join(f'"{o}"' for o in options)


class Fields:
    """One mapping being read; `fail(key, reason)` makes the located error.

    `text=True` reads a mapping of strings (environment variables, flags: the reference
    agent's settings) by the text forms of the same grammars: a whole number in ASCII
    digits, a duration where a bare number is seconds (docket.values.duration_text)."""

    def __init__(self, data: Mapping[str, object], fail: Fail, *, text: bool = False) -> None:
        self.data = data
        self._fail = fail
        self.text = text

    def fail(self, key: str, reason: str) -> NoReturn:
        raise self._fail(key, reason)

    def known(self, keys: Sequence[str]) -> None:
        """Refuse the first key not in `keys`, naming the nearest known one (or all)."""
        for key in self.data:
            if key not in keys:
                near = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
                hint = f" (did you mean {near[0]}?)" if near else f" (known: {', '.join(keys)})"
                self.fail(str(key), "unknown key" + hint)

    def has(self, key: str) -> bool:
        return key in self.data

    # Each reader returns `default` when the key is absent, so a default of None
    # gives an optional value and any other default a value of its type.

    @overload
    def integer(
        self, key: str, default: int, *, minimum: int = 0, maximum: int | None = None
    ) -> int: ...
    @overload
    def integer(
        self, key: str, default: None, *, minimum: int = 0, maximum: int | None = None
    ) -> int | None: ...
    def integer(
        self, key: str, default: int | None, *, minimum: int = 0, maximum: int | None = None
    ) -> int | None:
        if key not in self.data:
            return default
        v = self.data[key]
        if self.text and isinstance(v, str):
            try:
                v = parse_whole(v)
            except ValueProblem:
                self.fail(key, f"must be a whole number (ASCII digits, at most 15), got {show(v)}")
        if not isinstance(v, int) or isinstance(v, bool):
            self.fail(key, f"must be a whole number, got {show(v)}")
        if v < minimum or (maximum is not None and v > maximum):
            bound = (
                f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            )
            self.fail(key, f"must be {bound}, got {v}")
        return v

    def boolean(self, key: str, default: bool) -> bool:
        if key not in self.data:
            return default
        v = self.data[key]
        if not isinstance(v, bool):
            self.fail(key, f"must be true or false, got {show(v)}")
        return v

    @overload
    def choice(self, key: str, default: str, options: Sequence[str]) -> str: ...
    @overload
    def choice(self, key: str, default: None, options: Sequence[str]) -> str | None: ...
    def choice(self, key: str, default: str | None, options: Sequence[str]) -> str | None:
        if key not in self.data:
            return default
        v = self.data[key]
        if not isinstance(v, str) or v not in options:
            self.fail(key, f"must be {alternatives(options)}, got {show(v)}")
        return v

    @overload
    def string(self, key: str, default: str, pattern: re.Pattern[str] | None = None) -> str: ...
    @overload
    def string(
        self, key: str, default: None, pattern: re.Pattern[str] | None = None
    ) -> str | None: ...
    def string(
        self, key: str, default: str | None, pattern: re.Pattern[str] | None = None
    ) -> str | None:
        if key not in self.data:
            return default
        v = self.data[key]
        if not isinstance(v, str) or not v:
            self.fail(key, f"must be a non-empty string, got {show(v)}")
        if pattern is not None and not pattern.match(v):
            self.fail(key, f"is not a valid name, got {show(v)}")
        return v

    @overload
    def duration(self, key: str, default: float, *, positive: bool = True) -> float: ...
    @overload
    def duration(self, key: str, default: None, *, positive: bool = True) -> float | None: ...
    def duration(self, key: str, default: float | None, *, positive: bool = True) -> float | None:
        """Seconds, by docket.values' duration grammar; above zero when `positive`."""
        if key not in self.data:
            return default
        v = self.data[key]
        shape = "a positive duration" if positive else "a duration"
        try:
            if self.text and isinstance(v, str):
                seconds = duration_text(v, signed=True).seconds  # "-1" is not positive
            else:
                seconds = parse_duration(v).seconds
        except ValueProblem as exc:
            self.fail(key, f"must be {shape}: {DURATION_SHAPE}; {exc.reason}, got {show(v)}")
        if positive and seconds <= 0:
            self.fail(key, f"must be {shape}: {DURATION_SHAPE}; got {show(v)}")
        return seconds

    def size(self, key: str, default: int, *, minimum: int = 0) -> int:
        """Bytes, by docket.values' size grammar."""
        if key not in self.data:
            return default
        v = self.data[key]
        try:
            size = parse_size(v)
        except ValueProblem as exc:
            self.fail(
                key,
                f'must be bytes: a whole number or a string like "256MiB", got {show(v)} '
                f"({exc.reason}; units B, KB, MB, GB, KiB, MiB, GiB)",
            )
        if size < minimum:
            self.fail(key, f"must be at least {minimum} bytes, got {show(v)}")
        return size

    def fraction(self, key: str, default: float) -> float:
        """A share above 0 and at most 1: a number, or a percentage ("80%")."""
        if key not in self.data:
            return default
        v = self.data[key]
        try:
            return parse_fraction(v)
        except ValueProblem:
            self.fail(key, f'must be a number above 0 and at most 1 (or "80%"), got {show(v)}')

    @overload
    def positive(self, key: str, default: float) -> float: ...
    @overload
    def positive(self, key: str, default: None) -> float | None: ...
    def positive(self, key: str, default: float | None) -> float | None:
        if key not in self.data:
            return default
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
            self.fail(key, f"must be a positive number, got {show(v)}")
        return float(v)

    def number(self, key: str, default: float, *, minimum: float, maximum: float) -> float:
        """A finite number, whole or not, from `minimum` to `maximum` (NaN is neither)."""
        if key not in self.data:
            return default
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not minimum <= v <= maximum:
            self.fail(key, f"must be a number from {minimum:g} to {maximum:g}, got {show(v)}")
        return float(v)

    def usd(self, key: str) -> Decimal | None:
        """US dollars, by docket.values' money rule; None when absent."""
        if key not in self.data:
            return None
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
            self.fail(key, f"must be a positive number, got {show(v)}")
        try:
            return parse_usd(v)
        except ValueProblem as exc:
            self.fail(key, exc.reason)

    def mapping(self, key: str) -> Mapping[str, object]:
        """A nested mapping (a TOML table, a YAML mapping); empty when absent."""
        v = self.data.get(key, {})
        if not isinstance(v, dict):
            self.fail(key, f"must be a table ([{key}]), got {show(v)}")
        return v

    def listing(self, key: str) -> list[object]:
        v = self.data.get(key, [])
        if not isinstance(v, list):
            self.fail(key, f"must be a list, got {show(v)}")
        return v
