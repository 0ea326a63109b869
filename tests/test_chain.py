"""The pure chain: encoding, hashing and the incremental verifier, and the strict
JSON every reader of a ledger (verify, doctor, the writer resuming) shares."""

import hashlib
import json
import re
import subprocess
import sys
from decimal import Decimal

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docket.ledger import chain, doctor, strict_json
from docket.ledger.book import LedgerBook
from docket.ledger.limits import LedgerLimits
from docket.ledger.writer import LedgerDamaged, open_ledger
from docket.receipts.verify import scan_ledger


def build(n: int, body=lambda i: {"i": i}) -> list[bytes]:
    lines, prev = [], chain.GENESIS
    for i in range(n):
        line = chain.encode_line(
            seq=i,
            ts="2026-11-29T00:00:00.000Z",
            mono_ms=i * 3,
            type="model.request",
            prev=prev,
            body=chain.encode_body(body(i)),
        )
        lines.append(line)
        prev = chain.line_hash(line)
    return lines


def verify(lines: list[bytes]) -> chain.ChainVerifier:
    v = chain.ChainVerifier()
    for line in lines:
        v.feed(line)
    return v


def test_line_is_compact_json_with_common_fields_first():
    (line,) = build(1)
    assert line.startswith(b'{"v":1,"seq":0,"ts":"2026-11-29T00:00:00.000Z","mono_ms":0,')
    event = json.loads(line)
    assert list(event)[:6] == list(chain.COMMON_FIELDS)
    assert event["prev"] == "0" * 64 and event["i"] == 0


def test_hash_is_sha256_of_the_exact_bytes():
    lines = build(3)
    v = verify(lines)
    assert v.head == hashlib.sha256(lines[-1]).hexdigest()
    assert json.loads(lines[1])["prev"] == hashlib.sha256(lines[0]).hexdigest()
    assert v.count == 3 and v.offset == sum(len(x) + 1 for x in lines)


def test_empty_body_and_unicode_round_trip():
    line = chain.encode_line(
        seq=0, ts="t", mono_ms=0, type="session.end", prev=chain.GENESIS, body=b"{}"
    )
    assert json.loads(line)["type"] == "session.end"
    (uline,) = build(1, body=lambda i: {"model": "modèle-é", "n": None})
    assert "modèle-é".encode() in uline
    assert verify([uline]).count == 1


def test_body_may_not_shadow_common_fields():
    with pytest.raises(ValueError, match="seq"):
        chain.encode_body({"seq": 5})


def test_nan_is_refused():
    with pytest.raises(ValueError):
        chain.encode_body({"x": float("nan")})


@pytest.mark.parametrize(
    ("mutate", "code", "at"),
    [
        (lambda ls: ls[:1] + ls[2:], chain.SEQ_GAP, 1),
        (lambda ls: [ls[0], ls[2], ls[1], ls[3]], chain.SEQ_GAP, 1),
        (lambda ls: [ls[0], ls[1].replace(b'"i":1', b'"i":7')] + ls[2:], chain.CHAIN_BREAK, 2),
        (lambda ls: [ls[0], b"not json"] + ls[2:], chain.MALFORMED_LINE, 1),
        (
            lambda ls: [ls[0], ls[1].replace(b'"v":1', b'"v":2')] + ls[2:],
            chain.UNSUPPORTED_VERSION,
            1,
        ),
        (
            lambda ls: [ls[0], ls[1].replace(b'"mono_ms":3', b'"mono_ms":"3"')] + ls[2:],
            chain.MALFORMED_LINE,
            1,
        ),
    ],
    ids=["deleted", "reordered", "edited", "junk", "version", "mono-type"],
)
def test_each_break_has_its_code_and_place(mutate, code, at):
    lines = mutate(build(4))
    v = chain.ChainVerifier()
    with pytest.raises(chain.ChainError) as err:
        for line in lines:
            v.feed(line)
    assert err.value.code == code
    assert err.value.seq == at
    assert err.value.offset == sum(len(x) + 1 for x in lines[:at])


