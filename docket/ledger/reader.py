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
        # The line being read, as the pieces each block contributed: joined once,
        # when its newline arrives, so a long line costs linear time, not quadratic.
        parts: list[bytes] = []
        pending = 0  # bytes in parts
        offset = 0  # where the line being read starts
        while True:
            block = f.read(chunk)
            if not block:
                break
            start = 0
            while True:
                nl = block.find(b"\n", start)
                if nl < 0:
                    break
                if parts:
                    parts.append(block[start:nl])
                    data = b"".join(parts)
                    parts, pending = [], 0
                else:
                    data = block[start:nl]
                yield Line(offset, data, True)
                offset += len(data) + 1
                start = nl + 1
            if start < len(block):
                parts.append(block[start:])
                pending += len(block) - start
                if pending > MAX_LINE_BYTES:
                    raise LineTooLong(offset)
        if parts:
            yield Line(offset, b"".join(parts), False)


def starts_like_ledger(path: str | os.PathLike) -> bool:
    """Whether the file can be a ledger: it begins with LEDGER_MAGIC, or the whole
    file is a prefix of it (the writer's very first write, cut short).

    Reads at most len(LEDGER_MAGIC) bytes, so junk (a binary file, a 50 MB line
    of something else) is rejected before any long line is read.
    """
    with open(path, "rb", buffering=0) as f:
        head = f.read(len(LEDGER_MAGIC))
    # A short read of a regular file means end of file, so a head shorter than
    # the magic is the whole file.
    return bool(head) and LEDGER_MAGIC.startswith(head)
