"""Every committed vector in spec/vectors/manifest.json, through the library and the CLI.

The vectors are bytes on disk that another implementation of
spec/docket-receipt-1.md reads too; here the reference implementation must give
each one's verdict, code, seq, byte offset and field, and `python -m docket
verify` its exit code and line. The committed files must also be exactly what
spec/vectors/make_vectors.py generates.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from docket.ledger import strict_json
from docket.receipts.verify import VerifyInputError, verify

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "spec" / "vectors"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))["vectors"]
BY_NAME = {v["name"]: v for v in MANIFEST}


def paths(vector: dict) -> tuple[Path, Path | None]:
    ledger = VECTORS / vector["ledger"] if vector["ledger"] else None
    return VECTORS / vector["receipt"], ledger


@pytest.fixture(params=["default", "stdlib"])
def parser(request, monkeypatch):
    """The default JSON parser (jiter when installed), then the standard library's fallback."""
    if request.param == "stdlib":
        monkeypatch.setattr(strict_json, "parsers", strict_json.STDLIB)
    return request.param


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_vector_through_the_library(name, parser):
    vector = BY_NAME[name]
    receipt, ledger = paths(vector)
    if vector["verdict"] == "input_error":
        with pytest.raises(VerifyInputError) as caught:
            verify(receipt, ledger)
        assert caught.value.code == vector["code"]
        return
    verdict = verify(receipt, ledger)
    got = (verdict.ok, verdict.code, verdict.seq, verdict.offset, verdict.field)
    want = (vector["verdict"] == "ok", vector["code"], vector["seq"], vector["offset"])
    assert got == (*want, vector["field"]), verdict.summary()
    if verdict.ok:
        assert (verdict.events, verdict.head, verdict.bytes) == (
            vector["events"],
            vector["head"],
            vector["bytes"],
        )
        assert list(verdict.unbacked) == vector["unbacked"]
        assert verdict.tail_bytes == vector.get("tail_bytes", 0)  # given only where not 0


