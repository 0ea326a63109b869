"""The CLI's bad-input contract: every verb that reads a file, handed a bad one,
says so in exactly one line on stderr and exits 2, never with a traceback.

Run as real subprocesses (`python -m docket ...`), each with a timeout.
A verb that takes a file joins the contract with one row in FILE_VERBS.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import trio

from docket import __version__
from docket.cli import build_parser

MiB = 1024 * 1024
TIMEOUT = 60  # seconds; a generous bound for a 2-core machine shared with other runs


def docket(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "docket", *args],
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.fixture(scope="module")
def valid_receipt(tmp_path_factory) -> str:
    """A real receipt, so that a bad --ledger is what the verb trips on."""
    from docket.demo import record_run

    folder = tmp_path_factory.mktemp("valid")
    _ledger, receipt = trio.run(record_run, folder)
    return str(receipt)


# verb -> how to hand it the bad file (and, if it needs one, a good file beside it).
FILE_VERBS = {
    "verify RECEIPT": lambda bad, request: ["verify", bad],
    "verify --ledger": lambda bad, request: [
        "verify",
        request.getfixturevalue("valid_receipt"),
        "--ledger",
        bad,
    ],
    "doctor LEDGER": lambda bad, request: ["doctor", bad],
    "doctor --quarantine-torn-tail": lambda bad, request: ["doctor", bad, "--quarantine-torn-tail"],
}


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad")
    (folder / "a-directory").mkdir()
    (folder / "empty").write_bytes(b"")
    junk = random.Random(20261129).randbytes(64 * 1024)
    (folder / "random-bytes").write_bytes(junk)
    with open(folder / "one-50MB-line", "wb") as f:
        block = b"the quick brown fox jumps over the lazy dog " * 1024
        for _ in range(50 * MiB // len(block) + 1):
            f.write(block)
        f.write(b"\n")
    with open(folder / "one-50MB-line-that-starts-like-a-ledger", "wb") as f:
        f.write(b'{"v":1,"seq":0,"ts":"')
        f.write(b"x" * 50 * MiB)
        f.write(b'"}\n')
    return folder


BAD = [
    "missing",
    "a-directory",
    "empty",
    "random-bytes",
    "one-50MB-line",
    "one-50MB-line-that-starts-like-a-ledger",
]


def assert_one_line_refusal(result: subprocess.CompletedProcess, names: str) -> str:
    err = result.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    assert result.returncode == 2, (result.returncode, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("docket: ")
    assert names in err, f"the message should name {names}: {err}"
    out = result.stdout.decode("utf-8", "replace")
    assert out.count("\n") <= 1, out
    return err


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("verb", list(FILE_VERBS))
def test_a_bad_input_file_is_one_line_and_exit_2(request, bad_files, verb, bad):
    path = bad_files / bad
    result = docket(*FILE_VERBS[verb](str(path), request))
    assert_one_line_refusal(result, str(path))


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],
        ["--no-such-flag"],
        ["doctor"],
        ["doctor", "ledger.jsonl", "--no-such-flag"],
        ["verify", "receipt.json", "--ledger"],
        ["stub", "--kind", "nonsense"],
    ],
    ids=lambda a: " ".join(a),
)
def test_usage_errors_are_one_line_and_exit_2(args):
    result = docket(*args)
    assert_one_line_refusal(result, "")
    assert result.stdout == b""


def test_help_lists_every_verb_and_the_exit_codes():
    result = docket("--help")
    assert result.returncode == 0 and result.stderr == b""
    text = result.stdout.decode()
    verbs = build_parser()._subparsers._group_actions[0].choices
    assert {"verify", "doctor"} <= set(verbs)
    for verb in verbs:
        assert f"    {verb} " in text or f"    {verb}\n" in text, verb
    assert "exit codes:" in text and "42" in text


def test_version():
    result = docket("--version")
    assert (result.returncode, result.stderr) == (0, b"")
    assert result.stdout.decode().strip() == f"docket {__version__}"
