"""Receipts: the format's shape, and building one from a tally and writing it durably.

spec/docket-receipt-1.md is the normative text; this module and docket.receipts.verify
are its reference implementation. Verifying a receipt against its ledger lives
in docket.receipts.verify, which imports this module (never the other way).
"""

from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from docket.durable import replace_file
from docket.receipts.tally import (
    COUNTERS,
    MAX_INT,
    OPTIONAL_CLAIMS,
    PRICE_PATTERN,
    UNBACKED,
    Tally,
    check_evidence,
)

FORMAT = "docket-receipt-1"

# ---------------------------------------------------------------- the receipt's shape


def _str(v: object) -> str | None:
    return None if type(v) is str else "must be a string"


def _str_or_null(v: object) -> str | None:
    return None if v is None or type(v) is str else "must be a string or null"


def _count(v: object) -> str | None:
    ok = type(v) is int and 0 <= v <= MAX_INT
    return None if ok else "must be an integer from 0 to 2^53-1"


def _count_or_null(v: object) -> str | None:
    return None if v is None else _count(v)


def _int_or_null(v: object) -> str | None:
    ok = v is None or type(v) is int and abs(v) <= MAX_INT
    return None if ok else "must be an integer or null"


def _bool(v: object) -> str | None:
    return None if type(v) is bool else "must be true or false"


def _hex64(v: object) -> str | None:
    ok = type(v) is str and re.fullmatch(r"[0-9a-f]{64}", v) is not None
    return None if ok else "must be 64 lowercase hex digits"


def _usd(v: object) -> str | None:
    ok = type(v) is str and re.fullmatch(r"(0|[1-9][0-9]*)\.[0-9]{9}", v) is not None
    return None if ok else "must be a decimal string with 9 places"


def _price(v: object) -> str | None:
    ok = type(v) is str and PRICE_PATTERN.fullmatch(v) is not None
    return None if ok else "must be a decimal string with at most 3 decimals"


def _relative_path(v: object) -> str | None:
    ok = type(v) is str and v != "" and not v.startswith("/") and "\\" not in v
    return None if ok else "must be a relative path with / separators"


def _json_object(v: object) -> str | None:
    return None if type(v) is dict else "must be an object"


def _json_object_or_null(v: object) -> str | None:
    return None if v is None or type(v) is dict else "must be an object or null"


def _anything(v: object) -> str | None:
    return None


@dataclass(frozen=True)
class _MapOf:
    values: object


@dataclass(frozen=True)
class _ListOf:
    items: object


@dataclass(frozen=True)
class _Optional:
    """A member that may be absent (what its absence means, the spec says)."""

    shape: object


_COUNTER_SHAPE = dict.fromkeys(COUNTERS, _count) | {"usd": _usd}
_FIRST_CAP_SHAPE = {"cap": _str, "seq": _count, "limit": _anything, "observed": _anything}

RECEIPT_SHAPE = {
    "format": _str,
    "docket_version": _str,
    "run_id": _str,
    "started_at": _str,
    "ended_at": _str,
    "duration_ms": _count,
    "exit": {"status": _int_or_null, "reason": _str, "cap": _str_or_null},
    "ledger": {"file": _relative_path, "events": _count, "head": _hex64, "bytes": _count},
    "totals": _COUNTER_SHAPE
    | {
        "by_model": _MapOf(_COUNTER_SHAPE),
        # Every refusal by the rule that refused it, which endpoint answered, what the
        # breakers did (spec section 6.5); absent: not claimed (a receipt from before them).
        "refused_by_rule": _Optional(_MapOf(_count)),
        "by_provider": _Optional(_MapOf(_COUNTER_SHAPE)),
        "by_upstream": _Optional(_MapOf(_COUNTER_SHAPE)),
        "breaker_transitions": _Optional(_MapOf(_MapOf(_MapOf(_count)))),
    },
    "pricing": {
        "table_date": _str_or_null,
        "provenance": _str_or_null,
        "unit_prices": _MapOf({"input": _price, "output": _price, "cached_input": _price}),
    },
    "caps": {
        "limits": _json_object,
        "warnings": _ListOf(_FIRST_CAP_SHAPE),
        "breaches": _ListOf(_FIRST_CAP_SHAPE),
    },
    "policy_digest": _str,
    "ops": {
        "evidence": {
            "ledger_complete": _bool,
            "unwritten_events": _count,
            "first_failing_seq": _count_or_null,
            "write_failures": _count,
            # What the record lost, beyond the counts (spec section 7.4): model calls
            # that went upstream with no model.request on disk, and the last error.
            "unrecorded_calls": _Optional(_count),
            "last_error": _Optional(_str_or_null),
            "unverified_tail": _Optional(_bool),
            "unwritten_by_type": _Optional(_MapOf(_count)),
        },
        # Calls whose model.request no closing event follows (section 6.2); absent: none.
        "open_calls": _Optional(_ListOf({"call_id": _str, "seq": _count})),
        # The client's own retries, by its attempt marker (section 7.6); absent: none marked.
        "client_retries": _Optional(
            {"marked": _count, "retries": _count, "by_attempt": _MapOf(_count)}
        ),
        # The response cache (section 7.8); absent: the cache was never consulted.
        "cache": _Optional(
            {
                "hits": _count,
                "misses": _count,
                "stored": _count,
                "refused_by_reason": _MapOf(_count),
                "saved_nusd": _count,
            }
        ),
    },
    "faults": {
        "seed": _int_or_null,
        "plan": _json_object_or_null,
        "injected": _count,
        "by_fault": _MapOf(_count),
        "by_layer": _Optional(_MapOf(_count)),  # spec section 6.5; absent: not claimed
    },
}


