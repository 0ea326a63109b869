"""Checks on files a user hands to a command, so each problem is one clear line.

Every command reads its inputs through these helpers: a missing, empty,
directory, binary or oversized input becomes an InputError naming the file and
the problem, never a traceback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from docket.errors import InputError
from docket.values import ValueProblem, duration_text

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


# Command-line numbers: Python's int() and float() take any Unicode digit ("５",
# "٥") and "nan"/"inf"; a flag takes ASCII digits only, like every other grammar here.
_INTEGER = re.compile(r"-?[0-9]{1,15}")


def integer_arg(text: str) -> int:
    """argparse type: a whole number in ASCII digits."""
    if not _INTEGER.fullmatch(text):
        raise ValueError(text)
    return int(text)


def seconds_arg(text: str) -> float:
    """argparse type: a duration (`30`, `30s`, `500ms`, `1.5m`, `1h`), in seconds."""
    try:
        return duration_text(text).seconds
    except ValueProblem:
        raise ValueError(text) from None


integer_arg.__name__ = "whole number"  # argparse names the type in its error
# argparse: "invalid duration (seconds, or 30s, 500ms, 10m, 1h) value: 'soon'"
seconds_arg.__name__ = "duration (seconds, or 30s, 500ms, 10m, 1h)"
