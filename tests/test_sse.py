"""The incremental SSE parser and the stream trackers' byte accounting, under any split."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from docket.boundary.providers import RequestFacts, by_kind, stream_tracker
from docket.boundary.providers.sse import SSEEvent, SSEParser, parse_block

# --- a model of valid streams -------------------------------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\0"),
    max_size=12,
)
_eol = st.sampled_from(["\n", "\r\n"])


@st.composite
def sse_blocks(draw):
    """One block: (its bytes, the event it dispatches or None)."""
    lines = []  # (field, value) or (":", comment)
    name = draw(st.one_of(st.none(), _text))
    if name is not None:
        lines.append(("event", name))
    data = draw(st.lists(_text, max_size=3))
    lines += [("data", d) for d in data]
    event_id = draw(st.one_of(st.none(), _text))
    if event_id is not None:
        lines.append(("id", event_id))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, (":", draw(_text)))
    if draw(st.booleans()):
        draw(st.randoms()).shuffle(lines)
    if not lines:
        lines.append((":", "keepalive"))
    text = ""
    for field, value in lines:
        text += (f":{value}" if field == ":" else f"{field}: {value}") + draw(_eol)
    text += draw(_eol)
    # The spec's order matters for repeated fields: recompute from the final order.
    names = [v for f, v in lines if f == "event"]
    datas = [v for f, v in lines if f == "data"]
    ids = [v for f, v in lines if f == "id"]
    event = None
    if datas:
        event = SSEEvent(
            (names[-1] if names else "") or None, "\n".join(datas), ids[-1] if ids else None
        )
    return text.encode("utf-8"), event


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


# --- the parser ----------------------------------------------------------------


@settings(deadline=None)
@given(st.lists(sse_blocks(), max_size=8), st.lists(st.integers(0, 10_000), max_size=12))
def test_any_split_yields_the_same_events_and_blocks(blocks, cuts):
    stream = b"".join(b for b, _ in blocks)
    expected = [e for _, e in blocks if e is not None]

    whole = SSEParser()
    assert whole.feed(stream) == expected

    parser = SSEParser()
    got_blocks = []
    for chunk in split(stream, cuts):
        got_blocks += parser.feed_blocks(chunk)
    assert got_blocks == [b for b, _ in blocks]
    assert [parse_block(b) for b in got_blocks if parse_block(b)] == expected
    assert parser.pending == 0


def test_byte_at_a_time_with_crlf_comments_and_multiline_data():
    stream = (
        b": hello\r\n\r\n"
        b'event: message_start\r\ndata: {"a":\r\ndata:  1}\r\nid: 7\r\n\r\n'
        b"data:x\n\n"
        b"event: ping\n\n"  # no data: not dispatched
        b"data\n\n"  # a field with no colon: empty data
    )
    parser = SSEParser()
    events = []
    for i in range(len(stream)):
        events += parser.feed(stream[i : i + 1])
    assert events == [
        SSEEvent("message_start", '{"a":\n 1}', "7"),
        SSEEvent(None, "x"),
        SSEEvent(None, ""),
    ]


def test_incomplete_event_is_held_and_can_be_taken():
    parser = SSEParser()
    assert parser.feed(b"data: one\n\ndata: tw") == [SSEEvent(None, "one")]
    assert parser.pending == len(b"data: tw")
    assert parser.take_pending() == b"data: tw"
    assert parser.pending == 0


def test_invalid_utf8_is_replaced_not_raised():
    assert SSEParser().feed(b"data: \xff\xfe\n\n") == [SSEEvent(None, "\ufffd\ufffd")]


# --- trackers: what reaches the client -------------------------------------------

_CHAT = RequestFacts("openai", "chat.completions", "gpt-4o-mini", True, None)
_MESSAGES = RequestFacts("anthropic", "messages", "claude-sonnet-4-5", True, 1024)


def _chat_chunk(text: str) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        "usage": None,
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


_USAGE_CHUNK = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
    b'"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":19,'
    b'"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":3}}}\n\n'
)

# Model output that mentions usage and errors must not be mistaken for them.
_tricky = st.sampled_from(
    ['"usage":{"prompt_tokens":1}', '{"error":{"message":"x"}}', "hi", "\n\n", "data: [DONE]"]
)


@settings(deadline=None)
@given(
    st.lists(st.one_of(_tricky, _text), max_size=6),
    st.lists(st.integers(0, 10_000), max_size=10),
    st.booleans(),
)
def test_chat_stream_strips_exactly_the_usage_event_under_any_split(texts, cuts, keepalive):
    events = [_chat_chunk(t) for t in texts]
    if keepalive:
        events.insert(len(events) // 2, b": keepalive\n\n")
    events += [_USAGE_CHUNK, b"data: [DONE]\n\n"]
    stream = b"".join(events)
    without_usage = stream.replace(_USAGE_CHUNK, b"")
    # Where each block ends, and how much the client must have seen by then.
    ends, seen, total = [], [], 0
    for block in events:
        total += len(block)
        ends.append(total)
        seen.append((seen[-1] if seen else 0) + (0 if block is _USAGE_CHUNK else len(block)))

    stripping = stream_tracker(by_kind(_CHAT.kind), _CHAT, strip_usage_chunk=True)
    passing = stream_tracker(by_kind(_CHAT.kind), _CHAT, strip_usage_chunk=False)
    out_strip, out_pass, fed = b"", b"", 0
    for chunk in split(stream, cuts):
        forwarded = passing.feed(chunk)
        assert forwarded is chunk  # no copy when nothing is stripped
        out_pass += forwarded
        out_strip += stripping.feed(chunk)
        fed += len(chunk)
        # Latency: every event complete so far has gone out, nothing more.
        done = [s for e, s in zip(ends, seen, strict=True) if e <= fed]
        assert len(out_strip) == (done[-1] if done else 0)
    out_strip += stripping.flush()
    assert passing.flush() == b""

    assert out_pass == stream
    assert out_strip == without_usage
    for tracker in (stripping, passing):
        assert tracker.usage is not None
        assert (tracker.usage.input_tokens, tracker.usage.output_tokens) == (19, 10)
        assert tracker.usage.cached_tokens == 3
        assert tracker.finished
        assert tracker.error is None
        assert tracker.problem is None
        assert tracker.events == len(texts) + 2


def _anthropic_stream(output_steps: list[int]) -> list[bytes]:
    def ev(name: str, obj: dict) -> bytes:
        return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()

    blocks = [
        ev(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude-sonnet-4-5",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 25,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 7,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        ev(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        ev("ping", {"type": "ping"}),
    ]
    for n in output_steps:
        blocks.append(
            ev(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "Hello"},
                },
            )
        )
        blocks.append(
            ev(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": None},
                    "usage": {"output_tokens": n},
                },
            )
        )
    blocks.append(ev("content_block_stop", {"type": "content_block_stop", "index": 0}))
    blocks.append(ev("message_stop", {"type": "message_stop"}))
    return blocks


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 5000), min_size=1, max_size=5).map(sorted),
    st.lists(st.integers(0, 100_000), max_size=10),
)
def test_anthropic_usage_is_the_latest_cumulative_value_under_any_split(steps, cuts):
    stream = b"".join(_anthropic_stream(steps))
    tracker = stream_tracker(by_kind(_MESSAGES.kind), _MESSAGES)
    out = b"".join(tracker.feed(c) for c in split(stream, cuts)) + tracker.flush()
    assert out == stream
    assert tracker.finished
    assert tracker.usage.input_tokens == 25
    assert tracker.usage.output_tokens == steps[-1]  # not sum(steps)
    assert tracker.usage.cached_tokens == 7
    assert not tracker.usage.cached_is_subset
    assert tracker.usage.total_input_tokens == 32


def test_anthropic_stream_cut_keeps_what_is_known():
    blocks = _anthropic_stream([3, 9, 14])
    # message_start, content_block_start, ping, then (delta, message_delta) twice, then a torn event
    cut = b"".join(blocks[:7]) + blocks[7][:20]
    tracker = stream_tracker(by_kind(_MESSAGES.kind), _MESSAGES)
    assert tracker.feed(cut) == cut
    assert not tracker.finished
    assert tracker.usage.input_tokens == 25
    assert tracker.usage.output_tokens == 9
    assert tracker.pending == 20


def test_anthropic_cache_write_split_survives_later_deltas():
    start = {
        "type": "message_start",
        "message": {
            "usage": {
                "input_tokens": 5,
                "cache_creation_input_tokens": 30,
                "cache_read_input_tokens": 0,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 10,
                    "ephemeral_1h_input_tokens": 20,
                },
                "output_tokens": 1,
            }
        },
    }
    delta = {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 40}}
    tracker = stream_tracker(by_kind(_MESSAGES.kind), _MESSAGES)
    tracker.feed(f"event: message_start\ndata: {json.dumps(start)}\n\n".encode())
    tracker.feed(f"event: message_delta\ndata: {json.dumps(delta)}\n\n".encode())
    assert tracker.usage.output_tokens == 40
    assert (tracker.usage.cache_write_tokens, tracker.usage.cache_write_1h_tokens) == (30, 20)


def test_anthropic_stream_cut_before_message_start_has_no_usage():
    tracker = stream_tracker(by_kind(_MESSAGES.kind), _MESSAGES)
    tracker.feed(_anthropic_stream([1])[0][:40])
    assert tracker.usage is None
    assert tracker.events == 0


def test_an_oversized_event_switches_the_tracker_to_pass_through():
    tracker = stream_tracker(
        by_kind(_CHAT.kind), _CHAT, strip_usage_chunk=True, max_event_bytes=100
    )
    first = _chat_chunk("hi")
    held = b"data: " + b"x" * 60
    assert tracker.feed(first + held) == first
    more = b"y" * 60
    assert tracker.feed(more) == held + more  # released, nothing lost
    assert tracker.feed(_USAGE_CHUNK) == _USAGE_CHUNK  # no longer inspected
    assert "100 bytes" in tracker.problem
    assert tracker.usage is None
    assert tracker.flush() == b""


def test_a_complete_event_ahead_of_an_oversized_one_is_not_lost():
    tracker = stream_tracker(
        by_kind(_CHAT.kind), _CHAT, strip_usage_chunk=True, max_event_bytes=100
    )
    chunk = _chat_chunk("a") + _USAGE_CHUNK + b"data: " + b"z" * 200
    assert tracker.feed(chunk) == chunk.replace(_USAGE_CHUNK, b"")
    assert tracker.usage.input_tokens == 19
    assert tracker.problem is not None


def test_an_oversized_event_is_not_kept_in_memory_when_passing_through():
    tracker = stream_tracker(by_kind(_MESSAGES.kind), _MESSAGES, max_event_bytes=100)
    big = b"event: content_block_delta\ndata: " + b"x" * 500
    assert tracker.feed(big) is big
    assert tracker.pending == 0
    assert tracker.problem is not None
    assert tracker.flush() == b""
