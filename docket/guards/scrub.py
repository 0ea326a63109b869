"""Keep the provider keys out of the bytes relayed to the agent.

The boundary sends the real key upstream; an upstream that echoes it (an error
body quoting the Authorization header it got, a debugging gateway) would hand it
to the agent. The ledger's copy is redacted elsewhere (docket.guards.redact);
this is the agent's copy, streamed or not.

`Scrubber` is pure: feed it the relayed bytes in the pieces they arrive in and
it returns what may go out now, every key replaced by the marker. A key may be
split across pieces, so it holds back the shortest tail that could still grow
into a key: the bytes from the earliest position where what has arrived is a
proper prefix of some key (fewer than the longest key's length, usually none:
holding back a fixed len(key)-1 bytes would delay every streamed event's last
bytes until the next one came). For every way of cutting a stream into pieces,
the output is the same as scrubbing it whole (tests/test_keys_scrub.py):
leftmost match first, the shortest key where two match at the same place.

What it cannot catch: a key the upstream transforms (encodes, splits with
other bytes, changes case) is not the key any more and passes.
"""

from __future__ import annotations

from docket.guards.redact import MARKER

SCRUB_MARKER = MARKER.encode()
# A shorter "key" is not scrubbed: replacing every "sk" in an answer would destroy
# the answer and protect nothing real (the same floor as the ledger's, app.py).
MIN_SCRUBBED_KEY = 8


def relay_keys(keys) -> tuple[bytes, ...]:
    """The keys worth scrubbing, as bytes (a key is printable ASCII: checked at start)."""
    return tuple(sorted({k.encode() for k in keys if len(k) >= MIN_SCRUBBED_KEY}, key=len))


class Scrubber:
    """One relayed stream's scrubber: `feed` each piece, `flush` at the end.

    `count` is how many keys it has replaced so far.
    """

    def __init__(self, keys: tuple[bytes, ...]) -> None:
        self.keys = tuple(sorted(set(keys), key=len))  # shortest first: it wins a tie
        self.count = 0
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        if not self.keys:
            return data
        return self._scan(self._held + data, final=False)

    def flush(self) -> bytes:
        """The end of the stream: what was held back, scrubbed (nothing can follow)."""
        if not self.keys:
            return b""
        return self._scan(self._held, final=True)

    def whole(self, data: bytes) -> bytes:
        """A complete piece (a non-streamed answer, a header value) in one step,
        apart from the stream being fed (its held tail is left alone); counted."""
        if not self.keys:
            return data
        one = Scrubber(self.keys)
        out = one.feed(data) + one.flush()
        self.count += one.count
        return out

    def headers(self, pairs) -> list[tuple[bytes, bytes]]:
        """Header pairs with every value scrubbed (an upstream may echo a key there too)."""
        return [(name, self.whole(value)) for name, value in pairs]

    def _scan(self, buf: bytes, *, final: bool) -> bytes:
        out: list[bytes] = []
        while True:
            match = self._first_match(buf)
            hold = len(buf) if final else self._hold_from(buf)
            if match is not None and match[0] <= hold:
                at, key = match
                out.append(buf[:at])
                out.append(SCRUB_MARKER)
                self.count += 1
                buf = buf[at + len(key) :]
                continue
            out.append(buf[:hold])
            self._held = buf[hold:]
            return b"".join(out)

    def _first_match(self, buf: bytes) -> tuple[int, bytes] | None:
        best: tuple[int, bytes] | None = None
        for key in self.keys:  # shortest first, so a tie keeps the shorter key
            at = buf.find(key)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, key)
        return best

    def _hold_from(self, buf: bytes) -> int:
        """The earliest position from which `buf` is a proper prefix of some key
        (len(buf) when there is none): those bytes may yet become a key. Candidates
        are found by bytes.find (in C), so a chunk with no key's first byte in its
        last len(key) bytes costs one find per key."""
        best = len(buf)
        for key in self.keys:
            at = buf.find(key[:1], max(len(buf) - len(key) + 1, 0))
            while at != -1 and at < best:
                if key.startswith(buf[at:]):  # shorter than the key: it starts after
                    best = at  # len(buf) - len(key), so only a proper prefix fits
                    break
                at = buf.find(key[:1], at + 1)
        return best
