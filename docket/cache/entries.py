"""A shared store's entries as its file holds them, and every check one passes before
it may be served. Pure: JSON values in, an Entry or ValueError out.

Any process of the user can write the store file (a previous run's agent among them),
so nothing in it is taken on trust: the answer is served to an agent and its numbers
reach the ledger and the receipt. An entry is served only when every field is what
this code writes: status 200 (the only status stored: decide.storable); headers only
from ANSWER_HEADERS, each value printable ASCII with no CR, LF or NUL (the server
frames the body itself: no content-length, no transfer-encoding); a content-type that
agrees with `stream`; the body's length and SHA-256 as recorded beside it (the digest
is the one the origin run wrote on the closing event that stored it,
`cache_body_sha256`), a whole JSON object when not streamed, a stream ended by a blank
line when streamed; numbers whole and bounded (seq and hits, cost at most MAX_COST_NUSD
a call), times finite; names short and printable.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass

from docket.cache.store import Entry, Key

MAX_INT = 2**53 - 1  # the ledger's integer range (spec section 3.2)
# What one stored call may claim to have cost, in nano-USD: $1,000. No model call
# costs that; a larger claim is a forged saving, and a bound here keeps the receipt's
# sums far from 2^53 (a hit's saved_nusd times max_hits).
MAX_COST_NUSD = 10**12
# The answer headers worth replaying (and the only ones stored): the body's type and
# the provider's ids for the call. Rate-limit headers and dates would be stale; framing
# (content-length, transfer-encoding) is the server's to set for the bytes it sends.
ANSWER_HEADERS = frozenset(
    {
        b"content-type",
        b"x-request-id",
        b"request-id",
        b"openai-model",
        b"openai-organization",
        b"openai-processing-ms",
        b"openai-version",
        b"anthropic-organization-id",
    }
)
MAX_HEADERS = 16
MAX_HEADER_VALUE = 1024
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z", re.ASCII)
_VISIBLE = re.compile(rb"[\t\x20-\x7e]*\Z")


@dataclass(frozen=True)
class Stored:
    """An entry as the file holds it: the entry, and its hits so far (every run's)."""

    entry: Entry
    hits: int


def header_problem(name: bytes, value: bytes) -> str | None:
    """Why this answer header may not be stored or served, or None."""
    if name.lower() != name or name not in ANSWER_HEADERS:
        return f"header {name[:40]!r} is not one a cached answer carries"
    if len(value) > MAX_HEADER_VALUE or not _VISIBLE.match(value):
        return f"header {name.decode()} has a value that is not printable ASCII (CR, LF, NUL?)"
    return None


def replayable_headers(
    headers: tuple[tuple[bytes, bytes], ...],
) -> tuple[tuple[bytes, bytes], ...]:
    """The headers of a relayed answer kept with it: those header_problem lets through."""
    kept = ((k.lower(), v) for k, v in headers)
    return tuple((k, v) for k, v in kept if header_problem(k, v) is None)[:MAX_HEADERS]


def _b64(text: object, name: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{name} is not base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{name} is not base64 text") from None


def _int(value: object, name: str, *, maximum: int = MAX_INT) -> int:
    if type(value) is not int or not 0 <= value <= maximum:
        raise ValueError(f"{name} is not a whole number in [0, {maximum}]")
    return value


def _str(value: object, name: str, *, limit: int = 256) -> str:
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        raise ValueError(f"{name} is not a printable string of at most {limit} characters")
    return value


def _headers(value: object) -> tuple[tuple[bytes, bytes], ...]:
    if not isinstance(value, list) or len(value) > MAX_HEADERS:
        raise ValueError(f"headers is not a list of at most {MAX_HEADERS} pairs")
    out = []
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError("headers is not a list of pairs")
        name, text = _b64(pair[0], "a header name"), _b64(pair[1], "a header value")
        why = header_problem(name, text)
        if why is not None:
            raise ValueError(why)
        out.append((name, text))
    return tuple(out)


def _body_problem(body: bytes, stream: bool, content_type: bytes) -> str | None:
    if stream:
        if not content_type.startswith(b"text/event-stream"):
            return "a streamed answer's content-type is not text/event-stream"
        if not body.endswith((b"\n\n", b"\r\n\r\n")):
            return "a streamed answer does not end with a whole event"
        return None
    if not content_type.startswith(b"application/json"):
        return "a whole answer's content-type is not application/json"
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return "a whole answer's body is not JSON"
    return None if isinstance(doc, dict) else "a whole answer's body is not a JSON object"


def entry_from_doc(item: object, *, providers: Collection[str]) -> Stored:
    """The entry `item` describes, or ValueError naming the first field that is wrong."""
    if not isinstance(item, dict):
        raise ValueError("not an object")
    missing = sorted(set(ENTRY_FIELDS) - set(item))
    if missing:
        raise ValueError(f"{missing[0]} is missing")
    provider = _str(item["provider"], "provider", limit=64)
    if provider not in providers:
        raise ValueError(f"provider {provider!r} is not one of this policy's")
    path = _str(item["path"], "path", limit=8192)
    if not path.startswith("/"):
        raise ValueError("path does not start with /")
    sha, shaping = item["request_sha256"], item["headers_sha256"]
    if not isinstance(sha, str) or not _HEX64.match(sha):
        raise ValueError("request_sha256 is not 64 hex digits")
    if not isinstance(shaping, str) or not (shaping == "" or _HEX64.match(shaping)):
        raise ValueError("headers_sha256 is not empty or 64 hex digits")
    if item["status"] != 200 or type(item["status"]) is not int:
        raise ValueError("status is not 200")
    headers = _headers(item["headers"])
    stream = item["stream"]
    if type(stream) is not bool:
        raise ValueError("stream is not true/false")
    body = _b64(item["body"], "body")
    if _int(item["body_bytes"], "body_bytes") != len(body):
        raise ValueError("body_bytes is not the body's length")
    digest = item["body_sha256"]
    if not isinstance(digest, str) or hashlib.sha256(body).hexdigest() != digest:
        raise ValueError("body_sha256 is not the body's SHA-256")
    content_type = dict(headers).get(b"content-type", b"")
    why = _body_problem(body, stream, content_type)
    if why is not None:
        raise ValueError(why)
    stored_at = item["stored_at"]
    if type(stored_at) not in (int, float) or not math.isfinite(stored_at) or stored_at < 0:
        raise ValueError("stored_at is not a finite time")
    run_id = item["run_id"]
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ValueError("run_id is not a run's id")
    entry = Entry(
        key=Key(provider, path, sha, shaping),
        status=200,
        headers=headers,
        body=body,
        stream=stream,
        seq=_int(item["seq"], "seq"),
        stored_at=float(stored_at),
        cost_nusd=_int(item["cost_nusd"], "cost_nusd", maximum=MAX_COST_NUSD),
        model=_str(item["model"], "model"),
        run_id=run_id,
    )
    # Hits past this run's max_hits (another policy's brake): its next lookup drops it.
    return Stored(entry, _int(item["hits"], "hits"))


def entry_doc(s: Stored) -> dict:
    e = s.entry

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "provider": e.key.provider,
        "path": e.key.path,
        "request_sha256": e.key.request_sha256,
        "headers_sha256": e.key.headers_sha256,
        "status": e.status,
        "headers": [[b64(k), b64(v)] for k, v in e.headers],
        "body": b64(e.body),
        "body_bytes": len(e.body),
        "body_sha256": e.body_sha256,
        "stream": e.stream,
        "seq": e.seq,
        "stored_at": e.stored_at,
        "cost_nusd": e.cost_nusd,
        "model": e.model,
        "run_id": e.run_id,
        "hits": s.hits,
    }


ENTRY_FIELDS = tuple(
    entry_doc(Stored(Entry(Key("p", "/", "0" * 64), 200, (), b"", False, 0, 0.0, 0), 0))
)
