"""Spec rule 2.1.7: every number token is bounded on its text, before anything converts it.

A 5,000-digit integer was `receipt_not_json`/`malformed_line` to
Python and ok to JS and Go; `1e9999999999999999999` made the standard-library
fallback exit 70; `docket verify --json` exited 70 on `1e5000`, spun on
`1e99999999` and reported `1e-5000` as 0.0. Here the rule itself (a property
against an exact Decimal reading of the same text, with both parsers), and the
command on each form, receipt and ledger alike: one line, exit 1 or 2, never 70.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket.cli import main
from docket.ledger import strict_json
from docket.ledger.chain import encode_line, line_hash

ROOT = Path(__file__).resolve().parent.parent
OK_BASIC = ROOT / "spec" / "vectors" / "ok-basic"
HUGE = "1" + "0" * 4999
PAST_THE_BOUNDS = [
    HUGE,
    "-" + HUGE,
    "1" + "0" * 32,
    "1e9999999999999999999",
    "1e5000",
    "1e99999999",
    "1e-5000",
    "1e301",
    "10e300",
    "0.01e-299",
    "1e00001",
]
WITHIN = ["1e300", "-1e300", "1.5e-300", "0.1e-299", "9" * 32, "0e9999", "-0", "-0.0e-0"]


@pytest.fixture(params=["default", "stdlib"])
def parser(request, monkeypatch):
    """jiter when installed, then the standard library's fallback: both bound alike."""
    if request.param == "stdlib":
        monkeypatch.setattr(strict_json, "parsers", strict_json.STDLIB)
    return request.param


def within_bounds(text: str) -> bool:
    """Rule 2.1.7 read a second way: the written digits counted by regex, the
    magnitude taken from an exact Decimal of the text (which no rule here computes)."""
    m = re.fullmatch(r"-?([0-9]+)(?:\.([0-9]+))?(?:[eE][+-]?([0-9]+))?", text)
    assert m is not None
    if len(m[1]) + len(m[2] or "") > 32 or len(m[3] or "") > 4:
        return False
    value = Decimal(text)
    return value == 0 or -300 <= value.adjusted() <= 300


number_texts = st.builds(
    lambda sign, whole, frac, exp: sign + whole + frac + exp,
    st.sampled_from(["", "-"]),
    st.one_of(st.just("0"), st.from_regex(r"[1-9][0-9]{0,40}", fullmatch=True)),
    st.one_of(st.just(""), st.from_regex(r"\.[0-9]{1,40}", fullmatch=True)),
    st.one_of(st.just(""), st.from_regex(r"[eE][+-]?[0-9]{1,6}", fullmatch=True)),
)


# Where a number can stand, with the whitespace JSON allows around it; the cheap
# prefilter (strict_json.maybe_out_of_bounds) must never miss one past the bounds.
CONTEXTS = (
    b'{"n":[%s]}',
    b'{"n": [ \t%s\r\n]}',
    b'{"prev":"%s","n":[0,%s]}',
    b'{"s":"e000 ,:[","n":[\n%s ]}',
)


@given(text=number_texts, context=st.sampled_from(CONTEXTS))
def test_a_number_is_read_exactly_when_it_is_within_the_bounds(text, context):
    expected = within_bounds(text)
    data = context.replace(b"%s", text.encode())
    if not expected:
        assert strict_json.maybe_out_of_bounds(data), data
    for parsers in filter(None, (strict_json.JITER, strict_json.STDLIB)):
        for exact in (True, False):
            try:
                value = parsers[exact](data)
            except strict_json.AmbiguousJSON:
                assert not expected, text
                continue
            assert expected, text
            n = value["n"][-1]  # type: ignore[index]
            assert n == Decimal(text) if exact else True
            # Within the bounds a double holds it as a finite number, 0 only when it is 0.
            as_float = float(n)
            assert math.isfinite(as_float)
            assert (as_float == 0) == (Decimal(text) == 0), text


@pytest.mark.parametrize("text", PAST_THE_BOUNDS)
def test_a_number_past_the_bounds_is_ambiguous_json_wherever_it_is(text, parser):
    for data in (text, f'{{"a":{text}}}', f'{{"a":[1,{{"b": {text} }}]}}', f" {text} "):
        with pytest.raises(strict_json.AmbiguousJSON):
            strict_json.decode_json(data.encode())


@pytest.mark.parametrize("text", WITHIN)
def test_a_number_within_the_bounds_reads_as_its_value(text, parser):
    assert strict_json.decode_json(f'{{"a":{text}}}'.encode()) == {"a": Decimal(text)}


