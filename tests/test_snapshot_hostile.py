"""What an agent of the same user can do to the snapshot store, the run folder's records and
the tree, driven in-process against a real rollback and
a real `docket restore`: FIFOs where files are read, trees deeper than Python's recursion,
paths longer than PATH_MAX, names that are not UTF-8, records edited to point elsewhere.

Every blocking hazard runs in a thread joined with a deadline: a test that would hang
fails instead (and the FIFO is opened for writing afterwards, so the thread ends)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio
from helpers import read_events
from snapshot_helpers import fingerprint, make_tree, snapshot_of

from docket.errors import InputError
from docket.ledger.writer import open_ledger
from docket.snapshot.command import restore_command
from docket.snapshot.run import changes, rollback, take

DEADLINE = 10.0  # seconds: far above what each step takes, far below a hang


@pytest.fixture(autouse=True)
def _gone_after(tmp_path):
    """The trees here are deeper than pytest's own (recursive) clean-up can remove."""
    yield
    subprocess.run(["rm", "-rf", "--", str(tmp_path)], check=False, timeout=60)


def bounded(fn, *args, fifos: tuple[Path, ...] = (), **kwargs):
    """fn(*args) in a thread; its result (or exception). Fails the test if it has not
    ended within DEADLINE, after releasing any reader blocked on one of `fifos`."""
    out: dict = {}

    def body():
        try:
            out["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test below
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(DEADLINE)
    if thread.is_alive():
        for fifo in fifos:  # a writer appears: a reader blocked in open() goes on
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                continue  # no reader on this one
        thread.join(DEADLINE)
        pytest.fail(f"{fn.__name__} did not end within {DEADLINE} s")
    out["seconds"] = time.monotonic() - started
    if "error" in out:
        raise out["error"]
    return out["result"]


def run_folder(tmp_path: Path, tree: Path, change, *, scanned: bool = True) -> tuple[Path, object]:
    """A run's folder as `docket run --snapshot` leaves it (its ledger written by the real
    writer): the snapshot taken, `change(tree)` done as the agent, the change scan recorded
    (`scanned=False`: the supervisor died first, so the ledger has no snapshot.changes)."""
    folder = tmp_path / "run"
    folder.mkdir()
    snap, taken = take(0, str(tree), folder, tmp_path / "store")
    change(tree)
    found = changes(snap)

    async def write() -> None:
        async with open_ledger(folder / "ledger.jsonl") as ledger:
            await ledger.append("session.start")
            await ledger.append("snapshot.taken", **taken)
            if scanned:
                await ledger.append("snapshot.changes", **found)
                await ledger.append("session.end")

    trio.run(write)
    return folder, snap


def restore(folder: Path, *, apply: bool = False, only=None, force: bool = False):
    code = bounded(restore_command, str(folder), apply=apply, only=only, force=force)
    return code, json.loads((folder / "restore.json").read_text())


# ------------------------------------------------------------------ item 2: FIFOs where files are read


def test_a_store_object_swapped_for_a_fifo_fails_its_step_and_the_rollback_ends(tmp_path):
    tree = make_tree(tmp_path / "tree")
    snap = snapshot_of(tmp_path, tree)
    (tree / "README").write_text("changed by the run\n")
    changes(snap)
    obj = snap.store.object_path(snap.before.entries["README"].sha256)
    obj.unlink()
    os.mkfifo(obj)
    fields = bounded(rollback, snap, fifos=(obj,))
    assert [f["path"] for f in fields["failed"]] == ["README"]
    assert "not a regular file" in fields["failed"][0]["why"]
    assert fields["verified"] is False
    assert [d["path"] for d in fields["differences"]] == ["README"]
    assert (tree / "README").read_text() == "changed by the run\n"


def test_a_fifo_planted_under_an_objects_name_before_the_snapshot_is_replaced(tmp_path):
    """A shared store: a previous run's agent plants a FIFO where README's object goes."""
    tree = make_tree(tmp_path / "tree")
    sha = hashlib.sha256((tree / "README").read_bytes()).hexdigest()
    planted = tmp_path / "store" / "objects" / sha[:2] / sha[2:]
    planted.parent.mkdir(parents=True)
    os.mkfifo(planted)
    snap = snapshot_of(tmp_path, tree)
    assert stat.S_ISREG(planted.lstat().st_mode)
    (tree / "README").write_text("changed by the run\n")
    changes(snap)
    assert bounded(rollback, snap, fifos=(planted,))["verified"] is True


@pytest.mark.parametrize("where", ["", "objects", "tmp"])
def test_a_store_planted_as_a_symlink_out_is_refused_before_anything_is_copied(tmp_path, where):
    """A previous run's agent makes the shared store (or its objects/ or tmp/) a link to
    elsewhere: the next snapshot would write the tree's copies there."""
    from docket.snapshot.store import StoreError

    tree = make_tree(tmp_path / "tree")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = tmp_path / "store"
    if where:
        store.mkdir()
    os.symlink(elsewhere, store / where if where else store)
    with pytest.raises(StoreError, match="not followed"):
        take(0, str(tree), tmp_path / "run", store)
    assert list(elsewhere.iterdir()) == []


def test_a_store_folder_swapped_for_a_symlink_is_not_followed(tmp_path):
    tree = make_tree(tmp_path / "tree")
    snap = snapshot_of(tmp_path, tree)
    (tree / "README").write_text("changed by the run\n")
    changes(snap)
    sha = snap.before.entries["README"].sha256
    elsewhere = tmp_path / "elsewhere"
    os.rename(snap.store.root / "objects" / sha[:2], elsewhere)
    os.symlink(elsewhere, snap.store.root / "objects" / sha[:2])
    fields = bounded(rollback, snap)
    assert fields["failed"] and fields["verified"] is False


def test_restore_refuses_a_fifo_record_in_bounded_time(tmp_path):
    tree = make_tree(tmp_path / "tree")
    folder, _ = run_folder(tmp_path, tree, lambda t: (t / "README").write_text("x"))
    record = folder / "snapshots" / "0.json"
    record.unlink()
    os.mkfifo(record)
    with pytest.raises(InputError, match="not a regular file"):
        bounded(restore_command, str(folder), apply=False, only=None, force=False, fifos=(record,))


def test_restore_refuses_a_fifo_ledger_in_bounded_time(tmp_path):
    tree = make_tree(tmp_path / "tree")
    folder, _ = run_folder(tmp_path, tree, lambda t: (t / "README").write_text("x"))
    ledger = folder / "ledger.jsonl"
    ledger.unlink()
    os.mkfifo(ledger)
    with pytest.raises(InputError, match="ledger"):
        bounded(restore_command, str(folder), apply=False, only=None, force=False, fifos=(ledger,))


# ------------------------------------------------------------------ item 3: deep trees


def _deep(base: Path, levels: int) -> Path:
    """`levels` nested directories under base (made relative to a directory fd: the
    whole path is longer than the kernel takes), a file at the bottom."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        with open(os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("deep\n")
    finally:
        os.close(fd)
    return base


def test_a_tree_deeper_than_the_bound_before_the_run_is_snapshotted_to_the_bound(tmp_path):
    tree = make_tree(tmp_path / "tree")
    (tree / "deep").mkdir()
    _deep(tree / "deep", 1000)
    snap = bounded(snapshot_of, tmp_path, tree)
    assert any("deeper than" in s["why"] for s in snap.skipped), snap.skipped
    (tree / "README").write_text("changed\n")
    bounded(changes, snap)
    fields = bounded(rollback, snap)
    assert fields["verified"] is True, fields
    assert (tree / "README").read_text() == "read me\n"


# 1,000 levels is the reproduction (past Python's recursion limit); every level
# is a mkdir and an rmdir at some 2 ms each on the test disk, so the fast suite takes 300
# (past MAX_DEPTH, 256: the bound and the removal below it are the same code).
LEVELS = [300, pytest.param(1000, marks=pytest.mark.slow)]


@pytest.mark.parametrize("levels", LEVELS)
def test_a_deep_tree_the_run_made_is_removed_by_the_rollback(tmp_path, levels):
    tree = make_tree(tmp_path / "tree")
    before = fingerprint(tree)
    snap = snapshot_of(tmp_path, tree)
    (tree / "made").mkdir()
    _deep(tree / "made", levels)
    found = bounded(changes, snap)
    assert found["counts"]["created"] >= 1
    fields = bounded(rollback, snap)
    assert fields["verified"] is True, fields
    assert fingerprint(tree) == before


@pytest.mark.parametrize("levels", LEVELS)
def test_restore_plans_and_undoes_a_deep_tree_the_run_made(tmp_path, levels):
    """The supervisor died before its change scan: restore scans the tree itself."""
    tree = make_tree(tmp_path / "tree")
    before = fingerprint(tree)

    def change(t):
        (t / "made").mkdir()
        _deep(t / "made", levels)

    folder, _ = run_folder(tmp_path, tree, change, scanned=False)
    code, report = restore(folder)  # the dry run: planned, nothing done
    assert code == 0 and report["roots"][0]["planned"][0]["path"].startswith("made/d/")
    code, report = restore(folder, apply=True, force=True)
    assert code == 0, report
    assert fingerprint(tree) == before


# ------------------------------------------------------------------ item 7: what the run added, whatever it is


def test_non_utf8_names_a_fifo_and_a_renamed_file_are_undone_and_verified(tmp_path):
    tree = make_tree(tmp_path / "tree")
    before = fingerprint(tree)
    snap = snapshot_of(tmp_path, tree)
    raw = os.fsencode(tree)
    os.mkdir(raw + b"/evil\xff")
    Path(os.fsdecode(raw + b"/evil\xff/payload.sh")).write_text("rm -rf ~\n")
    os.mkfifo(tree / "pipe")
    os.rename(tree / "README", os.fsdecode(raw + b"/READ\xfeME"))
    found = changes(snap)
    created = [row["path"] for row in found["created"]]
    assert "evil\\xff" in created and "evil\\xff/payload.sh" in created
    assert "READ\\xfeME" in created
    pipe = next(row for row in found["created"] if row["path"] == "pipe")
    assert pipe["after"] == {"kind": "other", "type": "fifo"}
    fields = bounded(rollback, snap)
    assert fields["verified"] is True, fields
    assert fields["differences"] == []
    assert fingerprint(tree) == before
    assert sorted(os.listdir(raw)) == sorted(os.fsencode(n) for n in os.listdir(tree))
    assert not any(b"\xff" in n or b"\xfe" in n for n in os.listdir(raw))


def test_a_fifo_or_file_left_after_the_rollback_makes_it_unverified_and_named(tmp_path):
    tree = make_tree(tmp_path / "tree")
    snap = snapshot_of(tmp_path, tree)
    (tree / "README").write_text("changed\n")
    changes(snap)
    # made after the change scan (by a process outside the run): not undone, so named
    os.mkfifo(tree / "late-pipe")
    (tree / "late.txt").write_text("late\n")
    fields = bounded(rollback, snap)
    assert fields["verified"] is False
    named = {d["path"] for d in fields["differences"]}
    assert named == {"late-pipe", "late.txt"}, fields["differences"]


def test_a_snapshot_of_non_utf8_names_restores_them_byte_for_byte(tmp_path):
    tree = make_tree(tmp_path / "tree")
    raw = os.fsencode(tree)
    os.mkdir(raw + b"/caf\xe9")
    with open(raw + b"/caf\xe9/menu\\x41", "wb") as f:  # a real backslash in the name too
        f.write(b"latin-1 bytes\n")
    before = fingerprint(tree)
    snap = snapshot_of(tmp_path, tree)
    assert "caf\\xe9/menu\\\\x41" in snap.before.entries
    os.unlink(raw + b"/caf\xe9/menu\\x41")
    os.rmdir(raw + b"/caf\xe9")
    changes(snap)
    fields = bounded(rollback, snap)
    assert fields["verified"] is True, fields
    assert fingerprint(tree) == before


# ------------------------------------------------------------------ item 8: paths longer than PATH_MAX


def _long(base: Path, levels: int = 20, name: str = "n" * 250) -> str:
    """A file under `levels` directories of 250-byte names: a path of about 5,000 bytes."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("far down\n")
    finally:
        os.close(fd)
    return "/".join([name] * levels + ["f"])


def _write_at(root: Path, rel: str, text: str) -> None:
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        w = os.open(parts[-1], os.O_WRONLY | os.O_TRUNC, dir_fd=fd)
        os.write(w, text.encode())
        os.close(w)
    finally:
        os.close(fd)


def test_a_path_longer_than_4096_bytes_is_snapshotted_and_rolled_back(tmp_path):
    tree = make_tree(tmp_path / "tree")
    long = _long(tree)
    assert len(long) > 4096
    snap = snapshot_of(tmp_path, tree)
    assert long in snap.before.entries
    _write_at(tree, long, "changed by the run\n")
    _long(tree / "src")  # and a long path the run made
    changes(snap)
    fields = bounded(rollback, snap)
    assert fields["verified"] is True, fields


def test_restore_only_a_path_longer_than_4096_bytes(tmp_path):
    tree = make_tree(tmp_path / "tree")
    long = _long(tree)
    folder, _ = run_folder(tmp_path, tree, lambda t: _write_at(t, long, "changed\n"))
    code, report = restore(folder, apply=True, only=[long])
    assert code == 0, report
    assert [a["path"] for a in report["roots"][0]["applied"]] == [long]


# ------------------------------------------------------------------ item 11: the record's every field


def test_a_record_whose_store_points_elsewhere_is_refused_and_nothing_is_made(tmp_path):
    tree = make_tree(tmp_path / "tree")
    folder, _ = run_folder(tmp_path, tree, lambda t: (t / "README").write_text("x"))
    record = folder / "snapshots" / "0.json"
    data = json.loads(record.read_text())
    elsewhere = tmp_path / "elsewhere" / "planted"
    data["store"] = str(elsewhere)
    record.write_text(json.dumps(data, sort_keys=True, ensure_ascii=False) + "\n")
    with pytest.raises(InputError, match="edited"):
        bounded(restore_command, str(folder), apply=False, only=None, force=False)
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("field", ["store", "exclude", "skipped", "root", "extra"])
def test_every_field_of_the_record_is_covered_by_the_ledgers_digest(tmp_path, field):
    tree = make_tree(tmp_path / "tree")
    folder, _ = run_folder(tmp_path, tree, lambda t: (t / "README").write_text("x"))
    record = folder / "snapshots" / "0.json"
    data = json.loads(record.read_text())
    data[field] = ["edited"] if field in ("exclude", "skipped") else "edited"
    record.write_text(json.dumps(data, sort_keys=True, ensure_ascii=False) + "\n")
    with pytest.raises(InputError, match="snapshot 0"):
        bounded(restore_command, str(folder), apply=False, only=None, force=False)


def test_a_dry_run_creates_nothing_not_even_a_missing_store(tmp_path):
    tree = make_tree(tmp_path / "tree")
    folder, snap = run_folder(tmp_path, tree, lambda t: (t / "README").write_text("x"))
    store = snap.store.root
    import shutil

    shutil.rmtree(store)
    before = fingerprint(tree)
    code, report = restore(folder)
    assert code == 0 and report["roots"][0]["planned"]
    assert not store.exists()
    assert fingerprint(tree) == before


# ------------------------------------------------------------------ the run always ends with a receipt


FIFO_AGENT = r"""
import os, sys, time
store = sys.argv[1]
open("README", "w").write("changed by the agent\n")
for here, dirs, files in os.walk(os.path.join(store, "objects")):
    for name in files:
        os.unlink(os.path.join(here, name))
        os.mkfifo(os.path.join(here, name))
print("swapped", flush=True)
# One call the cap refuses: under on_breach = kill the run ends at once (exit 42), and
# --rollback-on-breach then meets the FIFOs. No fixed wait for a wall-clock cap.
import json, urllib.error, urllib.request
call = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
)
try:
    urllib.request.urlopen(call, timeout=30)
except urllib.error.HTTPError as refused:  # the refusal: the run is ending
    print("refused", refused.code, flush=True)
time.sleep(60)  # ended by the run's stop, not by this sleep
"""
KILL_ON_BREACH = '[caps]\nmax_usd = 0.000001\non_breach = "kill"\n'


def test_a_run_whose_store_objects_are_fifos_ends_with_a_receipt(tmp_path):
    tree = make_tree(tmp_path / "tree")
    run = tmp_path / "runs" / "r1"
    store = tmp_path / "runs" / ".docket-snapshot-store"
    agent = tmp_path / "agent.py"
    agent.write_text(FIFO_AGENT)
    policy = tmp_path / "docket.toml"
    policy.write_text(KILL_ON_BREACH)
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "docket",
            "run",
            "--ledger-dir",
            str(run),
            f"--snapshot={tree}",
            "--rollback-on-breach",
            "--policy",
            str(policy),
            "--",
            sys.executable,
            str(agent),
            str(store),
        ],  # fmt: skip
        cwd=tree,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=40)  # a hang is forever; a loaded CI box is slow
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        for obj in store.rglob("*"):
            if stat.S_ISFIFO(obj.lstat().st_mode):
                try:
                    os.close(os.open(obj, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    continue  # no reader there
        proc.communicate(timeout=10)
        pytest.fail("docket run did not end within 40 s")
    assert proc.returncode == 42, err
    assert time.monotonic() - started < 40
    events = read_events(run / "ledger.jsonl")
    restored = next(e for e in events if e["type"] == "snapshot.restored")
    assert restored["verified"] is False and restored["failed"]
    assert events[-1]["type"] == "session.end"
    receipt = json.loads((run / "receipt.json").read_text())
    assert receipt["exit"]["cap"] == "max_usd"  # ended by the breach the agent caused
    assert receipt["snapshot"][0]["restored"]["verified"] is False
    assert "the rollback of" in err


def test_the_record_digest_is_the_sha256_of_its_bytes(tmp_path):
    tree = make_tree(tmp_path / "tree")
    folder = tmp_path / "run"
    _, taken = take(0, str(tree), folder, tmp_path / "store")
    data = (folder / "snapshots" / "0.json").read_bytes()
    assert taken["record_sha256"] == hashlib.sha256(data).hexdigest()
    assert taken["store"] == str((tmp_path / "store").resolve())
