"""The values a person writes: durations, byte sizes, money, percentages, addresses.

One grammar for each, read by every config reader and flag (docket.toml's policy,
a chaos scenario, a game-day phase, `docket stub`'s flags, a fault's arguments),
so a value valid in one place is valid in all of them. The grammars are written
out in README.md ("Values") and docs/chaos.md; keep them in step with this file.

Pure: no I/O, no clock. A parser returns the value or raises `ValueProblem`, whose
`reason` says what is wrong and whose `offset` points into the text (the fault
grammar turns it into a column); each reader adds its own "where" (a key path,
FILE:LINE, a flag). Digits are ASCII only everywhere: `\\d`, `int()` and `float()`
also read "５" or "٣". Numbers are bounded (15 whole digits, 9 decimals) and so is
every value, so no later float, timer, timestamp or JSON number overflows.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

_BLANK = " \t\r\n"  # ASCII only: str.strip() would also drop U+3000 and U+2000
MAX_WHOLE_DIGITS = 19  # the largest size, 2**63 - 1, has 19
MAX_DECIMALS = 9


class ValueProblem(ValueError):
    """Why a value is not of its type; `offset` is where in the text, when it is text."""

    def __init__(self, reason: str, offset: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


# A decimal number with an optional sign and a unit glued or spaced after it.
_QUANTITY = re.compile(r"([+-]?)([0-9]+)(?:\.([0-9]*))?([ ]*)([A-Za-z/]*)")


def _quantity(text: str) -> tuple[str, str, str, str, int]:
    """(sign, whole, decimals, unit, unit offset) of "NUMBER UNIT", or ValueProblem."""
    lead = len(text) - len(text.lstrip(_BLANK))
    body = text.strip(_BLANK)
    m = _QUANTITY.fullmatch(body)
    if not m:
        raise ValueProblem(f"not a number with a unit: {text!r}", lead)
    sign, whole, decimals, _, unit = m.groups()
    if decimals == "":
        raise ValueProblem(f"a digit must follow the '.' in {text!r}", lead + m.start(4))
    if len(whole) > MAX_WHOLE_DIGITS:
        raise ValueProblem(f"more than {MAX_WHOLE_DIGITS} digits before the point", lead)
    if decimals is not None and len(decimals) > MAX_DECIMALS:
        raise ValueProblem(f"more than {MAX_DECIMALS} decimal places", lead)
    return sign, whole, decimals or "", unit, lead + m.start(5)


# ---------------------------------------------------------------- durations

PS_PER_S = 10**12
DURATION_UNITS = {"ms": 10**9, "s": PS_PER_S, "m": 60 * PS_PER_S, "h": 3600 * PS_PER_S}
UNIT_LIST = "ms, s, m or h"
MAX_DURATION_SECONDS = 10 * 365 * 86_400  # ten years: past it a timestamp or a timer overflows
_MAX_PS = MAX_DURATION_SECONDS * PS_PER_S
DURATION_SHAPE = (
    'a number of seconds, or "NUMBER UNIT" with a unit of ms, s, m or h '
    '(e.g. "500ms", "30s", "1.5m", "1h"; at most ten years)'
)


@dataclass(frozen=True, order=True)
class Duration:
    """An exact duration in picoseconds (every duration the grammar can write is a
    whole number of them: 9 decimals of a millisecond); negative only when signed."""

    ps: int

    @property
    def seconds(self) -> float:
        return self.ps / PS_PER_S  # int / int: the nearest float, not a product of two

    @property
    def text(self) -> str:
        """The canonical spelling: the largest unit that holds it as a whole number,
        else seconds or milliseconds with decimals. parse_duration reads it back."""
        return format_duration(self)


def format_duration(d: Duration) -> str:
    if d.ps == 0:
        return "0"
    sign, n = ("-" if d.ps < 0 else ""), abs(d.ps)
    for unit in ("h", "m", "s", "ms"):
        if n % DURATION_UNITS[unit] == 0:
            return f"{sign}{n // DURATION_UNITS[unit]}{unit}"
    unit = "s" if n % 1000 == 0 else "ms"  # whole nanoseconds fit 9 decimals of a second
    whole, frac = divmod(n, DURATION_UNITS[unit])
    digits = 12 if unit == "s" else 9
    decimals = f"{frac:0{digits}d}".rstrip("0")
    return f"{sign}{whole}.{decimals}{unit}"


def parse_duration(value: object, *, signed: bool = False) -> Duration:
    """A duration from a number (seconds) or text ("NUMBER UNIT", or "0").

    Text: optional spaces around, ASCII digits (at most 15, and at most 9 after a
    point), then a unit (ms, s, m, h), with optional spaces between; only zero may
    leave its unit out ("30" might mean seconds or milliseconds). A sign only when
    `signed`. A number (an int or float from TOML, YAML or JSON; never a bool) is
    seconds, finite. At most ten years either way.
    """
    if isinstance(value, bool):
        raise ValueProblem(f"not a duration: {_kind(value)}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueProblem(f"not a finite number of seconds: {value}")
        if abs(value) > MAX_DURATION_SECONDS:
            raise ValueProblem("at most ten years")
        # A float by its shortest spelling (0.1 is 0.1, not 0.1000000000000000055...).
        if value < 0 and not signed:
            raise ValueProblem("takes no sign (a duration is not negative)")
        return Duration(round(Fraction(Decimal(repr(value))) * PS_PER_S))
    if not isinstance(value, str):
        raise ValueProblem(f"not a duration: {_kind(value)}")
    sign, whole, decimals, unit, unit_at = _quantity(value)
    if not unit:
        if whole.strip("0") == "" and decimals.strip("0") == "" and not sign:
            return Duration(0)
        raise ValueProblem(f"expected a unit ({UNIT_LIST}) after {value.strip(_BLANK)!r}", unit_at)
    factor = DURATION_UNITS.get(unit)
    if factor is None:
        raise ValueProblem(f"unknown duration unit {unit!r} (expected {UNIT_LIST})", unit_at)
    if sign and not signed:
        raise ValueProblem("takes no sign (a duration is not negative)")
    ps = int(whole + decimals) * factor // 10 ** len(decimals)  # exact: factor has 9+ zeros
    if ps > _MAX_PS:
        raise ValueProblem("at most ten years")
    return Duration(-ps if sign == "-" else ps)


_PLAIN_NUMBER = re.compile(
    r"[+-]?(?:[0-9]{1,15}(?:\.[0-9]{0,17})?|\.[0-9]{1,17})(?:[eE][+-]?[0-9]{1,3})?"
)


def duration_text(text: str, *, signed: bool = False) -> Duration:
    """A duration typed as text on a command line or in an environment variable: the
    one grammar, where a bare number is a number, so seconds (text from a file has
    types, and there "30" in quotes is refused as unit-less)."""
    stripped = text.strip(_BLANK)
    if _PLAIN_NUMBER.fullmatch(stripped):
        # A number, so seconds: 30, 0.5, .5, 5., and 1e-06 as Python's :g prints a small
        # float (1e999 is inf, which parse_duration refuses). ASCII digits only.
        return parse_duration(float(stripped), signed=signed)
    return parse_duration(text, signed=signed)


def duration_seconds(value: object) -> float | None:
    """Seconds of a non-negative duration, or None when `value` is not one (for the
    readers that phrase their own message)."""
    try:
        return parse_duration(value).seconds
    except ValueProblem:
        return None


# ---------------------------------------------------------------- whole numbers as text


def parse_whole(text: str, *, max_digits: int = 15) -> int:
    """A non-negative whole number typed as text (a flag, an environment variable):
    ASCII digits only, at most `max_digits` (int() also reads "５" and "٣", and costs
    quadratic time, then raises, on thousands of digits)."""
    if not (text.isascii() and text.isdigit() and len(text) <= max_digits):
        raise ValueProblem(f"not a whole number (ASCII digits, at most {max_digits})")
    return int(text)


# ---------------------------------------------------------------- byte sizes

SIZE_UNITS = {
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
}
MAX_BYTES = (1 << 63) - 1  # TOML's largest integer, and an off_t's (a fault's size is
# further held to 2**53, exact as a JSON number in Toxiproxy's API: chaos.faults.converters)
SIZE_SHAPE = 'a whole number of bytes, or "NUMBER UNIT" with a unit of B, KB, MB, GB, KiB, MiB or GiB (e.g. "256MiB")'


def parse_size(value: object) -> int:
    """Bytes from an int, or text: ASCII digits (at most 19), then an optional unit
    (B, KB, MB, GB in powers of 1000; KiB, MiB, GiB in powers of 1024), optional
    spaces between and around. Whole numbers only; at most 2**63 - 1 bytes."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueProblem(f"not a size: {_kind(value)}")
    if isinstance(value, int):
        n = value
    else:
        sign, whole, decimals, unit, unit_at = _quantity(value)
        if sign or decimals:
            raise ValueProblem(f"a size is a whole number of bytes, found {value.strip(_BLANK)!r}")
        factor = SIZE_UNITS.get(unit or "B")
        if factor is None:
            raise ValueProblem(
                f"unknown size unit {unit!r} (expected B, KB, MB, GB, KiB, MiB or GiB)", unit_at
            )
        n = int(whole) * factor
    if n < 0:
        raise ValueProblem(f"a size is not negative, found {value}")
    if n > MAX_BYTES:
        raise ValueProblem(f"at most {MAX_BYTES} bytes (2**63 - 1)")
    return n