def test_mono_regression_is_caught():
    lines, prev = [], chain.GENESIS
    for seq, mono in enumerate([5, 9, 4]):
        line = chain.encode_line(seq=seq, ts="t", mono_ms=mono, type="x", prev=prev, body=b"{}")
        lines.append(line)
        prev = chain.line_hash(line)
    with pytest.raises(chain.ChainError) as err:
        verify(lines)
    assert err.value.code == chain.MONO_REGRESSION and err.value.seq == 2


@given(
    st.lists(
        st.dictionaries(
            st.text(min_size=1).filter(lambda k: k not in chain.COMMON_FIELDS),
            # Integers of at most 32 digits: spec rule 2.1.7 bounds every number token
            # (tests/test_number_bounds.py); the recorder writes none larger.
            st.one_of(
                st.integers(min_value=-(10**32) + 1, max_value=10**32 - 1),
                st.text(),
                st.booleans(),
                st.none(),
            ),
            max_size=4,
        ),
        max_size=8,
    )
)
def test_any_bodies_make_a_valid_chain(bodies):
    lines = build(len(bodies), body=lambda i: bodies[i])
    v = verify(lines)
    assert v.count == len(bodies)
    for line, fields in zip(lines, bodies, strict=True):
        decoded = json.loads(line)
        assert {k: decoded[k] for k in fields} == fields


# --- strict JSON: what json.loads would take, the chain refuses ------------------
#
# Each flawed line is the right next event when read leniently (json.loads reads
# it with the right seq, prev and mono_ms), so only the strict reading catches
# it. Every reader of a ledger must refuse it the same way: the verifier itself,
# doctor, the writer resuming the file, and verify's scan.

MAX_INT = 2**53 - 1


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def flaw(kind: str, line: bytes) -> bytes:
    """The line with one flaw, keeping its seq, prev and mono_ms as json.loads reads them."""
    event = json.loads(line)
    seq, mono = event["seq"], event["mono_ms"]
    if kind == "bom":
        return b"\xef\xbb\xbf" + line
    if kind == "utf16":
        return line.decode().encode("utf-16")  # with its byte-order mark
    if kind == "utf16le":
        return line.decode().encode("utf-16-le")
    if kind == "duplicate_key":  # last wins in json.loads: seq 99, then the right seq
        return line.replace(f'"seq":{seq},'.encode(), f'"seq":99,"seq":{seq},'.encode(), 1)
    if kind == "nan":
        return line[:-1] + b',"x":NaN}'
    if kind == "infinity":
        return line[:-1] + b',"x":-Infinity}'
    if kind == "deep_65":  # the line's object is level 1, so 64 arrays inside make 65
        return line[:-1] + b',"x":' + _nested(64) + b"}"
    if kind == "deep_100k":
        return line[:-1] + b',"x":' + _nested(100_000) + b"}"
    if kind == "mono_over_2^53":  # mono_ms may grow, but not past 2^53-1
        return line.replace(f'"mono_ms":{mono},'.encode(), f'"mono_ms":{MAX_INT + 1},'.encode())
    if kind == "lone_surrogate":
        return line[:-1] + b',"x":"\\ud800"}'
    raise AssertionError(kind)


FLAWS = [
    "bom",
    "utf16",
    "utf16le",
    "duplicate_key",
    "nan",
    "infinity",
    "deep_65",
    "deep_100k",
    "mono_over_2^53",
    "lone_surrogate",
]
FLAWED_AT = 3


def flawed_ledger(kind: str) -> tuple[list[bytes], bytes]:
    """Six good lines with line 3 flawed; returns the lines and the file's bytes."""
    lines = build(6)
    lines[FLAWED_AT] = flaw(kind, lines[FLAWED_AT])
    return lines, b"".join(line + b"\n" for line in lines)


