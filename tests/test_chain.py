"""The pure chain: encoding, hashing and the incremental verifier."""

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket.ledger import chain


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
            st.one_of(st.integers(), st.text(), st.booleans(), st.none()),
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
