"""--snapshot's costs: snapshot and change scan of a 10,000-file, 200 MB tree, and a restore.

Figures (each the median of a few repetitions; this machine is shared):
- snapshot: the tree copied into a fresh store (docket.snapshot.run.take: the
  O_NOFOLLOW walk, a copy per file by reflink / copy_file_range / read-write,
  the copy hashed), MB/s; and again into the same store with nothing changed
  (every copy is deduplicated, so this is the walk, copy and hash again).
- change scan: the whole tree hashed again and diffed with the snapshot
  (what runs after the child is reaped), with nothing changed and with
  1,000 files rewritten.
- restore: those 1,000 files planned and written back (apply_plan: each re-read
  and re-hashed under its parent's fd, then the stored copy re-hashed as it is
  written to a fresh name and renamed over it), and the whole rollback with its
  verifying re-scan of the tree.

The page cache is warm (the tree was just written, then synced): these are CPU,
copy and sync costs, not a cold disk's reads. Each snapshot and restore ends with
one syncfs. Files go to $DOCKET_BENCH_DIR, or the system's temporary folder.
Quick form: 1,000 files, 20 MB, 100 changed.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from docket.snapshot.confine import Tree
from docket.snapshot.manifest import diff
from docket.snapshot.plan import make_plan
from docket.snapshot.restore import apply_plan
from docket.snapshot.run import changes, rollback, take
from docket.snapshot.scan import scan

REPEATS = 3


def make_tree(root: Path, files: int, total_bytes: int, seed: int = 16) -> int:
    """`files` files in folders of 100, sizes drawn around the mean; the bytes written."""
    rng = random.Random(seed)
    mean = total_bytes // files
    written = 0
    block = os.urandom(1 << 20)
    for i in range(files):
        folder = root / f"d{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        size = max(1, int(rng.expovariate(1 / mean)))
        size = min(size, len(block) - 64)
        start = rng.randrange(0, 64)
        (folder / f"f{i:05d}.bin").write_bytes(i.to_bytes(4, "big") + block[start : start + size])
        written += size + 4
    return written


def _mbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e6, 1)


def run(quick: bool) -> dict:
    files, total, changed = (1_000, 20_000_000, 100) if quick else (10_000, 200_000_000, 1_000)
    base = Path(
        tempfile.mkdtemp(prefix="docket-bench-snapshot-", dir=os.environ.get("DOCKET_BENCH_DIR"))
    )
    try:
        tree = base / "tree"
        nbytes = make_tree(tree, files, total)
        os.sync()  # the tree's own writes are not the snapshot's to flush
        cold, warm, scan_same, scan_changed, apply_s, rollback_s = [], [], [], [], [], []
        methods: dict = {}
        for r in range(REPEATS):
            store = base / f"store{r}"
            os.sync()
            t0 = time.perf_counter()
            snap, fields = take(0, str(tree), base / f"run{r}", store)
            cold.append(time.perf_counter() - t0)
            methods = fields["copied"]
            t0 = time.perf_counter()
            take(0, str(tree), base / f"run{r}b", store)
            warm.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            same = changes(snap)
            scan_same.append(time.perf_counter() - t0)
            assert same["counts"] == {"created": 0, "modified": 0, "deleted": 0, "mode_changed": 0}
            victims = sorted(p for p, e in snap.before.entries.items() if e.kind == "file")[
                -changed:
            ]
            for p in victims:
                (tree / p).write_bytes(b"rewritten by the run " + p.encode())
            t0 = time.perf_counter()
            found = changes(snap)
            scan_changed.append(time.perf_counter() - t0)
            assert found["counts"]["modified"] == changed
            assert snap.after is not None
            paths = diff(snap.before, snap.after).paths()
            plan = make_plan(paths, snap.before.entries, snap.after.entries, snap.after.entries)
            t0 = time.perf_counter()
            with Tree(str(tree)) as t:
                applied = apply_plan(t, snap.store, plan)
            apply_s.append(time.perf_counter() - t0)
            assert len(applied.applied) == changed and not applied.failed
            for p in victims:  # again, for the whole rollback
                (tree / p).write_bytes(b"rewritten by the run " + p.encode())
            changes(snap)
            t0 = time.perf_counter()
            result = rollback(snap)
            rollback_s.append(time.perf_counter() - t0)
            assert result["verified"] and result["applied"] == changed
            with Tree(str(tree)) as t:
                assert scan(t).manifest.digest() == snap.before.digest()
            shutil.rmtree(store)
        med = statistics.median
        figures = {
            "files": files,
            "bytes": nbytes,
            "changed_files": changed,
            "copy_methods": methods,
            "snapshot_s": round(med(cold), 3),
            "snapshot_mb_s": _mbps(nbytes, med(cold)),
            "snapshot_again_same_store_s": round(med(warm), 3),
            "change_scan_unchanged_s": round(med(scan_same), 3),
            "change_scan_unchanged_mb_s": _mbps(nbytes, med(scan_same)),
            "change_scan_changed_s": round(med(scan_changed), 3),
            "restore_apply_s": round(med(apply_s), 3),
            "restore_files_per_s": round(changed / med(apply_s)),
            "rollback_with_verifying_scan_s": round(med(rollback_s), 3),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)
    summary = {
        "snapshot": f"{files} files, {nbytes / 1e6:.0f} MB in {figures['snapshot_s']} s "
        f"({figures['snapshot_mb_s']} MB/s; {methods})",
        "snapshot again, same store": f"{figures['snapshot_again_same_store_s']} s",
        "change scan, nothing changed": f"{figures['change_scan_unchanged_s']} s "
        f"({figures['change_scan_unchanged_mb_s']} MB/s)",
        f"restore of {changed} changed files": f"{figures['restore_apply_s']} s "
        f"({figures['restore_files_per_s']} files/s); rollback with its verifying scan "
        f"{figures['rollback_with_verifying_scan_s']} s",
    }
    return {"figures": figures, "summary": summary}
