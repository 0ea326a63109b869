"""EventTexts at its edges: events with no text among held ones, an event that never
ends, a key whose last bytes the stream's end releases, and the events it leaves to the
byte scan (no data line, not JSON, not an object). Each answer is read as the agent
would: the text its deltas join into, and the events as bytes."""

from __future__ import annotations

import json

from docket.guards.forms import SecretForms
from docket.guards.scrub import MAX_EVENT_BYTES, EventTexts, _text_delta

KEY = "sk-proj-edgecase-0123456789abcdef"


def delta(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"delta": {"content": text}}]}).encode() + b"\n\n"


def joined(stream: bytes) -> str:
    texts = []
    for event in stream.split(b"\n\n"):
        obj, path = _text_delta(event)
        if obj is not None and path is not None:
            texts.append(obj["choices"][0]["delta"]["content"])
    return "".join(texts)


def run(*pieces: bytes) -> tuple[bytes, list[str]]:
    found: list[str] = []
    events = EventTexts(SecretForms([KEY]), found.extend)
    return b"".join(events.feed(p) for p in pieces) + events.flush(), found


def test_an_event_without_text_between_the_halves_of_a_key_keeps_its_place():
    ping = b": keep-alive\n\n"
    out, found = run(delta("before " + KEY[:14]), ping, delta(KEY[14:] + " after"))
    assert KEY not in joined(out) and KEY[14:] not in joined(out), out
    assert found and ping in out  # the comment event goes out as it came, in order
    assert out.index(ping) < out.rindex(b"after")


def test_a_key_cut_at_the_streams_end_is_taken_out_of_the_last_text():
    out, found = run(delta("the key is " + KEY))
    assert KEY not in joined(out) and found, out
    assert joined(out).startswith("the key is ")  # the text around it kept


def test_an_event_that_never_ends_is_released_past_its_bound():
    huge = b"data: " + b"x" * (MAX_EVENT_BYTES + 10)  # no blank line: not an event yet
    found: list[str] = []
    events = EventTexts(SecretForms([KEY]), found.extend)
    out = events.feed(delta("hello")) + events.feed(huge)
    assert out.endswith(huge) and out.startswith(b"data: ")  # held no longer than its bound
    assert events.flush() == b"" and found == []


def test_events_it_leaves_to_the_byte_scan():
    assert _text_delta(b"event: ping") == (None, None)  # no data line
    assert _text_delta(b"data: [DONE]") == (None, None)  # not JSON
    assert _text_delta(b"data: {broken") == (None, None)  # not valid JSON
    assert _text_delta(b"data: {}\ndata: {}") == (None, None)  # two data lines
    obj, path = _text_delta(b'data: {"delta": {"text": "hi"}}')
    assert path == ("delta", "text") and obj == {"delta": {"text": "hi"}}


def test_a_tail_that_could_start_a_key_waits_for_the_end_and_then_goes_as_it_was():
    out, found = run(delta("a prefix that stops at " + KEY[:6]))  # "sk-pro": held, then no key
    assert joined(out) == "a prefix that stops at " + KEY[:6] and found == []


def test_no_key_to_look_for_leaves_every_byte_as_it_came():
    from docket.guards.scrub import Scrubber, scrub_piece

    assert scrub_piece(SecretForms([]), b"held ", b"and more", final=True).out == b"held and more"
    assert Scrubber(()).whole(b"sk-anything-at-all-0123456789") == b"sk-anything-at-all-0123456789"
