"""What scrubbing the relayed bytes costs on the hot path, per MB: the relay
scrubber as it first was (raw key only, kept here as it was) against the shared
forms (docket.guards.forms: raw in any case, percent, JSON escapes, base64 at
each alignment, hex), on the same streams, side by side in one process.

The new scrubber runs as the boundary relays a stream: the byte scan and the
joined text of the events' deltas (EventTexts). Two streams of 1 MB (quick:
128 KB) with no key in them, which is the hot path:
an SSE answer cut at each event (~90-byte pieces, the boundary's smallest
writes), once in plain words and once with escapes ('\\', '%', non-ASCII: the
slow path), and the same bytes in 16 KB reads; plus a stream with a key's hex form
every 64 KB, to show that finding keys costs nothing extra of note. The figure
is milliseconds per MB (best of N repeats), old and new, and their ratio.
"""

from __future__ import annotations

import json
import time

from docket.guards.scrub import Scrubber

KEY = b"sk-proj-Q7x9Kd2mP4vR8sT1wY6zB3nC5fH0jL"


class OldScrubber:
    """The relay scrubber of 28b28ff (docket/guards/scrub.py), raw keys only."""

    def __init__(self, keys: tuple[bytes, ...]) -> None:
        self.keys = tuple(sorted(set(keys), key=len))
        self.count = 0
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        return self._scan(self._held + data, final=False)

    def flush(self) -> bytes:
        return self._scan(self._held, final=True)

    def _scan(self, buf: bytes, *, final: bool) -> bytes:
        out: list[bytes] = []
        while True:
            match = self._first_match(buf)
            hold = len(buf) if final else self._hold_from(buf)
            if match is not None and match[0] <= hold:
                at, key = match
                out.append(buf[:at])
                out.append(b"[redacted]")
                self.count += 1
                buf = buf[at + len(key) :]
                continue
            out.append(buf[:hold])
            self._held = buf[hold:]
            return b"".join(out)

    def _first_match(self, buf: bytes):
        best = None
        for key in self.keys:
            at = buf.find(key)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, key)
        return best

    def _hold_from(self, buf: bytes) -> int:
        best = len(buf)
        for key in self.keys:
            at = buf.find(key[:1], max(len(buf) - len(key) + 1, 0))
            while at != -1 and at < best:
                if key.startswith(buf[at:]):
                    best = at
                    break
                at = buf.find(key[:1], at + 1)
        return best


PLAIN = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and", "rests"]
ESCAPES = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog;", "naïve",
           "café", "\\", "100%", "sure"]  # fmt: skip


def sse_events(size: int, *, key_every: int = 0, words=ESCAPES) -> list[bytes]:
    events, total, n = [], 0, 0
    while total < size:
        text = " ".join(words[(n + i) % len(words)] for i in range(6))
        if key_every and total // key_every != (total + 100) // key_every:
            text += " " + KEY.hex()
        payload = {"choices": [{"index": 0, "delta": {"content": text}}]}
        event = b"data: " + json.dumps(payload).encode() + b"\n\n"
        events.append(event)
        total += len(event)
        n += 1
    return events


def reads(events: list[bytes], size: int) -> list[bytes]:
    data = b"".join(events)
    return [data[i : i + size] for i in range(0, len(data), size)]


def _streaming(scrubber: Scrubber) -> Scrubber:
    scrubber.events()  # as the boundary relays a stream: a key split across deltas too
    return scrubber


def timed(make, pieces: list[bytes], repeats: int) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(repeats):
        scrubber = make()
        start = time.perf_counter()
        for piece in pieces:
            scrubber.feed(piece)
        scrubber.flush()
        best = min(best, time.perf_counter() - start)
        count = scrubber.count
    return best, count


def run(quick: bool) -> dict:
    size = (128 << 10) if quick else (1 << 20)
    repeats = 3 if quick else 7
    streams = {
        "sse_plain_text": sse_events(size, words=PLAIN),
        "sse_events": sse_events(size),
        "reads_16k": reads(sse_events(size), 16 << 10),
        "sse_hex_key_every_64k": sse_events(size, key_every=64 << 10),
    }
    results: dict = {}
    summary: dict = {}
    for name, pieces in streams.items():
        mb = sum(map(len, pieces)) / (1 << 20)
        old, old_found = timed(lambda: OldScrubber((KEY,)), pieces, repeats)
        new, new_found = timed(lambda: _streaming(Scrubber((KEY,))), pieces, repeats)
        bytes_only, _ = timed(lambda: Scrubber((KEY,)), pieces, repeats)
        results[name] = {
            "pieces": len(pieces),
            "mb": round(mb, 3),
            "old_ms_per_mb": round(old * 1000 / mb, 2),
            "new_ms_per_mb": round(new * 1000 / mb, 2),
            "new_bytes_only_ms_per_mb": round(bytes_only * 1000 / mb, 2),  # no EventTexts
            "ratio": round(new / old, 2),
            "keys_found_old": old_found,
            "keys_found_new": new_found,
        }
        r = results[name]
        summary[name] = (
            f"old {r['old_ms_per_mb']} ms/MB, new {r['new_ms_per_mb']} ms/MB "
            f"(x{r['ratio']}; byte scan alone {r['new_bytes_only_ms_per_mb']}); "
            f"keys found old {old_found}, new {new_found}"
        )
    return {"streams": results, "summary": summary}
