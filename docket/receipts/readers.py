"""The member readers the receipt's folds share, and the one error they raise.

tally.py folds the ledger; fleet_claims.py and snapshot_claims.py fold their own
sections for it and are imported by it, so what they share lives here, below all
three (no fold imports another's readers, and there is no cycle). An event a fold
cannot read is a TallyError, whichever fold read it: `docket verify` and the
readers of a run report it as a malformed event with the message as written here,
which the spec's vectors and the other verifiers compare.
"""

from __future__ import annotations

import re

from docket.ledger.strict_json import MAX_INT

HEX64 = re.compile(r"[0-9a-f]{64}\Z")  # a SHA-256 as the ledger writes one


class TallyError(ValueError):
    """An event the tally reads lacks a field it needs or holds one of the wrong type."""


def count(value: object, where: str) -> int:
    """An integer the spec interprets: 0 to 2^53-1 (a bool is not one)."""
    if type(value) is not int or not 0 <= value <= MAX_INT:
        raise TallyError(f"{where} must be an integer from 0 to 2^53-1")
    return value


def text(value: object, where: str) -> str:
    if type(value) is not str:
        raise TallyError(f"{where} must be a string")
    return value
