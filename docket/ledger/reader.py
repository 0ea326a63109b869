"""Reading a ledger file: complete lines with their byte offsets, and the torn tail.

Streams in fixed-size chunks, so memory is bounded by the longest line, and
that is bounded too (MAX_LINE_BYTES): a file with a longer line is not a
ledger this writer could have produced.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

CHUNK = 1 << 20
MAX_LINE_BYTES = 64 << 20
LEDGER_MAGIC = b'{"v":'  # every line the writer produces begins with these bytes


class LineTooLong(Exception):
    def __init__(self, offset: int):
        super().__init__(f"a line at byte {offset} is longer than {MAX_LINE_BYTES} bytes")
        self.offset = offset


@dataclass(frozen=True)
class Line:
    offset: int  # byte offset of the line's first byte
    data: bytes  # the line without its newline
    complete: bool  # False only for a last line with no newline: a torn tail


def iter_lines(path: str | os.PathLike, *, chunk: int = CHUNK) -> Iterator[Line]:
    """Every line of the file in order; only the very last may be incomplete."""
    with open(path, "rb", buffering=0) as f:
        pending = b""
        pending_offset = 0
        while True:
            block = f.read(chunk)
            if not block:
                break
            buf = pending + block if pending else block
            start = 0
            while True:
                nl = buf.find(b"\n", start)
                if nl < 0:
                    break
                yield Line(pending_offset + start, buf[start:nl], True)
                start = nl + 1
            pending_offset += start
            pending = buf[start:]
            if len(pending) > MAX_LINE_BYTES:
                raise LineTooLong(pending_offset)
        if pending:
            yield Line(pending_offset, pending, False)