def test_digits_inside_strings_are_not_numbers(parser):
    text = b'{"a":"1e99999999","b":"' + HUGE.encode() + b'","c":"x,1e5000"}'
    assert strict_json.decode_json(text)["c"] == "x,1e5000"  # type: ignore[index]


def _verify_json(capsys, *argv: str) -> tuple[int, dict, str]:
    started = time.monotonic()
    code = main(["verify", *argv, "--json"])
    seconds = time.monotonic() - started
    out, err = capsys.readouterr()
    assert err == "" and out.count("\n") == 1, (out, err)
    assert seconds < 5, f"docket verify took {seconds:.1f}s"
    return code, json.loads(out), out


@pytest.mark.parametrize("text", PAST_THE_BOUNDS)
def test_verify_json_on_a_receipt_number_past_the_bounds_is_receipt_malformed(
    text, tmp_path, capsys, parser
):
    receipt = (
        (OK_BASIC / "receipt.json")
        .read_bytes()
        .replace(b'"calls": 50', b'"calls": ' + text.encode(), 1)
    )
    (tmp_path / "receipt.json").write_bytes(receipt)
    code, report, _ = _verify_json(
        capsys, str(tmp_path / "receipt.json"), "--ledger", str(OK_BASIC / "ledger.jsonl")
    )
    assert (code, report["exit"], report["code"], report["field"]) == (
        1,
        1,
        "receipt_malformed",
        None,
    )


def _ledger_with(lines: list[bytes], i: int, old: bytes, new: bytes) -> bytes:
    """Line i edited and the chain rebuilt after it: only the edit can be caught."""
    out, prev = [], None
    for n, line in enumerate(lines):
        if n == i:
            line = line.replace(old, new, 1)
        elif prev is not None and n > i:
            event = json.loads(line)
            body = {
                k: v
                for k, v in event.items()
                if k not in ("v", "seq", "ts", "mono_ms", "type", "prev")
            }
            line = encode_line(seq=n, ts=event["ts"], mono_ms=event["mono_ms"], type=event["type"],
                               prev=prev, body=json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode())  # fmt: skip
        out.append(line)
        prev = line_hash(line)
    return b"".join(line + b"\n" for line in out)


@pytest.mark.parametrize("text", PAST_THE_BOUNDS)
def test_verify_json_on_a_ledger_number_past_the_bounds_is_malformed_line(
    text, tmp_path, capsys, parser
):
    lines = (OK_BASIC / "ledger.jsonl").read_bytes().splitlines()
    (tmp_path / "ledger.jsonl").write_bytes(
        _ledger_with(lines, 3, b'"ttfb_ms":210', b'"ttfb_ms":' + text.encode())
    )
    code, report, _ = _verify_json(
        capsys, str(OK_BASIC / "receipt.json"), "--ledger", str(tmp_path / "ledger.jsonl")
    )
    assert (code, report["code"], report["seq"]) == (1, "malformed_line", 3)


def test_verify_json_reports_a_tiny_number_as_itself_not_zero(tmp_path, capsys):
    lines = (OK_BASIC / "ledger.jsonl").read_bytes().splitlines()
    ledger = _ledger_with(lines, 0, b'"calls":50', b'"calls":50,"tiny":1.5e-300')
    (tmp_path / "ledger.jsonl").write_bytes(ledger)
    receipt = json.loads((OK_BASIC / "receipt.json").read_text())
    receipt["caps"]["limits"]["tiny"] = 1.5e-300
    last = ledger.splitlines()[-1]
    receipt["ledger"].update(file="ledger.jsonl", head=line_hash(last), bytes=len(ledger))
    (tmp_path / "receipt.json").write_text(json.dumps(receipt))
    code, report, out = _verify_json(capsys, str(tmp_path / "receipt.json"))
    assert code == 0, report
    assert report["claims"]["caps"]["limits"]["tiny"] == 1.5e-300
    assert "1.5e-300" in out


def test_the_command_answers_1e99999999_at_once_with_one_line(tmp_path):
    """The form that spun for over 120 s: a real process, exit 1, well within a bound."""
    receipt = (
        (OK_BASIC / "receipt.json").read_bytes().replace(b'"calls": 50', b'"calls": 1e99999999', 1)
    )
    (tmp_path / "receipt.json").write_bytes(receipt)
    done = subprocess.run(
        [sys.executable, "-m", "docket", "verify", str(tmp_path / "receipt.json"), "--ledger",
         str(OK_BASIC / "ledger.jsonl"), "--json"],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr == "" and json.loads(done.stdout)["code"] == "receipt_malformed"
