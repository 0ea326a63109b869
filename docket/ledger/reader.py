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
    """A line longer than MAX_LINE_BYTES: not read, so memory stays bounded."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"a line at byte {offset} is longer than {MAX_LINE_BYTES} bytes")
        self.offset = offset


@dataclass(frozen=True)
class Line:
    offset: int  # byte offset of the line's first byte
    data: bytes  # the line without its newline
    complete: bool  # False only for a last line with no newline: a torn tail


class Lines:
    """The complete lines of a file, in order, as bytes without their newlines.

    Iterate once. Afterwards `tail` holds the bytes after the last newline (a
    torn tail), b"" if there are none. A line or tail longer than
    MAX_LINE_BYTES raises LineTooLong once the lines before it are yielded.
    verify's scan, the writer's resume and iter_lines all read through here.
    """

    def __init__(self, path: str | os.PathLike[str], *, chunk: int = CHUNK) -> None:
        self.path = path
        self.chunk = chunk
        self.tail = b""

    def __iter__(self) -> Iterator[bytes]:
        limit = MAX_LINE_BYTES
        # A block never holds a whole line longer than the limit, so only lines
        # that span blocks need measuring.
        chunk = min(self.chunk, limit)
        # The line being read, as the pieces each block contributed: joined once,
        # when its newline arrives, so a long line costs linear time, not quadratic.
        carry: list[bytes] = []
        carried = 0  # bytes in carry
        start = 0  # where the carried line starts
        done = 0  # bytes read before this block
        with open(self.path, "rb", buffering=0) as f:
            while block := f.read(chunk):
                lines = block.split(b"\n")
                rest = lines.pop()
                if lines:
                    if carry:
                        carried += len(lines[0])
                        if carried > limit:
                            raise LineTooLong(start)
                        carry.append(lines[0])
                        lines[0] = b"".join(carry)
                    yield from lines
                    start = done + len(block) - len(rest)
                    carry, carried = [rest], len(rest)
                else:
                    carry.append(rest)
                    carried += len(rest)
                if carried > limit:
                    raise LineTooLong(start)
                done += len(block)
        self.tail = b"".join(carry)


def iter_lines(path: str | os.PathLike[str], *, chunk: int = CHUNK) -> Iterator[Line]:
    """Every line of the file in order, with its offset; only the very last may be incomplete."""
    lines = Lines(path, chunk=chunk)
    offset = 0
    for data in lines:
        yield Line(offset, data, True)
        offset += len(data) + 1
    if lines.tail:
        yield Line(offset, lines.tail, False)


def starts_like_ledger(path: str | os.PathLike[str]) -> bool:
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
