"""The upstream side of HTTP/1.1 on the wire, sans-IO: requests out, responses in.

The boundary's own server speaks h11 (protocol.py). Its upstream client, on every
call's path, uses this instead: requests are written here, and responses are
parsed by llhttp (Node.js's parser, through httptools). Measured on this
machine, sending a request and parsing a chat answer took h11-mypyc 38 us and
this 5 us; under load that was a tenth of the boundary's CPU per call (ADR 0008).

    reader = ResponseReader(head_only=method == "HEAD")
    reader.receive_data(data)            # b"" at the end of the stream
    event = reader.next_event()          # a ResponseHead, then body bytes, then END;
                                         # NEED_DATA until more bytes come
    reader.reusable                      # after END: may the connection carry another?

Failures raise WireError (the client turns it into ProtocolError, or into
ConnectionReset when the stream had ended). Nothing here does I/O.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

import httptools


class WireError(Exception):
    """The peer's bytes are not an HTTP/1.1 response (or ended before one was complete)."""


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Marker("NEED_DATA")  # no event until more bytes arrive
END = _Marker("END")  # the response is complete


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]  # names lower-case, in the order sent
    http_version: bytes


# RFC 9110 5.1 and 5.5: a name is a token; a value has no control character but HTAB.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")


def _bytes(text: bytes | str) -> bytes:
    return text if isinstance(text, bytes) else text.encode("latin-1")


def encode_request(method: str, target: str | bytes, headers) -> tuple[bytes, bool]:
    """The request line and headers, and whether they ask to close the connection.

    ValueError for what HTTP/1.1 cannot carry: a method that is not a token, a
    target with spaces or control characters, a header name that is not a token,
    a value with CR, LF, NUL or another control character (a header injection).
    The caller adds the framing header (content-length or transfer-encoding).
    """
    verb = _bytes(method)
    path = _bytes(target)
    if not _TOKEN.fullmatch(verb):
        raise ValueError(f"not an HTTP method: {method!r}")
    if not path or _BAD_TARGET.search(path):
        raise ValueError(f"not a request target: {target!r}")
    lines = [verb, b" ", path, b" HTTP/1.1\r\n"]
    names: list[bytes] = []
    values: list[bytes] = []
    close = False
    for name, value in headers:
        key, val = _bytes(name), _bytes(value)
        names.append(key)
        values.append(val)
        lines += (key, b": ", val, b"\r\n")
        if key.lower() == b"connection" and b"close" in val.lower():
            close = True
    # One scan for all names and one for all values (joined by a character each
    # allows), rather than two per header: this runs on every call.
    if names and (not all(names) or not _TOKEN.fullmatch(b"".join(names))):
        bad = next(n for n in names if not _TOKEN.fullmatch(n))
        raise ValueError(f"not a header name: {bad!r}")
    if values and _BAD_VALUE.search(b"\t".join(values)):
        bad = next(v for v in values if _BAD_VALUE.search(v))
        raise ValueError(f"a header value with a control character: {bad!r}")
    lines.append(b"\r\n")
    return b"".join(lines), close


def encode_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (never empty: an empty chunk ends the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"

# Reader states.
_HEAD, _BODY, _DONE = 0, 1, 2


class ResponseReader:
    """One response, parsed as its bytes arrive. A new reader for each exchange.

    `head_only`: the request was a HEAD, so the response has no body whatever
    its headers say (llhttp cannot know which request it answers). A failure
    is raised by next_event once the events before it have been taken, so a
    relay passes on what came before the break, as h11 would.
    """

    __slots__ = (
        "_parser",
        "_events",
        "_state",
        "_head_only",
        "_headers",
        "_reason",
        "_delimited",
        "_keep_alive",
        "_failure",
        "eof",
        "extra",
    )

    def __init__(self, *, head_only: bool = False) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._events: deque = deque()
        self._state = _HEAD
        self._head_only = head_only
        self._headers: list[tuple[bytes, bytes]] = []
        self._reason = b""
        self._delimited = True  # the body's end is known without the stream's end
        self._keep_alive = False
        self._failure: WireError | None = None
        self.eof = False  # the upstream's end of the stream was fed
        self.extra = False  # bytes came after the response: the connection cannot be kept

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    @property
    def reusable(self) -> bool:
        """The response is complete and both sides keep the connection."""
        return self._state == _DONE and self._keep_alive and not (self.extra or self.eof)

    def receive_data(self, data: bytes | bytearray) -> None:
        """Feed bytes from the upstream; b"" is the end of the stream."""
        if self._failure is not None:
            return
        if not data:
            self._end_of_stream()
            return
        if self._state == _DONE:
            self.extra = True  # nothing more was asked for
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._failure = WireError("the upstream switched protocols, which was not asked for")
        except httptools.HttpParserError as exc:
            if self._state == _DONE:
                self.extra = True  # garbage after a complete response
            else:
                self._failure = WireError(f"the upstream spoke bad HTTP: {exc}")

    def next_event(self):
        """A ResponseHead, then body chunks (bytes), then END; NEED_DATA when the
        bytes so far hold no more. Raises WireError at a failure."""
        if self._events:
            return self._events.popleft()
        if self._failure is not None:
            raise self._failure
        return NEED_DATA

    def _end_of_stream(self) -> None:
        self.eof = True
        if self._state == _BODY and not self._delimited:
            self._finish()  # a body delimited by the connection's close ends here
        elif self._state != _DONE:
            where = "before the response head" if self._state == _HEAD else "mid-body"
            self._failure = WireError(f"the upstream closed the connection {where}")

    def _finish(self) -> None:
        self._state = _DONE
        self._events.append(END)

    # ------------------------------------------------------------ llhttp's callbacks

    def on_message_begin(self) -> None:
        if self._state == _DONE:
            self.extra = True  # a second response nobody asked for

    def on_status(self, reason: bytes) -> None:
        if self._state == _HEAD:
            self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state == _HEAD:
            self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self._state != _HEAD:
            return
        parser = self._parser
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._headers, self._reason = [], b""  # informational: the answer follows
            return
        headers = self._headers
        version = parser.get_http_version().encode("ascii")
        self._events.append(ResponseHead(status, self._reason, headers, version))
        self._keep_alive = parser.should_keep_alive()
        if self._head_only:
            self._finish()
            return
        self._state = _BODY
        framed = False
        for name, value in headers:
            if name == b"content-length" or (
                name == b"transfer-encoding" and value.lower().rstrip().endswith(b"chunked")
            ):
                framed = True
        self._delimited = framed or status in (204, 304)

    def on_body(self, body: bytes) -> None:
        if self._state == _BODY:
            self._events.append(body)
        else:
            self.extra = True  # body bytes after a HEAD's answer

    def on_message_complete(self) -> None:
        if self._state == _BODY:
            self._finish()
        # in _HEAD: an informational response ended; the real one follows. In _DONE:
        # a HEAD's answer as llhttp sees it, or a second response (flagged at its begin).
