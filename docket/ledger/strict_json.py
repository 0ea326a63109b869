"""Strict JSON (spec/docket-receipt-1.md section 2.1): one reading of a text, or a refusal.

RFC 8259 leaves some texts to the reader (a name twice in one object, nesting
as deep as the parser's stack allows), and Python's json module also takes
texts that are not JSON at all (NaN, a UTF-16 or BOM-prefixed byte string).
Ledger lines and receipts are read here instead, so that every verifier, in
any language, reads the same bytes the same way or refuses them.

jiter (Rust) does the parsing when it is installed, else the standard library,
made as strict; `parsers` holds the pair in use, one per number mode.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from decimal import Decimal

try:
    import jiter
except ImportError:  # the standard library's parser, made as strict, takes over
    jiter = None  # type: ignore[assignment]  # None marks "not installed" below

MAX_DEPTH = 64  # objects and arrays nested deeper than this are refused
MAX_INT = 2**53 - 1  # every integer the spec interprets fits a double exactly
TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"

Parser = Callable[[bytes], object]


class AmbiguousJSON(ValueError):
    """Well-formed JSON that implementations read differently: refused all the same."""


def _object_pairs(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise AmbiguousJSON(f"duplicate key {key!r}")
            seen.add(key)
    return obj


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _check_unicode(value: object) -> None:
    # A \u escape may leave a lone surrogate, which is not Unicode text.
    try:
        if type(value) is str:
            value.encode("utf-8")
        elif type(value) is dict:
            for k, v in value.items():
                k.encode("utf-8")
                _check_unicode(v)
        elif type(value) is list:
            for v in value:
                _check_unicode(v)
    except UnicodeEncodeError:
        raise ValueError("a \\u escape leaves a lone surrogate: not Unicode text") from None


def _stdlib_parser(exact: bool) -> Parser:
    decoder = json.JSONDecoder(
        object_pairs_hook=_object_pairs,
        parse_constant=_no_constant,
        parse_float=Decimal if exact else float,
    )
    scan = decoder.scan_once  # type: ignore[attr-defined]  # set in __init__, not in typeshed

    def parse(data: bytes) -> object:
        # bytes.decode, unlike json.loads(bytes), never guesses UTF-16 and keeps a BOM as text.
        text = data.decode("utf-8")
        try:
            value, end = scan(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):  # rare: surrounding whitespace, or not JSON (raises with a position)
            value = decoder.decode(text)
        if b"\\u" in data:
            _check_unicode(value)
        return value

    return parse


def _jiter_parser(exact: bool) -> Parser:
    return functools.partial(
        jiter.from_json,
        allow_inf_nan=False,
        catch_duplicate_keys=True,
        cache_mode="keys",
        float_mode="decimal" if exact else "float",
    )


# Keyed by `exact`: non-integer numbers as exact Decimals (what verify compares),
# or as floats. The mode changes how a number is returned, never what is accepted.
STDLIB: dict[bool, Parser] = {exact: _stdlib_parser(exact) for exact in (True, False)}
JITER: dict[bool, Parser] | None = (
    None if jiter is None else {exact: _jiter_parser(exact) for exact in (True, False)}
)
parsers: dict[bool, Parser] = STDLIB if JITER is None else JITER  # tests swap in STDLIB

decode_json_stdlib = STDLIB[True]  # the fallback alone: no depth bound (decode_json adds it)


def decode_json(data: bytes, *, exact: bool = True) -> object:
    """One JSON value from UTF-8 bytes, refusing what implementations read differently.

    Raises ValueError for what is not JSON text: invalid UTF-8 (a byte-order
    mark included), a lone surrogate, NaN/Infinity, bad syntax; and its
    subclass AmbiguousJSON for JSON that readers disagree on: a key twice in
    one object, nesting deeper than MAX_DEPTH. Non-integer numbers are exact
    Decimals (floats with exact=False). JSON whitespace may surround the value.
    """
    try:
        value = parsers[exact](data)
    except (ValueError, RecursionError) as exc:
        raise refusal(exc) from None
    if too_deep(data, value):
        raise AmbiguousJSON(TOO_DEEP)
    return value


_JITER_DUPLICATE = "duplicate key"  # how jiter words the refusal that is AmbiguousJSON


def refusal(exc: ValueError | RecursionError) -> ValueError:
    """A parser's refusal, as AmbiguousJSON when the text is JSON that readers disagree on."""
    if isinstance(exc, AmbiguousJSON):
        return exc
    if isinstance(exc, RecursionError):  # the standard library's stack, deeper than our bound
        return AmbiguousJSON(TOO_DEEP)
    message = str(exc)
    if "recursion limit" in message:  # jiter's own limit, deeper than ours
        return AmbiguousJSON(TOO_DEEP)
    if _JITER_DUPLICATE in message:
        return AmbiguousJSON(message)
    return exc


def nesting_depth(value: object) -> int:
    """How deep objects and arrays nest in a decoded value (a bare object is 1)."""
    if type(value) is dict:
        return 1 + max(map(nesting_depth, value.values()), default=0)
    if type(value) is list:
        return 1 + max(map(nesting_depth, value), default=0)
    return 0


def too_deep(data: bytes, value: object) -> bool:
    """Whether `value`, decoded from `data`, nests deeper than MAX_DEPTH."""
    # Only a text with that many brackets can nest that deep, and counting is cheap.
    if data.count(b"{") + data.count(b"[") <= MAX_DEPTH:
        return False
    try:
        return nesting_depth(value) > MAX_DEPTH
    except RecursionError:
        return True


# A string (perhaps cut short), or one bracket.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')
_OPENERS = frozenset(b"[{")


def text_nests_deeper(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the brackets of a text, complete or cut short, nest deeper than `limit`.

    For bytes that may not parse at all (a torn tail): no parser is asked, so
    no parser's stack is at risk. Brackets inside strings do not count.
    """
    if data.count(b"{") + data.count(b"[") <= limit:
        return False
    depth = 0
    for token in _TOKEN.finditer(data):
        first = data[token.start()]
        if first in _OPENERS:
            depth += 1
            if depth > limit:
                return True
        elif first != 0x22:  # a closing bracket
            depth -= 1
    return False
