"""Section 8 step 2: whether a receipt is JSON is decided over the whole text first.

A text with a duplicate name or nested past 64 is receipt_malformed only if it
is JSON everywhere; a syntax error or a lone surrogate anywhere in it makes it
receipt_not_json, at any depth, with either parser (jiter and the standard
library stop at their own nesting limits, about 200 and 1,000 levels).
"""

from __future__ import annotations

import json
import random

import pytest

from docket.ledger import strict_json
from docket.receipts.json_syntax import json_syntax_problem
from docket.receipts.verify import RECEIPT_MALFORMED, RECEIPT_NOT_JSON, VerifyInputError, verify


@pytest.fixture(params=["default", "stdlib"])
def parser(request, monkeypatch):
    if request.param == "stdlib":
        monkeypatch.setattr(strict_json, "parsers", strict_json.STDLIB)
    return request.param


def code_for(tmp_path, text: bytes) -> str:
    receipt = tmp_path / "receipt.json"
    receipt.write_bytes(text)
    try:
        verdict = verify(receipt)
    except VerifyInputError as exc:
        return exc.code
    assert verdict.seq is None and verdict.offset is None and verdict.field is None
    return verdict.code


def deep(depth: int, inner: bytes = b"1", tail: bytes = b"") -> bytes:
    return b'{"format":"docket-receipt-1","x":' + b"[" * depth + inner + b"]" * depth + b"}" + tail


DEPTHS = [64, 100, 199, 200, 201, 255, 256, 1_000, 1_001, 100_000]


@pytest.mark.parametrize("depth", DEPTHS)
def test_json_nested_past_64_is_malformed_at_any_depth(tmp_path, parser, depth):
    assert code_for(tmp_path, deep(depth)) == RECEIPT_MALFORMED


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize(
    "tail", [b" trailing", b",", b"}", b'"\\ud800"'], ids=["junk", "comma", "brace", "surrogate"]
)
def test_deep_text_that_is_not_json_at_its_end_is_not_json(tmp_path, parser, depth, tail):
    assert code_for(tmp_path, deep(depth, tail=tail)) == RECEIPT_NOT_JSON


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_text_with_a_lone_surrogate_inside_is_not_json(tmp_path, parser, depth):
    assert code_for(tmp_path, deep(depth, inner=b'"\\udc00"')) == RECEIPT_NOT_JSON


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (b'{"format":"docket-receipt-1","format":"x"} trailing', RECEIPT_NOT_JSON),
        (b'{"format":"docket-receipt-1","format":"x"}', RECEIPT_MALFORMED),
        (b'{"a":1,"a":2,', RECEIPT_NOT_JSON),
        (b'{"a":1,"\\u0061":2, "b": NaN}', RECEIPT_NOT_JSON),
        (b'{"a":1,"a":2, "b": "\\ud800x"}', RECEIPT_NOT_JSON),
        (b'{"a":1,"a":2, "b": "\\ud83d\\ude00"}', RECEIPT_MALFORMED),
        (b'{"a":{"b":1,"b":1}} {}', RECEIPT_NOT_JSON),
    ],
)
def test_a_duplicate_name_is_malformed_only_in_json(tmp_path, parser, text, code):
    assert code_for(tmp_path, text) == code


# ---------------------------------------------------------------- the syntax check itself


def stdlib_says_json(text: bytes) -> bool:
    """RFC 8259 JSON (duplicates allowed), as Python's json module reads it, made strict."""

    def refuse(name):
        raise ValueError(name)

    try:
        value = json.loads(text.decode("utf-8"), parse_constant=refuse)
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot encode
    except (ValueError, UnicodeError):
        return False
    return True


PIECES = [b"{", b"}", b"[", b"]", b",", b":", b'"a"', b"1", b"-", b"0", b" ", b"true", b"nul"]
PIECES += [b'"\\ud800"', b'"\\\\ud800"', b"1e5", b"1.", b"\xef\xbb\xbf", b'"\\t"', b'"\t"']


def test_the_syntax_check_agrees_with_the_json_module_on_random_texts():
    rnd = random.Random(20261201)
    for _ in range(30_000):
        text = b"".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 9)))
        assert (json_syntax_problem(text) is None) == stdlib_says_json(text), text


def test_the_syntax_check_uses_no_recursion():
    # 100,000 levels: a hundred times Python's recursion limit and past what the C stack
    # of a recursive parser takes; a million cost 20 to 40 s of the suite for no more proof.
    assert json_syntax_problem(b"[" * 100_000 + b"]" * 100_000) is None
    problem = json_syntax_problem(b"[" * 100_000 + b"]" * 99_999)
    assert problem == "the text ends before its value does"
