"""Hostile ledgers for the verbs that read one a same-user agent can write (part of
family `inputs`): `docket export otel` reads a run's folder, and an agent of the same
user can plant or rewrite the ledger there before it is exported.

Each is refused whole, one line and exit 2, under the family's memory bound, before
anything is sent (the endpoint is a port nothing listens on: an export that got as far
as sending would exit 1, so exit 2 also proves nothing was tried). The control, a
well-formed ledger, exits 1 there: accepted, then unreachable.
"""

from __future__ import annotations

from docket.export.otel_fold import MAX_OPEN_CALLS
from docket.ledger.chain import GENESIS, encode_body, encode_line, line_hash

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback there
START = {
    "run_id": "attack-probe",
    "docket_version": "0",
    "policy_digest": "sha256:" + "0" * 64,
    "pricing": {},
    "caps": {},
}

EVIDENCE = {
    "ledger_complete": True,
    "unwritten_events": 0,
    "first_failing_seq": None,
    "write_failures": 0,
}


def chained(bodies: list[tuple[str, dict]], step_ms: int = 1) -> bytes:
    """A ledger whose chain holds: the given (type, members) events in order, step_ms apart."""
    out, prev = [], GENESIS
    for seq, (kind, fields) in enumerate(bodies):
        line = encode_line(
            seq=seq,
            ts="2026-12-02T10:00:00.000Z",
            mono_ms=seq * step_ms,
            type=kind,
            prev=prev,
            body=encode_body(fields),
        )
        out.append(line)
        prev = line_hash(line)
    return b"\n".join(out) + b"\n"


def good_ledger() -> bytes:
    request = {"call_id": "c-1", "provider": "openai", "model": "m", "endpoint": "chat.completions"}
    return chained(
        [
            ("session.start", START),
            ("model.request", request),
            ("model.response", {"call_id": "c-1", "model": "m", "cost_nusd": 0, "priced": False}),
            (
                "session.end",
                {"reason": "child exited with status 0", "exit_status": 0, "evidence": EVIDENCE},
            ),
        ]
    )


def unclosed_calls(n: int) -> bytes:
    """n model calls opened and never closed: what a flood of planted requests holds."""
    opened = [
        ("model.request", {"call_id": f"c-{i}", "model": "m", "endpoint": "chat.completions"})
        for i in range(n)
    ]
    return chained([("session.start", START), *opened])


def ledger_cases() -> list[tuple[str, bytes, bool]]:
    """(name, the ledger's bytes, in the quick form?)."""
    good = good_ledger()
    lines = good.split(b"\n")
    edited = b"\n".join([lines[0], lines[1].replace(b'"m"', b'"n"'), *lines[2:]])
    return [
        ("binary", bytes(range(256)) * 16, False),
        ("empty", b"", False),
        ("a line of 70 MB", b'{"v":1,"x":"' + b"9" * 70_000_000 + b'"}\n', True),
        ("a torn tail", good + b'{"v":1,"seq":4', False),
        ("an edited line (chain break)", edited, True),
        ("JSON nested 100,000 deep", b'{"v":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", False),
        ("NaN in a line", good.replace(b'"cost_nusd":0', b'"cost_nusd":NaN'), False),
        (f"{MAX_OPEN_CALLS + 1} calls never closed", unclosed_calls(MAX_OPEN_CALLS + 1), False),
        # mono_ms at its most (2^53-1 ms): a chain that holds, a time OTLP cannot carry
        (
            "an event 285,000 years on",
            chained([("session.start", START), ("agent.backoff", {})], 2**53 - 1),
            True,
        ),
    ]
