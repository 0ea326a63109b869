"""`docket verify --json`: one JSON object on stdout, whatever the verdict.

The shape is the other two verifiers' (verify-js/verify.mjs and verify-go/ with
--json), so a script can read any of the three the same way: the test-vector
manifest's names (spec section 12) for the verdict, the text form's line, and
once the chain was read its figures. Both `message` (the JavaScript verifier's
name) and `detail` (the Go verifier's) are given, alike: the ok line, or the
failure's detail (the text form's `FAIL CODE at ...: DETAIL` without its prefix). On ok,
`claims` (which only this verifier reports) holds every claim verify re-derived and
compared, keyed by its path in the receipt, in the order compared (verify.CLAIMS, the
table the comparison itself walks; spec section 10 lists them). Each is the ledger's
value: for a run without one, what a receipt without it states ([] for snapshot, all zero for
ops.client_retries and ops.cache, null for replay_of and fleet); an unbacked one is null
(`unbacked` names its paths).

    {"ok": false, "verdict": "fail", "exit": 1, "code": "chain_break", "seq": 3,
     "offset": 812, "field": null, "message": "prev does not match ...",
     "detail": "prev does not match ...", "events": 12, "head": "...", "bytes": 3669, "unbacked": [],
     "complete": null, "tail_bytes": 0}

An input error (a missing, empty or malformed file) is the same object with
verdict "input_error", exit 2 and its code; it goes to stdout too, as the
others do, and nothing is printed on stderr.
"""

from __future__ import annotations

import json

from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE, InputError, one_line
from docket.receipts.receipt import plain_number
from docket.receipts.tally import UNBACKED
from docket.receipts.verify import Verdict, verify


def verdict_report(verdict: Verdict) -> dict:
    """The --json object for a verdict (ok or a failed check)."""
    line = one_line(verdict.summary())
    return {
        "ok": verdict.ok,
        "verdict": "ok" if verdict.ok else "fail",
        "exit": EXIT_OK if verdict.ok else EXIT_CHECK_FAILED,
        "code": verdict.code,
        "seq": verdict.seq,
        "offset": verdict.offset,
        "field": verdict.field,
        "message": line if verdict.ok else one_line(verdict.detail),
        "detail": line if verdict.ok else one_line(verdict.detail),
        "events": verdict.events,
        "head": verdict.head,
        "bytes": verdict.bytes,
        "unbacked": list(verdict.unbacked),
        "complete": verdict.complete,
        "tail_bytes": verdict.tail_bytes,
        **({"claims": verdict.claims} if verdict.ok and verdict.claims is not None else {}),
    }


def input_error_report(exc: InputError) -> dict:
    """The --json object when verification could not start."""
    message = one_line(str(exc))
    return {
        "ok": False,
        "verdict": "input_error",
        "exit": EXIT_USAGE,
        "code": getattr(exc, "code", "input_error"),
        "seq": None,
        "offset": None,
        "field": None,
        "message": message,
        "detail": message,
        "events": None,
        "head": None,
        "bytes": None,
        "unbacked": [],
        "complete": None,
        "tail_bytes": 0,
    }


def _plain(value: object) -> object:
    # A claim the ledger cannot back (its event was never written) is null here;
    # `unbacked` names its path.
    if value is UNBACKED:
        return None
    return plain_number(value)


def dumps(report: dict) -> str:
    """One line of JSON; the claims' exact decimals stay numbers, as in a receipt."""
    return json.dumps(report, ensure_ascii=False, default=_plain)


def verify_json_command(receipt_path: str, ledger_path: str | None) -> int:
    """`docket verify --json`: the object on stdout, the verdict's exit code."""
    try:
        report = verdict_report(verify(receipt_path, ledger_path))
    except InputError as exc:
        report = input_error_report(exc)
    print(dumps(report))
    return int(report["exit"])
