"""`docket prune`: real stores and run folders made by real snapshots (take), objects
counted on disk; what a kept run references never goes, by age and by size, dry run
by default; the store's lock keeps it from racing a snapshot under way."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from docket.cli import main
from docket.snapshot.prune import choose, prune_command
from docket.snapshot.run import STORE_NAME, take
from docket.snapshot.store import Store, StoreLock

DOCKET = [sys.executable, "-m", "docket"]


def tree_of(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def objects(store: Path) -> dict[str, int]:
    """sha -> size of every object on disk."""
    out = {}
    for sub in (store / "objects").iterdir():
        for f in sub.iterdir():
            out[sub.name + f.name] = f.stat().st_size
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


SHARED, ONLY_A, ONLY_B = b"shared by both\n", b"a" * 5000, b"b" * 700


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Runs a and b beside their store; a's folder then deleted (no longer kept)."""
    runs = tmp_path / "runs"
    store = runs / STORE_NAME
    ta = tree_of(tmp_path / "ta", {"s": SHARED, "x/a": ONLY_A})
    tb = tree_of(tmp_path / "tb", {"s": SHARED, "b": ONLY_B})
    take(0, str(ta), runs / "a", store)
    take(0, str(tb), runs / "b", store)
    shutil.rmtree(runs / "a")
    return tmp_path, store, runs / "b"


def test_a_dry_run_lists_what_would_go_and_removes_nothing(two_runs, capsys):
    _, store, _ = two_runs
    before = objects(store)
    assert prune_command(str(store), older_than=None, max_size=None, runs=[], apply=False) == 0
    out = capsys.readouterr().out
    assert f"would remove {sha(ONLY_A)[:16]}… (5000 bytes" in out
    assert "would remove 1 objects, 5000 bytes freed" in out and "dry run" in out
    assert sha(ONLY_B)[:16] not in out and sha(SHARED)[:16] not in out
    assert objects(store) == before


def test_apply_removes_only_what_no_kept_run_references(two_runs, capsys):
    _, store, run_b = two_runs
    assert prune_command(str(store), older_than=None, max_size=None, runs=[], apply=True) == 0
    assert "removed 1 objects, 5000 bytes freed" in capsys.readouterr().out
    left = objects(store)
    assert set(left) == {sha(SHARED), sha(ONLY_B)}
    assert not (store / "objects" / sha(ONLY_A)[:2]).exists()  # its emptied folder went too
    # b can still be restored: each of its objects reads back and hashes to its name
    reader = Store(store, create=False)
    for want in (SHARED, ONLY_B):
        fd = reader.open_object(sha(want))
        try:
            assert os.read(fd, 10000) == want
        finally:
            os.close(fd)


def test_older_than_keeps_what_was_stored_recently(two_runs, capsys):
    tmp, store, _ = two_runs
    old = store / "objects" / sha(ONLY_A)[:2] / sha(ONLY_A)[2:]
    tc = tree_of(tmp / "tc", {"c": b"c" * 300})
    take(0, str(tc), tmp / "runs" / "c", store)
    shutil.rmtree(tmp / "runs" / "c")  # c's object: unreferenced, stored just now
    week = time.time() - 8 * 86400
    os.utime(old, (week, week))
    code = main(["prune", str(store), "--older-than", "168h", "--apply"])
    assert code == 0
    left = objects(store)
    assert sha(ONLY_A) not in left and sha(b"c" * 300) in left
    assert "removed 1 objects, 5000 bytes freed" in capsys.readouterr().out


def test_max_size_removes_the_oldest_unreferenced_first_until_it_fits(tmp_path, capsys):
    runs = tmp_path / "runs"
    store = runs / STORE_NAME
    datas = [bytes([65 + i]) * 1000 for i in range(4)]
    for i, data in enumerate(datas):
        take(0, str(tree_of(tmp_path / f"t{i}", {"f": data})), runs / f"r{i}", store)
        path = store / "objects" / sha(data)[:2] / sha(data)[2:]
        stamp = time.time() - 1000 * (10 - i)  # r0's object is the oldest
        os.utime(path, (stamp, stamp))
    for i in range(3):
        shutil.rmtree(runs / f"r{i}")
    # 4000 bytes; fit 2500: the two oldest unreferenced go, the third stays
    assert main(["prune", str(store), "--max-size", "2500", "--apply"]) == 0
    assert set(objects(store)) == {sha(datas[2]), sha(datas[3])}
    capsys.readouterr()
    # fit 500: every unreferenced one goes, and the referenced 1000 bytes are said to stay
    assert main(["prune", str(store), "--max-size", "500", "--apply"]) == 0
    assert set(objects(store)) == {sha(datas[3])}
    assert "stays above 500 bytes" in capsys.readouterr().out


