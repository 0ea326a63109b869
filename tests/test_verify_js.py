"""verify-js/verify.mjs, the independent JavaScript verifier, over every committed vector.

It must give each vector in spec/vectors/manifest.json the verdict, exit code, failure code,
seq, byte offset and field the manifest states (section 12 of spec/docket-receipt-1.md), and
for ok vectors the chain's figures and the unbacked claims; its command line must say bad input
in one line on stderr with exit 2. Skipped, with the reason, where `node` is not installed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docket.ledger.chain import GENESIS, encode_body, encode_line, line_hash
from docket.receipts.receipt import build_receipt, write_receipt
from docket.receipts.tally import Tally
from docket.receipts.verify import verify

ROOT = Path(__file__).resolve().parent.parent
VERIFIER = ROOT / "verify-js" / "verify.mjs"
VECTORS = ROOT / "spec" / "vectors"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text(encoding="utf-8"))["vectors"]
BY_NAME = {v["name"]: v for v in MANIFEST}
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed: verify-js not run")


def node(*args: str | Path, script: Path = VERIFIER) -> subprocess.CompletedProcess:
    argv = [NODE, str(script), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)


def node_each(jobs: list[list[str | Path]]) -> list[subprocess.CompletedProcess]:
    """Many command lines of verify.mjs in one Node process (chaos/verify_js_each.mjs):
    each answer is what `node verify.mjs ARGS` writes and returns. The suite runs the
    ~180 vector rows this way (one Node start, not 180); the command-line tests below
    start a real `node verify.mjs` each."""
    driver = ROOT / "chaos" / "verify_js_each.mjs"
    payload = json.dumps([[str(a) for a in args] for args in jobs])
    done = subprocess.run(
        [NODE, str(driver), str(VERIFIER)], input=payload, capture_output=True, text=True,
        timeout=60 + len(jobs), cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(jobs), done.stdout[-500:]
    return [
        subprocess.CompletedProcess(args, a["exit"], a["stdout"], a["stderr"])
        for args, a in zip(jobs, answers, strict=True)
    ]


@pytest.fixture(scope="module")
def vector_answers() -> dict[tuple[str, bool], subprocess.CompletedProcess]:
    """{(vector name, as JSON?): what verify.mjs answered}, every vector both ways."""
    keys = [(name, as_json) for name in sorted(BY_NAME) for as_json in (True, False)]
    jobs = [vector_args(BY_NAME[n]) + (["--json"] if j else []) for n, j in keys]
    return dict(zip(keys, node_each(jobs), strict=True))


def vector_args(vector: dict) -> list[Path | str]:
    args: list[Path | str] = [VECTORS / vector["receipt"]]
    if vector["ledger"]:
        args += ["--ledger", VECTORS / vector["ledger"]]
    return args


def judged(done: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in done.stderr and "    at " not in done.stderr, done.stderr
    assert done.stdout.count("\n") == 1, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_one_node_per_case_answers_as_the_batch_does(vector_answers):
    """The batch is the command: a real `node verify.mjs` on a few vectors of each verdict
    writes and returns what the batch recorded for them."""
    picked = {v["verdict"]: v["name"] for v in MANIFEST}  # the last vector of each verdict
    for name in picked.values():
        for as_json in (True, False):
            alone = node(*vector_args(BY_NAME[name]), *(["--json"] if as_json else []))
            batch = vector_answers[name, as_json]
            got = (alone.returncode, alone.stdout, alone.stderr)
            assert got == (batch.returncode, batch.stdout, batch.stderr), name


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_vector_verdict_as_json(name, vector_answers):
    vector = BY_NAME[name]
    done = vector_answers[name, True]
    out = judged(done)
    keys = ["verdict", "exit", "code", "seq", "offset", "field"]
    if vector["verdict"] == "ok":
        keys += ["events", "head", "bytes", "unbacked"]
    assert {k: out[k] for k in keys} == {k: vector[k] for k in keys}, out["message"]
    if vector["verdict"] == "ok":  # the manifest gives tail_bytes only where it is not 0
        assert out["tail_bytes"] == vector.get("tail_bytes", 0), out["message"]
    assert done.returncode == vector["exit"]
    assert out["ok"] is (vector["verdict"] == "ok")


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_vector_line_as_docket_verify_prints_it(name, vector_answers):
    """Section 10's lines: ok and FAIL on stdout, an input error as one line on stderr."""
    vector = BY_NAME[name]
    done = vector_answers[name, False]
    assert done.returncode == vector["exit"], (done.stdout, done.stderr)
    if vector["verdict"] == "ok":
        assert done.stdout.startswith(f"ok: {vector['events']} events, head {vector['head']}, ")
        assert done.stdout.count("\n") == 1 and done.stderr == ""
    elif vector["verdict"] == "fail":
        where = []
        if vector["seq"] is not None:
            where.append(f"seq {vector['seq']}")
        if vector["offset"] is not None:
            where.append(f"byte {vector['offset']}")
        at = f" at {', '.join(where)}" if where else ""
        assert done.stdout.startswith(f"FAIL {vector['code']}{at}: "), done.stdout
        assert done.stdout.count("\n") == 1 and done.stderr == ""
    else:
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.rstrip().endswith(f"({vector['code']})"), done.stderr


