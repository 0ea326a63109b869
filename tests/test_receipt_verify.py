"""Tampering, property-tested: any single-byte change, deletion or insertion, and
any deleted, duplicated, swapped or truncated line, is caught by `verify` with
the code the spec gives for where the change landed.

Ledgers are built with the pure chain.encode_line (not the trio writer) from a
random run; its receipt is built and written as the recorder would. The
expected failure is worked out from the byte's place in the line the writer
laid out (which field it falls in), never by asking the verifier.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docket.ledger import strict_json
from docket.ledger.chain import (
    GENESIS,
    ChainError,
    ChainVerifier,
    encode_body,
    encode_line,
    line_hash,
)
from docket.ledger.reader import LEDGER_MAGIC
from docket.receipts.receipt import build_receipt, write_receipt
from docket.receipts.tally import Tally
from docket.receipts.verify import NOT_A_LEDGER, VerifyInputError, verify

EXAMPLES = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
COMPLETE = {
    "ledger_complete": True,
    "unwritten_events": 0,
    "first_failing_seq": None,
    "write_failures": 0,
}
MODELS = {
    "gpt-4o": {"input": "2.50", "output": "10.00", "cached_input": "1.25"},
    "claude-sonnet-4": {"input": "3.00", "output": "15.00", "cached_input": "0.30"},
}
HEX = b"0123456789abcdef"
JSON_SPACE = b" \t\r"


@st.composite
def runs(draw) -> list[tuple[str, int, dict]]:
    """(type, mono_ms, fields) for a plausible run of a few model calls."""
    mono = 0

    def later() -> int:
        nonlocal mono
        mono += draw(st.integers(0, 3000))
        return mono

    events = [
        (
            "session.start",
            0,
            {
                "run_id": draw(st.text(min_size=1, max_size=12)),
                "docket_version": "0.1.0",
                "policy_digest": "sha256:" + "ab" * 32,
                "pricing": {"table_date": "2026-11-01", "provenance": "test table"},
                "caps": {"usd": "1.00"},
            },
        )
    ]
    for n in range(draw(st.integers(1, 5))):
        model = draw(st.sampled_from([*MODELS, "unpriced-model"]))
        call_id = f"call-{n}"
        events.append(("model.request", later(), {"call_id": call_id, "model": model}))
        tokens_in, tokens_out = draw(st.integers(0, 9999)), draw(st.integers(0, 999))
        usage = {"input_tokens": tokens_in, "output_tokens": tokens_out, "cached_tokens": 0}
        if draw(st.booleans()):
            response = {
                "call_id": call_id,
                "model": model,
                "usage": usage,
                "cost_nusd": tokens_in * 2500 + tokens_out * 10000,
                "priced": model in MODELS,
                "duration_ms": draw(st.integers(0, 5000)),
            }
            if model in MODELS:
                response["unit_prices"] = MODELS[model]
            events.append(("model.response", later(), response))
        else:
            error = {"call_id": call_id, "model": model, "reason": "upstream 503", "cost_nusd": 0}
            events.append(("model.error", later(), error))
    end = {"reason": "child exited", "exit_status": 0, "cap": None, "evidence": COMPLETE}
    events.append(("session.end", later(), end))
    return events


class Written:
    """A run encoded as a ledger, with its receipt, in a temporary folder."""

    def __init__(self, folder: Path, run: list[tuple[str, int, dict]]) -> None:
        self.folder = folder
        self.lines: list[bytes] = []
        tally, prev = Tally(), GENESIS
        for seq, (kind, mono_ms, fields) in enumerate(run):
            ts = f"2026-11-29T10:00:{mono_ms // 1000 % 60:02d}.{mono_ms % 1000:03d}Z"
            line = encode_line(
                seq=seq, ts=ts, mono_ms=mono_ms, type=kind, prev=prev, body=encode_body(fields)
            )
            tally.add({"v": 1, "seq": seq, "ts": ts, "mono_ms": mono_ms, "type": kind} | fields)
            self.lines.append(line)
            prev = line_hash(line)
        self.data = b"".join(line + b"\n" for line in self.lines)
        self.offsets = []
        at = 0
        for line in self.lines:
            self.offsets.append(at)
            at += len(line) + 1
        self.receipt = folder / "receipt.json"
        (folder / "ledger.jsonl").write_bytes(self.data)
        write_receipt(
            self.receipt,
            build_receipt(
                tally,
                ledger_path=folder / "ledger.jsonl",
                head=prev,
                count=len(self.lines),
                size=len(self.data),
                evidence=COMPLETE,
                version="0.1.0",
            ),
        )

    @property
    def n(self) -> int:
        return len(self.lines)

    def line_at(self, position: int) -> int:
        """The index of the line holding byte `position` (its newline included)."""
        for i in reversed(range(self.n)):
            if self.offsets[i] <= position:
                return i
        raise AssertionError(position)

    def verdict(self, tampered: bytes) -> tuple[str, int | None, int | None]:
        """(code, seq, offset) that verify reports for the tampered ledger bytes."""
        path = self.folder / "tampered.jsonl"
        path.write_bytes(tampered)
        try:
            v = verify(self.receipt, path)
        except VerifyInputError as exc:
            return exc.code, None, None
        assert not v.ok, "a tampered ledger passed verification"
        return v.code, v.seq, v.offset


def region(line: bytes, at: int) -> str:
    """Which part of a writer-made line the byte at index `at` belongs to."""

    def span(key: bytes, length: int | None = None) -> range:
        start = line.index(key) + len(key)
        end = start + length if length is not None else line.index(b",", start)
        return range(start, end)

    if at == len(line):
        return "newline"
    if at in span(b'"v":', 1):
        return "v"
    if at in span(b'"seq":'):
        return "seq"
    if at in span(b'"mono_ms":'):
        return "mono"
    if at in span(b'"prev":"', 64):
        return "prev"
    return "other"


def expected(w: Written, i: int, where: str, new: bytes | None) -> set:
    """The (code, seq, offset) outcomes allowed when line i changed in `where`.

    `new` is the byte written there (None for a deletion). A line that is no
    longer what the writer wrote may be malformed JSON, or hold but hash
    differently (so the next line's prev breaks, or the receipt's head).
    """
    here = {("malformed_line", i, w.offsets[i])}
    downstream = (
        {("chain_break", i + 1, w.offsets[i + 1] + len_change(where, new))}
        if i + 1 < w.n
        else {("head_mismatch", i, w.offsets[i])}
    )
    if new is not None and len(new) == 1 and new in b" \t\r" and where in ("v", "seq", "mono"):
        # JSON whitespace beside a number keeps its value (or splits it: malformed);
        # a line that still parses hashes differently, so the break shows downstream
        return here | downstream
    if where == "prev":
        if new is not None and new in HEX:
            return {("chain_break", i, w.offsets[i])}
        return here
    if where == "seq":
        return here | {("seq_gap", i, w.offsets[i])}
    if where == "v":
        return here | {("unsupported_version", i, w.offsets[i])}
    if where == "mono":
        return here | {("mono_regression", i, w.offsets[i])} | downstream
    return here | downstream


def len_change(where: str, new: bytes | None) -> int:
    # The offset of the next line moves with the edit: a deletion takes a byte away.
    return -1 if new is None else 0


def as_input_error(outcomes: set, w: Written, tampered: bytes) -> set:
    """A first line that is malformed, or of another version, makes it not a ledger (exit 2)."""
    if not tampered.startswith(LEDGER_MAGIC):
        return {(NOT_A_LEDGER, None, None)}
    out = set()
    for code, seq, offset in outcomes:
        if seq == 0 and code in ("malformed_line", "unsupported_version"):
            out.add((NOT_A_LEDGER, None, None))
        else:
            out.add((code, seq, offset))
    return out


@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory(prefix="docket-test-tamper-") as tmp:
        yield Path(tmp)


def written(folder: Path, run) -> Written:
    sub = Path(tempfile.mkdtemp(dir=folder))
    return Written(sub, run)


@EXAMPLES
@given(run=runs(), data=st.data())
def test_a_changed_byte_is_caught_with_the_code_for_where_it_landed(folder, run, data):
    w = written(folder, run)
    at = data.draw(st.integers(0, len(w.data) - 1), label="position")
    old = w.data[at : at + 1]
    new = data.draw(st.integers(0, 255).map(lambda b: bytes([b])).filter(lambda b: b != old))
    tampered = w.data[:at] + new + w.data[at + 1 :]
    i = w.line_at(at)
    where = region(w.lines[i], at - w.offsets[i])
    if where == "newline":
        if i == w.n - 1:
            allowed = {("torn_tail", i, w.offsets[i])}
        else:  # two lines joined into one that is not JSON
            allowed = {("malformed_line", i, w.offsets[i])}
    elif new == b"\n":  # the line split: its first part is not a whole object
        allowed = {("malformed_line", i, w.offsets[i])}
    else:
        allowed = expected(w, i, where, new)
    assert w.verdict(tampered) in as_input_error(allowed, w, tampered)


@EXAMPLES
@given(run=runs(), data=st.data())
def test_a_deleted_byte_is_caught_with_the_code_for_where_it_landed(folder, run, data):
    w = written(folder, run)
    at = data.draw(st.integers(0, len(w.data) - 1), label="position")
    tampered = w.data[:at] + w.data[at + 1 :]
    i = w.line_at(at)
    where = region(w.lines[i], at - w.offsets[i])
    if where == "newline":
        allowed = (
            {("torn_tail", i, w.offsets[i])}
            if i == w.n - 1
            else {("malformed_line", i, w.offsets[i])}
        )
    elif where == "prev":  # 63 hex digits are not a hash
        allowed = {("malformed_line", i, w.offsets[i])}
    else:
        allowed = expected(w, i, where, None)
    assert w.verdict(tampered) in as_input_error(allowed, w, tampered)


@EXAMPLES
@given(run=runs(), data=st.data())
def test_an_inserted_byte_is_caught_with_the_code_for_where_it_landed(folder, run, data):
    w = written(folder, run)
    at = data.draw(st.integers(0, len(w.data)), label="position")  # insert before byte `at`
    new = data.draw(st.integers(0, 255).map(lambda b: bytes([b])), label="byte")
    tampered = w.data[:at] + new + w.data[at:]
    size = len(w.data)
    if at == size:  # after the last newline
        allowed = {("malformed_line", w.n, size)} if new == b"\n" else {("torn_tail", w.n, size)}
    else:
        i = w.line_at(at)
        start, end = w.offsets[i], w.offsets[i] + len(w.lines[i])  # end: the newline's index
        if new == b"\n":
            if at == end:  # an empty line after line i
                allowed = {("malformed_line", i + 1, end + 1)}
            else:  # an empty line, or the line split in two
                allowed = {("malformed_line", i, start)}
        elif at in (start, end):  # before the brace or after it: only whitespace is JSON
            allowed = {("malformed_line", i, start)} | expected(w, i, "other", new)
            allowed = {(c, s, o + 1 if c == "chain_break" else o) for c, s, o in allowed}
        else:
            where = region(w.lines[i], at - start)
            if new.isdigit() and region(w.lines[i], at - start - 1) in ("v", "seq", "mono"):
                # a digit inserted just after a number's last digit lengthens that number
                # (seq 1 becomes 10: a seq_gap), as one inserted inside it does
                where = region(w.lines[i], at - start - 1)
            if where == "prev":  # 65 characters are not a hash
                allowed = {("malformed_line", i, start)}
            else:
                allowed = {
                    (c, s, o + 1 if c == "chain_break" else o)
                    for c, s, o in expected(w, i, where, new)
                }
    assert w.verdict(tampered) in as_input_error(allowed, w, tampered)


@EXAMPLES
@given(run=runs(), data=st.data())
def test_deleted_duplicated_or_swapped_lines_are_caught(folder, run, data):
    w = written(folder, run)
    lines, n = list(w.lines), w.n
    kind = data.draw(st.sampled_from(["delete", "duplicate", "swap"]))
    i = data.draw(st.integers(0, n - 1), label="line")
    if kind == "delete":
        del lines[i]
        tampered = b"".join(line + b"\n" for line in lines)
        if i == n - 1:  # the chain holds, but is an event short of the receipt
            allowed = {("count_mismatch", n - 1, len(tampered))}
        else:
            allowed = {("seq_gap", i, w.offsets[i])}
    elif kind == "duplicate":
        lines.insert(i + 1, lines[i])
        tampered = b"".join(line + b"\n" for line in lines)
        allowed = {("seq_gap", i + 1, w.offsets[i] + len(w.lines[i]) + 1)}
    else:
        j = data.draw(st.integers(0, n - 1).filter(lambda j: j != i), label="other line")
        i, j = min(i, j), max(i, j)
        lines[i], lines[j] = lines[j], lines[i]
        tampered = b"".join(line + b"\n" for line in lines)
        allowed = {("seq_gap", i, w.offsets[i])}
    assert w.verdict(tampered) in allowed


@EXAMPLES
@given(run=runs(), data=st.data())
def test_a_truncated_ledger_is_caught(folder, run, data):
    w = written(folder, run)
    cut = data.draw(st.integers(1, len(w.data) - 1), label="bytes kept")
    tampered = w.data[:cut]
    if cut in w.offsets:  # cut at a line boundary: the chain holds, events are missing
        k = w.offsets.index(cut)
        allowed = {("count_mismatch", k, cut)}
    else:
        i = w.line_at(cut)
        allowed = {("torn_tail", i, w.offsets[i])}
    assert w.verdict(tampered) in as_input_error(allowed, w, tampered)


def first_failure(verifier, data: bytes) -> tuple | None:
    """Feed every complete line; the first ChainError as (code, seq, offset), or None."""
    lines = data.split(b"\n")
    try:
        for line in lines[:-1]:
            verifier.feed(line)
    except ChainError as exc:
        return exc.code, exc.seq, exc.offset
    return None


@EXAMPLES
@given(run=runs(), data=st.data())
def test_the_chain_verdict_depends_on_neither_parser_nor_number_mode(folder, run, data):
    # verify reads numbers as exact Decimals, doctor and the writer as floats, and
    # either may run on jiter or the standard library: all four must agree.
    w = written(folder, run)
    at = data.draw(st.integers(0, len(w.data) - 1), label="position")
    new = data.draw(st.integers(0, 255).map(lambda b: bytes([b])), label="byte")
    tampered = w.data[:at] + new + w.data[at + 1 :]
    verdicts = set()
    for parsers in filter(None, (strict_json.JITER, strict_json.STDLIB)):
        with patched(strict_json, "parsers", parsers):
            for exact in (True, False):
                verdicts.add(first_failure(ChainVerifier(exact=exact), tampered))
    assert len(verdicts) == 1, verdicts
    (verdict,) = verdicts
    if verdict is not None:  # what verify itself reports for the same bytes
        assert w.verdict(tampered) in {verdict, (NOT_A_LEDGER, None, None)}


@contextmanager
def patched(module, name: str, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)