@pytest.mark.parametrize("kind", FLAWS)
def test_a_lenient_reading_would_have_taken_each_flawed_line(kind):
    # Why each case is a trap: json.loads sees the right next event (or, for
    # 100,000 brackets, raises RecursionError, a traceback for the user).
    lines = build(6)
    bad = flaw(kind, lines[FLAWED_AT])
    assert b"\n" not in bad
    if kind == "deep_100k":
        with pytest.raises(RecursionError):
            json.loads(bad)
        return
    event = json.loads(bad)
    assert event["seq"] == FLAWED_AT and event["v"] == 1
    assert event["prev"] == chain.line_hash(lines[FLAWED_AT - 1])
    if kind != "mono_over_2^53":
        assert event["mono_ms"] == json.loads(lines[FLAWED_AT])["mono_ms"]


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("kind", FLAWS)
def test_the_verifier_refuses_each_flaw_as_a_malformed_line(json_parser, kind, exact):
    lines, _ = flawed_ledger(kind)
    v = chain.ChainVerifier(exact=exact)
    for line in lines[:FLAWED_AT]:
        v.feed(line)
    with pytest.raises(chain.ChainError) as err:
        v.feed(lines[FLAWED_AT])
    assert (err.value.code, err.value.seq) == (chain.MALFORMED_LINE, FLAWED_AT)
    assert err.value.offset == sum(len(x) + 1 for x in lines[:FLAWED_AT])
    # A refused line changes nothing: the verifier still stands after line 2.
    assert (v.count, v.head) == (FLAWED_AT, chain.line_hash(lines[FLAWED_AT - 1]))


@pytest.mark.parametrize("kind", FLAWS)
async def test_doctor_the_writer_and_verify_refuse_each_flaw_alike(tmp_path, json_parser, kind):
    lines, data = flawed_ledger(kind)
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(data)
    offset = sum(len(x) + 1 for x in lines[:FLAWED_AT])

    d = doctor.classify(path)
    assert (d.state, d.problem.seq, d.problem.offset) == (chain.MALFORMED_LINE, FLAWED_AT, offset)
    assert (d.events, d.verified_bytes, d.lines) == (FLAWED_AT, offset, len(lines))

    scan = scan_ledger(path)
    error = scan.chain_error
    assert (error.code, error.seq, error.offset) == (chain.MALFORMED_LINE, FLAWED_AT, offset)
    assert (scan.events, scan.size) == (FLAWED_AT, offset)

    with trio.fail_after(10):
        with pytest.raises(
            LedgerDamaged, match=f"malformed_line at seq {FLAWED_AT}, byte {offset}"
        ):
            async with open_ledger(path):
                raise AssertionError("a damaged ledger was opened for appending")
    assert path.read_bytes() == data  # and nothing was written to it


@pytest.mark.parametrize("kind", ["deep_100k", "bom", "duplicate_key"])
def test_docket_doctor_names_the_flaw_in_one_report_and_no_traceback(tmp_path, kind):
    _, data = flawed_ledger(kind)
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-m", "docket", "doctor", str(path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (1, b"")
    assert f"corrupt line at seq {FLAWED_AT}" in done.stdout.decode()


def test_mono_ms_and_seq_may_reach_2_53_minus_1_and_no_further():
    top = chain.encode_line(
        seq=0, ts="t", mono_ms=MAX_INT, type="x", prev=chain.GENESIS, body=b"{}"
    )
    v = chain.ChainVerifier()
    assert v.feed(top)["mono_ms"] == MAX_INT
    # seq at the bound is out of step here, so a seq gap; one past it is malformed.
    for seq, code in [(MAX_INT, chain.SEQ_GAP), (MAX_INT + 1, chain.MALFORMED_LINE)]:
        line = chain.encode_line(
            seq=seq, ts="t", mono_ms=MAX_INT, type="x", prev=v.head, body=b"{}"
        )
        with pytest.raises(chain.ChainError) as err:
            v.copy().feed(line)
        assert err.value.code == code


def test_non_integers_are_floats_or_exact_decimals_and_accepted_alike():
    (line,) = build(1, body=lambda i: {"a": 0.1, "b": 1, "n": 10**30})
    line = line.replace(b'"b":1,', b'"b":1e300,')  # the largest magnitude rule 2.1.7 reads
    loose, exact = chain.ChainVerifier().feed(line), chain.ChainVerifier(exact=True).feed(line)
    assert (loose["a"], loose["b"], loose["n"]) == (0.1, 1e300, 10**30)
    assert (exact["a"], exact["b"], exact["n"]) == (Decimal("0.1"), Decimal("1e300"), 10**30)
    with pytest.raises(chain.ChainError) as err:  # past it: refused by both readers alike
        chain.ChainVerifier().feed(line.replace(b"1e300", b"1e400"))
    assert err.value.code == chain.MALFORMED_LINE


