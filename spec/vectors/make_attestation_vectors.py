"""Generate the attestation test vectors (spec/docket-attestation-1.md section 7):
`python spec/vectors/make_vectors.py [OUTDIR]` runs this after the receipt vectors.

Each vector is a DSSE envelope in its own folder, checked against a run folder of the
receipt vectors (ok-basic unless it says otherwise) with the public key in attest-key/,
and an entry in attestations.json with the verdict and code every verifier must give.
The key pair in attest-key/ is a TEST KEY, derived from a published phrase: anyone can
sign with it, so it proves nothing outside these tests. Ed25519 signatures are
deterministic, so the committed files equal a fresh run (tests/test_vectors.py checks).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from docket.attest.dsse import envelope_text, sign_envelope
from docket.attest.keys import private_pem, public_pem
from docket.attest.statement import (
    GAMEDAY_PREDICATE,
    RUN_PREDICATE,
    statement,
    statement_bytes,
)

TEST_KEY = Ed25519PrivateKey.from_private_bytes(
    hashlib.sha256(b"docket attestation vectors: TEST KEY, NOT SECRET, NEVER TRUST IT").digest()
)
OTHER_KEY = Ed25519PrivateKey.from_private_bytes(
    hashlib.sha256(b"docket attestation vectors: another TEST KEY, the wrong one").digest()
)
KEY_DIR = "attest-key"
PUBKEY = f"{KEY_DIR}/TEST-ONLY-ed25519.pem.pub"
KEY_README = """\
TEST KEY PAIR for the attestation vectors (spec/docket-attestation-1.md section 7).
The private key is derived from a phrase printed in make_attestation_vectors.py and is
committed on purpose: anyone can sign with it. Never trust a signature by this key
outside these tests, and never use it to sign a real run.
"""
VERSION = "0.1.0"  # pinned, as in make_vectors.py


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_statement(out: Path, run: str) -> dict:
    """The statement `docket attest` makes for the run folder `run` (its receipt as the
    receipt vectors committed it, whatever its verdict)."""
    folder = out / run
    receipt = json.loads((folder / "receipt.json").read_text(encoding="utf-8"))
    ledger = receipt["ledger"]
    predicate = {
        "run_id": receipt["run_id"],
        "ledger": {k: ledger[k] for k in ("events", "head", "bytes")},
        "verify": {"verdict": "ok", "complete": True, "unbacked": [], "by": f"docket {VERSION}"},
        "totals": receipt["totals"],
    }
    subjects = [
        {"name": n, "digest": {"sha256": sha256_file(folder / n)}}
        for n in ("ledger.jsonl", "receipt.json")
    ]
    return statement(RUN_PREDICATE, subjects, predicate)


GAMEDAY_JSON = {
    "format": "docket-gameday-1",
    "docket_version": VERSION,
    "verdict": "pass",
    "counts": {"pass": 1, "fail": 0, "unknown": 0},
    "phases": [{"name": "caps", "verdict": "pass"}],
}
JUNIT_XML = (
    '<?xml version="1.0" encoding="utf-8"?>\n<testsuites name="docket game-day" tests="1" '
    'failures="0" errors="0"><testsuite name="caps" tests="1" failures="0" errors="0">'
    '<testcase classname="gameday.caps" name="the cap stops the run" /></testsuite></testsuites>\n'
)


def make_attestations(out: Path, receipt_manifest: list[dict]) -> None:
    (out / KEY_DIR).mkdir(parents=True, exist_ok=True)
    (out / KEY_DIR / "TEST-ONLY-ed25519.pem").write_bytes(private_pem(TEST_KEY))
    (out / PUBKEY).write_bytes(public_pem(TEST_KEY.public_key()))
    (out / KEY_DIR / "README.txt").write_text(KEY_README, encoding="utf-8")
    basic = next(v for v in receipt_manifest if v["name"] == "ok-basic")
    forged = next(v for v in receipt_manifest if v["name"] == "forged-usage-and-head")
    entries: list[dict] = []

    def add(name: str, description: str, envelope: dict | bytes, verdict: str, code, **kw):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        data = envelope if isinstance(envelope, bytes) else envelope_text(envelope).encode()
        (folder / "attestation.dsse.json").write_bytes(data)
        exit_code = {"ok": 0, "fail": 1, "input_error": 2}[verdict]
        entry = {
            "name": name,
            "description": description,
            "run": kw.pop("run", "ok-basic"),
            "attestation": f"{name}/attestation.dsse.json",
            "pubkey": PUBKEY,
            "verdict": verdict,
            "exit": exit_code,
            "code": code,
            "seq": None,
            "offset": None,
            "field": None,
        }
        entry.update(kw)
        entries.append(entry)

    def signed(stmt: dict, key: Ed25519PrivateKey = TEST_KEY, **kw) -> dict:
        return sign_envelope(statement_bytes(stmt), key, **kw)

    good = run_statement(out, "ok-basic")
    figures = {k: basic[k] for k in ("events", "head", "bytes")}
    add("attest-ok", "ok-basic's run, signed with the test key", signed(good), "ok", None,
        **figures)  # fmt: skip
    add("attest-wrong-key", "ok-basic's run, signed with another key", signed(good, OTHER_KEY),
        "fail", "signature_invalid")  # fmt: skip

    edited = signed(good)
    body = json.loads(base64.b64decode(edited["payload"]))
    body["predicate"]["totals"]["usd"] = "0.000000001"
    edited["payload"] = base64.b64encode(statement_bytes(body)).decode("ascii")
    add("attest-edited-payload", "attest-ok with the statement's totals.usd edited after signing",
        edited, "fail", "signature_invalid")  # fmt: skip

    swapped = copy.deepcopy(good)
    swapped["subject"][1]["digest"]["sha256"] = sha256_file(out / "ok-cap-kill" / "receipt.json")
    add("attest-swapped-subject",
        "signed, but receipt.json's subject digest is ok-cap-kill's receipt's",
        signed(swapped), "fail", "subject_mismatch")  # fmt: skip

    add("attest-wrong-payload-type", "attest-ok's statement signed as application/json",
        signed(good, payload_type="application/json"), "fail", "payload_type_mismatch")  # fmt: skip

    unsigned = signed(good)
    unsigned["signatures"] = []
    add("attest-signature-missing", "attest-ok with its signatures removed", unsigned, "fail",
        "signature_missing")  # fmt: skip

    malformed = signed(good)
    malformed["payload"] = malformed["payload"][:-4] + "!!!!"
    add("attest-payload-not-base64", "the payload's last four characters are not base64",
        malformed, "fail", "envelope_malformed")  # fmt: skip

    other_type = copy.deepcopy(good)
    other_type["_type"] = "https://in-toto.io/Statement/v0.1"
    add("attest-statement-v0", "signed, but the statement's _type is in-toto's v0.1",
        signed(other_type), "fail", "statement_malformed")  # fmt: skip

    lying = copy.deepcopy(good)
    lying["predicate"]["ledger"]["events"] = 15
    add("attest-predicate-mismatch",
        "signed, subjects right, but the predicate says 15 events where the ledger has 16",
        signed(lying), "fail", "predicate_mismatch")  # fmt: skip

    huge = copy.deepcopy(good)
    huge["predicate"]["ledger"]["events"] = 2**53
    add("attest-predicate-count-too-big",
        "signed, but the predicate's event count is 2^53, past every integer the spec reads",
        signed(huge), "fail", "statement_malformed")  # fmt: skip

    add("attest-receipt-fails",
        "forged-usage-and-head's run, signed: the subjects match, the receipt still fails",
        signed(run_statement(out, "forged-usage-and-head")), "fail", forged["code"],
        run="forged-usage-and-head", seq=forged["seq"], offset=forged["offset"],
        field=forged["field"])  # fmt: skip

    add("attest-not-json", "the envelope file is not JSON", b"{\"payload\": \n", "input_error",
        "attestation_not_json")  # fmt: skip

    report = out / "attest-gameday-ok"
    report.mkdir(parents=True, exist_ok=True)
    (report / "gameday.json").write_text(json.dumps(GAMEDAY_JSON, indent=2) + "\n")
    (report / "junit.xml").write_text(JUNIT_XML)
    subjects = [
        {"name": n, "digest": {"sha256": sha256_file(report / n)}}
        for n in ("gameday.json", "junit.xml")
    ]
    predicate = {"verdict": "pass", "phases": {"caps": "pass"}, "by": f"docket {VERSION}"}
    add("attest-gameday-ok", "a game-day report folder, signed with the test key",
        signed(statement(GAMEDAY_PREDICATE, subjects, predicate)), "ok", None,
        run="attest-gameday-ok", events=None, head=None, bytes=None)  # fmt: skip

    doc = {
        "format": "docket-attestation-1 test vectors",
        "spec": "spec/docket-attestation-1.md",
        "paths": "relative to the folder holding this manifest",
        "command": "VERIFIER RUN --attestation ATTESTATION --pubkey PUBKEY [--json]",
        "vectors": entries,
    }
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    (out / "attestations.json").write_text(text, encoding="utf-8")
