"""`docket verify RUN --attestation FILE --pubkey FILE`: the envelope, then the receipt.

The order (spec/docket-attestation-1.md section 5): read the envelope (bounded), its
shape, a signature present, the signature over PAE with the given key, the payloadType,
the Statement, each subject's digest against the file on disk, then for a run the
receipt as `docket verify` checks it, and the predicate's figures against what that
re-derived. The first that fails is the verdict.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from docket.attest.dsse import MAX_ENVELOPE_BYTES, PAYLOAD_TYPE, b64decode_canonical, pae
from docket.attest.keys import key_id, load_public_key
from docket.attest.statement import (
    GAMEDAY_PREDICATE,
    RUN_PREDICATE,
    STATEMENT_TYPE,
    SUBJECT_FILES,
    file_sha256,
)
from docket.errors import InputError
from docket.ledger.strict_json import MAX_INT, decode_json
from docket.receipts.verify import Verdict, VerifyInputError, verify

# Failed checks (exit 1), in the order they are made.
ENVELOPE_MALFORMED = "envelope_malformed"
SIGNATURE_MISSING = "signature_missing"
SIGNATURE_INVALID = "signature_invalid"
PAYLOAD_TYPE_MISMATCH = "payload_type_mismatch"
STATEMENT_MALFORMED = "statement_malformed"
SUBJECT_MISSING = "subject_missing"
SUBJECT_MISMATCH = "subject_mismatch"
PREDICATE_MISMATCH = "predicate_mismatch"
# Input errors (exit 2): the check could not start.
ATTESTATION_UNREADABLE = "attestation_unreadable"
ATTESTATION_TOO_LARGE = "attestation_too_large"
ATTESTATION_NOT_JSON = "attestation_not_json"
PUBKEY_UNREADABLE = "pubkey_unreadable"

HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass
class AttestedVerdict:
    """The envelope's verdict, and for a run that passed it, the receipt's."""

    ok: bool
    code: str | None = None
    detail: str = ""
    kind: str | None = None  # the predicateType, once the statement was read
    keyid: str | None = None
    subjects: list[str] = field(default_factory=list)
    receipt: Verdict | None = None  # a run's receipt verdict, once the subjects matched
    predicate: dict | None = None  # the signed predicate, once the statement was read


def _failed(code: str, detail: str, **kw) -> AttestedVerdict:
    return AttestedVerdict(ok=False, code=code, detail=detail, **kw)


def read_envelope(path: str | os.PathLike) -> bytes:
    """The envelope's bytes, at most MAX_ENVELOPE_BYTES of them: a planted 10 GB file
    costs one bounded read, not the memory to hold it."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise VerifyInputError(
                    ATTESTATION_UNREADABLE, f"attestation {p}: not a regular file"
                )
            data = f.read(MAX_ENVELOPE_BYTES + 1)
    except FileNotFoundError:
        raise VerifyInputError(ATTESTATION_UNREADABLE, f"attestation {p}: no such file") from None
    except IsADirectoryError:
        raise VerifyInputError(
            ATTESTATION_UNREADABLE, f"attestation {p}: is a directory, not a file"
        ) from None
    except OSError as exc:
        raise VerifyInputError(
            ATTESTATION_UNREADABLE, f"attestation {p}: cannot read ({exc.strerror})"
        ) from None
    if len(data) > MAX_ENVELOPE_BYTES:
        raise VerifyInputError(
            ATTESTATION_TOO_LARGE,
            f"attestation {p}: more than {MAX_ENVELOPE_BYTES} bytes; an envelope is not that big (not read further)",
        )
    return data


def _signatures(envelope: object) -> tuple[str, bytes, list] | AttestedVerdict:
    """(payloadType, payload bytes, signatures) or the envelope_malformed verdict."""
    if type(envelope) is not dict:
        return _failed(ENVELOPE_MALFORMED, "the envelope is not a JSON object")
    kind, payload, sigs = (envelope.get(k) for k in ("payloadType", "payload", "signatures"))
    if type(kind) is not str:
        return _failed(ENVELOPE_MALFORMED, "payloadType is not a string")
    if type(payload) is not str:
        return _failed(ENVELOPE_MALFORMED, "payload is not a string")
    body = b64decode_canonical(payload)
    if body is None:
        return _failed(ENVELOPE_MALFORMED, "payload is not canonical base64")
    if sigs is None:
        sigs = []
    if type(sigs) is not list:
        return _failed(ENVELOPE_MALFORMED, "signatures is not an array")
    decoded = []
    for i, s in enumerate(sigs):
        if type(s) is not dict or type(s.get("sig")) is not str:
            return _failed(ENVELOPE_MALFORMED, f"signatures[{i}] has no sig string")
        raw = b64decode_canonical(s["sig"])
        if raw is None:
            return _failed(ENVELOPE_MALFORMED, f"signatures[{i}].sig is not canonical base64")
        decoded.append(raw)
    return kind, body, decoded


