"""Server-sent events, parsed incrementally from bytes (sans-IO).

The parser cuts the byte stream into blocks, each ending at a blank line, and
keeps only an incomplete block between feeds. Block ends are found by one C-level
scan over the new bytes (bytes.find for "\n\n", or a regex once a CR has been
seen), never a Python loop per byte; the scan resumes two bytes before the old
end, so an event split into many chunks costs linear time. Events that look
like what providers send (one data line, perhaps after an event line) take a
fast path; anything else goes through the full field grammar.

Line endings are LF or CRLF, as every provider sends them. A bare CR is not a
line ending here (the WHATWG grammar allows it; no provider emits it): such a
stream yields no events, which the trackers report as missing usage.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# A blank line ends an event: the end of the last field line, then an empty line.
_BLOCK_END = re.compile(rb"\n\r?\n")


class SSEEvent(NamedTuple):
    """One dispatched event. `event` is None for the spec's default type ("message").

    A NamedTuple rather than a dataclass: one is built per event on the hot path,
    and a tuple is built in half the time.
    """

    event: str | None
    data: str
    id: str | None = None


def parse_block(block: bytes) -> SSEEvent | None:
    """The event one block dispatches, or None (comments only, or no data field).

    `id` is the id field of this block only; `retry` and unknown fields are
    ignored, since the boundary never reconnects on the client's behalf.
    """
    text = block.decode("utf-8", "replace")
    if "\r" not in text:
        # The shapes providers send: one data line, perhaps after one event line.
        if text.startswith("data: ") and text.count("\n") == 2:
            return SSEEvent(None, text[6:-2])
        if text.startswith("event: ") and text.count("\n") == 3:
            name_end = text.index("\n")
            if text.startswith("data: ", name_end + 1):
                return SSEEvent(text[7:name_end] or None, text[name_end + 7 : -2])
    event = None
    event_id = None
    data: list[str] = []
    for line in text.split("\n"):
        if line[-1:] == "\r":
            line = line[:-1]
        if not line or line[0] == ":":
            continue
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\0" not in value:
            event_id = value
    if not data:
        return None
    return SSEEvent(event or None, "\n".join(data), event_id)


class SSEParser:
    """Feed bytes as they arrive; get back the blocks (or events) they complete."""

    __slots__ = ("_buf", "_scan", "_crlf")

    def __init__(self) -> None:
        self._buf = bytearray()  # bytes of the incomplete block, if any
        self._scan = 0  # where in _buf the next search for a block end starts
        self._crlf = False  # a CR seen: block ends need the regex, not a plain find

    @property
    def pending(self) -> int:
        """Bytes of an incomplete event held since the last complete one.

        Unbounded here; a caller that reads untrusted streams bounds it (the
        stream trackers stop inspecting past max_event_bytes)."""
        return len(self._buf)

    def feed_blocks(self, chunk: bytes) -> list[bytes]:
        """The complete raw blocks (each ending with its blank line) this chunk finishes.

        Concatenating every block returned, then `take_pending()`, gives back
        exactly the bytes fed.
        """
        buf = self._buf
        # `view` is the memoryview over buf when earlier bytes were held, else None and
        # the chunk is searched where it lies (no copy into buf for the common case).
        view: memoryview | None = None
        data: bytes | memoryview
        if buf:
            buf += chunk
            data = view = memoryview(buf)
        else:
            data = chunk
        blocks = []
        start = 0
        if self._crlf or b"\r" in chunk:
            self._crlf = True
            for match in _BLOCK_END.finditer(data, self._scan):
                end = match.end()
                blocks.append(bytes(data[start:end]))
                start = end
        else:
            find = chunk.find if view is None else buf.find
            while (at := find(b"\n\n", start or self._scan)) >= 0:
                end = at + 2
                blocks.append(bytes(data[start:end]))
                start = end
        if view is None:
            if start < len(chunk):
                buf += chunk[start:]
        else:
            view.release()
            if start:
                del buf[:start]
        self._scan = max(0, len(buf) - 2)
        return blocks

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events this chunk completes."""
        return [e for e in map(parse_block, self.feed_blocks(chunk)) if e is not None]

    def take_pending(self) -> bytes:
        """Remove and return the incomplete block (at the end of a stream: a cut event)."""
        tail = bytes(self._buf)
        self._buf.clear()
        self._scan = 0
        return tail
