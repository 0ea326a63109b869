"""Attempts to make a restore (or a snapshot) read or write outside its tree, on purpose.

The tests run as root, which bypasses permission checks: every refusal here comes
from the confinement itself (docket/snapshot/confine.py: the O_NOFOLLOW walk, the
st_dev check, the re-check at write time, rename over the entry), never from a
permission a root process would ignore. Each test checks the outside is unchanged
byte for byte (and, where there is one, what was refused and why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from snapshot_helpers import fingerprint, make_tree, snapshot_of

from docket.snapshot.confine import Refused, Tree, check_root, open_regular
from docket.snapshot.manifest import DIR, FILE, LINK, OTHER, Entry
from docket.snapshot.plan import MKDIR, REMOVE, SYMLINK, WRITE, Plan, Step, make_plan
from docket.snapshot.restore import apply_plan
from docket.snapshot.run import changes, rollback
from docket.snapshot.scan import scan

DOCKET = [sys.executable, "-m", "docket"]


@pytest.fixture
def world(tmp_path):
    """(tree, outside): a snapshotted tree and a folder beside it that must never change."""
    tree = make_tree(tmp_path / "tree")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside bytes\n")
    os.chmod(outside / "secret", 0o600)
    return tree, outside


def _snap(tmp_path, tree):
    return snapshot_of(tmp_path, tree)


def _store(snap):
    return snap.store


def _obj(snap, path: str) -> Entry:
    return snap.before.entries[path]


# ------------------------------------------------------------------ paths in the plan


@pytest.mark.parametrize(
    "path",
    ["../outside/secret", "/tmp/escape", "src/../../outside/secret", "src//x", "./README", ""],
)
def test_a_step_with_a_path_that_leaves_the_tree_is_refused(tmp_path, world, path):
    tree, outside = world
    snap = _snap(tmp_path, tree)
    before = fingerprint(outside), fingerprint(tree)
    plan = Plan(
        steps=[
            Step(WRITE, path, _obj(snap, "README"), None),
            Step(REMOVE, path, None, Entry(FILE, 0o600, "0" * 64, 1)),
        ]
    )
    with Tree(str(tree)) as t:
        result = apply_plan(t, snap.store, plan)
    assert not result.applied and len(result.failed) == 2
    assert (fingerprint(outside), fingerprint(tree)) == before
    assert not Path("/tmp/escape").exists()


def test_a_manifest_edited_to_name_an_absolute_path_is_refused_by_restore(tmp_path, world):
    tree, outside = world
    run = _cli_run(tmp_path, tree, "open('README','w').write('changed')")
    record = run / "snapshots" / "0.json"
    data = json.loads(record.read_text())
    data["entries"][str(outside / "planted")] = data["entries"].pop("README")
    record.write_text(json.dumps(data))
    before = fingerprint(outside)
    proc = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert "absolute paths are refused" in proc.stderr
    assert fingerprint(outside) == before
    assert not (outside / "planted").exists()


def test_a_manifest_edited_consistently_still_fails_the_ledgers_digest(tmp_path, world):
    tree, outside = world
    run = _cli_run(tmp_path, tree, "open('README','w').write('changed')")
    record = run / "snapshots" / "0.json"
    data = json.loads(record.read_text())
    data["entries"]["README"]["mode"] = 0o4755  # a setuid bit the snapshot never had
    record.write_text(json.dumps(data))
    proc = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "do not hash to the manifest_sha256" in proc.stderr
    assert (tree / "README").read_text() == "changed"


def test_a_ledger_edited_to_name_another_path_breaks_its_chain_and_is_refused(tmp_path, world):
    tree, outside = world
    run = _cli_run(tmp_path, tree, "open('README','w').write('changed')")
    ledger = run / "ledger.jsonl"
    ledger.write_bytes(
        ledger.read_bytes().replace(b'"path":"README"', b'"path":"../outside/secret"')
    )
    before = fingerprint(outside)
    proc = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "chain does not hold" in proc.stderr
    assert fingerprint(outside) == before


def test_only_with_a_path_out_of_the_tree_is_a_usage_error(tmp_path, world):
    tree, _ = world
    run = _cli_run(tmp_path, tree, "open('README','w').write('changed')")
    for only in ("../outside", "/etc", "src/../.."):
        proc = subprocess.run(
            [*DOCKET, "restore", str(run), "--apply", "--only", only],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and proc.stderr.startswith("docket: restore: --only"), only
    assert (tree / "README").read_text() == "changed"


# ------------------------------------------------------------------ symlinks


def test_a_directory_the_run_swapped_for_a_symlink_out_is_replaced_not_followed(tmp_path, world):
    tree, outside = world
    snap = _snap(tmp_path, tree)
    want = fingerprint(tree)
    os.rename(tree / "src", tmp_path / "src.moved")
    os.symlink(outside, tree / "src")  # the run points src at the outside
    changes(snap)
    before_outside = fingerprint(outside)
    result = rollback(snap)
    assert result["verified"], result
    assert fingerprint(tree) == want
    assert fingerprint(outside) == before_outside


def test_a_parent_swapped_for_a_symlink_after_the_plan_fails_the_step(tmp_path, world):
    tree, outside = world
    snap = _snap(tmp_path, tree)
    (tree / "src" / "pkg" / "mod.py").write_text("changed\n")
    changes(snap)
    plan = make_plan(
        ["src/pkg/mod.py"], snap.before.entries, snap.after.entries, snap.after.entries
    )
    os.rename(tree / "src" / "pkg", tmp_path / "pkg.moved")
    os.symlink(outside, tree / "src" / "pkg")  # swapped between the plan and the write
    (outside / "mod.py").write_text("changed\n")  # so a followed link would match the re-check
    before = fingerprint(outside)
    with Tree(str(tree)) as t:
        result = apply_plan(t, snap.store, plan)
    assert not result.applied
    assert "symlink" in result.failed[0]["why"]
    assert fingerprint(outside) == before


def test_a_file_the_run_replaced_with_a_symlink_to_an_outside_file(tmp_path, world):
    tree, outside = world
    snap = _snap(tmp_path, tree)
    want = fingerprint(tree)
    os.unlink(tree / "README")
    os.symlink(outside / "secret", tree / "README")
    changes(snap)
    before = fingerprint(outside)
    assert rollback(snap)["verified"]
    assert fingerprint(tree) == want and fingerprint(outside) == before


def test_a_symlink_swapped_in_after_the_plan_is_not_written_through(tmp_path, world):
    tree, outside = world
    snap = _snap(tmp_path, tree)
    (tree / "README").write_text("the run's\n")
    changes(snap)
    plan = make_plan(["README"], snap.before.entries, snap.after.entries, snap.after.entries)
    (outside / "secret").write_text("the run's\n")  # same bytes as the step expects
    os.unlink(tree / "README")
    os.symlink(outside / "secret", tree / "README")
    before = fingerprint(outside)
    with Tree(str(tree)) as t:
        result = apply_plan(t, snap.store, plan)
    assert result.failed and result.failed[0]["why"] == "changed since the plan was made"
    assert fingerprint(outside) == before


def test_a_link_with_dotdot_in_its_target_is_restored_as_a_link_only(tmp_path, world):
    tree, outside = world
    os.symlink("../outside/secret", tree / "up")
    snap = _snap(tmp_path, tree)
    want = fingerprint(tree)
    os.unlink(tree / "up")
    changes(snap)
    before = fingerprint(outside)
    assert rollback(snap)["verified"]
    assert os.readlink(tree / "up") == "../outside/secret"
    assert fingerprint(tree) == want and fingerprint(outside) == before


def test_symlinks_swapped_in_and_out_during_a_restore_never_lead_a_write_out(tmp_path, world):
    """Another thread flips src/pkg between a directory and a link to the outside, as
    fast as it can, while 200 files are restored into it."""
    _flip_race(tmp_path, world, 200)


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(10))
def test_the_symlink_flip_race_at_length(tmp_path, world, round_):
    """`nox -s slow`: the race above, ten times over 2,000 files."""
    _flip_race(tmp_path, world, 2000)


def _flip_race(tmp_path, world, n: int) -> None:
    tree, outside = world
    pkg = tree / "src" / "pkg"
    for i in range(n):
        (pkg / f"f{i}").write_text(f"v{i}\n")
    snap = _snap(tmp_path, tree)
    for i in range(n):
        (pkg / f"f{i}").write_text("changed\n")
        (outside / f"f{i}").write_text("changed\n")  # a followed link would find what it expects
    changes(snap)
    before = fingerprint(outside)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            os.rename(pkg, tmp_path / "pkg.aside")
            os.symlink(outside, pkg)
            os.unlink(pkg)
            os.rename(tmp_path / "pkg.aside", pkg)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        result = rollback(snap)
    finally:
        stop.set()
        flipper.join(10)
    assert fingerprint(outside) == before
    assert result["applied"] + len(result["failed"]) >= n
    assert all(f["why"] for f in result["failed"])


# ------------------------------------------------------------------ hard links, kinds


def test_a_file_the_run_hard_linked_to_an_outside_file_is_replaced_not_written_in_place(
    tmp_path, world
):
    tree, outside = world
    snap = _snap(tmp_path, tree)
    want = fingerprint(tree)
    os.unlink(tree / "README")
    os.link(outside / "secret", tree / "README")
    changes(snap)
    before = fingerprint(outside)
    assert rollback(snap)["verified"]
    assert fingerprint(tree) == want and fingerprint(outside) == before
    assert os.stat(outside / "secret").st_nlink == 1


def test_a_mode_change_on_a_hard_linked_file_never_chmods_the_shared_inode(tmp_path, world):
    tree, outside = world
    os.unlink(tree / "README")
    os.link(outside / "secret", tree / "README")  # linked before the snapshot
    snap = _snap(tmp_path, tree)
    os.chmod(outside / "secret", 0o666)  # changed from the outside, seen in the tree
    changes(snap)
    assert snap.after is not None
    assert rollback(snap)["verified"]
    assert os.stat(outside / "secret").st_mode & 0o777 == 0o666  # the outside inode untouched
    assert os.stat(tree / "README").st_mode & 0o777 == 0o600
    assert os.stat(tree / "README").st_ino != os.stat(outside / "secret").st_ino


def test_a_file_replaced_by_a_directory_and_a_directory_by_a_file(tmp_path, world):
    tree, outside = world
    snap = _snap(tmp_path, tree)
    want = fingerprint(tree)
    os.unlink(tree / "README")
    (tree / "README" / "deep").mkdir(parents=True)
    (tree / "README" / "deep" / "x").write_text("x")
    import shutil

    shutil.rmtree(tree / "src")
    (tree / "src").write_text("now a file")
    changes(snap)
    assert rollback(snap)["verified"]
    assert fingerprint(tree) == want


def test_a_directory_appearing_where_a_file_is_to_be_written_fails_the_step(tmp_path, world):
    tree, _ = world
    snap = _snap(tmp_path, tree)
    os.unlink(tree / "README")
    changes(snap)
    plan = make_plan(["README"], snap.before.entries, snap.after.entries, snap.after.entries)
    (tree / "README").mkdir()
    (tree / "README" / "keep").write_text("someone else's")
    with Tree(str(tree)) as t:
        result = apply_plan(t, snap.store, plan)
    assert result.failed and "appeared" in result.failed[0]["why"]
    assert (tree / "README" / "keep").read_text() == "someone else's"


def test_a_tampered_store_object_is_never_restored(tmp_path, world):
    tree, _ = world
    snap = _snap(tmp_path, tree)
    (tree / "README").write_text("the run's")
    changes(snap)
    obj = snap.store.object_path(_obj(snap, "README").sha256)
    os.chmod(obj, 0o600)
    obj.write_text("planted bytes")
    result = rollback(snap)
    assert not result["verified"] and "do not hash" in result["failed"][0]["why"]
    assert (tree / "README").read_text() == "the run's"


# ------------------------------------------------------------------ /proc, /sys, /dev, devices


@pytest.mark.parametrize("root", ["/", "/proc", "/proc/self", "/sys", "/dev", "/dev/shm"])
def test_forbidden_roots_are_refused(root):
    with pytest.raises(Refused):
        check_root(root)


def test_a_root_that_is_a_symlink_into_proc_is_refused(tmp_path):
    os.symlink("/proc/sys", tmp_path / "sneaky")
    with pytest.raises(Refused, match="/proc"):
        Tree(str(tmp_path / "sneaky"))


def test_run_refuses_a_forbidden_snapshot_root_before_starting(tmp_path):
    proc = subprocess.run(
        [*DOCKET, "run", "--ledger-dir", str(tmp_path / "r"), "--snapshot=/proc", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("docket: run: --snapshot /proc")
    assert not (tmp_path / "r").exists()


def test_proc_mounted_inside_the_tree_is_not_entered(tmp_path, world):
    tree, _ = world
    mnt = tree / "p"
    mnt.mkdir()
    if subprocess.run(["mount", "--bind", "/proc", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here")
    try:
        with Tree(str(tree)) as t:
            result = scan(t)
            with pytest.raises(Refused, match="another filesystem"), t.parent("p/self/environ"):
                pass
        assert not any(p.startswith("p/") for p in result.manifest.entries)
        assert {"path": "p", "why": "a mount point (another filesystem)"} in result.skipped
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _mknod(path: Path) -> None:
    try:
        os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))  # a char device, /dev/null's
    except PermissionError:
        pytest.skip("mknod not permitted here")


def test_a_device_file_in_the_tree_is_recorded_by_kind_never_opened(tmp_path, world):
    tree, _ = world
    _mknod(tree / "null")
    os.mkfifo(tree / "fifo")  # opening a FIFO would block the snapshot forever
    snap = _snap(tmp_path, tree)
    assert snap.before.entries["null"] == Entry(OTHER, target="char-device")
    assert snap.before.entries["fifo"] == Entry(OTHER, target="fifo")
    assert not snap.skipped


def test_a_device_the_run_put_where_a_file_was_is_replaced_never_written(tmp_path, world):
    tree, _ = world
    snap = _snap(tmp_path, tree)
    want = fingerprint(tree)
    os.unlink(tree / "README")
    _mknod(tree / "README")
    changes(snap)
    plan = make_plan(["README"], snap.before.entries, snap.after.entries, snap.after.entries)
    with Tree(str(tree)) as t:
        result = apply_plan(t, snap.store, plan)
    # the device is recorded by kind: the file is renamed over it,
    # the device never opened
    assert not result.failed and snap.after.entries["README"].kind == OTHER
    assert fingerprint(tree) == want


def test_a_fifo_swapped_in_for_a_checked_file_is_refused_without_blocking(tmp_path):
    (tmp_path / "f").write_text("x")
    checked = os.lstat(tmp_path / "f")
    os.unlink(tmp_path / "f")
    os.mkfifo(tmp_path / "f")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        start = time.monotonic()
        with pytest.raises(Refused, match="swapped"):
            open_regular(fd, "f", "f", expected=checked)
        assert time.monotonic() - start < 1
    finally:
        os.close(fd)


# ------------------------------------------------------------------ moves and concurrency


def test_a_directory_moved_out_of_the_tree_mid_step_is_reported(tmp_path, world):
    tree, outside = world
    with Tree(str(tree)) as t, t.parent("src/pkg/mod.py") as (fd, _name):
        where = os.fstat(fd)
        os.rename(tree / "src" / "pkg", outside / "pkg")
        assert not t.still_at("src/pkg", where)


def test_a_process_changing_the_tree_during_a_restore_is_reported_not_overwritten(tmp_path, world):
    tree, outside = world
    files = tree / "src" / "many"
    files.mkdir()
    for i in range(300):
        (files / f"{i}").write_text("before")
    snap = _snap(tmp_path, tree)
    for i in range(300):
        (files / f"{i}").write_text("the run's")
    changes(snap)
    plan = make_plan(
        [f"src/many/{i}" for i in range(300)],
        snap.before.entries,
        snap.after.entries,
        snap.after.entries,
    )
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time\nend=time.time()+5\ni=0\nwhile time.time()<end:\n"
            " open(f'{sys.argv[1]}/{299-i%300}','w').write('concurrent'); i+=1\n",
            str(files),
        ],
    )
    try:
        # Under way before the restore starts: its first write is on disk.
        deadline = time.monotonic() + 10
        while "concurrent" not in {(files / str(i)).read_text() for i in (299, 298)}:
            assert writer.poll() is None and time.monotonic() < deadline, "writer never wrote"
            time.sleep(0.01)  # polling the condition, with the deadline above
        before = fingerprint(outside)
        with Tree(str(tree)) as t:
            result = apply_plan(t, snap.store, plan)
    finally:
        writer.kill()
        writer.wait(10)
    assert fingerprint(outside) == before
    assert len(result.applied) + len(result.failed) == 300
    for f in result.failed:
        assert f["why"] == "changed since the plan was made"
    # what the other process wrote after our write may stand; what we wrote is the snapshot's
    assert {(files / str(i)).read_text() for i in range(300)} <= {
        "before",
        "concurrent",
        "",
    }  # '': killed mid-write


def test_the_runs_own_folder_and_the_store_inside_the_tree_are_never_snapshotted(tmp_path):
    tree = make_tree(tmp_path / "tree")
    from docket.snapshot.run import take

    snap, _ = take(0, str(tree), tree / "docket-runs" / "r1", tree / ".store")
    assert not any(p.startswith(("docket-runs/r1", ".store")) for p in snap.before.entries)


# ------------------------------------------------------------------ helpers


def _cli_run(tmp_path: Path, tree: Path, code: str) -> Path:
    """A real `docket run --snapshot` whose child runs `code` in the tree, then exits."""
    run = tmp_path / "run"
    proc = subprocess.run(
        [
            *DOCKET,
            "run",
            "--ledger-dir",
            str(run),
            f"--snapshot={tree}",
            "--",
            sys.executable,
            "-c",
            code,
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return run


# unused names kept explicit for readers of the plan's vocabulary
_ = (DIR, LINK, MKDIR, SYMLINK)


def test_a_root_swapped_for_a_symlink_after_the_run_is_refused_by_restore(tmp_path, world):
    tree, outside = world
    run = _cli_run(tmp_path, tree, "import os; os.remove('README')")
    os.rename(tree, tmp_path / "tree.real")
    os.symlink(outside, tree)  # the recorded root now leads to the outside
    before = fingerprint(outside)
    proc = subprocess.run(
        [*DOCKET, "restore", str(run), "--apply", "--force"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "not the snapshot's tree" in proc.stderr, proc.stderr
    assert fingerprint(outside) == before


# ------------------------------------------------------------------ the walker, any path

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PARTS = st.sampled_from(["a", "b", "..", ".", "", "out", "link", "/", "\0", "a\\b", "x" * 300])


@settings(deadline=None)
@given(st.lists(PARTS, min_size=1, max_size=6))
def test_any_path_the_walker_accepts_has_its_parent_inside_the_root(tmp_path_factory, parts):
    base = tmp_path_factory.mktemp("walk")
    root = base / "root"
    (root / "a" / "b").mkdir(parents=True)
    (base / "out").mkdir()
    os.symlink(base / "out", root / "link")
    os.symlink("../../out", root / "a" / "link")
    path = "/".join(parts)
    with Tree(str(root)) as t:
        try:
            with t.parent(path) as (fd, _name):
                where = os.readlink(f"/proc/self/fd/{fd}")
        except Refused:
            return
    assert where == str(root) or where.startswith(str(root) + "/"), (path, where)


def test_restored_entries_keep_the_owner_of_what_they_replace_or_their_folder(tmp_path, world):
    """Run as root, a restore would otherwise hand a user's files to root."""
    tree, _ = world
    for here, dirs, files in os.walk(tree):
        for name in [*dirs, *files]:
            os.chown(os.path.join(here, name), 1234, 5678, follow_symlinks=False)
    os.chown(tree, 1234, 5678)
    snap = _snap(tmp_path, tree)
    (tree / "README").write_text("the run's")  # replaced: keeps its owner
    import shutil

    shutil.rmtree(tree / "src")  # recreated: takes its folder's owner
    changes(snap)
    assert rollback(snap)["verified"]
    for p in ("README", "src", "src/pkg", "src/pkg/mod.py", "src/run.sh"):
        st = os.lstat(tree / p)
        assert (st.st_uid, st.st_gid) == (1234, 5678), p
    assert os.stat(tree / "src" / "run.sh").st_mode & 0o777 == 0o755
