"""Attacks on a signed run (spec/docket-attestation-1.md), from an agent of the same user.

A real `docket run` whose agent, running as the same user, tries to read the signing
key at a path it was told (an attacker who knows where CI keeps it). Then the run is
attested and attacked as a carrier of its folder would: the receipt swapped after
attesting, the ledger and receipt replaced by another honest run's (each verifies on
its own), a line appended to the ledger, the envelope re-signed with the attacker's
own key, its signatures dropped, a huge envelope planted. Each is judged by every
verifier present (`docket verify`, verify-js, verify-go) with the signer's public key;
good is the verdict the spec names, in one line, within its time. And `docket attest`
must refuse a key file that group or others can read.

What a same-user agent can do with a 0600 key is reported, not counted: it reads it,
as the same user reads any of its own files. The defence is where the key lives (a CI
secret given to the signing step after the run, never on the run's machine while it
runs), which docs/reading.md says; the figure shows the limit is real.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from chaos.attack import Figures
from chaos.attack.rig import DOCKET, KEY_ENV, run_env, stub
from chaos.verifiers import Answer, Verifier, find_go, find_js, python_command
from docket.attest.dsse import sign_envelope
from docket.attest.keys import private_pem, public_pem

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"
VERIFY_BOUND_S = 10.0  # a verdict on a planted envelope, whatever its size
READABLE_MODES = (0o644, 0o640, 0o604, 0o660)

# The agent: read the key it was told of (same user), say what it got, outside the run.
KEY_READER = """\
import json, sys
key, out = sys.argv[1], sys.argv[2]
try:
    with open(key, "rb") as f:
        got = {"read": len(f.read())}
except OSError as exc:
    got = {"read": None, "error": exc.strerror}
with open(out, "w") as f:
    json.dump(got, f)
