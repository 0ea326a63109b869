"""`docket run --snapshot --rollback-on-breach` and `docket restore`, end to end: real
`docket` processes, a real looping agent, the tree compared entry by entry (kind,
mode, bytes' hash, link target) and the ledger read from its bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import read_events
from snapshot_helpers import fingerprint, make_tree

DOCKET = [sys.executable, "-m", "docket"]

# Loops until stopped: rewrites, deletes, creates, chmods, swaps kinds, relinks.
LOOPING_AGENT = r"""
import itertools, os, shutil, time
for i in itertools.count():
    with open("README", "w") as f:
        f.write(f"rewritten {i}\n")
    os.chmod("src/run.sh", 0o600)
    if os.path.exists("src/pkg/mod.py"):
        os.remove("src/pkg/mod.py")
    if os.path.isdir("empty"):
        os.rmdir("empty")
        open("empty", "w").write("a file now")
    os.makedirs(f"made/{i % 4}", exist_ok=True)
    with open(f"made/{i % 4}/out.bin", "wb") as f:
        f.write(os.urandom(64))
    if os.path.lexists("link"):
        os.remove("link")
    os.symlink("/etc/passwd", "link")
    shutil.rmtree("data/sub", ignore_errors=True)
    time.sleep(0.02)
"""


def _tree(tmp_path: Path) -> Path:
    tree = make_tree(tmp_path / "tree")
    (tree / "data" / "sub").mkdir(parents=True)
    for i in range(50):
        (tree / "data" / "sub" / f"{i}.bin").write_bytes(os.urandom(100 + i))
    (tree / ".git").mkdir()
    (tree / ".git" / "HEAD").write_text("ref: x\n")
    return tree


def _run(tmp_path, tree, *flags, code=LOOPING_AGENT, timeout=60):
    agent = tmp_path / "agent.py"
    agent.write_text(code)
    run = tmp_path / "run"
    proc = subprocess.run(
        [*DOCKET, "run", "--ledger-dir", str(run), *flags, "--", sys.executable, str(agent)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, run


def test_a_looping_agent_stopped_by_a_cap_leaves_the_tree_byte_identical(tmp_path):
    tree = _tree(tmp_path)
    before = fingerprint(tree)
    proc, run = _run(
        tmp_path, tree, f"--snapshot={tree}", "--rollback-on-breach", "--max-wall-clock", "1.5"
    )
    assert proc.returncode == 42, proc.stderr
    assert fingerprint(tree) == before
    events = read_events(run / "ledger.jsonl")
    types = [e["type"] for e in events]
    assert types.index("snapshot.taken") < types.index("process.spawn")
    assert types.index("process.exit") < types.index("snapshot.changes")
    assert (
        types.index("snapshot.changes")
        < types.index("snapshot.restored")
        < types.index("session.end")
    )
    changes = next(e for e in events if e["type"] == "snapshot.changes")
    assert all(changes["counts"][k] > 0 for k in ("created", "modified", "deleted", "mode_changed"))
    assert not any(r["path"].startswith(".git") for r in changes["modified"] + changes["deleted"])
    restored = next(e for e in events if e["type"] == "snapshot.restored")
    assert restored["verified"] is True and restored["failed"] == []
    taken = next(e for e in events if e["type"] == "snapshot.taken")
    assert restored["manifest_sha256"] == taken["manifest_sha256"]
    receipt = json.loads((run / "receipt.json").read_text())
    assert receipt["snapshot"][0]["restored"] == {
        "applied": restored["applied"],
        "failed": 0,
        "verified": True,
    }
    verified = subprocess.run(
        [*DOCKET, "verify", str(run / "receipt.json")], capture_output=True, text=True, timeout=60
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_without_rollback_the_changes_stay_and_docket_restore_undoes_them(tmp_path):
    tree = _tree(tmp_path)
    before = fingerprint(tree)
    proc, run = _run(tmp_path, tree, f"--snapshot={tree}", "--max-wall-clock", "1")
    assert proc.returncode == 42, proc.stderr
    after = fingerprint(tree)
    assert after != before
    evidence = {p: (run / p).read_bytes() for p in ("ledger.jsonl", "receipt.json")}

    dry = subprocess.run([*DOCKET, "restore", str(run)], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "would write README" in dry.stdout and "would delete made" in dry.stdout
    assert fingerprint(tree) == after  # a dry run changes nothing
    report = json.loads((run / "restore.json").read_text())
    assert report["format"] == "docket/restore/v1" and report["apply"] is False
    assert report["roots"][0]["planned"] and report["roots"][0]["applied"] == []

    done = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert fingerprint(tree) == before
    report = json.loads((run / "restore.json").read_text())
    assert len(report["roots"][0]["applied"]) == len(report["roots"][0]["planned"])
    assert {p: (run / p).read_bytes() for p in evidence} == evidence  # never edits the evidence


def test_a_file_changed_after_the_run_is_a_conflict_skipped_unless_forced(tmp_path):
    tree = _tree(tmp_path)
    before = fingerprint(tree)
    proc, run = _run(tmp_path, tree, f"--snapshot={tree}", "--max-wall-clock", "1")
    assert proc.returncode == 42
    (tree / "README").write_text("my own edit, after the run\n")
    done = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "conflict README: changed after the run ended" in done.stdout
    assert (tree / "README").read_text() == "my own edit, after the run\n"
    skipped = json.loads((run / "restore.json").read_text())["roots"][0]["skipped"]
    assert [s["path"] for s in skipped] == ["README"]
    forced = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply", "--force"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert forced.returncode == 0, forced.stdout
    assert fingerprint(tree) == before


def test_only_restores_the_paths_named(tmp_path):
    tree = _tree(tmp_path)
    before = fingerprint(tree)
    proc, run = _run(tmp_path, tree, f"--snapshot={tree}", "--max-wall-clock", "1")
    assert proc.returncode == 42
    done = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply", "--only", "data/sub"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout
    now = fingerprint(tree)
    assert {p: v for p, v in now.items() if p.startswith("data")} == {
        p: v for p, v in before.items() if p.startswith("data")
    }
    assert now["README"] != before["README"]


def test_a_run_that_ends_on_its_own_is_not_rolled_back(tmp_path):
    tree = _tree(tmp_path)
    proc, run = _run(
        tmp_path,
        tree,
        f"--snapshot={tree}",
        "--rollback-on-breach",
        code="open('README','w').write('kept')",
    )
    assert proc.returncode == 0, proc.stderr
    assert (tree / "README").read_text() == "kept"
    types = [e["type"] for e in read_events(run / "ledger.jsonl")]
    assert "snapshot.changes" in types and "snapshot.restored" not in types


def test_rollback_without_snapshot_and_restore_of_a_plain_run_are_usage_errors(tmp_path):
    tree = _tree(tmp_path)
    proc, run = _run(tmp_path, tree, "--rollback-on-breach", code="pass")
    assert proc.returncode == 2 and "needs --snapshot" in proc.stderr
    proc, run = _run(tmp_path, tree, code="pass")
    assert proc.returncode == 0
    r = subprocess.run([*DOCKET, "restore", str(run)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "took no snapshot" in r.stderr
    r = subprocess.run(
        [*DOCKET, "restore", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_verify_checks_the_receipts_snapshot_section_against_the_ledger(tmp_path):
    tree = _tree(tmp_path)
    proc, run = _run(
        tmp_path, tree, f"--snapshot={tree}", "--rollback-on-breach", "--max-wall-clock", "1"
    )
    assert proc.returncode == 42, proc.stderr
    path = run / "receipt.json"
    good = json.loads(path.read_text())
    for edit, field in (
        (
            lambda r: r["snapshot"][0]["restored"].update(verified=False),
            "snapshot[0].restored.verified",
        ),
        (lambda r: r["snapshot"][0]["changes"].update(deleted=0), "snapshot[0].changes.deleted"),
        (lambda r: r.pop("snapshot"), "snapshot"),
    ):
        forged = json.loads(json.dumps(good))
        edit(forged)
        path.write_text(json.dumps(forged))
        v = subprocess.run(
            [*DOCKET, "verify", str(path)], capture_output=True, text=True, timeout=60
        )
        assert v.returncode == 1 and "snapshot_mismatch" in v.stdout and field in v.stdout, v.stdout


def test_the_policys_snapshot_exclude_is_left_out_and_never_rolled_back(tmp_path):
    tree = _tree(tmp_path)
    (tree / "build.log").write_text("old log\n")
    policy = tmp_path / "docket.toml"
    policy.write_text('[snapshot]\nexclude = ["*.log"]\n')  # .git is snapshotted now
    code = (
        "import time\nopen('build.log','w').write('new log')\n"
        "open('.git/HEAD','w').write('ref: other')\ntime.sleep(60)\n"
    )
    flags = ["--policy", str(policy), f"--snapshot={tree}", "--rollback-on-breach"]
    proc, run = _run(tmp_path, tree, *flags, "--max-wall-clock", "1", code=code)
    assert proc.returncode == 42, proc.stderr
    assert (tree / "build.log").read_text() == "new log"  # excluded: not the snapshot's to undo
    assert (tree / ".git" / "HEAD").read_text() == "ref: x\n"  # included: rolled back
    taken = next(e for e in read_events(run / "ledger.jsonl") if e["type"] == "snapshot.taken")
    assert taken["exclude"] == ["*.log"]


def test_the_default_run_folder_and_other_runs_evidence_are_left_out(tmp_path):
    tree = _tree(tmp_path)
    old = tree / "docket-runs" / "an-earlier-run"
    old.mkdir(parents=True)
    (old / "ledger.jsonl").write_text("another run's evidence\n")
    agent = tmp_path / "agent.py"
    agent.write_text("open('docket-runs/an-earlier-run/ledger.jsonl','a').write('more\\n')\n")
    proc = subprocess.run(
        [*DOCKET, "run", "--snapshot", "--", sys.executable, str(agent)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    (run,) = [p for p in (tree / "docket-runs").iterdir() if p.name.startswith("2")]
    record = json.loads((run / "snapshots" / "0.json").read_text())
    assert not any(p.startswith("docket-runs") for p in record["entries"])
    changes = next(e for e in read_events(run / "ledger.jsonl") if e["type"] == "snapshot.changes")
    assert changes["counts"] == {"created": 0, "modified": 0, "deleted": 0, "mode_changed": 0}


def test_restore_refuses_a_snapshot_record_that_is_empty_binary_or_deep(tmp_path):
    tree = _tree(tmp_path)
    proc, run = _run(tmp_path, tree, f"--snapshot={tree}", code="open('README','w').write('x')")
    assert proc.returncode == 0
    record = run / "snapshots" / "0.json"
    for bad in (b"", b"\x00\xff\xfe binary", b"[" * 100_000 + b"]" * 100_000, b'{"format": 7}'):
        record.write_bytes(bad)
        r = subprocess.run(
            [*DOCKET, "restore", str(run), "--apply"], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 2 and r.stderr.startswith("docket: restore: snapshot 0:"), r.stderr
        assert r.stderr.count("\n") == 1
    assert (tree / "README").read_text() == "x"


def test_restore_after_a_run_that_never_recorded_its_changes_plans_every_difference(tmp_path):
    """The supervisor killed mid-run: the ledger ends before snapshot.changes (a valid
    prefix), so restore compares the tree with the snapshot itself, and says so."""
    tree = _tree(tmp_path)
    before = fingerprint(tree)
    proc, run = _run(tmp_path, tree, f"--snapshot={tree}", "--max-wall-clock", "1")
    assert proc.returncode == 42
    ledger = run / "ledger.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if b'"type":"process.spawn"' in line)
    ledger.write_bytes(b"".join(lines[: cut + 1]))
    done = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "note: the ledger has no snapshot.changes" in done.stdout
    assert fingerprint(tree) == before
    assert json.loads((run / "restore.json").read_text())["roots"][0]["notes"]


def test_an_incomplete_rollback_is_a_warning_before_the_last_line(tmp_path):
    """The agent rewrites a file and deletes the store's objects: the rollback cannot
    bring the file back, says so in snapshot.restored (the step failed, the path named
    among the differences), and `docket run` prints it before its last line."""
    tree = _tree(tmp_path)
    code = (
        "import os, shutil, time\nopen('README', 'w').write('agent')\n"
        f"shutil.rmtree({str(tmp_path / '.docket-snapshot-store' / 'objects')!r})\n"
        "time.sleep(60)\n"
    )
    proc, run = _run(
        tmp_path,
        tree,
        f"--snapshot={tree}",
        "--rollback-on-breach",
        "--max-wall-clock",
        "1",
        code=code,
    )
    assert proc.returncode == 42
    restored = next(
        e for e in read_events(run / "ledger.jsonl") if e["type"] == "snapshot.restored"
    )
    assert restored["verified"] is False and restored["failed"]
    assert [d["path"] for d in restored["differences"]] == ["README"]
    assert "docket: warning: the rollback of" in proc.stderr
    assert "1 path(s) are not as in the snapshot" in proc.stderr


def test_explain_judges_write_scope_from_a_real_snapshot_run(tmp_path):
    """docket explain's write-scope finding, read from the snapshot.changes a real
    --snapshot run wrote: a path changed outside [explain] write_scope is named, one
    inside it is not."""
    tree = _tree(tmp_path)
    code = (
        "import os\n"
        "open('src/inside.py', 'w').write('x = 1\\n')\n"
        "open('outside.txt', 'w').write('not in scope\\n')\n"
    )
    proc, run = _run(tmp_path, tree, f"--snapshot={tree}", code=code)
    assert proc.returncode == 0, proc.stderr
    policy = tmp_path / "explain.toml"
    policy.write_text('[explain]\nwrite_scope = ["src"]\n')
    found = subprocess.run(
        [*DOCKET, "explain", str(run), "--policy", str(policy), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    report = json.loads(found.stdout)
    scope = [f for f in report["findings"] if f["pattern"] == "write-scope"]
    assert len(scope) == 1, report
    assert scope[0]["evidence"]["outside_scope"] == ["created outside.txt"]
    assert "write-scope" not in report.get("not_judged", {})
