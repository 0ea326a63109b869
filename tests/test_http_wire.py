"""docket.http.wire, sans-IO: requests as bytes, responses parsed from bytes in any split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket.http import wire

BODY = b'{"id":"chatcmpl-1","usage":{"prompt_tokens":9,"completion_tokens":16}}'
SIZED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'6\r\ndata: \r\nc\r\n{"x": "y"}\n\n\r\n0\r\n\r\n'
)
INFORMATIONAL = (
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + SIZED
)
UNTIL_CLOSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nthe body runs to the end"


def parse(data: bytes, cuts=(), *, eof: bool = False, head_only: bool = False):
    """Feed `data` split at `cuts`; every event, and the reader."""
    reader = wire.ResponseReader(head_only=head_only)
    events = []
    edges = [0, *sorted(set(cuts)), len(data)]
    pieces = [data[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]
    for piece in pieces + ([b""] if eof else []):
        reader.receive_data(piece)
        while (event := reader.next_event()) is not wire.NEED_DATA:
            events.append(event)
    return events, reader


def summary(events):
    """(status, headers, body) from a head, body chunks and END, checking their order."""
    head, *rest = events
    assert isinstance(head, wire.ResponseHead)
    assert rest[-1] is wire.END and wire.END not in rest[:-1]
    return head.status, head.headers, b"".join(rest[:-1])


@pytest.mark.parametrize(
    "data,body",
    [(SIZED, BODY), (CHUNKED, b'data: {"x": "y"}\n\n'), (INFORMATIONAL, BODY)],
    ids=["content-length", "chunked", "informational-first"],
)
@given(cuts=st.lists(st.integers(min_value=1, max_value=300), max_size=12))
def test_any_split_of_the_bytes_gives_the_same_response(data, body, cuts):
    events, reader = parse(data, [c for c in cuts if c < len(data)])
    status, headers, got = summary(events)
    assert (status, got) == (200, body)
    assert all(name == name.lower() for name, _ in headers)  # names lower-case, as h11 gave them
    assert reader.complete and reader.reusable


def test_a_body_without_a_length_ends_with_the_stream_and_the_connection():
    events, reader = parse(UNTIL_CLOSE, eof=False)
    assert wire.END not in events  # more may come until the upstream closes
    events, reader = parse(UNTIL_CLOSE, [30], eof=True)
    assert summary(events)[2] == b"the body runs to the end"
    assert reader.complete and not reader.reusable


@pytest.mark.parametrize(
    "data,where",
    [
        (b"", "before the response head"),
        (b"HTTP/1.1 200 OK\r\nContent-Len", "before the response head"),
        (SIZED[:-5], "mid-body"),
        (CHUNKED[:-7], "mid-body"),
    ],
)
def test_an_end_before_the_response_is_complete_is_an_error_after_what_came(data, where):
    reader = wire.ResponseReader()
    reader.receive_data(data)
    reader.receive_data(b"")
    seen = []
    with pytest.raises(wire.WireError, match=where):
        while (event := reader.next_event()) is not wire.NEED_DATA:
            seen.append(event)
    assert reader.eof and not reader.complete
    if where == "mid-body":  # the head and the body so far come first, as a relay needs
        assert isinstance(seen[0], wire.ResponseHead) and len(seen) >= 2


def test_bad_http_is_an_error_without_the_end_of_the_stream():
    reader = wire.ResponseReader()
    reader.receive_data(b"SMTP READY\r\n\r\n")
    with pytest.raises(wire.WireError, match="bad HTTP"):
        reader.next_event()
    assert not reader.eof


def test_the_answer_to_a_head_has_no_body_whatever_its_length_says():
    data = b"HTTP/1.1 200 OK\r\ncontent-length: 512\r\n\r\n"
    events, reader = parse(data, head_only=True)
    assert summary(events) == (200, [(b"content-length", b"512")], b"")
    assert reader.reusable
    _, without_head = parse(data)
    assert not without_head.complete  # a GET's answer would wait for the 512 bytes


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nhi",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\n",  # unasked bytes
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi\x00\x01garbage",
    ],
    ids=["http-1.0", "connection-close", "a-second-response", "garbage-after"],
)
def test_a_connection_is_kept_only_when_both_sides_mean_to(data):
    events, reader = parse(data)
    assert summary(events)[2] == b"hi"
    assert reader.complete and not reader.reusable


def test_status_without_a_body():
    events, reader = parse(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert summary(events) == (204, [], b"")
    assert reader.reusable


def test_a_request_is_its_line_its_headers_and_a_blank_line():
    head, closing = wire.encode_request(
        "POST", "/v1/chat/completions?x=1", [(b"host", b"api.test"), ("Content-Length", "2")]
    )
    assert head == (
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: api.test\r\nContent-Length: 2\r\n\r\n"
    )
    assert not closing
    _, closing = wire.encode_request("GET", "/", [(b"connection", b"Keep-Alive, Close")])
    assert closing


@pytest.mark.parametrize(
    "method,target,headers,problem",
    [
        ("PO ST", "/", [], "method"),
        ("POST", "/a b", [], "target"),
        ("POST", "/a\r\nx: y", [], "target"),
        ("POST", "", [], "target"),
        ("POST", "/", [(b"x-bad\r\nevil", b"1")], "header name"),
        ("POST", "/", [(b"", b"1")], "header name"),
        ("POST", "/", [(b"x-ok", b"1\r\nevil: injected")], "control character"),
        ("POST", "/", [(b"x-ok", b"nul\x00")], "control character"),
        ("POST", "/", [(b"a", b"fine"), (b"b", b"\x7f")], "control character"),
    ],
)
def test_what_http_cannot_carry_is_refused_never_sent(method, target, headers, problem):
    with pytest.raises(ValueError, match=problem):
        wire.encode_request(method, target, headers)


@given(value=st.binary(max_size=40))
def test_a_header_value_is_sent_only_when_it_cannot_split_the_head(value):
    try:
        head, _ = wire.encode_request("POST", "/", [(b"x-v", value)])
    except ValueError:
        assert any(b in value for b in b"\r\n\x00") or any(
            c < 0x20 and c != 0x09 or c == 0x7F for c in value
        )
        return
    assert head.count(b"\r\n") == 3  # the request line, the one header, the blank line


def test_chunks():
    assert wire.encode_chunk(b"hello") == b"5\r\nhello\r\n"
    assert wire.encode_chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"
    assert wire.LAST_CHUNK == b"0\r\n\r\n"


@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.sampled_from([SIZED, CHUNKED, INFORMATIONAL, UNTIL_CLOSE]),
        # near-misses of a real answer: a valid one with a few bytes replaced
        st.builds(
            lambda base, at, junk: base[:at] + junk + base[at + len(junk) :],
            st.sampled_from([SIZED, CHUNKED, INFORMATIONAL]),
            st.integers(min_value=0, max_value=120),
            st.binary(min_size=1, max_size=6),
        ),
    ),
    cuts=st.lists(st.integers(min_value=1, max_value=300), max_size=6),
    eof=st.booleans(),
)
def test_any_bytes_give_events_in_order_or_a_wire_error_never_another_failure(data, cuts, eof):
    """Whatever an upstream sends, the reader yields a head, then body bytes, then END
    (or stops short of them), or raises WireError: the pool's failures are typed."""
    try:
        events, reader = parse(data, [c for c in cuts if c < len(data)], eof=eof)
    except wire.WireError:
        return
    if events:
        assert isinstance(events[0], wire.ResponseHead)
        assert all(type(e) is bytes for e in events[1:-1])
        assert events[-1] is wire.END or type(events[-1]) is bytes
        assert wire.END not in events[1:-1]
    assert reader.complete == (bool(events) and events[-1] is wire.END)
