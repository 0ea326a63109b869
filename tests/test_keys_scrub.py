"""The relay scrubber (docket.guards.scrub): a key never reaches the agent, however
the upstream's bytes are cut into pieces, and the output is the same as scrubbing
the whole stream at once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from docket.guards.scrub import SCRUB_MARKER, Scrubber, relay_keys

# Keys from an alphabet without the marker's bytes: a key that holds "[redacted]"'s
# bytes could be re-formed across a marker, which no real key does.
KEY_ALPHABET = b"bfgkms-_0123"
keys_st = st.lists(
    st.binary(min_size=1, max_size=12).map(
        lambda b: bytes(KEY_ALPHABET[x % len(KEY_ALPHABET)] for x in b)
    ),
    min_size=1,
    max_size=3,
)


def reference(data: bytes, keys) -> bytes:
    """Scrub in one pass, position by position: leftmost match, shortest key on a tie."""
    keys = sorted(set(keys), key=len)
    out, i = bytearray(), 0
    while i < len(data):
        key = next((k for k in keys if data.startswith(k, i)), None)
        if key is None:
            out.append(data[i])
            i += 1
        else:
            out += SCRUB_MARKER
            i += len(key)
    return bytes(out)


def chunks_of(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points + [len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


@settings(deadline=None)
@given(
    keys=keys_st,
    filler=st.lists(st.one_of(st.binary(max_size=6), st.sampled_from(list(b"ks-0b"))), max_size=12),
    plant=st.lists(st.integers(0, 2), max_size=6),
    cuts=st.lists(st.integers(0, 10_000), max_size=20),
)
def test_any_chunking_scrubs_like_the_whole(keys, filler, plant, cuts):
    parts = []
    for i, f in enumerate(filler):
        parts.append(bytes([f]) if isinstance(f, int) else f)
        if i < len(plant):
            parts.append(keys[plant[i] % len(keys)])  # the key, whole, somewhere
    data = b"".join(parts)
    scrubber = Scrubber(tuple(keys))
    out = b"".join(scrubber.feed(piece) for piece in chunks_of(data, cuts)) + scrubber.flush()
    assert out == reference(data, keys)
    for key in keys:
        assert key not in out
    assert scrubber.count == out.count(SCRUB_MARKER) - data.count(SCRUB_MARKER)


@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=10))
def test_without_keys_bytes_pass_unchanged(data, cuts):
    scrubber = Scrubber(())
    assert b"".join(scrubber.feed(p) for p in chunks_of(data, cuts)) + scrubber.flush() == data


def test_holds_back_only_what_could_become_a_key():
    key = b"sk-proj-0123456789abcdef"
    scrubber = Scrubber((key,))
    assert scrubber.feed(b'data: {"delta": "hello"}\n\n') == b'data: {"delta": "hello"}\n\n'
    assert scrubber.feed(b"your key is sk-pr") == b"your key is "  # may be a key: held
    assert scrubber.feed(b"oj-0123456789abcdef!") == SCRUB_MARKER + b"!"
    assert scrubber.feed(b"sk-nope") == b"sk-nope"  # can no longer be the key
    assert scrubber.count == 1


def test_relay_keys_skips_short_and_empty_keys():
    assert relay_keys(["", "short", "sk-0123456789"]) == (b"sk-0123456789",)
