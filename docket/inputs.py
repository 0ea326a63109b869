"""Checks on files a user hands to a command, so each problem is one clear line.

Every command reads its inputs through these helpers: a missing, empty,
directory, binary or oversized input becomes an InputError naming the file and
the problem, never a traceback.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from docket.errors import InputError

MiB = 1024 * 1024


def existing_file(path: str | os.PathLike, what: str) -> Path:
    """The path, if it names a readable regular file that is not empty."""
    p = Path(path)
    if "\x00" in str(p):
        # No file has this name (the kernel takes names up to a NUL), and os.stat
        # raises ValueError on it: a name read from a receipt or a scenario may hold one.
        raise InputError(f"{what} {str(p)!r}: a file name cannot hold a NUL byte")
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{what} {p}: no such file") from None
    except OSError as exc:
        raise InputError(f"{what} {p}: cannot read ({exc.strerror})") from None
    if p.is_dir():
        raise InputError(f"{what} {p}: is a directory, not a file")
    if not p.is_file():
        raise InputError(f"{what} {p}: not a regular file")
    if st.st_size == 0:
        raise InputError(f"{what} {p}: is empty")
    if not os.access(p, os.R_OK):
        raise InputError(f"{what} {p}: permission denied")
    return p


def read_text(path: str | os.PathLike, what: str, *, max_bytes: int = 16 * MiB) -> str:
    """A small text input (a receipt, a policy, a scenario), decoded as UTF-8."""
    p = existing_file(path, what)
    size = p.stat().st_size
    if size > max_bytes:
        raise InputError(
            f"{what} {p}: {size} bytes is more than the {max_bytes // MiB} MiB a {what} may be"
        )
    data = p.read_bytes()
    if b"\x00" in data:
        raise InputError(f"{what} {p}: binary data (a NUL byte), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {p}: not UTF-8 text (byte {exc.start})") from None


# ---------------------------------------------------------------- durations

# One grammar for the durations a person writes (policy, scenario, phase, stub flags):
# ASCII digits only (`\d` would take "５"), a bounded number of them, and a bounded
# value, so no later float, timer or timestamp overflows on what the input said.
MAX_DURATION_SECONDS = 10 * 365 * 86_400.0  # ten years
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*([a-z]*)")


def parse_duration(
    value: object, *, units: tuple[str, ...] = ("ms", "s", "m", "h"), bare: bool = False
) -> float | None:
    """Seconds from "500ms", "30s", "5m", "1h" (the `units` allowed), or from a number
    when `bare` (an int or float, or a string without a unit); None when `value` is
    not such a duration, negative, not finite, or more than MAX_DURATION_SECONDS.
    The caller names the input and the shape it wants."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = float(value) if bare and math.isfinite(value) else None
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value.strip())):
        number, unit = m.groups()
        if unit:
            seconds = float(number) * DURATION_UNITS[unit] if unit in units else None
        else:
            seconds = float(number) if bare else None
    else:
        return None
    if seconds is None or not 0 <= seconds <= MAX_DURATION_SECONDS:
        return None
    return seconds


# Command-line numbers: Python's int() and float() take any Unicode digit ("５",
# "٥") and "nan"/"inf"; a flag takes ASCII digits only, like every other grammar here.
_INTEGER = re.compile(r"-?[0-9]{1,15}")
_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?")


def integer_arg(text: str) -> int:
    """argparse type: a whole number in ASCII digits."""
    if not _INTEGER.fullmatch(text):
        raise ValueError(text)
    return int(text)


def seconds_arg(text: str) -> float:
    """argparse type: a non-negative number of seconds in ASCII digits (no unit)."""
    if not _DECIMAL.fullmatch(text):
        raise ValueError(text)
    return float(text)


integer_arg.__name__ = "whole number"  # argparse names the type in its error
seconds_arg.__name__ = "number of seconds"
