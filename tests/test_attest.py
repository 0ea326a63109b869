"""`docket keygen`, `docket attest` and `docket verify --attestation` on real files:
key modes on disk, refusals (one line, their exit codes), the envelope's bytes, and a
tampered run caught by its subjects. The vectors' verdicts are tests/test_vectors.py's."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from docket.attest.dsse import PAYLOAD_TYPE, b64decode_canonical, pae
from docket.attest.statement import RUN_PREDICATE, STATEMENT_TYPE
from docket.cli import main

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, words: str) -> None:
    assert err.startswith("docket: ") and err.count("\n") == 1, err
    assert words in err, err
    assert "Traceback" not in err


@pytest.fixture
def key(tmp_path, capsys) -> Path:
    path = tmp_path / "keys" / "signer.pem"
    path.parent.mkdir()
    assert cli(capsys, "keygen", "--out", str(path))[0] == 0
    return path


@pytest.fixture
def run(tmp_path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(VECTORS / "ok-basic", folder)
    return folder


def test_keygen_writes_a_0600_private_key_and_a_public_key_beside_it(key, tmp_path, capsys):
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    pub = Path(str(key) + ".pub")
    assert pub.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----\n")
    assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")  # PKCS#8
    before = key.read_bytes()
    code, _, err = cli(capsys, "keygen", "--out", str(key))
    assert code == 2
    one_line_error(err, "already exists")
    assert key.read_bytes() == before


def test_keygen_refuses_when_only_the_public_half_exists(tmp_path, capsys):
    (tmp_path / "k.pub").write_text("mine")
    code, _, err = cli(capsys, "keygen", "--out", str(tmp_path / "k"))
    assert code == 2 and not (tmp_path / "k").exists()
    one_line_error(err, "k.pub: already exists")


def test_attest_then_verify(run, key, capsys):
    code, out, _ = cli(capsys, "attest", str(run), "--key", str(key))
    assert code == 0, out
    envelope = json.loads((run / "attestation.dsse.json").read_text())
    assert envelope["payloadType"] == PAYLOAD_TYPE
    body = base64.b64decode(envelope["payload"])
    stmt = json.loads(body)
    assert stmt["_type"] == STATEMENT_TYPE and stmt["predicateType"] == RUN_PREDICATE
    assert {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]} == {
        name: hashlib.sha256((run / name).read_bytes()).hexdigest()
        for name in ("ledger.jsonl", "receipt.json")
    }
    receipt = json.loads((run / "receipt.json").read_text())
    assert stmt["predicate"]["ledger"] == {
        k: receipt["ledger"][k] for k in ("events", "head", "bytes")
    }
    assert stmt["predicate"]["totals"] == receipt["totals"]
    assert stmt["predicate"]["verify"]["verdict"] == "ok"
    # the signature is over PAE, as an independent Ed25519 check with the public key says
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    public = load_pem_public_key(Path(str(key) + ".pub").read_bytes())
    sig = b64decode_canonical(envelope["signatures"][0]["sig"])
    public.verify(sig, pae(PAYLOAD_TYPE, body))  # raises if not

    code, out, _ = cli(capsys, "verify", str(run), "--attestation",
                       str(run / "attestation.dsse.json"), "--pubkey", f"{key}.pub")  # fmt: skip
    assert code == 0 and out.startswith("attested run (key "), out
    assert "; ok: 16 events" in out


def test_a_receipt_swapped_after_attesting_fails_on_its_subject(run, key, capsys):
    assert cli(capsys, "attest", str(run), "--key", str(key))[0] == 0
    receipt = json.loads((run / "receipt.json").read_text())
    receipt["totals"]["usd"] = "0.000000001"
    (run / "receipt.json").write_text(json.dumps(receipt))
    code, out, _ = cli(capsys, "verify", str(run), "--attestation",
                       str(run / "attestation.dsse.json"), "--pubkey", f"{key}.pub")  # fmt: skip
    assert code == 1 and out.startswith("FAIL subject_mismatch: subject receipt.json"), out


def test_attest_refuses_a_run_whose_receipt_does_not_verify(tmp_path, key, capsys):
    folder = tmp_path / "forged"
    shutil.copytree(VECTORS / "forged-usage-and-head", folder)
    code, out, err = cli(capsys, "attest", str(folder), "--key", str(key))
    assert code == 1 and out == ""
    one_line_error(err, "the receipt does not verify (total_mismatch")
    assert not (folder / "attestation.dsse.json").exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_attest_refuses_a_key_others_can_read(run, key, capsys, mode):
    os.chmod(key, mode)
    code, _, err = cli(capsys, "attest", str(run), "--key", str(key))
    assert code == 2
    one_line_error(err, "lets group or others read it")
    assert not (run / "attestation.dsse.json").exists()


@pytest.mark.parametrize(
    "setup, words",
    [
        (lambda run, key: shutil.rmtree(run) or run.mkdir(), "neither a run's folder"),
        (lambda run, key: (run / "ledger.jsonl").unlink(), "has no ledger.jsonl"),
        (lambda run, key: key.write_text("not a key"), "not a PEM PKCS#8 private key"),
        (lambda run, key: key.unlink(), "no such file"),
    ],
)
def test_attest_bad_input_is_one_line_and_exit_2(run, key, capsys, setup, words):
    setup(run, key)
    code, out, err = cli(capsys, "attest", str(run), "--key", str(key))
    assert code == 2 and out == ""
    one_line_error(err, words)


def test_attest_writes_where_out_says(run, key, tmp_path, capsys):
    out_path = tmp_path / "elsewhere.dsse.json"
    assert cli(capsys, "attest", str(run), "--key", str(key), "--out", str(out_path))[0] == 0
    assert out_path.is_file() and not (run / "attestation.dsse.json").exists()


def test_verify_attestation_flags_go_together(run, capsys):
    code, _, err = cli(capsys, "verify", str(run), "--attestation", "a.json")
    assert code == 2
    one_line_error(err, "--attestation and --pubkey go together")


def test_verify_with_a_bad_public_key_is_an_input_error(run, key, tmp_path, capsys):
    assert cli(capsys, "attest", str(run), "--key", str(key))[0] == 0
    bad = tmp_path / "bad.pub"
    bad.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    argv = ["verify", str(run), "--attestation", str(run / "attestation.dsse.json"),
            "--pubkey", str(bad)]  # fmt: skip
    code, _, err = cli(capsys, *argv)
    assert code == 2
    one_line_error(err, "(pubkey_unreadable)")
    code, out, _ = cli(capsys, *argv, "--json")
    assert code == 2 and json.loads(out)["code"] == "pubkey_unreadable"


def test_a_game_day_report_folder_is_attested_by_its_json_and_junit(tmp_path, key, capsys):
    report = tmp_path / "report"
    shutil.copytree(VECTORS / "attest-gameday-ok", report)
    (report / "attestation.dsse.json").unlink()
    assert cli(capsys, "attest", str(report), "--key", str(key))[0] == 0
    argv = ["verify", str(report), "--attestation", str(report / "attestation.dsse.json"),
            "--pubkey", f"{key}.pub"]  # fmt: skip
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and out.startswith("attested game-day report"), out
    with open(report / "junit.xml", "a") as f:
        f.write("<!-- edited -->\n")
    code, out, _ = cli(capsys, *argv)
    assert code == 1 and out.startswith("FAIL subject_mismatch: subject junit.xml"), out


def test_a_file_changed_while_being_attested_is_not_signed(run, key, capsys, monkeypatch):
    # The ledger grows between the digests and the receipt's check (an agent still
    # writing, a carrier swapping): what was verified is not what would be signed.
    import docket.attest.command as command

    real_verify = command.verify

    def verify_then_append(receipt, ledger):
        verdict = real_verify(receipt, ledger)
        with open(ledger, "ab") as f:
            f.write(b"\n")
        return verdict

    monkeypatch.setattr(command, "verify", verify_then_append)
    code, _, err = cli(capsys, "attest", str(run), "--key", str(key))
    assert code == 1
    one_line_error(err, "a file changed while it was being attested")
    assert not (run / "attestation.dsse.json").exists()