def _object_of_or_null(shape: dict):
    def check(v: object) -> str | None:
        if v is None:
            return None
        found = shape_problem(v, shape)
        return None if found is None else f"must be null or an object of {', '.join(shape)}"

    return check


# --snapshot's section (spec section 7.7); absent when the run took no snapshot.
SNAPSHOT_SHAPE = {
    "index": _count,
    "root": _str,
    "manifest_sha256": _hex64,
    "files": _count,
    "bytes": _count,
    "changes": _object_of_or_null(
        dict.fromkeys(("created", "modified", "deleted", "mode_changed"), _count)
    ),
    "restored": _object_of_or_null({"applied": _count, "failed": _count, "verified": _bool}),
}
RECEIPT_SHAPE["snapshot"] = _Optional(_ListOf(SNAPSHOT_SHAPE))
# `docket replay`'s run (spec section 7.9); absent: not a replay.
RECEIPT_SHAPE["replay_of"] = _Optional({"run_id": _str, "head": _hex64})
# A [fleet] run's budget (spec section 7.10); absent: the run held no fleet budget.
_AMOUNTS_SHAPE = {"nusd": _count, "tokens": _count, "calls": _count}
RECEIPT_SHAPE["fleet"] = _Optional(
    {
        "budget": _str,
        "database": {"host": _str_or_null, "port": _str_or_null, "dbname": _str_or_null},
        "leases": _MapOf(_count),
        "granted": _AMOUNTS_SHAPE,
        "reported": _AMOUNTS_SHAPE,
        "returned": _AMOUNTS_SHAPE,
        "lapsed": _AMOUNTS_SHAPE,
        "refused_by_code": _MapOf(_count),
        "store_failures": _count,
        "ended": _str,
    }
)

# ops.cache when a receipt omits it (spec section 7.8): the cache was never consulted.
NO_CACHE = {"hits": 0, "misses": 0, "stored": 0, "refused_by_reason": {}, "saved_nusd": 0}

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def shape_problem(value: object, shape: object, path: str = "") -> tuple[str, str] | None:
    """The first place where `value` departs from `shape`, as (path, problem)."""
    if isinstance(shape, dict):
        if type(value) is not dict:
            return path or "receipt", "must be an object"
        for key in sorted(value.keys() | shape.keys()):
            where = join_path(path, key)
            if key not in shape:
                return where, "is not a field of " + FORMAT
            member = shape[key]
            if isinstance(member, _Optional):
                if key not in value:
                    continue
                member = member.shape
            if key not in value:
                return where, "is missing"
            found = shape_problem(value[key], member, where)
            if found:
                return found
        return None
    if isinstance(shape, _MapOf):
        if type(value) is not dict:
            return path, "must be an object"
        for key in sorted(value):
            found = shape_problem(value[key], shape.values, join_path(path, key))
            if found:
                return found
        return None
    if isinstance(shape, _ListOf):
        if type(value) is not list:
            return path, "must be an array"
        for i, item in enumerate(value):
            found = shape_problem(item, shape.items, join_path(path, i))
            if found:
                return found
        return None
    assert callable(shape), shape  # a leaf of a shape is its check
    problem = shape(value)
    return (path, problem) if problem else None


# ---------------------------------------------------------------- building and writing