def test_choose_is_oldest_first_and_never_past_what_was_asked():
    from docket.snapshot.prune import StoredObject

    objs = [StoredObject(f"{i:02x}", "0" * 62, 100, float(i)) for i in range(10)]
    assert choose(objs, 1000, 100.0, None, None) == sorted(objs, key=lambda o: o.mtime)
    assert [o.mtime for o in choose(objs, 1000, 100.0, 95.5, None)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [o.mtime for o in choose(objs, 1000, 100.0, None, 750)] == [0.0, 1.0, 2.0]
    both = choose(objs, 1000, 100.0, 98.5, 650)  # age takes 0, 1; size adds 2, 3
    assert [o.mtime for o in both] == [0.0, 1.0, 2.0, 3.0]


def test_a_run_elsewhere_is_found_in_the_stores_runs_list_or_with_runs(tmp_path, capsys):
    store = tmp_path / "shared-store"
    away = tmp_path / "elsewhere" / "run1"
    take(0, str(tree_of(tmp_path / "t", {"f": ONLY_A})), away, store)
    assert prune_command(str(store), older_than=None, max_size=None, runs=[], apply=True) == 0
    assert sha(ONLY_A) in objects(store)  # named in runs.jsonl by the snapshot
    (store / "runs.jsonl").unlink()
    assert prune_command(
        str(store), older_than=None, max_size=None, runs=[str(away.parent)], apply=True
    ) == 0  # fmt: skip
    assert sha(ONLY_A) in objects(store)  # --runs DIR: a folder of run folders
    assert prune_command(str(store), older_than=None, max_size=None, runs=[], apply=True) == 0
    assert objects(store) == {}  # no one names it any more
    capsys.readouterr()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--older-than", "soon"], "prune: --older-than 'soon':"),
        (["--older-than=-1h"], "prune: --older-than '-1h': takes no sign"),
        (["--max-size", "1.5GiB"], "prune: --max-size '1.5GiB': a size is a whole number"),
        (["--max-size", "10 parsecs"], "prune: --max-size '10 parsecs': unknown size unit"),
        (["--runs", "/nonexistent/runs"], "prune: --runs /nonexistent/runs: not a folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(two_runs, capsys, args, said):
    _, store, _ = two_runs
    before = objects(store)
    assert main(["prune", str(store), *args, "--apply"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"docket: {said}") and err.count("\n") == 1, err
    assert objects(store) == before


def test_a_store_that_is_not_one_and_a_damaged_record_are_refused(two_runs, capsys):
    tmp, store, run_b = two_runs
    (tmp / "afile").write_text("x")
    os.symlink(store, tmp / "link-to-store")
    for target, said in (
        (tmp / "nothing", "no store here"),
        (tmp / "afile", "not named as an object, not a snapshot store"),
        (tmp / "link-to-store", "a symlink (not followed), not a snapshot store"),
    ):
        assert main(["prune", str(target)]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    before = objects(store)
    (run_b / "snapshots" / "0.json").write_text("{not json")
    assert main(["prune", str(store), "--apply"]) == 2
    err = capsys.readouterr().err
    assert "0.json: not a snapshot record" in err and "nothing removed" in err
    assert objects(store) == before


def test_a_prune_waits_for_a_snapshot_under_way_and_keeps_what_it_names(tmp_path, capsys):
    """A snapshot copying 2,000 files holds the store's lock shared until its record is
    written; a prune --apply started meanwhile must wait, then keep every object."""
    runs = tmp_path / "runs"
    store = runs / STORE_NAME
    take(0, str(tree_of(tmp_path / "t0", {"f": b"first"})), runs / "r0", store)
    big = tree_of(tmp_path / "big", {f"d/{i}": os.urandom(64) for i in range(2000)})
    done = threading.Event()
    snap_box: dict = {}

    def snapshot() -> None:
        snap_box["snap"], _ = take(0, str(big), runs / "r1", store)
        done.set()

    thread = threading.Thread(target=snapshot)
    thread.start()
    deadline = time.monotonic() + 20
    lock = os.open(store / "lock", os.O_RDWR)
    try:
        while True:  # until the snapshot holds the lock
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(lock, fcntl.LOCK_UN)
            except BlockingIOError:
                break
            assert time.monotonic() < deadline and not done.is_set(), "never saw it locked"
            time.sleep(0.001)
    finally:
        os.close(lock)
    assert not done.is_set()
    code = prune_command(str(store), older_than=None, max_size=None, runs=[], apply=True, wait=60)
    assert done.is_set()  # it waited for the snapshot's record
    thread.join(20)
    assert code == 0
    left = objects(store)
    named = {e.sha256 for e in snap_box["snap"].before.entries.values() if e.sha256}
    assert len(named) == 2000 and named <= set(left)
    capsys.readouterr()


def test_a_busy_store_is_said_and_nothing_is_removed(two_runs, capsys):
    _, store, _ = two_runs
    before = objects(store)
    with StoreLock(store, exclusive=False, wait=None, create=True):
        code = prune_command(
            str(store), older_than=None, max_size=None, runs=[], apply=True, wait=0.2
        )
    assert code == 1
    assert "in use (a run is taking a snapshot" in capsys.readouterr().out
    assert objects(store) == before


def test_prune_after_a_real_docket_run(tmp_path):
    tree = tree_of(tmp_path / "tree", {"notes.txt": b"kept by the run\n"})
    runs = tmp_path / "docket-runs"
    run = subprocess.run(
        [*DOCKET, "run", "--quiet", "--ledger-dir", str(runs / "r1"), f"--snapshot={tree}",
         "--", sys.executable, "-c", "open('notes.txt', 'w').write('changed')"],
        cwd=tree, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    store = runs / STORE_NAME
    keep = subprocess.run(
        [*DOCKET, "prune", "--apply"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert keep.returncode == 0, keep.stderr
    assert "removed 0 objects" in keep.stdout and sha(b"kept by the run\n") in objects(store)
    shutil.rmtree(runs / "r1")
    gone = subprocess.run(
        [*DOCKET, "prune", "--apply"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert gone.returncode == 0, gone.stderr
    assert "removed 1 objects, 16 bytes freed" in gone.stdout
    assert objects(store) == {}
