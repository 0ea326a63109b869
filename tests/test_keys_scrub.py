"""The relay scrubber (docket.guards.scrub): a key never reaches the agent, in any
of the forms the ledger's redactor knows (docket.guards.forms), however the
upstream's bytes are cut into pieces; the output is the same as scrubbing the
whole stream at once, and no more is held back than could still grow into a key."""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import unquote_to_bytes

from hypothesis import given, settings
from hypothesis import strategies as st

from docket.guards.forms import SecretForms
from docket.guards.redact import Redactor
from docket.guards.scrub import SCRUB_MARKER, Scrubber, relay_keys, scrub_piece

# Keys from a provider key's alphabet, without the marker's letters: a key that held
# "[redacted]"'s bytes could be re-formed across a marker, which no real key does.
KEY_ALPHABET = "bfgkmsBFGKMS-_0123456789"
keys_st = st.text(KEY_ALPHABET, min_size=8, max_size=40)
# Filler with near misses: a key's own characters and the escapes' first bytes.
filler_st = st.binary(max_size=8) | st.sampled_from(
    [b"sk-", b"%2", b"\\u00", b"73", b"c2", b"\n\n", b'data: {"x": "', b"b", b"-"]
)
KINDS = ("raw", "case", "percent", "json", "base64", "urlsafe", "hex", "HEX")


def encode(key: str, kind: str, mask: list[bool], lead: bytes) -> bytes:
    """One form of `key`; `mask` picks which characters an escape form escapes (mixed,
    as an attacker likes); `lead` shifts a base64 form to another alignment."""
    raw = key.encode()
    if kind == "raw":
        return raw
    if kind == "case":
        return bytes(
            c ^ 0x20 if m and chr(c).isalpha() else c for c, m in zip(raw, mask, strict=False)
        )
    if kind == "percent":
        return b"".join(b"%%%02X" % c if m else bytes([c]) for c, m in zip(raw, mask, strict=False))
    if kind == "json":
        return b"".join(
            b"\\u%04x" % c if m else bytes([c]) for c, m in zip(raw, mask, strict=False)
        )
    if kind in ("base64", "urlsafe"):
        coder = base64.b64encode if kind == "base64" else base64.urlsafe_b64encode
        return coder(lead[:2] + raw + b"~")
    return raw.hex().encode() if kind == "hex" else raw.hex().upper().encode()


def chunks_of(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points + [len(data)]:
        pieces.append(data[last:p])
        last = p
    return pieces


def decoded(data: bytes) -> bytes:
    """What an agent would read out of `data` by undoing each escape form."""
    text = re.sub(rb"\\u([0-9a-fA-F]{4})", lambda m: bytes([int(m[1], 16) & 0xFF]), data)
    return unquote_to_bytes(text).lower()


def leaked(key: str, out: bytes) -> bool:
    raw = key.encode()
    if raw.lower() in decoded(out) or raw.hex().encode() in out.lower():
        return True
    cores = [c.encode() for c in SecretForms([key]).cores]  # the base64 forms' cores
    return any(core in out.lower() for core in cores)


# No deadline: a new set of keys compiles its patterns first (~0.1 s for three keys).
@settings(deadline=None)
@given(
    keys=st.lists(keys_st, min_size=1, max_size=3, unique=True),
    filler=st.lists(filler_st, max_size=10),
    plants=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from(KINDS),
            st.lists(st.booleans(), min_size=40, max_size=40),
            st.binary(min_size=2, max_size=2),
            st.integers(0, 2),
        ),
        max_size=5,
    ),
    cuts=st.lists(st.integers(0, 10_000), max_size=25),
)
def test_any_split_of_any_form_scrubs_like_the_whole(keys, filler, plants, cuts):
    parts = list(filler)
    for which, kind, mask, lead, align in plants:
        parts.insert(
            which * len(parts) // 2, encode(keys[which % len(keys)], kind, mask, lead[:align])
        )
    data = b"".join(parts)
    scrubber = Scrubber(relay_keys(keys))
    pieces, most_held = [], 0
    for piece in chunks_of(data, cuts):
        pieces.append(scrubber.feed(piece))
        most_held = max(most_held, len(scrubber._held))
    out = b"".join(pieces) + scrubber.flush()
    whole = scrub_piece(scrubber.forms, b"", data, final=True)
    assert out == whole.out  # any split: the same bytes as the whole
    assert scrubber.count == len(whole.found) >= len(plants)
    assert most_held <= scrubber.forms.longest - 1  # never more than the window
    for key in keys:
        assert not leaked(key, out), (key, out)


@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=10))
def test_without_keys_bytes_pass_unchanged(data, cuts):
    scrubber = Scrubber(())
    assert b"".join(scrubber.feed(p) for p in chunks_of(data, cuts)) + scrubber.flush() == data


@settings(deadline=None)
@given(
    key=keys_st, kind=st.sampled_from(KINDS), mask=st.lists(st.booleans(), min_size=40, max_size=40)
)
def test_the_recorder_and_the_relay_catch_the_same_forms(key, kind, mask):
    form = encode(key, kind, mask, b"\x07\x08")
    text = b'{"error": "you sent ' + form + b'"}'
    relayed = Scrubber(relay_keys([key])).whole(text)
    recorded, hit = Redactor([key]).text(text.decode("latin-1"))
    assert hit and recorded.encode("latin-1") == relayed
    assert not leaked(key, relayed)