def build_receipt(
    tally: Tally,
    *,
    ledger_path: str | os.PathLike,
    head: str,
    count: int,
    size: int,
    evidence: dict,
    version: str,
    start: dict | None = None,
    end: dict | None = None,
    receipt_dir: str | os.PathLike | None = None,
) -> dict:
    """The receipt for a finished run, from the writer's tally and its own account.

    `count`, `head` and `size` are the ledger's durable events, last line hash
    and bytes; `evidence` is the writer's ops.evidence. If session.start or
    session.end could not be written, pass the event as it would have been as
    `start`/`end`: its claims then stand unbacked, and the evidence must say so.
    `ledger.file` is the ledger's path relative to `receipt_dir` (default: the
    receipt is written beside the ledger).
    """
    if count != tally.events:
        raise ValueError(f"count {count} is not the {tally.events} events the tally folded")
    claims = tally.to_claims(start=start, end=end)
    for parent, member in OPTIONAL_CLAIMS:
        if not claims[parent][member]:  # said only when there is something to say
            del claims[parent][member]
    missing = [key for key, value in claims.items() if value is UNBACKED]
    if missing:
        raise ValueError(f"the ledger cannot supply {', '.join(missing)}: pass start= or end=")
    if claims["docket_version"] != version:
        raise ValueError(f"session.start says docket {claims['docket_version']}, not {version}")
    ledger_path = Path(ledger_path)
    file = (
        os.path.relpath(ledger_path, receipt_dir) if receipt_dir is not None else ledger_path.name
    )
    receipt = {
        "format": FORMAT,
        **claims,
        "ledger": {"file": Path(file).as_posix(), "events": count, "head": head, "bytes": size},
        "ops": {"evidence": check_evidence(evidence, "evidence")},
    }
    snapshot = tally.snapshot.claims()
    if snapshot is not None:  # said only for a --snapshot run
        receipt["snapshot"] = snapshot
    open_calls = tally.open_calls()
    if open_calls:  # said only when there are some, so a receipt without any is unchanged
        receipt["ops"]["open_calls"] = open_calls
    client_retries = tally.client_retries()
    if client_retries["marked"]:  # likewise: a run no client marked keeps the old shape
        receipt["ops"]["client_retries"] = client_retries
    cache = tally.cache()
    if cache != NO_CACHE:  # a run without [cache] keeps the old shape
        receipt["ops"]["cache"] = cache
    replay_of = tally.replay_of(start)
    if isinstance(replay_of, dict):  # said only for a `docket replay` run (section 7.9)
        receipt["replay_of"] = replay_of
    fleet = tally.fleet_claims(start)
    if isinstance(fleet, dict):  # said only for a run under [fleet] (section 7.10)
        receipt["fleet"] = fleet
    found = shape_problem(receipt, RECEIPT_SHAPE)
    if found:
        raise ValueError(f"receipt field {found[0]} {found[1]}")
    return receipt


def plain_number(value: object) -> object:
    # A Decimal read from a ledger line, written back as a JSON number.
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def encode_receipt(receipt: dict) -> bytes:
    """Sorted keys, two-space indent, UTF-8, a trailing newline."""
    text = json.dumps(
        receipt,
        sort_keys=True,
        indent=2,
        ensure_ascii=False,
        allow_nan=False,
        default=plain_number,
    )
    return (text + "\n").encode("utf-8")


def write_receipt(path: str | os.PathLike, receipt: dict) -> None:
    """Write atomically and durably: a temp file, fsync, rename over `path`, fsync the folder."""
    replace_file(path, encode_receipt(receipt))  # owner only, like the ledger it seals


# Blocks set aside at the start of a run for its receipt (a receipt is 2-3 KB;
# one with many models more), so a volume that fills during the run still
# takes it. The file is hidden until the receipt is written into it.
RECEIPT_RESERVE_BYTES = 16 * 1024
RESERVE_NAME = ".receipt.json.reserve"


def reserve_receipt(folder: str | os.PathLike, nbytes: int = RECEIPT_RESERVE_BYTES) -> Path:
    """Allocate real blocks for the receipt, in `folder`; OSError (ENOSPC...) if they cannot be.

    posix_fallocate, not a file of zeros: the blocks are the filesystem's
    promise that a write into them will not fail for want of space (tmpfs and
    ext4 both keep it).
    """
    path = Path(folder) / RESERVE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.write(fd, b"\0" * nbytes)  # no fallocate here: zeros take the blocks instead
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    _fsync_folder(Path(folder))
    return path


def write_receipt_into(reserve: str | os.PathLike, path: str | os.PathLike, receipt: dict) -> None:
    """Write the receipt into its reserve (no new blocks needed when it fits), trim the
    reserve to the receipt's size, fsync, and rename it to `path`; OSError if any step fails."""
    data = encode_receipt(receipt)
    fd = os.open(reserve, os.O_WRONLY | os.O_CLOEXEC)
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.pwrite(fd, view[done:], done)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(reserve, path)
    _fsync_folder(Path(path).parent)


def _fsync_folder(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def receipt_line(receipt: dict) -> str:
    """The receipt as one line of JSON (the fallback printed on stderr)."""
    return json.dumps(
        receipt, sort_keys=True, ensure_ascii=False, allow_nan=False, default=plain_number
    )


def refusals_by_rule(totals: dict) -> dict[str, int]:
    """The receipt's refusals per rule (`totals.refused_by_rule`, spec section 6.5: every
    refused call under the rule that refused it); {} for a receipt that makes no such
    claim (one written before it, or a run with no refusal)."""
    found = totals.get("refused_by_rule")
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if isinstance(v, int)}


def refused_calls(totals: dict) -> int:
    """Every call the run refused: the sum of `refused_by_rule` where the receipt has it
    (`totals.refused` counts the policy's denials alone), else `totals.refused`."""
    rules = refusals_by_rule(totals)
    return sum(rules.values()) if rules else int(totals.get("refused", 0))