# The first vector of each (verdict, exit) class runs as a real `python -m docket
# verify` process (the exit status a shell sees); the rest through the same entry
# point in this process, 0.1 s of interpreter start each saved.
AS_PROCESS = frozenset(
    {next(v["name"] for v in sorted(MANIFEST, key=lambda v: v["name"]) if (v["verdict"], v["exit"]) == kind)
     for kind in {(v["verdict"], v["exit"]) for v in MANIFEST}}
)  # fmt: skip


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def verify_command(argv: list[str], as_process: bool, capsys, monkeypatch) -> Done:
    monkeypatch.delenv("DOCKET_DEBUG", raising=False)
    if as_process:
        env = {k: v for k, v in os.environ.items() if k != "DOCKET_DEBUG"}
        done = subprocess.run([sys.executable, "-m", "docket", *argv], capture_output=True,
                              text=True, timeout=60, env=env, cwd=ROOT)  # fmt: skip
        return Done(done.returncode, done.stdout, done.stderr)
    from docket.cli import main

    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return Done(code, out, err)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_vector_through_the_cli(name, capsys, monkeypatch):
    vector = BY_NAME[name]
    receipt, ledger = paths(vector)
    argv = ["verify", str(receipt)]
    if ledger is not None:
        argv += ["--ledger", str(ledger)]
    done = verify_command(argv, name in AS_PROCESS, capsys, monkeypatch)
    if name == "input-receipt-directory":
        # `docket verify FOLDER` reads the folder as a run, its receipt.json
        # (docket/reading/run_paths.py); the verifier's own answer to a folder given as
        # the receipt, receipt_unreadable, is checked in tests/test_verify_json.py.
        assert done.returncode == 0 and done.stdout.startswith("ok: "), done
        return
    assert done.returncode == vector["exit"], (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    if vector["verdict"] == "ok":
        assert done.stdout.startswith(f"ok: {vector['events']} events, head {vector['head']}")
        assert done.stderr == ""
    elif vector["verdict"] == "fail":
        where = []
        if vector["seq"] is not None:
            where.append(f"seq {vector['seq']}")
        if vector["offset"] is not None:
            where.append(f"byte {vector['offset']}")
        at = f" at {', '.join(where)}" if where else ""
        assert done.stdout.startswith(f"FAIL {vector['code']}{at}: "), done.stdout
        assert done.stdout.count("\n") == 1
    else:
        assert done.stdout == ""
        assert done.stderr.startswith("docket: ") and done.stderr.count("\n") == 1
        assert done.stderr.rstrip().endswith(f"({vector['code']})")


def test_the_manifest_covers_every_failure_the_spec_names():
    codes = {v["code"] for v in MANIFEST}
    assert codes >= {
        "malformed_line",
        "unsupported_version",
        "seq_gap",
        "chain_break",
        "mono_regression",
        "torn_tail",
        "empty_ledger",
        "receipt_malformed",
        "count_mismatch",
        "head_mismatch",
        "bytes_mismatch",
        "malformed_event",
        "evidence_mismatch",
        "open_call",
        "run_mismatch",
        "duration_mismatch",
        "exit_mismatch",
        "total_mismatch",
        "pricing_mismatch",
        "caps_mismatch",
        "policy_mismatch",
        "faults_mismatch",
        "fleet_mismatch",
        "receipt_unreadable",
        "receipt_not_json",
        "not_a_receipt",
        "ledger_unreadable",
        "not_a_ledger",
    }
    assert sum(v["verdict"] == "ok" for v in MANIFEST) >= 5


def test_committed_vectors_are_what_the_generator_makes(tmp_path):
    make = runpy.run_path(str(VECTORS / "make_vectors.py"))["make"]
    make(tmp_path)

    def tree(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix != ".py" and p.name != ".gitattributes"
        }

    made, committed = tree(tmp_path), tree(VECTORS)
    committed = {k: v for k, v in committed.items() if "__pycache__" not in k}
    assert sorted(made) == sorted(committed)
    for name, data in made.items():
        assert committed[name] == data, f"{name} differs: run spec/vectors/make_vectors.py"


# ---------------------------------------------- attestations (spec/docket-attestation-1.md)

ATTESTATIONS = json.loads((VECTORS / "attestations.json").read_text(encoding="utf-8"))["vectors"]
ATTEST_BY_NAME = {v["name"]: v for v in ATTESTATIONS}


def attest_argv(vector: dict) -> list[str]:
    return [
        "verify",
        str(VECTORS / vector["run"]),
        "--attestation",
        str(VECTORS / vector["attestation"]),
        "--pubkey",
        str(VECTORS / vector["pubkey"]),
    ]


@pytest.mark.parametrize("name", sorted(ATTEST_BY_NAME))
def test_attestation_vector_through_the_library(name):
    from docket.attest.check import verify_attested

    vector = ATTEST_BY_NAME[name]
    args = (VECTORS / vector["run"], VECTORS / vector["attestation"], VECTORS / vector["pubkey"])
    if vector["verdict"] == "input_error":
        with pytest.raises(VerifyInputError) as caught:
            verify_attested(*args)
        assert caught.value.code == vector["code"]
        return
    verdict = verify_attested(*args)
    assert (verdict.ok, verdict.code) == (vector["verdict"] == "ok", vector["code"]), verdict
    receipt = verdict.receipt
    if vector["verdict"] == "ok" and vector["events"] is not None:
        assert receipt is not None and receipt.ok
        assert (receipt.events, receipt.head, receipt.bytes) == (
            vector["events"],
            vector["head"],
            vector["bytes"],
        )
    if vector["seq"] is not None or vector["field"] is not None:  # the receipt's failure
        assert receipt is not None
        assert (receipt.seq, receipt.offset, receipt.field) == (
            vector["seq"],
            vector["offset"],
            vector["field"],
        )


@pytest.mark.parametrize("name", sorted(ATTEST_BY_NAME))
def test_attestation_vector_through_the_cli(name, capsys, monkeypatch):
    vector = ATTEST_BY_NAME[name]
    done = verify_command(attest_argv(vector), name == "attest-ok", capsys, monkeypatch)
    assert done.returncode == vector["exit"], (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    if vector["verdict"] == "ok":
        assert done.stdout.startswith("attested ") and done.stdout.count("\n") == 1
        if vector["events"] is not None:
            assert f"; ok: {vector['events']} events, head {vector['head']}" in done.stdout
    elif vector["verdict"] == "fail":
        assert done.stdout.startswith(f"FAIL {vector['code']}"), done.stdout
        assert done.stdout.count("\n") == 1
    else:
        assert done.stdout == "" and done.stderr.count("\n") == 1
        assert done.stderr.rstrip().endswith(f"({vector['code']})")
    as_json = verify_command(attest_argv(vector) + ["--json"], False, capsys, monkeypatch)
    got = json.loads(as_json.stdout)
    keys = ("verdict", "exit", "code", "seq", "offset", "field")
    assert {k: got[k] for k in keys} == {k: vector[k] for k in keys}, got["detail"]
    assert as_json.returncode == vector["exit"] and as_json.stderr == ""


def test_every_attestation_failure_has_its_own_code_and_vector():
    codes = [v["code"] for v in ATTESTATIONS if v["verdict"] != "ok"]
    assert set(codes) >= {
        "signature_invalid",
        "signature_missing",
        "payload_type_mismatch",
        "subject_mismatch",
        "envelope_malformed",
        "statement_malformed",
        "predicate_mismatch",
        "attestation_not_json",
    }
    assert {v["name"] for v in ATTESTATIONS} >= {
        "attest-ok",
        "attest-wrong-key",
        "attest-edited-payload",
        "attest-swapped-subject",
        "attest-wrong-payload-type",
        "attest-signature-missing",
    }