# ---------------------------------------------------------------- bad input on the command line


def one_line_input_error(done: subprocess.CompletedProcess, code: str) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "    at " not in done.stderr, done.stderr
    assert done.stderr.rstrip().endswith(f"({code})"), done.stderr
    return done.stderr


def test_a_missing_receipt_is_one_line_and_exit_2(tmp_path):
    line = one_line_input_error(node(tmp_path / "nope.json"), "receipt_unreadable")
    assert "ENOENT" in line


def test_an_empty_receipt_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "r.json").write_bytes(b"")
    assert "empty" in one_line_input_error(node(tmp_path / "r.json"), "receipt_unreadable")


def test_a_binary_receipt_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "r.json").write_bytes(b'{"format": "docket-receipt-1"}\x00\x01\x02\xff')
    assert "NUL" in one_line_input_error(node(tmp_path / "r.json"), "receipt_unreadable")


def test_a_receipt_over_16_mib_is_refused_unread(tmp_path):
    big = tmp_path / "r.json"
    big.write_bytes(b'{"format": "docket-receipt-1", "pad": "' + b"x" * (16 << 20) + b'"}')
    assert "16 MiB" in one_line_input_error(node(big), "receipt_unreadable")


def test_a_receipt_with_a_byte_order_mark_is_not_json(tmp_path):
    receipt = (VECTORS / "ok-basic" / "receipt.json").read_bytes()
    (tmp_path / "r.json").write_bytes(b"\xef\xbb\xbf" + receipt)
    one_line_input_error(node(tmp_path / "r.json"), "receipt_not_json")


def test_no_receipt_or_an_unknown_option_is_a_usage_error(tmp_path):
    one_line_input_error(node(), "usage")
    one_line_input_error(node(VECTORS / "ok-basic" / "receipt.json", "--frobnicate"), "usage")


def test_input_errors_as_json_carry_the_code_on_stdout(tmp_path):
    done = node(tmp_path / "nope.json", "--json")
    assert done.returncode == 2 and done.stderr == ""
    out = json.loads(done.stdout)
    assert (out["ok"], out["verdict"], out["code"]) == (False, "input_error", "receipt_unreadable")
    assert out["message"]


# ---------------------------------------------------------------- cases the spec's text settles