# --- torn tails that are not what a writer leaves ----------------------------------


@pytest.mark.parametrize(
    ("tail", "state"),
    [
        (b',"x":' + b"[" * 100_000, chain.MALFORMED_LINE),  # deeper than any line: not a cut
        (b',"x":' + b"[" * 65, chain.MALFORMED_LINE),
        (b',"x":' + b"[" * 63, chain.TORN_TAIL),  # 64 with the line's object: could be a cut
        (b',"x":"' + b"[" * 100_000, chain.TORN_TAIL),  # brackets in a string do not nest
        (b',"x":NaN}', chain.MALFORMED_LINE),  # whole, but not JSON: does not verify
        (b',"x":1,"x":2}', chain.MALFORMED_LINE),  # whole, but ambiguous
        (b',"x":NaN', chain.TORN_TAIL),  # cut short, never whole
    ],
    ids=["deep-100k", "deep-66", "deep-64", "string", "nan-whole", "dup-whole", "nan-cut"],
)
def test_doctor_judges_a_tail_without_a_traceback(tmp_path, tail, state):
    lines = build(4)
    data = b"".join(line + b"\n" for line in lines[:3]) + lines[3][:-1] + tail
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(data)
    d = doctor.classify(path)
    assert (d.state, d.problem.seq) == (state, 3)
    assert (d.tail.offset, d.tail.length) == (
        sum(len(x) + 1 for x in lines[:3]),
        len(data) - d.tail.offset,
    )


# --- the writer writes nothing the verifier would refuse ---------------------------


def test_the_writer_refuses_an_event_nested_deeper_than_the_verifier_reads():
    book = LedgerBook(LedgerLimits())
    fits = chain.encode_body({"x": json.loads(_nested(63))})  # 64 levels with the object
    item = book.admit("model.request", "t", 0, fits)
    line = chain.encode_line(
        seq=0, ts="t", mono_ms=0, type="model.request", prev=chain.GENESIS, body=fits
    )
    assert chain.ChainVerifier().feed(line)["x"] == json.loads(_nested(63))
    too_deep = chain.encode_body({"x": json.loads(_nested(64))})
    with pytest.raises(ValueError, match="nested more than 64 levels"):
        book.admit("model.request", "t", 0, too_deep)
    assert list(book.queue) == [item]  # the refusal changed nothing


# --- the fast path against a plain reading of the spec -----------------------------


def spec_first_failure(data: bytes) -> tuple[str, int, int] | None:
    """Spec section 4 transcribed as plainly as it reads: (code, seq, offset) or None."""
    count, head, offset, last_mono = 0, chain.GENESIS, 0, 0
    for line in data.split(b"\n")[:-1]:
        fail = (count, offset)
        try:
            event = strict_json.decode_json(line)
        except ValueError:
            return (chain.MALFORMED_LINE, *fail)
        if not isinstance(event, dict) or any(k not in event for k in chain.COMMON_FIELDS):
            return (chain.MALFORMED_LINE, *fail)
        ints = [event["v"], event["seq"], event["mono_ms"]]
        if any(type(x) is not int or x < 0 for x in ints) or max(ints[1:]) > MAX_INT:
            return (chain.MALFORMED_LINE, *fail)
        prev = event["prev"]
        if type(event["ts"]) is not str or type(event["type"]) is not str or not event["type"]:
            return (chain.MALFORMED_LINE, *fail)
        if type(prev) is not str or re.fullmatch("[0-9a-f]{64}", prev) is None:
            return (chain.MALFORMED_LINE, *fail)
        if event["v"] != 1:
            return (chain.UNSUPPORTED_VERSION, *fail)
        if event["seq"] != count:
            return (chain.SEQ_GAP, *fail)
        if prev != head:
            return (chain.CHAIN_BREAK, *fail)
        if event["mono_ms"] < last_mono:
            return (chain.MONO_REGRESSION, *fail)
        count, head, offset = count + 1, hashlib.sha256(line).hexdigest(), offset + len(line) + 1
        last_mono = event["mono_ms"]
    return None


