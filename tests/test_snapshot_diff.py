"""`docket restore RUN --diff`: a real `docket run --snapshot` whose agent edits a text
file, rewrites a binary one, grows one past 1 MiB, makes one and deletes one; the diff
shows each the way it must, and writes nothing (the tree and the run folder are read
back byte for byte)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from snapshot_helpers import fingerprint

DOCKET = [sys.executable, "-m", "docket"]
BINARY = bytes(range(256)) * 8
BIG = b"x" * (1 << 20) + b"\n"  # one byte over 1 MiB once the agent appends

AGENT = r"""
import os
open("notes.txt", "w").write("line one\nline 2\nline three\nline four")
open("blob.bin", "wb").write(bytes(range(255, -1, -1)) * 8)
open("big.txt", "a").write("y\n")
open("made.txt", "w").write("made by the run\n")
os.remove("gone.txt")
os.symlink("notes.txt", "alias")
"""


@pytest.fixture(scope="module")
def snapshot_run(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("diff")
    tree = base / "tree"
    tree.mkdir()
    (tree / "notes.txt").write_text("line one\nline two\nline three\n")
    (tree / "blob.bin").write_bytes(BINARY)
    (tree / "big.txt").write_bytes(BIG)
    (tree / "gone.txt").write_text("keep me\n")
    (tree / "same.txt").write_text("untouched\n")
    agent = base / "agent.py"
    agent.write_text(AGENT)
    run = base / "runs" / "r1"
    proc = subprocess.run(
        [*DOCKET, "run", "--quiet", "--ledger-dir", str(run), f"--snapshot={tree}",
         "--", sys.executable, str(agent)],
        cwd=tree, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return tree, run


def diff(run: Path, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*DOCKET, "restore", str(run), "--diff", *more], capture_output=True, text=True, timeout=60
    )


def test_diff_shows_text_binary_big_made_and_deleted_files_and_writes_nothing(snapshot_run):
    tree, run = snapshot_run
    tree_before, run_before = fingerprint(tree), fingerprint(run)
    proc = diff(run)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # text: a unified diff, the snapshot's lines as "-", the file now as "+"
    assert "write notes.txt\n--- a/notes.txt (snapshot)\n+++ b/notes.txt (now)\n" in out
    assert "-line two\n+line 2\n" in out and "+line four\n\\ No newline at end of file" in out
    # binary: sizes and digests, no lines of it
    now_blob = bytes(range(255, -1, -1)) * 8
    assert "write blob.bin: binary, digests only" in out
    assert f"snapshot: 2048 bytes, sha256 {hashlib.sha256(BINARY).hexdigest()}" in out
    assert f"now:      2048 bytes, sha256 {hashlib.sha256(now_blob).hexdigest()}" in out
    # over 1 MiB: digests only, said so
    assert "write big.txt: over 1048576 bytes, digests only" in out
    assert f"sha256 {hashlib.sha256(BIG + b'y' + bytes([10])).hexdigest()}" in out
    assert "xxxxxxxx" not in out
    # made by the run: what a restore deletes; deleted by it: what it writes back
    assert "delete made.txt (not in the snapshot)\n--- /dev/null\n+++ b/made.txt (now)" in out
    assert "+made by the run" in out
    assert "write gone.txt (absent now)\n--- a/gone.txt (snapshot)\n+++ /dev/null" in out
    assert "delete alias (a link to notes.txt: not in the snapshot)" in out
    assert "same.txt" not in out
    assert "nothing was written" in out
    assert fingerprint(tree) == tree_before and fingerprint(run) == run_before
    assert not (run / "restore.json").exists()


def test_diff_takes_only_and_names_a_conflict(snapshot_run):
    tree, run = snapshot_run
    proc = diff(run, "--only", "notes.txt")
    assert proc.returncode == 0, proc.stderr
    assert "notes.txt" in proc.stdout and "blob.bin" not in proc.stdout
    original = (tree / "notes.txt").read_bytes()
    (tree / "notes.txt").write_text("edited after the run\n")
    try:
        proc = diff(run, "--only", "notes.txt")
        assert proc.returncode == 1
        assert "conflict notes.txt:" in proc.stdout and "--- a/notes.txt" not in proc.stdout
        forced = diff(run, "--only", "notes.txt", "--force")
        assert forced.returncode == 0
        assert "-line two\n-line three\n+edited after the run\n" in forced.stdout
    finally:
        (tree / "notes.txt").write_bytes(original)


def test_a_damaged_object_is_said_not_shown(snapshot_run, tmp_path):
    tree, run = snapshot_run
    want = hashlib.sha256(b"keep me\n").hexdigest()
    store = run.parent / ".docket-snapshot-store"
    obj = store / "objects" / want[:2] / want[2:]
    os.chmod(obj, 0o600)
    original = obj.read_bytes()
    obj.write_bytes(b"tampered\n")
    try:
        proc = diff(run, "--only", "gone.txt")
        assert proc.returncode == 0, proc.stderr
        assert "cannot show (object" in proc.stdout and "do not hash to its name" in proc.stdout
        assert "tampered" not in proc.stdout
    finally:
        obj.write_bytes(original)


def test_diff_with_apply_or_on_a_plain_folder_is_one_line_exit_2(snapshot_run, tmp_path):
    _, run = snapshot_run
    proc = diff(run, "--apply")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--diff shows what --apply would change" in proc.stderr
    proc = diff(tmp_path)
    assert proc.returncode == 2 and "no ledger.jsonl" in proc.stderr