def write_run(folder: Path, events: list[tuple[str, dict]], evidence: dict) -> Path:
    """A ledger of these events, chained by the reference encoder, and its receipt."""
    ledger, tally = folder / "ledger.jsonl", Tally()
    prev, size = GENESIS, 0
    with open(ledger, "wb") as f:
        for seq, (kind, fields) in enumerate(events):
            ts = f"2026-11-01T00:00:{seq:02d}.000Z"
            body = encode_body(fields)
            line = encode_line(seq=seq, ts=ts, mono_ms=seq * 10, type=kind, prev=prev, body=body)
            tally.add({"v": 1, "seq": seq, "ts": ts, "mono_ms": seq * 10, "type": kind, **fields})
            f.write(line + b"\n")
            prev, size = line_hash(line), size + len(line) + 1
    receipt = build_receipt(
        tally,
        ledger_path=ledger,
        head=prev,
        count=len(events),
        size=size,
        evidence=evidence,
        version="0.0.0",
        end={
            "reason": "killed",
            "exit_status": -9,
            "cap": None,
            "evidence": evidence,
            "ts": "2026-11-01T00:01:00.000Z",
            "mono_ms": 990,
        },
    )
    write_receipt(folder / "receipt.json", receipt)
    return folder / "receipt.json"


START = (
    "session.start",
    {
        "run_id": "run-x",
        "docket_version": "0.0.0",
        "policy_digest": "sha256:" + hashlib.sha256(b"p").hexdigest(),
        "pricing": {"table_date": None, "provenance": None},
        "caps": {},
    },
)
LOST = {
    "ledger_complete": False,
    "unwritten_events": 1,
    "first_failing_seq": 4,
    "write_failures": 1,
}


def test_a_call_id_asked_twice_and_never_closed_is_one_open_call(tmp_path):
    """Section 7.5: calls are told apart by call_id; the first request since its last close."""
    request = {"call_id": "c1", "model": "m"}
    events = [START, ("model.request", request), ("model.request", request), ("x.note", {})]
    receipt = write_run(tmp_path, events, LOST)
    stated = json.loads(receipt.read_text())["ops"]["open_calls"]
    assert stated == [{"call_id": "c1", "seq": 1}]
    assert verify(receipt).ok  # the reference reads it so
    out = judged(node(receipt, "--json"))
    assert (out["verdict"], out["code"]) == ("ok", None), out["message"]


def test_bytes_after_an_unverified_tail_are_not_read(tmp_path):
    """Section 8 step 5: with unverified_tail the pass stops at ledger.events lines, so a
    torn write after them is reported as unverified bytes, not as torn_tail."""
    receipt = write_run(tmp_path, [START, ("x.note", {})], LOST | {"first_failing_seq": 2})
    doc = json.loads(receipt.read_text())
    doc["ops"]["evidence"]["unverified_tail"] = True
    receipt.write_text(json.dumps(doc))
    with open(tmp_path / "ledger.jsonl", "ab") as f:
        f.write(b'{"v":1,"seq":2,"ts":"2026')
    out = judged(node(receipt, "--json"))
    assert (out["verdict"], out["tail_bytes"]) == ("ok", 25), out["message"]
    assert "25 bytes past the record" in out["message"]


def test_docket_verify_reads_no_byte_after_an_unverified_tail(tmp_path):
    """The same case through the Python verifier (no node needed): it used to say
    torn_tail at seq 2, failing the one run unverified_tail exists for (a write that
    failed and could not be cut back), where the spec says those bytes are not read."""
    receipt = write_run(tmp_path, [START, ("x.note", {})], LOST | {"first_failing_seq": 2})
    doc = json.loads(receipt.read_text())
    doc["ops"]["evidence"]["unverified_tail"] = True
    receipt.write_text(json.dumps(doc))
    with open(tmp_path / "ledger.jsonl", "ab") as f:
        f.write(b'{"v":1,"seq":2,"ts":"2026')
    result = verify(receipt)
    assert result.ok, result
    assert result.tail_bytes == 25


def test_a_receipt_with_a_duplicate_name_and_a_syntax_error_is_not_json(tmp_path):
    """Section 8 step 2: whether it is JSON is decided over the whole text first."""
    (tmp_path / "r.json").write_text('{"format":"docket-receipt-1","format":"x"} trailing')
    one_line_input_error(node(tmp_path / "r.json"), "receipt_not_json")
    (tmp_path / "r.json").write_text('{"format":"docket-receipt-1","format":"x"}')
    done = node(tmp_path / "r.json", "--json")
    assert (judged(done)["code"], done.returncode) == ("receipt_malformed", 1)


