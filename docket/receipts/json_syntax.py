"""Whether a text is JSON at all, decided without recursion (spec section 8, step 2).

The fast readers (docket.ledger.strict_json) stop at the first duplicate name or
at their nesting limit, before they have seen the rest of the text. A receipt
refused there is `receipt_malformed` only if the whole text is JSON; a syntax
error or a lone surrogate anywhere makes it `receipt_not_json`. This check
reads the whole text with an explicit stack, so no depth can exhaust it. It is
only asked about receipts the fast readers refused as ambiguous: never on the
ledger's hot path.
"""

from __future__ import annotations

import json
import re

_WHITESPACE = re.compile(rb"[ \t\n\r]*")


def _skip_whitespace(data: bytes, at: int) -> int:
    match = _WHITESPACE.match(data, at)
    assert match is not None  # `*` matches the empty string anywhere
    return match.end()


# A string: no raw control character, only the escapes RFC 8259 allows.
_STRING = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERAL = re.compile(rb"true|false|null")

# What may come next.
_VALUE, _VALUE_OR_CLOSE, _NAME, _NAME_OR_CLOSE, _COLON, _COMMA_OR_CLOSE = range(6)


def _string_problem(token: bytes) -> str | None:
    # Only a \u escape can leave a lone surrogate; decoding one string never recurses.
    if b"\\u" not in token:
        return None
    try:
        json.loads(token).encode("utf-8")
    except UnicodeEncodeError:
        return "a \\u escape leaves a lone surrogate: not Unicode text"
    return None


def json_syntax_problem(data: bytes) -> str | None:
    """Why `data` is not one JSON text (RFC 8259, spec section 2.1 rules 1, 2, 5, 6), or None.

    Duplicate names and depth are not checked: they make a text ambiguous, not
    something other than JSON.
    """
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 at byte {exc.start}"
    stack: list[int] = []  # the open brackets, as byte values
    expect = _VALUE
    at = _skip_whitespace(data, 0)
    end = len(data)
    while at < end:
        char = data[at]
        if expect == _COLON:
            if char != 0x3A:  # ':'
                return f"expected ':' at byte {at}"
            at += 1
            expect = _VALUE
        elif expect == _COMMA_OR_CLOSE:
            if char == 0x2C:  # ','
                expect = _NAME if stack[-1] == 0x7B else _VALUE
                at += 1
            elif char in (0x5D, 0x7D) and stack[-1] == char - 2:  # ']' closes '[', '}' closes '{'
                stack.pop()
                at += 1
                expect = _COMMA_OR_CLOSE if stack else -1
            else:
                return f"expected ',' or a closing bracket at byte {at}"
        elif expect in (_NAME, _NAME_OR_CLOSE):
            if char == 0x7D and expect == _NAME_OR_CLOSE:
                stack.pop()
                at += 1
                expect = _COMMA_OR_CLOSE if stack else -1
            else:
                token = _STRING.match(data, at) if char == 0x22 else None
                if token is None:
                    return f"expected a member name at byte {at}"
                problem = _string_problem(token.group())
                if problem:
                    return f"{problem} (byte {at})"
                at = token.end()
                expect = _COLON
        elif expect in (_VALUE, _VALUE_OR_CLOSE):
            if char in (0x5B, 0x7B):  # '[' or '{'
                stack.append(char)
                at += 1
                expect = _VALUE_OR_CLOSE if char == 0x5B else _NAME_OR_CLOSE
            elif char == 0x5D and expect == _VALUE_OR_CLOSE:
                stack.pop()
                at += 1
                expect = _COMMA_OR_CLOSE if stack else -1
            else:
                if char == 0x22:
                    token = _STRING.match(data, at)
                    problem = token and _string_problem(token.group())
                    if problem:
                        return f"{problem} (byte {at})"
                else:
                    token = _NUMBER.match(data, at) or _LITERAL.match(data, at)
                if token is None:
                    return f"not a JSON value at byte {at}"
                at = token.end()
                expect = _COMMA_OR_CLOSE if stack else -1
        else:  # the value is complete: nothing but whitespace may follow
            return f"more after the JSON value, at byte {at}"
        at = _skip_whitespace(data, at)
    if expect != -1:
        return "the text ends before its value does"
    return None