def format_size(n: int) -> str:
    """The largest binary unit that holds n whole; parse_size reads it back."""
    for unit in ("GiB", "MiB", "KiB"):
        if n and n % SIZE_UNITS[unit] == 0:
            return f"{n // SIZE_UNITS[unit]}{unit}"
    return f"{n}B"


# ---------------------------------------------------------------- money

NANO = 10**9  # nano-USD per USD: every money figure is an integer count of these
MAX_USD = 10**15  # 15 whole digits, like every number here


def parse_usd(value: object) -> Decimal:
    """A positive amount of US dollars from a number (TOML has no decimal type):
    finite, above zero, at most 9 decimal places (nano-USD is the unit), at most
    10**15. One spelling per amount (10, 10.0 and 1E+1 are the same), for digests."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueProblem(f"not an amount: {_kind(value)}")
    if not math.isfinite(value) or value <= 0:
        raise ValueProblem(f"not a positive amount: {value}")
    # str() of a float is its shortest round-trip form: 10.1 stays 10.1, not 10.0999...
    amount = Decimal(str(value))
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -MAX_DECIMALS:
        raise ValueProblem(f"has more than 9 decimal places (nano-USD is the unit), got {value}")
    if amount > MAX_USD:
        raise ValueProblem(f"at most {MAX_USD} USD")
    return Decimal(format(amount.normalize(), "f"))


def nano_usd(amount: Decimal) -> int:
    """An amount from parse_usd in nano-USD (exact: it has at most 9 decimals)."""
    return int(amount * NANO)


def format_usd(amount: Decimal) -> str:
    return format(amount.normalize(), "f")


# ---------------------------------------------------------------- percentages

_PERCENT = re.compile(r"([0-9]+)(?:\.([0-9]+))?%")


def parse_percent(text: str) -> int:
    """Basis points (hundredths of a percent, 0..10000) from "N%" or "N.NN%": ASCII
    digits, at most two decimal places, at most 100%."""
    m = _PERCENT.fullmatch(text.strip(_BLANK))
    if not m:
        raise ValueProblem(f"not a percentage like 20% or 0.5%: {text!r}")
    whole, frac = m.group(1), m.group(2) or ""
    if len(whole) > MAX_WHOLE_DIGITS:  # before int(): leading zeros are allowed ("050%")
        raise ValueProblem(f"a percentage is at most 100%, found {text.strip(_BLANK)}")
    if len(frac) > 2:
        raise ValueProblem("a percentage takes at most two decimal places")
    basis_points = int(whole) * 100 + int(frac.ljust(2, "0") or 0)
    if basis_points > 10_000:
        raise ValueProblem(f"a percentage is at most 100%, found {text.strip(_BLANK)}")
    return basis_points


def format_percent(basis_points: int) -> str:
    whole, frac = divmod(basis_points, 100)
    return f"{whole}%" if frac == 0 else f"{whole}.{frac:02d}".rstrip("0") + "%"


def parse_fraction(value: object) -> float:
    """A share above 0 and at most 1: a number (0.8), or a percentage ("80%")."""
    if isinstance(value, str):
        share = parse_percent(value) / 10_000
    elif isinstance(value, int | float) and not isinstance(value, bool):
        share = float(value)
    else:
        raise ValueProblem(f"not a number: {_kind(value)}")
    if not math.isfinite(share) or not 0 < share <= 1:
        raise ValueProblem(f"not above 0 and at most 1: {value}")
    return share


# ---------------------------------------------------------------- addresses

_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\Z")


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def host_problem(value: object) -> str | None:
    """Why `value` is not a bind address (an IP address or a host name), or None."""
    if not isinstance(value, str) or not value:
        return f"must be an IP address or a host name, got {value!r}"
    if not is_ip(value) and not _HOST_NAME.match(value):
        return f"must be an IP address or a host name, got {value!r}"
    return None


def parse_port(value: object, *, allow_zero: bool = True) -> int:
    """A TCP port: a whole number 1..65535 (0 too when `allow_zero`: pick a free one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueProblem(f"not a port number: {_kind(value)}")
    low = 0 if allow_zero else 1
    if not low <= value <= 65535:
        raise ValueProblem(f"not a port number ({low} to 65535): {value}")
    return value


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return repr(value)
    return f"a {type(value).__name__}"