# ---------------------------------------------------------------- the vectors can fail it


@pytest.mark.parametrize(
    ("check", "disabled", "vector"),
    [
        ("=== size) jfail(", "=== -1) jfail(", "duplicate-key-rechained"),
        ("if (prev !== chain.head) throw", "if (false) throw", "changed-prev"),
        ("if (++D > MAX_DEPTH) jfail", "if (++D < 0) jfail", "too-deep-rechained"),
        ("if (mono < chain.lastMono) throw", "if (false) throw", "mono-regression-rechained"),
    ],
)
def test_a_verifier_with_a_check_removed_fails_its_vector(tmp_path, check, disabled, vector):
    """The vectors catch a verifier that skips a check: the same file with one check disabled."""
    source = VERIFIER.read_text(encoding="utf-8")
    assert check in source, check
    broken = tmp_path / "verify.mjs"
    broken.write_text(source.replace(check, disabled), encoding="utf-8")
    want = BY_NAME[vector]
    out = judged(node(*vector_args(want), "--json", script=broken))
    assert (out["code"], out["seq"]) != (want["code"], want["seq"]), out


# ---------------------------------------------------------------- edges, judged as the reference does


def reference(receipt: Path, ledger: Path | None) -> tuple:
    from docket.receipts.verify import VerifyInputError

    try:
        v = verify(receipt, ledger)
    except VerifyInputError as exc:
        return "input_error", exc.code, None, None, None
    return ("ok" if v.ok else "fail"), v.code, v.seq, v.offset, v.field


BASIC = VECTORS / "ok-basic"
FIRST_LINE = (BASIC / "ledger.jsonl").read_bytes().split(b"\n")[0]


def edit_receipt(**changes) -> bytes:
    doc = json.loads((BASIC / "receipt.json").read_text())
    doc.update(changes)
    return json.dumps(doc).encode()


EDGES = {
    # A line of 64 MiB + 1 bytes after a good first line, then one past 64 MiB with no newline.
    "huge-line": (None, FIRST_LINE + b"\n" + b"x" * ((64 << 20) + 1) + b"\n"),
    "huge-torn-tail": (None, FIRST_LINE + b"\n" + b'{"v":1' + b" " * (64 << 20)),
    "nul-in-a-line": (None, FIRST_LINE + b"\n" + FIRST_LINE.replace(b"run-", b"run\x00") + b"\n"),
    "crlf-first-line": (None, FIRST_LINE + b"\r\n"),
    "integer-past-2^53": (edit_receipt(duration_ms=2**53), None),
    "negative-integer": (edit_receipt(duration_ms=-1), None),
    "integer-as-1.0": (edit_receipt(duration_ms=1.0), None),
    "escaped-name-twice": (
        (BASIC / "receipt.json")
        .read_bytes()
        .replace(b'"run_id"', b'"run_\\u0069d": "a", "run_id"'),
        None,
    ),
    "deep-receipt": (b'{"format": "docket-receipt-1", "x": ' + b"[" * 70 + b"]" * 70 + b"}", None),
    "lone-surrogate": (b'{"format": "docket-receipt-1", "x": "\\udc00"}', None),
    "big-number-format": (b'{"format": 1e400}', None),
    "bounded-number-format": (b'{"format": 1e300}', None),
}