def test_holds_back_only_what_could_become_a_key():
    key = b"sk-proj-0123456789abcdef"
    scrubber = Scrubber((key,))
    assert scrubber.feed(b'data: {"delta": "hello"}\n\n') == b'data: {"delta": "hello"}\n\n'
    assert scrubber.feed(b"your key is sk-pr") == b"your key is "  # may be a key: held
    assert scrubber.feed(b"oj-0123456789abcdef!") == SCRUB_MARKER + b"!"
    assert scrubber.feed(b"sk-nope") == b"sk-nope"  # can no longer be the key
    # An escaped form, cut inside an escape: held from the cut form's start.
    assert scrubber.feed(b"echo: sk\\u002dproj\\u00") == b"echo: "
    assert scrubber.feed(b"2d0123456789abcdef.") == SCRUB_MARKER + b"."
    # Hex, cut in two: the first half waits, the whole goes.
    assert scrubber.feed(b"x " + key.hex().encode()[:20]) == b"x "
    assert scrubber.feed(key.hex().encode()[20:] + b" y") == SCRUB_MARKER + b" y"
    assert scrubber.count == 3
    assert dict(scrubber.kinds) == {"raw": 1, "json": 1, "hex": 1}


def test_reported_forms_each_reach_the_agent_as_the_marker():
    """A \\u002d-escaped echo, base64 and hex of the
    key (each relayed whole before the shared forms)."""
    key = "sk-proj-0123456789abcdef"
    scrubber = Scrubber(relay_keys([key]))
    for form in (
        key.replace("-", "\\u002d").encode(),
        base64.b64encode(key.encode()),
        base64.urlsafe_b64encode(b"\xfb" + key.encode()),
        key.encode().hex().encode(),
        key.encode().hex().upper().encode(),
    ):
        out = scrubber.whole(b'{"echo": "' + form + b'"}')
        assert SCRUB_MARKER in out and not leaked(key, out), (form, out)


def test_relay_keys_skips_short_and_empty_keys():
    assert relay_keys(["", "short", "sk-0123456789"]) == (b"sk-0123456789",)


# ---------------------------------------------------------------- split across events

TEXT_ST = st.text("abcks -_0123xyz", max_size=12)


def openai_event(text: str) -> bytes:
    payload = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def anthropic_event(text: str) -> bytes:
    payload = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }
    return b"event: content_block_delta\ndata: " + json.dumps(payload).encode() + b"\n\n"


def joined(stream: bytes) -> str:
    """The text an agent joins out of the stream's deltas."""
    texts = []
    for line in stream.split(b"\n"):
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            delta = obj["choices"][0]["delta"] if "choices" in obj else obj["delta"]
            texts.append(delta.get("content", delta.get("text", "")))
    return "".join(texts)


@settings(deadline=None)
@given(
    key=keys_st,
    before=st.lists(TEXT_ST, max_size=4),
    after=st.lists(TEXT_ST, max_size=4),
    splits=st.lists(st.integers(1, 39), max_size=4),
    shape=st.sampled_from([openai_event, anthropic_event]),
    plant=st.booleans(),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_a_key_split_across_text_deltas_never_joins_up_for_the_agent(
    key, before, after, splits, shape, plant, cuts
):
    points = sorted({s % len(key) for s in splits} - {0})
    pieces = (
        [key[a:b] for a, b in zip([0, *points], [*points, len(key)], strict=True)] if plant else []
    )
    texts = [*before, *pieces, *after]
    stream = b"".join(shape(t) for t in texts) + b"data: [DONE]\n\n"
    scrubber = Scrubber(relay_keys([key]))
    scrubber.events()
    out = b"".join(scrubber.feed(p) for p in chunks_of(stream, cuts)) + scrubber.flush()
    text = joined(out)
    assert key not in text and key.lower() not in text.lower()
    assert out.endswith(b"data: [DONE]\n\n")
    if key.lower() not in "".join(texts).lower():
        assert out == stream  # no key: byte for byte, however it was cut
    else:
        assert scrubber.count >= 1 and MARKER_TEXT in text


MARKER_TEXT = SCRUB_MARKER.decode()


def test_an_event_waits_only_for_a_tail_long_enough_to_be_a_key_start():
    key = "sk-proj-0123456789abcdef"
    scrubber = Scrubber(relay_keys([key]))
    scrubber.events()
    # "This" ends like "s..." but too short to hold a token back for: it goes at once.
    assert scrubber.feed(openai_event("This")) == openai_event("This")
    # ...and a key that did start there still loses all but that "s".
    out = scrubber.feed(openai_event("k-proj-0123456789abcdef!"))
    assert joined(out) == MARKER_TEXT + "!"
    # Four bytes of a key's start: that event waits for the next one.
    assert scrubber.feed(openai_event("see sk-p")) == b""
    out = scrubber.feed(openai_event("lain"))
    assert joined(out) == "see sk-plain"
    assert out == openai_event("see sk-p") + openai_event("lain")  # as they came