def verifier_first_failure(data: bytes) -> tuple[str, int, int] | None:
    v = chain.ChainVerifier()
    try:
        for line in data.split(b"\n")[:-1]:
            v.feed(line)
    except chain.ChainError as exc:
        return exc.code, exc.seq, exc.offset
    return None


# Byte strings that, dropped into a line, reach each rule of the spec.
SPLICES = [b"0", b"9", b"f", b"-", b'"', b"x", b"{", b"[", b"\\", b",", b":", b" ", b"\xff"]
SPLICES += [b"NaN", b"1.5", b"9007199254740992", b"\xef\xbb\xbf", b'"seq":1,', b'"v":2,']


MOVES = ["drop", "repeat", "swap", b'"v":2', b'"v":true', b'"seq":7', b'"seq":-1']
MOVES += [
    b'"seq":9007199254740992',
    b'"mono_ms":0',
    b'"mono_ms":1e3',
    b'"mono_ms":9007199254740992',
]
MOVES += [b'"prev":"' + b"f" * 64 + b'"', b'"prev":"' + b"F" * 64 + b'"', b'"prev":null']
MOVES += [b'"ts":1', b'"type":""', b'"type":"x"', b'"ts":"t","ts":"t"']


def chain_with_edits(monos: list[int], moves: list[tuple[str, int, int]], edits) -> bytes:
    """A chain of len(monos) lines, then whole lines moved or a field set, then bytes spliced in."""
    lines, prev = [], chain.GENESIS
    for seq, mono in enumerate(monos):
        line = chain.encode_line(
            seq=seq, ts="t", mono_ms=mono, type="model.request", prev=prev, body=b'{"a":1}'
        )
        lines.append(line)
        prev = chain.line_hash(line)
    for move, i, j in moves:
        i, j = i % len(lines), j % len(lines)
        if move == "drop" and len(lines) > 1:
            del lines[i]
        elif move == "repeat":
            lines.insert(i, lines[i])
        elif move == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif isinstance(move, bytes):  # a common field set to another value
            name = move.split(b":", 1)[0]
            lines[i] = re.sub(re.escape(name) + rb':("[^"]*"|[^,}]*)', move, lines[i], count=1)
    data = bytearray(b"".join(line + b"\n" for line in lines))
    for at, cut, splice in edits:  # replace `cut` bytes at `at` with `splice`
        at %= len(data)
        data[at : at + cut] = splice
    return bytes(data)


# The json_parser fixture holds for the whole test, the same for every example.
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    monos=st.lists(st.integers(0, 50), min_size=1, max_size=5).map(sorted),
    moves=st.lists(
        st.tuples(
            st.sampled_from(["drop", "repeat", "swap"]), st.integers(0, 9), st.integers(0, 9)
        ),
        max_size=1,
    ),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 3), st.sampled_from(SPLICES)),
        max_size=2,
    ),
)
def test_the_verifier_agrees_with_a_plain_reading_of_the_spec(json_parser, monos, moves, edits):
    data = chain_with_edits(monos, moves, edits)
    assert verifier_first_failure(data) == spec_first_failure(data)


def test_a_lone_surrogate_becomes_a_replacement_character_not_a_lost_event():
    body = chain.encode_body({"message": "bad \ud800 text"})
    body.decode("utf-8")  # valid UTF-8
    line = chain.encode_line(
        seq=0, ts="t", mono_ms=0, type="model.error", prev=chain.GENESIS, body=body
    )
    assert chain.ChainVerifier().feed(line)["message"] == "bad \ufffd text"


def test_a_chain_error_passes_through_a_context_manager_unchanged():
    # contextlib sets __traceback__ on the way out; a frozen dataclass exception
    # turned that into a FrozenInstanceError and lost the chain's verdict.
    from contextlib import contextmanager

    from docket.ledger.chain import ChainError

    @contextmanager
    def around():
        yield

    error = ChainError("chain_break", 3, 120, "prev does not match")
    with pytest.raises(ChainError) as caught, around():
        raise error
    assert caught.value is error
    assert str(caught.value) == "chain_break at seq 3, byte 120: prev does not match"
