"""Argument value converters: one token of fault text -> a `Value`, by shape.

Each returns None when the token is not its shape at all, and raises when the
token is its shape but wrong (a bad unit, out of range), so the error is precise.
The grammar tries a parameter's shapes in order (chaos.faults.VALUE_TYPES names them).
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Callable
from typing import Protocol

from chaos.fault_values import Duration, HttpDate, Rate, Size, Value
from chaos.faults import Param
from docket.errors import InputError

_NUMBER_UNIT = re.compile(r"([+-]?)(\d+)(?:\.(\d+))?([A-Za-z/]*)")
_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000}
_SIZE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}


class ColumnReporter(Protocol):
    """What a converter needs of the parser: an error that names the column."""

    def fail(self, reason: str, pos: int | None = None) -> InputError: ...


def _check_range(p: ColumnReporter, param: Param, n: int, at: int, shown: str) -> None:
    if param.nonzero and n == 0:
        raise p.fail(f"{param.name!r} cannot be zero", at)
    if param.minimum is not None and n < param.minimum:
        raise p.fail(f"{param.name!r} is at least {param.minimum}, found {shown}", at)
    if param.maximum is not None and n > param.maximum:
        raise p.fail(f"{param.name!r} is at most {param.maximum}, found {shown}", at)


def _int(p: ColumnReporter, param: Param, token: str, at: int) -> int | None:
    if not token.isascii() or not token.isdigit():
        return None
    n = int(token)
    _check_range(p, param, n, at, token)
    return n


def _duration(p: ColumnReporter, param: Param, token: str, at: int) -> Duration | None:
    m = _NUMBER_UNIT.fullmatch(token)
    if not m:
        return None
    sign, whole, frac, unit = m.groups()
    if not unit:
        if token == "0":
            _check_range(p, param, 0, at, token)
            return Duration(0)
        raise p.fail(f"expected a unit (ms, s or m) after {token!r}", at + len(token))
    factor = _DURATION_UNITS.get(unit)
    if factor is None:
        raise p.fail(f"unknown duration unit {unit!r} (expected ms, s or m)", at + m.start(4))
    if sign and "signed_duration" not in param.types:
        raise p.fail(f"{param.name!r} takes no sign", at)
    numerator = int(whole + (frac or "")) * factor
    denominator = 10 ** len(frac or "")
    if numerator % denominator:
        raise p.fail(f"{token!r} is not a whole number of milliseconds", at)
    ms = numerator // denominator * (-1 if sign == "-" else 1)
    _check_range(p, param, ms, at, token)
    return Duration(ms)


def _size(p: ColumnReporter, param: Param, token: str, at: int) -> Size | None:
    m = _NUMBER_UNIT.fullmatch(token)
    if not m or m.group(1) or m.group(3) or not m.group(4):
        return None
    factor = _SIZE_UNITS.get(m.group(4))
    if factor is None:
        raise p.fail(f"unknown size unit {m.group(4)!r} (expected B, KiB or MiB)", at + m.start(4))
    n = int(m.group(2)) * factor
    _check_range(p, param, n, at, token)
    return Size(n)


def _rate(p: ColumnReporter, param: Param, token: str, at: int) -> Rate | None:
    m = _NUMBER_UNIT.fullmatch(token)
    if not m or m.group(1) or m.group(3):
        return None
    if m.group(4) != "KB/s":
        raise p.fail(f"expected a rate in KB/s (e.g. 100KB/s), found {token!r}", at)
    return Rate(int(m.group(2)))


def _http_date(p: ColumnReporter, param: Param, token: str, at: int) -> HttpDate | None:
    if not token.startswith('"'):
        return None
    inner = token[1:-1]
    try:
        parsed = email.utils.parsedate_to_datetime(inner)
    except (TypeError, ValueError) as exc:
        raise p.fail(f"{inner!r} is not an HTTP date ({exc})", at) from exc
    if not inner.endswith(" GMT") or parsed.tzinfo is None:
        raise p.fail(f'{inner!r} is not an HTTP date (e.g. "Wed, 21 Oct 2015 07:28:00 GMT")', at)
    return HttpDate(email.utils.format_datetime(parsed, usegmt=True))  # the canonical spelling


def _choice(p: ColumnReporter, param: Param, token: str, at: int) -> str | None:
    if token not in param.choices:
        raise p.fail(f"{param.name!r} is one of {', '.join(param.choices)}, found {token!r}", at)
    return token


CONVERTERS: dict[str, Callable[[ColumnReporter, Param, str, int], Value | None]] = {
    "int": _int,
    "duration": _duration,
    "signed_duration": _duration,
    "size": _size,
    "rate": _rate,
    "http_date": _http_date,
    "choice": _choice,
}
SHAPES = {
    "int": "a whole number",
    "duration": "a duration (e.g. 2s)",
    "signed_duration": "a signed duration (e.g. -30s)",
    "size": "a size (e.g. 64KiB)",
    "rate": "a rate (e.g. 100KB/s)",
    "http_date": "an HTTP date in quotes",
    "choice": "a word",
}