"""


def write_key(path: Path, mode: int = 0o600) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem(key))
    os.chmod(path, mode)
    Path(f"{path}.pub").write_bytes(public_pem(key.public_key()))
    return key


def agent_run(folder: Path, key: Path) -> tuple[Path, dict]:
    """A supervised run whose agent tries to read `key`; the run folder and what it read."""
    agent, said = folder / "key_reader.py", folder / "agent-read.json"
    agent.write_text(KEY_READER)
    run_dir = folder / "run"
    with stub(folder) as url:
        policy = folder / "policy.toml"
        policy.write_text(
            f'[providers.openai]\nkind = "openai"\nbase_url = "{url}"\nkey_env = "{KEY_ENV}"\n'
        )
        done = subprocess.run(
            [*DOCKET, "run", "--policy", str(policy), "--ledger-dir", str(run_dir), "--",
             sys.executable, str(agent), str(key), str(said)],
            capture_output=True, timeout=120, check=False, env=run_env(),
        )  # fmt: skip
    if done.returncode != 0 or not (run_dir / "receipt.json").is_file():
        raise RuntimeError(f"docket run exited {done.returncode}: {done.stderr[-300:]!r}")
    return run_dir, json.loads(said.read_text())


def attest(run_dir: Path, key: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*DOCKET, "attest", str(run_dir), "--key", str(key)],
                          capture_output=True, text=True, timeout=60, env=run_env())  # fmt: skip


def verifiers(folder: Path) -> tuple[list[Verifier], list[str]]:
    found = [python_command(sys.executable), find_js(), find_go(build_dir=folder / "go-build")]
    runnable = [v for v in found if v.runnable]
    skipped = [f"{v.name}: {v.absent or v.broken}" for v in found if not v.runnable]
    return runnable, skipped


def judged(v: Verifier, run_dir: Path, envelope: Path, pubkey: Path) -> tuple[Answer, float]:
    started = time.monotonic()
    args = [str(run_dir), "--attestation", str(envelope), "--pubkey", str(pubkey)]
    return v.run_args(args, timeout_s=VERIFY_BOUND_S * 3), time.monotonic() - started


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("attest")
    folder.mkdir(parents=True, exist_ok=True)
    # 1. a key group or others can read is never used to sign
    for mode in READABLE_MODES:
        bad = folder / f"readable-{mode:o}.pem"
        write_key(bad, mode)
        done = attest(VECTORS / "ok-basic", bad)
        figures.add(
            done.returncode == 2
            and done.stderr.count("\n") == 1
            and "Traceback" not in done.stderr,
            f"attest: a key of mode {mode:04o} -> exit {done.returncode}: {done.stderr.strip()[:200]}",
        )
    # 2. the run's agent (same user) reads the 0600 key it was told of: reported
    key = folder / "signer.pem"
    write_key(key)
    run_dir, read = agent_run(folder, key)
    done = attest(run_dir, key)
    if done.returncode != 0:
        raise RuntimeError(f"docket attest of a clean run exited {done.returncode}: {done.stderr}")
    envelope, pubkey = run_dir / "attestation.dsse.json", Path(f"{key}.pub")
    pristine = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    found, skipped = verifiers(folder)

    def restore() -> None:
        for name, data in pristine.items():
            (run_dir / name).write_bytes(data)

    def swap_receipt() -> None:
        receipt = json.loads((run_dir / "receipt.json").read_text())
        receipt["totals"]["usd"] = "0.000000001"
        (run_dir / "receipt.json").write_text(json.dumps(receipt))

    def replace_run() -> None:  # another honest run, whose receipt verifies on its own
        for name in ("ledger.jsonl", "receipt.json"):
            shutil.copyfile(VECTORS / "ok-basic" / name, run_dir / name)

    def append_line() -> None:
        with open(run_dir / "ledger.jsonl", "ab") as f:
            f.write(b'{"v":1}\n')

    def resign() -> None:  # the attacker's own key over the replaced run: not the signer's
        replace_run()
        body = json.loads(envelope.read_text())
        stmt = json.loads(base64.b64decode(body["payload"]))
        for s in stmt["subject"]:
            s["digest"]["sha256"] = hashlib.sha256((run_dir / s["name"]).read_bytes()).hexdigest()
        payload = json.dumps(stmt).encode()
        envelope.write_text(json.dumps(sign_envelope(payload, Ed25519PrivateKey.generate())))

    def drop_signatures() -> None:
        body = json.loads(envelope.read_text())
        body["signatures"] = []
        envelope.write_text(json.dumps(body))

    def plant_huge() -> None:  # sparse: the size costs no disk, only a reader that reads it
        envelope.unlink()
        with open(envelope, "wb") as f:
            f.truncate((64 << 20) if quick else (4 << 30))

    cases = [
        ("untouched", lambda: None, (0, "ok")),
        ("receipt swapped after attesting", swap_receipt, (1, "subject_mismatch")),
        ("ledger and receipt of another honest run", replace_run, (1, "subject_mismatch")),
        ("a line appended to the ledger", append_line, (1, "subject_mismatch")),
        ("re-signed with the agent's own key", resign, (1, "signature_invalid")),
        ("signatures dropped", drop_signatures, (1, "signature_missing")),
        ("a huge envelope planted", plant_huge, (2, "attestation_too_large")),
    ]
    verdicts: dict[str, str] = {}
    slowest = 0.0
    for what, spoil, want in cases:
        restore()
        spoil()
        for v in found:
            answer, took = judged(v, run_dir, envelope, pubkey)
            slowest = max(slowest, took)
            verdicts[f"{v.name}: {what}"] = answer.code or answer.said[:80]
            figures.add(
                (answer.exit, answer.code) == want and took <= VERIFY_BOUND_S,
                f"attest: {what}: {v.name} said exit {answer.exit} {answer.code} in {took:.1f}s "
                f"(want exit {want[0]} {want[1]} within {VERIFY_BOUND_S:g}s): {answer.said[:160]}",
            )
    restore()
    figures.extra = {
        "same_user_read_0600_key": read.get("read") is not None,
        "verifiers": [v.name for v in found],
        "skipped_verifiers": skipped,
        "slowest_s": round(slowest, 2),
        "verdicts": verdicts,
    }
    return figures
