"""`docket attest` and `docket verify --attestation`: the commands' words and exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from docket.attest.check import AttestedVerdict, verify_attested
from docket.attest.dsse import envelope_text, sign_envelope
from docket.attest.keys import key_id, load_private_key
from docket.attest.statement import (
    GAMEDAY_PREDICATE,
    RUN_PREDICATE,
    SUBJECT_FILES,
    default_out,
    folder_kind,
    gameday_predicate,
    run_predicate,
    statement,
    statement_bytes,
    subjects,
)
from docket.durable import replace_file
from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, CheckFailed, InputError, one_line
from docket.ledger.strict_json import decode_json
from docket.receipts.verify import verify
from docket.receipts.verify_report import dumps, input_error_report, verdict_report


def attest_folder(folder: str | os.PathLike, key_path: str, out: str | None = None) -> Path:
    """Sign `folder` (a run's, or a game-day report's) into a DSSE envelope at `out`
    (default FOLDER/attestation.dsse.json). A run whose receipt does not verify is
    refused (CheckFailed); a bad folder or key is InputError."""
    key = load_private_key(key_path)  # first: a readable key is refused before any work
    run = Path(folder)
    kind = folder_kind(run)
    names = SUBJECT_FILES[kind]
    before = subjects(run, kind)
    if kind == RUN_PREDICATE:
        receipt_path, ledger_path = run / names[1], run / names[0]
        verdict = verify(receipt_path, ledger_path)
        if not verdict.ok:
            raise CheckFailed(
                f"{run}: the receipt does not verify ({verdict.code}: {verdict.detail}); "
                "nothing was signed"
            )
        receipt: Any = decode_json(receipt_path.read_bytes())
        predicate = run_predicate(receipt, verdict)
    else:
        try:
            report = decode_json((run / names[0]).read_bytes())
        except ValueError as exc:
            raise InputError(f"{run / names[0]}: not JSON ({exc})") from None
        if type(report) is not dict:
            raise InputError(f"{run / names[0]}: not a game-day report (not an object)")
        predicate = gameday_predicate(report)
    # The digests are taken before and after the receipt is verified: the same both
    # times, what was verified is what is signed; a file changed in between is refused.
    if subjects(run, kind) != before:
        raise CheckFailed(f"{run}: a file changed while it was being attested; nothing was signed")
    stmt = statement(kind, before, predicate)
    envelope = sign_envelope(statement_bytes(stmt), key)
    target = Path(out) if out else default_out(run)
    try:
        replace_file(target, envelope_text(envelope).encode("utf-8"))
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror}") from None
    return target


def attest_command(run: str, key: str, out: str | None) -> int:
    target = attest_folder(run, key, out)
    keyid = key_id(load_private_key(key).public_key())
    print(f"attested {run}: {target} (keyid {keyid})")
    return EXIT_OK


def attested_line(v: AttestedVerdict) -> str:
    if v.receipt is not None and not v.receipt.ok:
        return v.receipt.summary()  # where in the ledger, as `docket verify` says it
    if not v.ok:
        return f"FAIL {v.code}: {one_line(v.detail)}"
    what = "game-day report" if v.kind == GAMEDAY_PREDICATE else "run"
    line = f"attested {what} (key {v.keyid}; {', '.join(v.subjects)} match)"
    if v.receipt is not None:
        line += f"; {v.receipt.summary()}"
    return line


def attested_report(v: AttestedVerdict) -> dict:
    """verify --json's object, with the attestation's figures under "attestation"."""
    if v.receipt is not None:
        out = verdict_report(v.receipt)
    else:
        out = input_error_report(InputError(""))  # the shape, filled in below
        out.update(verdict="ok", exit=EXIT_OK, code=None)
    if not v.ok:
        detail = one_line(v.detail)
        out.update(ok=False, verdict="fail", exit=EXIT_CHECK_FAILED, code=v.code,
                   message=detail, detail=detail)  # fmt: skip
    else:
        out.update(ok=True, message=attested_line(v), detail=attested_line(v))
    out["attestation"] = {"kind": v.kind, "keyid": v.keyid, "subjects": v.subjects}
    return out


def verify_attested_command(run: str, attestation: str, pubkey: str, as_json: bool) -> int:
    if as_json:
        try:
            report = attested_report(verify_attested(run, attestation, pubkey))
        except InputError as exc:
            report = input_error_report(exc)
        print(dumps(report))
        return int(report["exit"])
    verdict = verify_attested(run, attestation, pubkey)
    print(attested_line(verdict))
    return EXIT_OK if verdict.ok else EXIT_CHECK_FAILED


def envelope_json(path: Path) -> dict:
    """An envelope file as JSON (tests and the attack rig read them)."""
    return json.loads(path.read_text(encoding="utf-8"))
