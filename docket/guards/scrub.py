"""Keep the provider keys out of the bytes relayed to the agent.

The boundary sends the real key upstream; an upstream that echoes it (an error
body quoting the Authorization header it got, a debugging gateway, a model told
to spell it out) would hand it to the agent. The ledger's copy is redacted by
docket.guards.redact.Redactor; this is the agent's copy, streamed or not. Both
match the same forms (docket.guards.forms: raw in any case, percent-encoded, JSON
\\u escapes of any of its characters, base64 in both alphabets at each alignment,
hex), so an encoding that is caught on disk is caught on the wire too.

`scrub_piece` is the pure core: the bytes held from before plus a new piece in,
what may go out now, the new held tail and what was found. A key may be split
across pieces (SSE events, chunk boundaries, reads), so it holds back the
shortest tail that could still grow into a form of a key: the bytes from the
earliest position where what has arrived is a proper prefix of some form, which
is never more than the longest form's length minus one and usually nothing
(holding back a fixed window would delay every streamed event's last bytes until
the next one came). For every way of cutting a stream into pieces the output is
the same as scrubbing it whole (tests/test_keys_scrub.py).

`Scrubber` keeps one stream's held tail and its counts between pieces.

What it cannot catch: a key the upstream transforms otherwise (split with other
bytes between its characters, such as two SSE events' framing around two halves;
encrypted; spelled out in words) is not a form of the key and passes.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

# jiter is one of Docket's dependencies (pyproject.toml): ~5x the standard library's parser
# on a stream's small events.
from jiter import from_json as _loads

from docket.guards.forms import MIN_SCRUBBED_SECRET, SecretForms
from docket.guards.redact import MARKER

SCRUB_MARKER = MARKER.encode()
# A shorter "key" is not scrubbed: replacing every "sk" in an answer would destroy
# the answer and protect nothing real (the same floor as the ledger's).
MIN_SCRUBBED_KEY = MIN_SCRUBBED_SECRET


def relay_keys(keys) -> tuple[bytes, ...]:
    """The keys worth scrubbing, as bytes (a key is printable ASCII: checked at start)."""
    return tuple(sorted({k.encode() for k in keys if len(k) >= MIN_SCRUBBED_KEY}, key=len))


class Scanned(NamedTuple):
    out: bytes  # what may go out now, every form of a key replaced by the marker
    held: bytes  # what may still grow into a key: fed again before the next piece
    found: tuple[str, ...]  # the form of each key replaced (raw, percent, json, ...)


def scrub_piece(forms: SecretForms, held: bytes, data: bytes, *, final: bool) -> Scanned:
    """Scrub `held + data`; with `final`, nothing can follow and nothing is held.

    Leftmost match first, as `forms.bytes_.search` would find them; but the regex is
    tried only where a match can begin (one of `forms.starts`, found by bytes.find in
    C): the alternation of every form, tried at every byte, cost ~80 ms per MB."""
    buf = held + data
    pattern = forms.bytes_
    if pattern is None:
        return Scanned(buf, b"", ())
    out: list[bytes] = []
    found: list[str] = []
    at = 0
    hold = len(buf) if final else _hold_from(forms, buf)
    for start in _candidates(forms.starts, buf.lower()):
        if start < at:
            continue
        if start >= hold and not final:
            break
        match = pattern.match(buf, start)
        if match is None:
            continue
        out.append(buf[at:start])
        out.append(SCRUB_MARKER)
        found.append(forms.kind(match))
        at = match.end()
        if at > hold:  # a whole key ran into what was held: what follows it is looked at anew
            hold = len(buf) if final else max(at, _hold_from(forms, buf, at))
    hold = max(hold, at)
    out.append(buf[at:hold])
    return Scanned(b"".join(out), buf[hold:], tuple(found))


def _candidates(starts: tuple[bytes, ...], lowered: bytes) -> list[int]:
    """Every position where one of `starts` occurs, in order (a match begins at one)."""
    found: set[int] = set()
    for start in starts:
        at = lowered.find(start)
        while at != -1:
            found.add(at)
            at = lowered.find(start, at + 1)
    return sorted(found)


def _hold_from(forms: SecretForms, buf: bytes, at: int = 0) -> int:
    """The earliest position (at or after `at`) from which `buf` is a proper prefix of
    some form (len(buf) when there is none): those bytes may yet become a key. Only
    the last longest-1 bytes can be one, and only the trailing run of bytes that
    occur in some form (an SSE event's closing newlines end it: nothing is held)."""
    window = buf[max(at, len(buf) - forms.longest + 1) :]
    run = len(window) - len(window.rstrip(forms.alphabet))
    if run == 0 or forms.prefix_bytes is None:
        return len(buf)
    match = forms.prefix_bytes.search(buf, len(buf) - run)
    return len(buf) if match is None else match.start()


@functools.lru_cache(maxsize=16)  # a Scrubber per call, the same few keys for the run
def _forms_of(keys: tuple[bytes, ...]) -> SecretForms:
    return SecretForms(k.decode("utf-8", "replace") for k in keys)


class Scrubber:
    """One relayed stream's scrubber: `feed` each piece, `flush` at the end.

    `count` is how many keys it has replaced so far; `kinds` counts them by form.
    """

    def __init__(self, keys: tuple[bytes, ...]) -> None:
        self.keys = tuple(sorted(set(keys), key=len))
        self.forms = _forms_of(self.keys)
        self.count = 0
        self.kinds: Counter[str] = Counter()
        self._held = b""
        self._events: EventTexts | None = None

    def events(self) -> None:
        """The stream is an event stream: a key split across events' text deltas is
        caught too (EventTexts, before the byte scan)."""
        if not self.forms.empty:
            self._events = EventTexts(self.forms, self._count)

    def feed(self, data: bytes) -> bytes:
        if self.forms.empty:
            return data
        if self._events is not None:  # first: the byte scan would cut a key's first half
            data = self._events.feed(data)
        return self._take(scrub_piece(self.forms, self._held, data, final=False))

    def flush(self) -> bytes:
        """The end of the stream: what was held back, scrubbed (nothing can follow)."""
        if self.forms.empty:
            return b""
        rest = b"" if self._events is None else self._events.flush()
        return self._take(scrub_piece(self.forms, self._held, rest, final=True))

    def whole(self, data: bytes) -> bytes:
        """A complete piece (a non-streamed answer, a header value) in one step,
        apart from the stream being fed (its held tail is left alone); counted."""
        if self.forms.empty:
            return data
        scanned = scrub_piece(self.forms, b"", data, final=True)
        self._count(scanned.found)
        return scanned.out

    def headers(self, pairs) -> list[tuple[bytes, bytes]]:
        """Header pairs with every value scrubbed (an upstream may echo a key there too)."""
        return [(name, self.whole(value)) for name, value in pairs]

    def _take(self, scanned: Scanned) -> bytes:
        self._held = scanned.held
        self._count(scanned.found)
        return scanned.out

    def _count(self, found: tuple[str, ...]) -> None:
        self.count += len(found)
        self.kinds.update(found)


# ---------------------------------------------------------------- a key split across events

# An event longer than this is relayed as it is without being looked into (a partial
# event is held until its end: this bounds what is held).
MAX_EVENT_BYTES = 1 << 20
# A text tail shorter than this that may grow into a key is relayed, not held: the
# few bytes it gives away are a key's public start ("sk-"), or two bytes of its hex.
SHORT_TAIL = 4
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class EventTexts:
    """The text an agent joins out of a stream's events, scrubbed as one text.

    An upstream can hand the agent a key in pieces: "sk-proj-12" in one delta,
    "34..." in the next, with the events' framing between them. No byte-level scan
    sees that key; the agent, joining the deltas, does. So each complete event of an
    OpenAI or Anthropic stream has its text delta taken out (choices[].delta.content,
    content_block_delta's delta.text, the Responses API's output_text delta) and fed
    to one text scan (`scrub_piece` on the joined text, with its carry-over tail).
    While that scan holds a tail that may grow into a key, the events that carried it
    are held too; when the tail resolves they go out as they came, unless a key was
    found across them: then each held event's text is replaced by the scan's output
    for it (the marker lands in the event that completed the key). An answer without
    a key is relayed byte for byte, only held back by events that end like a key's start.
    """

    def __init__(self, forms: SecretForms, found: Callable[[tuple[str, ...]], None]) -> None:
        self.forms = forms
        self._found = found
        self._partial = b""  # an event not yet complete
        self._queue: list[tuple[bytes, dict | None, tuple | None, bytes]] = []  # held events
        self._held = b""  # the text scan's carry-over, its events held back
        self._sent = b""  # a carry-over too short to hold events for, already relayed
        self._hit = False  # a key was found across the held events

    def feed(self, data: bytes) -> bytes:
        buf = self._partial + data if self._partial else data
        out: list[bytes] = []
        start = 0
        for end in _EVENT_END.finditer(buf):
            out.append(self._event(buf[start : end.end()]))
            start = end.end()
        self._partial = buf[start:]
        if len(self._partial) > MAX_EVENT_BYTES:
            out.append(self._release() + self._partial)
            self._partial = b""
        return b"".join(out)

    def flush(self) -> bytes:
        """The end of the stream: every held event out, the text's tail scanned as final."""
        tail, self._partial = self._partial, b""
        return self._release(final=True) + tail

    def _event(self, raw: bytes) -> bytes:
        obj, path = _text_delta(raw)
        if obj is None or path is None:
            if not self._queue:
                return raw
            self._queue.append((raw, None, None, b""))
            return b""
        text = _get(obj, path).encode("utf-8", "surrogatepass")
        sent, self._sent = self._sent, b""
        if not self._queue and not self._held and not sent and self._clean(text):
            return raw  # the common case, decided without a full scan
        scanned = scrub_piece(self.forms, self._held or sent, text, final=False)
        out, held = scanned.out, scanned.held
        if sent:  # already relayed: only what the match made of it, from its start, goes
            out = out[len(os.path.commonprefix([out, sent])) :]
        if held and len(held) < SHORT_TAIL:
            # Too short to hold back an event for (a delta ending in "s" would wait for
            # the next one): it goes now, and is scanned again with the next text, so a
            # key that starts in it still loses all but these few bytes.
            out, self._sent, held = out + held, held, b""
        self._held = held
        if scanned.found:
            self._hit = True
            self._found(scanned.found)
        if not self._queue and not held and out == text:
            return raw  # nothing held, nothing found: as it came
        self._queue.append((raw, obj, path, out))
        return b"" if held else self._release()

    def _clean(self, text: bytes) -> bool:
        """True when `text` alone holds no form of a key and does not end like one's
        start: no escape character, none of the forms' first bytes, and a last byte
        that no form holds or a trailing run that is no form's prefix."""
        lowered = text.lower()
        if b"\\" in text or b"%" in text or any(s in lowered for s in self.forms.starts):
            return False
        return _hold_from(self.forms, text) == len(text)

    def _release(self, *, final: bool = False) -> bytes:
        """Every held event, rewritten only if a key was found across them."""
        queue, self._queue = self._queue, []
        hit, self._hit = self._hit, False
        tail = b""
        if final and self._held:
            scanned = scrub_piece(self.forms, self._held, b"", final=True)
            tail, self._held = scanned.out, b""
            if scanned.found:
                hit = True
                self._found(scanned.found)
        if not hit:
            return b"".join(raw for raw, *_ in queue)
        out = []
        texts = [piece for _, obj, _, piece in queue if obj is not None]
        if texts and tail:  # what the scan held to the end goes with the last text event
            last = max(i for i, (_, obj, _, _) in enumerate(queue) if obj is not None)
            raw, obj, path, piece = queue[last]
            queue[last] = (raw, obj, path, piece + tail)
        for raw, obj, path, piece in queue:
            if obj is None or path is None:
                out.append(raw)
                continue
            _set(obj, path, piece.decode("utf-8", "replace"))
            out.append(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")
        return b"".join(out)


def joined_texts_scrubbed(forms: SecretForms, data: bytes) -> tuple[bytes, int]:
    """A whole recorded stream with every secret split across its text deltas taken
    out (EventTexts), and how many were; anything else is left to the caller's scrub."""
    if forms.empty or b"data:" not in data:
        return data, 0
    found: list[str] = []
    events = EventTexts(forms, found.extend)
    return events.feed(data) + events.flush(), len(found)


def _text_delta(raw: bytes) -> tuple[dict | None, tuple | None]:
    """An event's JSON and the path to its text delta, when it has one (one data line)."""
    at = 0 if raw.startswith(b"data:") else raw.find(b"\ndata:") + 1
    if at == 0 and not raw.startswith(b"data:"):
        return None, None
    end = raw.find(b"\n", at)
    line = raw[at + 5 : end if end != -1 else len(raw)]
    if not line.lstrip().startswith(b"{") or b"\ndata:" in raw[at + 5 :]:
        return None, None  # not JSON, or more than one data line: left to the byte scan
    try:
        obj = _loads(line)
    except ValueError:
        return None, None
    if not isinstance(obj, dict):
        return None, None
    choices = obj.get("choices")
    if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
        delta = choices[0].get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            return obj, ("choices", 0, "delta", "content")
    delta = obj.get("delta")
    if isinstance(delta, dict) and isinstance(delta.get("text"), str):
        return obj, ("delta", "text")  # Anthropic's content_block_delta
    if obj.get("type") == "response.output_text.delta" and isinstance(delta, str):
        return obj, ("delta",)
    return None, None


def _get(obj, path: tuple):
    for step in path:
        obj = obj[step]
    return obj


def _set(obj, path: tuple, value: str) -> None:
    for step in path[:-1]:
        obj = obj[step]
    obj[path[-1]] = value
