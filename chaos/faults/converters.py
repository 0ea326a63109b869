"""Argument value converters: one token of fault text -> a `Value`, by shape.

Each returns None when the token is not its shape at all, and raises when the
token is its shape but wrong (a bad unit, out of range), so the error is precise.
The grammar tries a parameter's shapes in order (chaos.faults.VALUE_TYPES names them).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
from collections.abc import Callable
from typing import Protocol

from chaos.faults import Param
from chaos.faults.values import Duration, HttpDate, Rate, Size, Value
from docket.errors import InputError
from docket.values import DURATION_UNITS, ValueProblem, parse_duration, parse_size

# ASCII digits only: `\d` would also take "５" or "٣", which int() reads as numbers.
_NUMBER_UNIT = re.compile(r"([+-]?)([0-9]+)(?:\.([0-9]+))?([A-Za-z/]*)")
# Bounds on every number the grammar reads, so a value is refused here, with its
# column, instead of overflowing a clock, a timestamp or a C long mid-run.
MAX_DIGITS = 15  # before int(): a 5,000-digit token would cost (or, past 4,300, raise) in int()
MAX_WHOLE = 1 << 53  # ints, sizes, rates: exact in a JSON number (the ledger, Toxiproxy's API)
# Durations and sizes are docket.values' grammars (ten years either sign at most: a clock
# stepped back by more than the epoch's age would have no RFC 3339 timestamp for session.end).
PS_PER_MS = DURATION_UNITS["ms"]


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


def _digits(p: ColumnReporter, param: Param, digits: str, at: int) -> None:
    if len(digits) > MAX_DIGITS:
        raise p.fail(f"{param.name!r} has more than {MAX_DIGITS} digits", at)


def _whole(p: ColumnReporter, param: Param, n: int, at: int, shown: str) -> int:
    if n > MAX_WHOLE:
        raise p.fail(f"{param.name!r} is at most {MAX_WHOLE}, found {shown}", at)
    return n


def _int(p: ColumnReporter, param: Param, token: str, at: int) -> int | None:
    if not token.isascii() or not token.isdigit():
        return None
    _digits(p, param, token, at)
    n = _whole(p, param, int(token), at, token)
    _check_range(p, param, n, at, token)
    return n


def _duration(p: ColumnReporter, param: Param, token: str, at: int) -> Duration | None:
    """docket.values' duration grammar, held to whole milliseconds (the schedule's unit)."""
    m = _NUMBER_UNIT.fullmatch(token)
    if not m:
        return None
    signed = "signed_duration" in param.types
    if m.group(1) and not signed:
        raise p.fail(f"{param.name!r} takes no sign", at)
    _digits(p, param, m.group(2) + (m.group(3) or ""), at)
    try:
        ps = parse_duration(token, signed=signed).ps
    except ValueProblem as exc:
        if exc.reason == "at most ten years":
            raise p.fail(
                f"{param.name!r} is at most ten years (3650 days), found {token!r}", at
            ) from None
        raise p.fail(exc.reason, at + exc.offset) from None
    if ps % PS_PER_MS:
        raise p.fail(f"{token!r} is not a whole number of milliseconds", at)
    ms = ps // PS_PER_MS
    _check_range(p, param, ms, at, token)
    return Duration(ms)


def _size(p: ColumnReporter, param: Param, token: str, at: int) -> Size | None:
    """docket.values' size grammar; a fault's size always names its unit (a bare
    number is the `int` shape)."""
    m = _NUMBER_UNIT.fullmatch(token)
    if not m or m.group(1) or m.group(3) or not m.group(4):
        return None
    _digits(p, param, m.group(2), at)
    try:
        n = _whole(p, param, parse_size(token), at, token)
    except ValueProblem as exc:
        raise p.fail(exc.reason, at + exc.offset) from None
    _check_range(p, param, n, at, token)
    return Size(n)


def _rate(p: ColumnReporter, param: Param, token: str, at: int) -> Rate | None:
    m = _NUMBER_UNIT.fullmatch(token)
    if not m or m.group(1) or m.group(3):
        return None
    if m.group(4) != "KB/s":
        raise p.fail(f"expected a rate in KB/s (e.g. 100KB/s), found {token!r}", at)
    _digits(p, param, m.group(2), at)
    return Rate(_whole(p, param, int(m.group(2)), at, token))


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_IMF_FIXDATE = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{2}) (" + "|".join(_MONTHS) + r") ([0-9]{4}) "
    r"([0-9]{2}):([0-9]{2}):([0-9]{2}) GMT"
)
_HTTP_DATE_EXAMPLE = '(e.g. "Wed, 21 Oct 2015 07:28:00 GMT")'


def _http_date(p: ColumnReporter, param: Param, token: str, at: int) -> HttpDate | None:
    """An IMF-fixdate (RFC 9110 5.6.7), read by its own grammar: a general date parser
    takes offsets ("+0100 GMT"), any number of year digits and line breaks, and then
    fails (or overflows) when the value is printed back in GMT."""
    if not token.startswith('"'):
        return None
    inner = token[1:-1]
    m = _IMF_FIXDATE.fullmatch(inner)
    if not m:
        raise p.fail(f"{inner!r} is not an HTTP date {_HTTP_DATE_EXAMPLE}", at)
    day, month, year, hour, minute, second = m.groups()
    try:
        parsed = dt.datetime(
            int(year), _MONTHS.index(month) + 1, int(day), int(hour), int(minute), int(second),
            tzinfo=dt.UTC,
        )  # fmt: skip
    except ValueError as exc:  # 31 Feb, hour 25: datetime names the field
        raise p.fail(f"{inner!r} is not an HTTP date ({exc})", at) from None
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