def _statement_problem(stmt: object) -> str | None:
    if type(stmt) is not dict:
        return "the payload is not a JSON object"
    if stmt.get("_type") != STATEMENT_TYPE:
        return f"_type is not {STATEMENT_TYPE}"
    kind = stmt.get("predicateType")
    if kind not in SUBJECT_FILES:
        return f"predicateType is not one of {', '.join(SUBJECT_FILES)}"
    subject = stmt.get("subject")
    if type(subject) is not list:
        return "subject is not an array"
    names = []
    for i, s in enumerate(subject):
        digest = s.get("digest") if type(s) is dict else None
        if type(digest) is not dict or type(s.get("name")) is not str:
            return f"subject[{i}] has no name and digest"
        if type(digest.get("sha256")) is not str or not HEX64.fullmatch(digest["sha256"]):
            return f"subject[{i}].digest.sha256 is not 64 lowercase hex digits"
        names.append(s["name"])
    if sorted(names) != sorted(SUBJECT_FILES[kind]):
        return f"the subjects are not {' and '.join(SUBJECT_FILES[kind])}, each once"
    if type(stmt.get("predicate")) is not dict:
        return "predicate is not an object"
    if kind == RUN_PREDICATE:
        p = stmt["predicate"]
        ledger = p.get("ledger")
        if type(p.get("run_id")) is not str or type(ledger) is not dict:
            return "predicate has no run_id and ledger"
        counts = (ledger.get("events"), ledger.get("bytes"))
        if not all(type(n) is int and 0 <= n <= MAX_INT for n in counts) or (
            type(ledger.get("head")) is not str
        ):
            return "predicate.ledger has no events, head and bytes (integers 0 to 2^53 - 1)"
    return None


def check_envelope(
    folder: Path, envelope_path: str | os.PathLike, public: Ed25519PublicKey
) -> AttestedVerdict:
    """Every check up to the subjects' digests (the receipt's are the caller's)."""
    data = read_envelope(envelope_path)
    try:
        envelope = decode_json(data)
    except ValueError as exc:
        raise VerifyInputError(
            ATTESTATION_NOT_JSON, f"attestation {envelope_path}: not JSON ({exc})"
        ) from None
    got = _signatures(envelope)
    if isinstance(got, AttestedVerdict):
        return got
    payload_type, body, sigs = got
    if not sigs:
        return _failed(SIGNATURE_MISSING, "the envelope carries no signature")
    message = pae(payload_type, body)
    for sig in sigs:
        try:
            public.verify(sig, message)
            break
        except InvalidSignature:
            continue
    else:
        return _failed(
            SIGNATURE_INVALID,
            f"no signature verifies over the envelope with key {key_id(public)}",
        )
    keyid = key_id(public)
    if payload_type != PAYLOAD_TYPE:
        return _failed(
            PAYLOAD_TYPE_MISMATCH,
            f"payloadType is {payload_type!r}, not {PAYLOAD_TYPE}",
            keyid=keyid,
        )
    try:
        stmt: Any = decode_json(body)
    except ValueError as exc:
        return _failed(STATEMENT_MALFORMED, f"the payload is not JSON ({exc})", keyid=keyid)
    problem = _statement_problem(stmt)
    if problem:
        return _failed(STATEMENT_MALFORMED, problem, keyid=keyid)
    kind = stmt["predicateType"]
    names = []
    for s in stmt["subject"]:
        name, want = s["name"], s["digest"]["sha256"]
        target = folder / name
        if not target.is_file():
            return _failed(
                SUBJECT_MISSING, f"subject {name}: no such file in {folder}", kind=kind, keyid=keyid
            )
        try:
            have = file_sha256(target)
        except OSError as exc:
            return _failed(
                SUBJECT_MISSING,
                f"subject {name}: cannot read ({exc.strerror})",
                kind=kind,
                keyid=keyid,
            )
        if have != want:
            return _failed(
                SUBJECT_MISMATCH,
                f"subject {name}: sha256 {have} on disk, {want} signed",
                kind=kind,
                keyid=keyid,
            )
        names.append(name)
    return AttestedVerdict(
        ok=True, kind=kind, keyid=keyid, subjects=names, predicate=stmt["predicate"]
    )


def run_folder(run: str | os.PathLike) -> Path:
    """The folder the subjects are named in: RUN itself, or a receipt's folder."""
    p = Path(run)
    return p if p.is_dir() else p.parent


def verify_attested(run: str | os.PathLike, attestation: str, pubkey: str) -> AttestedVerdict:
    """The envelope's checks, then for a run the receipt's and the predicate's."""
    try:
        public = load_public_key(pubkey)
    except InputError as exc:
        raise VerifyInputError(PUBKEY_UNREADABLE, str(exc)) from None
    folder = run_folder(run)
    verdict = check_envelope(folder, attestation, public)
    if not verdict.ok:
        return verdict
    if verdict.kind == GAMEDAY_PREDICATE:
        return verdict
    names = SUBJECT_FILES[RUN_PREDICATE]
    receipt = verify(folder / names[1], folder / names[0])
    verdict.receipt = receipt
    if not receipt.ok:
        return _failed(
            receipt.code or "",
            receipt.detail,
            kind=verdict.kind,
            keyid=verdict.keyid,
            subjects=verdict.subjects,
            receipt=receipt,
        )
    assert verdict.predicate is not None  # an ok envelope carries its statement's
    claimed = verdict.predicate["ledger"]
    for name, have in (
        ("events", receipt.events),
        ("head", receipt.head),
        ("bytes", receipt.bytes),
    ):
        if claimed[name] != have:
            return _failed(
                PREDICATE_MISMATCH,
                f"predicate.ledger.{name} is {claimed[name]!r}, the ledger's is {have!r}",
                kind=verdict.kind, keyid=verdict.keyid, subjects=verdict.subjects, receipt=receipt,
            )  # fmt: skip
    return verdict
