"""An answer served by `docket replay`'s upstream: how the boundary knows it.

The replay upstream (docket/replay/upstream.py) puts one header on each answer it
serves: `docket-replayed-from: KEY RUN_ID SEQ LINE_SHA256` for a recorded answer,
`KEY miss` for the error it makes up on a miss, `KEY forwarded` for the real provider's
answer to a miss under `--on-miss forward` (recorded `replay_forwarded`, charged),
`KEY fault` for a recorded answer an injected fault replaced or broke (`docket chaos
--replay`: recorded `replay_fault`, free). KEY is a random
secret the replay command made for this run and gave only to the upstream it started
and to this run's boundary (the supervisor hands it over in memory). The boundary
reads the header only on its routes to that upstream, compares the key in constant
time, and never relays the header to the agent: the agent cannot forge a replay (it
writes requests, not answers, and never sees the key), nor can a real provider (its
routes have no key, and a header it sends is dropped unread).

A call answered from the record is recorded with `replayed_from` {run_id, seq,
line_sha256} on its closing event and costs zero: nothing was bought (a miss's error,
`replay_miss: true`, costs zero too).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable

REPLAY_HEADER = b"docket-replayed-from"
_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_SEQ = re.compile(r"(0|[1-9][0-9]{0,15})\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


def replay_header(key: str, run_id: str, seq: int, line_sha256: str) -> tuple[bytes, bytes]:
    return REPLAY_HEADER, f"{key} {run_id} {seq} {line_sha256}".encode("ascii")


def miss_header(key: str, what: str = "miss") -> tuple[bytes, bytes]:
    """The mark of an answer not from the record: "miss" (the error made up for a request
    with no recorded answer), "forwarded" (the real provider's, under --on-miss forward)
    or "fault" (a recorded answer an injected fault replaced or broke: docket chaos
    --replay, docket/replay/faults.py)."""
    return REPLAY_HEADER, f"{key} {what}".encode("ascii")


def replay_mark(
    headers: Iterable[tuple[bytes, bytes]], key: str | None
) -> dict[str, object] | str | None:
    """What the answer's replay header says, for a route with a replay key: the
    `replayed_from` object, "miss", "forwarded", "fault", or None (no header, a wrong key, a
    malformed value)."""
    if key is None:
        return None
    for name, value in headers:
        if name.lower() != REPLAY_HEADER:
            continue
        words = value.decode("latin-1").split(" ")
        if not hmac.compare_digest(words[0].encode("latin-1"), key.encode("ascii")):
            return None
        if words[1:] in (["miss"], ["forwarded"], ["fault"]):
            return words[1]
        well_formed = len(words) == 4 and _RUN_ID.match(words[1]) and _SEQ.match(words[2])
        if well_formed and _HEX64.match(words[3]):
            return {"run_id": words[1], "seq": int(words[2]), "line_sha256": words[3]}
        return None
    return None