# What the spec's text says of each (the reference must say it too).
EDGE_CODES = {
    "huge-line": "malformed_line",  # section 3.1: no line past 64 MiB is read
    "huge-torn-tail": "malformed_line",  # section 4 step 1: past 64 MiB, tail or not
    "nul-in-a-line": "malformed_line",  # a control character in a string
    "crlf-first-line": "count_mismatch",  # CR is JSON whitespace, and hashed: one line
    "integer-past-2^53": "receipt_malformed",  # rule 2.1.6
    "negative-integer": "receipt_malformed",
    "integer-as-1.0": "receipt_malformed",  # 1.0 is not an integer
    "escaped-name-twice": "receipt_malformed",  # rule 2.1.3 after unescaping
    "deep-receipt": "receipt_malformed",  # rule 2.1.4
    "lone-surrogate": "receipt_not_json",  # rule 2.1.5
    "big-number-format": "receipt_malformed",  # rule 2.1.7: past 10^300, before the format
    "bounded-number-format": "not_a_receipt",
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_an_edge_is_judged_as_the_reference_judges_it(tmp_path, name):
    receipt_bytes, ledger_bytes = EDGES[name]
    receipt, ledger = tmp_path / "receipt.json", tmp_path / "ledger.jsonl"
    receipt.write_bytes(receipt_bytes or (BASIC / "receipt.json").read_bytes())
    ledger.write_bytes(ledger_bytes or (BASIC / "ledger.jsonl").read_bytes())
    out = judged(node(receipt, "--ledger", ledger, "--json"))
    got = (out["verdict"], out["code"], out["seq"], out["offset"], out["field"])
    assert out["code"] == EDGE_CODES[name], out["message"]
    assert got == reference(receipt, ledger), out["message"]


# ---------------------------------------------------------------- attestations (spec/docket-attestation-1.md)

ATTESTATIONS = json.loads((VECTORS / "attestations.json").read_text(encoding="utf-8"))["vectors"]
ATTEST_BY_NAME = {v["name"]: v for v in ATTESTATIONS}


def attestation_args(vector: dict) -> list[str | Path]:
    return [VECTORS / vector["run"], "--attestation", VECTORS / vector["attestation"],
            "--pubkey", VECTORS / vector["pubkey"]]  # fmt: skip


@pytest.fixture(scope="module")
def attestation_answers() -> dict[tuple[str, bool], subprocess.CompletedProcess]:
    """{(vector name, as JSON?): what verify.mjs answered}: one Node process for all."""
    keys = [(name, as_json) for name in sorted(ATTEST_BY_NAME) for as_json in (True, False)]
    jobs = [attestation_args(ATTEST_BY_NAME[n]) + (["--json"] if j else []) for n, j in keys]
    return dict(zip(keys, node_each(jobs), strict=True))


@pytest.mark.parametrize("name", sorted(ATTEST_BY_NAME))
def test_attestation_vector(name, attestation_answers):
    vector = ATTEST_BY_NAME[name]
    out = judged(attestation_answers[name, True])
    keys = ["verdict", "exit", "code", "seq", "offset", "field"]
    if vector["verdict"] == "ok":
        keys += ["events", "head", "bytes"]
    assert {k: out[k] for k in keys} == {k: vector[k] for k in keys}, out["message"]
    line = attestation_answers[name, False]
    assert line.returncode == vector["exit"], (line.stdout, line.stderr)
    if vector["verdict"] == "ok":
        assert line.stdout.startswith("attested ") and line.stdout.count("\n") == 1
    elif vector["verdict"] == "fail":
        assert line.stdout.startswith(f"FAIL {vector['code']}") and line.stderr == ""
    else:
        assert line.stdout == "" and line.stderr.count("\n") == 1
        assert line.stderr.rstrip().endswith(f"({vector['code']})"), line.stderr


def test_an_attested_ok_line_is_what_docket_verify_prints():
    args = [str(a) for a in attestation_args(ATTEST_BY_NAME["attest-ok"])]
    ours = node(*args)
    theirs = subprocess.run([sys.executable, "-m", "docket", "verify", *args],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout) == (0, ours.stdout)


def test_a_huge_envelope_is_refused_after_one_bounded_read(tmp_path):
    huge = tmp_path / "attestation.dsse.json"
    with open(huge, "wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of zeros, not read
    args = attestation_args(ATTEST_BY_NAME["attest-ok"])
    args[2] = huge
    one_line_input_error(node(*args), "attestation_too_large")


def test_attestation_without_pubkey_is_a_usage_error():
    done = node(VECTORS / "ok-basic", "--attestation", VECTORS / "attest-ok/attestation.dsse.json")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
