"""What the snapshot leaves out, watched (docket/snapshot/excluded.py): a real
`docket run --snapshot` over a real `git init` repository whose .git the command
edits or deletes; the ledger's snapshot.changes read from disk, the run's last lines
read from its stderr; and the identity step's bounds on the trees it must not walk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import read_events

from docket.snapshot import excluded as ex
from docket.snapshot.confine import Tree
from docket.snapshot.run import changes, take

DOCKET = [sys.executable, "-m", "docket"]
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
}  # fmt: skip


def git_repo(root: Path) -> Path:
    root.mkdir()
    (root / "README").write_text("hello\n")
    for args in (["init", "-q", "-b", "main"], ["add", "README"], ["commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=root, env=GIT_ENV, check=True, timeout=30)
    return root


def docket_run(tmp_path: Path, tree: Path, code: str) -> tuple[subprocess.CompletedProcess, dict]:
    run = tmp_path / "run"
    proc = subprocess.run(
        [*DOCKET, "run", "--ledger-dir", str(run), f"--snapshot={tree}", "--",
         sys.executable, "-c", code],
        cwd=tree, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    events = read_events(run / "ledger.jsonl")
    (found,) = [e for e in events if e["type"] == "snapshot.changes"]
    return proc, found


def test_a_run_that_edits_git_head_is_on_record_and_said(tmp_path):
    tree = git_repo(tmp_path / "repo")
    proc, found = docket_run(tmp_path, tree, "open('.git/HEAD','w').write('ref: refs/heads/x\\n')")
    assert proc.returncode == 0, proc.stderr
    (changed,) = found["excluded_changed"]
    assert changed["path"] == ".git" and changed["what"] == ["head_sha256"]
    assert changed["before"]["git"]["head_sha256"] != changed["after"]["git"]["head_sha256"]
    assert found["counts"] == {"created": 0, "modified": 0, "deleted": 0, "mode_changed": 0}
    lines = proc.stderr.strip().splitlines()
    said = [line for line in lines if "changed what the snapshot excludes" in line]
    assert said and ".git (head_sha256)" in said[0], proc.stderr
    assert lines.index(said[0]) >= len(lines) - 3  # among the run's last lines


def test_a_run_that_deletes_git_is_on_record_and_said(tmp_path):
    tree = git_repo(tmp_path / "repo")
    proc, found = docket_run(tmp_path, tree, "import shutil; shutil.rmtree('.git')")
    assert proc.returncode == 0, proc.stderr
    (changed,) = found["excluded_changed"]
    assert changed["path"] == ".git" and changed["what"] == ["kind"]
    assert (changed["before"]["kind"], changed["after"]) == ("dir", {"kind": "missing"})
    assert ".git (dir -> missing)" in proc.stderr


def test_a_run_that_commits_changes_refs_and_the_index(tmp_path):
    tree = git_repo(tmp_path / "repo")
    code = (
        "import subprocess; open('new.txt','w').write('x')\n"
        "subprocess.run(['git','add','new.txt'],check=True)\n"
        "subprocess.run(['git','commit','-qm','two'],check=True)\n"
    )
    run = tmp_path / "run"
    proc = subprocess.run(
        [*DOCKET, "run", "--ledger-dir", str(run), f"--snapshot={tree}", "--",
         sys.executable, "-c", code],
        cwd=tree, capture_output=True, text=True, timeout=60, env=GIT_ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (found,) = [e for e in read_events(run / "ledger.jsonl") if e["type"] == "snapshot.changes"]
    (changed,) = found["excluded_changed"]
    assert {"refs_sha256", "index"} <= set(changed["what"]), changed
    assert "head_sha256" not in changed["what"]  # HEAD still names refs/heads/main


def test_a_run_that_does_not_touch_git_records_no_change(tmp_path):
    tree = git_repo(tmp_path / "repo")
    proc, found = docket_run(tmp_path, tree, "open('README','w').write('changed')")
    assert proc.returncode == 0, proc.stderr
    assert found["excluded_changed"] == []
    assert found["counts"]["modified"] == 1  # the snapshot's own change, as before
    assert "excludes" not in proc.stderr


# ---------------------------------------------------------------- the identity step


def snapshot_of(tmp_path: Path, tree: Path, exclude=(".git",)):
    folder = tmp_path / "folder"
    folder.mkdir(exist_ok=True)
    snap, _ = take(0, str(tree), folder, tmp_path / "store", exclude)
    return snap


def test_an_excluded_root_swapped_for_a_link_is_recorded_as_the_link(tmp_path):
    tree = git_repo(tmp_path / "repo")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "HEAD").write_text("ref: refs/heads/main\n")
    snap = snapshot_of(tmp_path, tree)
    os.rename(tree / ".git", tmp_path / "moved-git")
    os.symlink(elsewhere, tree / ".git")
    found = changes(snap)["excluded_changed"]
    assert found[0]["after"] == {"kind": "link", "target": str(elsewhere)}
    assert found[0]["what"] == ["kind"]


def test_other_excluded_roots_are_watched_by_their_top_level(tmp_path):
    tree = tmp_path / "tree"
    (tree / "node_modules" / "pkg").mkdir(parents=True)
    (tree / "node_modules" / "a.js").write_text("a")
    (tree / "keep.txt").write_text("k")
    snap = snapshot_of(tmp_path, tree, exclude=("node_modules",))
    assert changes(snap)["excluded_changed"] == []  # nothing changed yet
    snap = snapshot_of(tmp_path, tree, exclude=("node_modules",))
    (tree / "node_modules" / "a.js").write_text("a, longer now")
    (changed,) = changes(snap)["excluded_changed"]
    assert changed["path"] == "node_modules"
    assert "entries_sha256" in changed["what"]


def test_a_huge_excluded_directory_is_read_only_to_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(ex, "MAX_TOP_ENTRIES", 50)
    tree = tmp_path / "tree"
    (tree / "big").mkdir(parents=True)
    for i in range(200):
        (tree / "big" / f"{i}").write_text("x")
    with Tree(str(tree)) as t:
        got = ex.identities(t, ["big"])["big"]
    assert got["entries"] == 50 and got["truncated"] is True


def test_roots_past_the_bound_are_said_unwatched_not_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(ex, "MAX_ROOTS", 2)
    tree = tmp_path / "tree"
    for i in range(4):
        (tree / f"p{i}" / ".git").mkdir(parents=True)
    with Tree(str(tree)) as t:
        got = ex.identities(t, ["p0/.git", "p1/.git", "p2/.git", "p3/.git"])
    assert set(got) == {"p0/.git", "p1/.git", ex.MORE}
    assert got[ex.MORE]["why"].startswith("2 excluded root(s) past the first 2")
    changed = ex.excluded_changes(got, got)
    assert [c["path"] for c in changed] == [ex.MORE] and changed[0]["what"] == ["unwatched"]


def test_the_identity_step_stops_at_its_deadline(tmp_path):
    tree = tmp_path / "tree"
    (tree / "big").mkdir(parents=True)
    for i in range(20):
        (tree / "big" / f"{i}").write_text("x")
    with Tree(str(tree)) as t:
        started = time.monotonic()
        got = ex.identities(t, ["big"], seconds=0.0)
    assert time.monotonic() - started < 1.0
    assert got["big"]["kind"] == "unwatched" and "not done within" in got["big"]["why"]


@pytest.mark.parametrize("kind", ["file", "missing"])
def test_identity_of_a_file_or_nothing(tmp_path, kind):
    tree = tmp_path / "tree"
    tree.mkdir()
    if kind == "file":
        (tree / "x.log").write_text("log")
    with Tree(str(tree)) as t:
        got = ex.identities(t, ["x.log"])["x.log"]
    assert got["kind"] == kind
    if kind == "file":
        assert got["size"] == 3
    assert json.loads(json.dumps(got)) == got  # goes into the ledger as it is
