"""The Go verifier (verify-go/, spec/docket-receipt-1.md read independently) over every
committed vector and a few command-line cases.

The binary is built once a session into a temporary folder with `go build -o`
(tests/conftest.py go_verifier), so the test checks what the source builds today,
never a stale binary. Without `go` on the
machine the tests are skipped, saying so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VERIFY_GO = ROOT / "verify-go"
VECTORS = ROOT / "spec" / "vectors"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))["vectors"]
BY_NAME = {v["name"]: v for v in MANIFEST}


@pytest.fixture(scope="module")
def binary(go_verifier) -> Path:
    """The session's one build of verify-go/ (tests/conftest.py go_verifier)."""
    if go_verifier.absent:
        pytest.skip(f"the Go verifier cannot be built: {go_verifier.absent}")
    assert go_verifier.broken is None, go_verifier.broken
    return Path(go_verifier.argv[0])


def run(binary: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def vector_args(vector: dict) -> list[str]:
    args = [str(VECTORS / vector["receipt"])]
    if vector["ledger"]:
        args += ["--ledger", str(VECTORS / vector["ledger"])]
    return args


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_vector_json(binary, name):
    vector = BY_NAME[name]
    done = run(binary, *vector_args(vector), "--json")
    assert done.returncode == vector["exit"], (done.stdout, done.stderr)
    got = json.loads(done.stdout)
    keys = ("verdict", "exit", "code", "seq", "offset", "field")
    assert {k: got[k] for k in keys} == {k: vector[k] for k in keys}, got["detail"]
    if vector["verdict"] == "ok":
        keys = ("events", "head", "bytes", "unbacked")
        assert {k: got[k] for k in keys} == {k: vector[k] for k in keys}
        # The manifest gives tail_bytes only where it is not 0.
        assert got.get("tail_bytes", 0) == vector.get("tail_bytes", 0), got["detail"]


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_vector_line(binary, name):
    """Without --json: the same one line `docket verify` prints (spec section 10)."""
    vector = BY_NAME[name]
    done = run(binary, *vector_args(vector))
    assert done.returncode == vector["exit"], (done.stdout, done.stderr)
    if vector["verdict"] == "ok":
        assert done.stdout.startswith(f"ok: {vector['events']} events, head {vector['head']}")
        assert done.stderr == ""
    elif vector["verdict"] == "fail":
        where = [
            f"{k if k == 'seq' else 'byte'} {vector[k]}"
            for k in ("seq", "offset")
            if vector[k] is not None
        ]
        at = f" at {', '.join(where)}" if where else ""
        assert done.stdout.startswith(f"FAIL {vector['code']}{at}: "), done.stdout
        assert done.stdout.count("\n") == 1 and done.stderr == ""
    else:
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1
        assert done.stderr.rstrip().endswith(f"({vector['code']})"), done.stderr


@pytest.mark.parametrize("name", ["ok-basic", "ok-no-session-end", "ok-open-call-disclosed"])
def test_ok_lines_are_what_docket_verify_prints(binary, name):
    """The whole ok line, unbacked claims included, word for word."""
    receipt = str(VECTORS / name / "receipt.json")
    ours = run(binary, receipt)
    theirs = subprocess.run(
        [sys.executable, "-m", "docket", "verify", receipt],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout)


def _one_line_input_error(done: subprocess.CompletedProcess, code: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("docket-verify: ")
    assert done.stderr.rstrip().endswith(f"({code})")
    assert "goroutine" not in done.stderr and "panic" not in done.stderr


def test_missing_receipt(binary, tmp_path):
    _one_line_input_error(run(binary, str(tmp_path / "nope.json")), "receipt_unreadable")


def test_empty_receipt(binary, tmp_path):
    (tmp_path / "receipt.json").write_bytes(b"")
    _one_line_input_error(run(binary, str(tmp_path / "receipt.json")), "receipt_unreadable")


def test_binary_receipt(binary, tmp_path):
    (tmp_path / "receipt.json").write_bytes(bytes(range(256)) * 4)
    _one_line_input_error(run(binary, str(tmp_path / "receipt.json")), "receipt_unreadable")


def test_receipt_that_is_a_folder(binary, tmp_path):
    _one_line_input_error(run(binary, str(tmp_path)), "receipt_unreadable")


def test_missing_ledger_given(binary, tmp_path):
    receipt = str(VECTORS / "ok-basic" / "receipt.json")
    done = run(binary, receipt, "--ledger", str(tmp_path / "none.jsonl"))
    _one_line_input_error(done, "ledger_unreadable")


@pytest.mark.parametrize(
    "args", [[], ["--ledger"], ["a.json", "b.json"], ["--frobnicate", "a.json"]]
)
def test_bad_command_lines(binary, args):
    done = run(binary, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("docket-verify: ")


# ---------------------------------------------------------------- attestations (spec/docket-attestation-1.md)

ATTESTATIONS = json.loads((VECTORS / "attestations.json").read_text(encoding="utf-8"))["vectors"]
ATTEST_BY_NAME = {v["name"]: v for v in ATTESTATIONS}


def attestation_args(vector: dict) -> list[str]:
    return [str(VECTORS / vector["run"]), "--attestation", str(VECTORS / vector["attestation"]),
            "--pubkey", str(VECTORS / vector["pubkey"])]  # fmt: skip


@pytest.mark.parametrize("name", sorted(ATTEST_BY_NAME))
def test_attestation_vector(binary, name):
    vector = ATTEST_BY_NAME[name]
    done = run(binary, *attestation_args(vector), "--json")
    assert done.returncode == vector["exit"], (done.stdout, done.stderr)
    got = json.loads(done.stdout)
    keys = ["verdict", "exit", "code", "seq", "offset", "field"]
    if vector["verdict"] == "ok":
        keys += ["events", "head", "bytes"]
    assert {k: got[k] for k in keys} == {k: vector[k] for k in keys}, got["detail"]
    line = run(binary, *attestation_args(vector))
    assert line.returncode == vector["exit"]
    if vector["verdict"] == "fail":
        assert line.stdout.startswith(f"FAIL {vector['code']}") and line.stderr == ""
    elif vector["verdict"] == "input_error":
        _one_line_input_error(line, vector["code"])


def test_an_attested_ok_line_is_what_docket_verify_prints(binary):
    args = attestation_args(ATTEST_BY_NAME["attest-ok"])
    ours = run(binary, *args)
    theirs = subprocess.run([sys.executable, "-m", "docket", "verify", *args],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout) == (0, ours.stdout)


def test_a_huge_envelope_is_refused_after_one_bounded_read(binary, tmp_path):
    huge = tmp_path / "attestation.dsse.json"
    with open(huge, "wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of zeros, not read
    args = attestation_args(ATTEST_BY_NAME["attest-ok"])
    args[2] = str(huge)
    _one_line_input_error(run(binary, *args), "attestation_too_large")


@pytest.mark.parametrize(
    "args",
    [["x", "--attestation", "a.json"], ["x", "--pubkey", "k"], ["x", "--attestation"],
     ["x", "--attestation", "a", "--pubkey", "k", "--ledger", "l"]],
)  # fmt: skip
def test_bad_attestation_command_lines(binary, args):
    done = run(binary, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("docket-verify: ")
