"""What `docket run --snapshot` and `docket restore` call: the snapshot's files and events.

A run's folder holds snapshots/N.json (N: the root's index, in --snapshot's
order): the manifest, the root and the store it names. Its digest is in the
ledger's snapshot.taken, so `docket restore` refuses a manifest edited since.
Events (the ledger's, fields as below): snapshot.taken before process.spawn;
snapshot.changes once the child is reaped; snapshot.restored after a rollback.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass, field
from pathlib import Path

from docket.snapshot.confine import Refused, Tree
from docket.snapshot.manifest import (
    Manifest,
    ManifestError,
    changes_event,
    diff,
    manifest_from_dict,
)
from docket.snapshot.plan import Plan, make_plan
from docket.snapshot.restore import Applied, _entry_at, apply_plan
from docket.snapshot.scan import DEFAULT_EXCLUDE, Excluder, identities, scan
from docket.snapshot.store import Store

SNAPSHOT_DIR = "snapshots"
STORE_NAME = ".docket-snapshot-store"


def default_store(folder: Path) -> Path:
    """Shared by every run whose folder has the same parent (docket-runs/ by default)."""
    return folder.resolve().parent / STORE_NAME


@dataclass
class RootSnapshot:
    index: int
    root: str
    store: Store
    excluder: Excluder
    before: Manifest
    skipped: list[dict]
    after: Manifest | None = None
    after_skipped: list[dict] = field(default_factory=list)

    def tree(self) -> Tree:
        return Tree(self.root, recorded=True)

    def record_path(self, folder: Path) -> Path:
        return folder / SNAPSHOT_DIR / f"{self.index}.json"


def take(
    index: int,
    root: str,
    folder: Path,
    store_dir: Path,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE,
    also_skip: tuple[Path, ...] = (),
) -> tuple[RootSnapshot, dict]:
    """Snapshot `root` into the store; (the snapshot, snapshot.taken's fields). Refused
    (confine) for a root that cannot be one; OSError if the copy fails."""
    store = Store(store_dir)
    excluder = Excluder(tuple(exclude), identities([folder, store_dir, *also_skip]))
    with Tree(root) as tree:
        result = scan(tree, excluder, store)
        real = tree.root
    store.sync()
    snap = RootSnapshot(index, real, store, excluder, result.manifest, result.skipped)
    record = {
        **result.manifest.as_dict(),
        "root": real,
        "store": str(store.root),
        "exclude": list(exclude),
        "skipped": result.skipped,
    }
    path = snap.record_path(folder)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n", "utf-8")
    fields = {
        "index": index,
        "root": real,
        **result.manifest.totals(),
        "manifest_sha256": result.manifest.digest(),
        "manifest": f"{SNAPSHOT_DIR}/{index}.json",
        "exclude": list(exclude),
        "skipped": result.skipped,
        "copied": dict(store.methods),
        "deduped": store.deduped,
    }
    return snap, fields


def changes(snap: RootSnapshot) -> dict:
    """Scan the tree again (hashes only); snapshot.changes' fields."""
    with snap.tree() as tree:
        result = scan(tree, snap.excluder)
    snap.after, snap.after_skipped = result.manifest, result.skipped
    found = diff(snap.before, result.manifest)
    return {
        "index": snap.index,
        **changes_event(snap.before, result.manifest, found),
        "skipped": result.skipped,
    }


def rollback(snap: RootSnapshot) -> dict:
    """Restore what the run changed (the tree as the change scan saw it), then scan again:
    `verified` is whether the tree's manifest is the snapshot's once more. That scan is
    the catcher of both failure modes: a changed file missed, an unchanged one touched."""
    assert snap.after is not None, "changes() first"
    found = diff(snap.before, snap.after)
    paths = found.paths()
    end = {p: e for p, e in snap.after.entries.items() if p in set(paths)}
    plan = make_plan(paths, snap.before.entries, end, end)
    with snap.tree() as tree:
        applied = apply_plan(tree, snap.store, plan)
        now = scan(tree, snap.excluder).manifest
    return {
        "index": snap.index,
        "applied": len(applied.applied),
        "paths": [a["path"] for a in applied.applied],
        "failed": applied.failed,
        "verified": now.digest() == snap.before.digest(),
        "manifest_sha256": now.digest(),
    }


# ---------------------------------------------------------------- docket restore


class RestoreInputError(Exception):
    """A run folder `docket restore` cannot plan from: one line, exit 2."""


@dataclass
class RootRestore:
    index: int
    root: str
    plan: Plan
    store: Store
    applied: Applied | None = None
    notes: list[str] = field(default_factory=list)


def load_record(folder: Path, taken: dict) -> tuple[Manifest, str, Store, list[str]]:
    """snapshots/N.json, checked against the digest snapshot.taken recorded."""
    rel = taken.get("manifest")
    if type(rel) is not str or rel != f"{SNAPSHOT_DIR}/{taken.get('index')}.json":
        raise RestoreInputError("snapshot.taken names no manifest file of this run")
    path = folder / rel
    try:
        data = json.loads(path.read_text("utf-8"))
        manifest = manifest_from_dict(data)
    except RecursionError:
        raise RestoreInputError(f"{path}: JSON nested too deeply") from None
    except (OSError, ValueError, ManifestError) as exc:
        raise RestoreInputError(f"{path}: {exc}") from None
    if manifest.digest() != taken.get("manifest_sha256"):
        raise RestoreInputError(
            f"{path}: its entries do not hash to the manifest_sha256 the ledger recorded (edited?)"
        )
    root, store = data.get("root"), data.get("store")
    if root != taken.get("root") or type(store) is not str:
        raise RestoreInputError(f"{path}: its root is not the one the ledger recorded")
    exclude = data.get("exclude")
    return manifest, root, Store(store), list(exclude) if isinstance(exclude, list) else []


def current(tree: Tree, paths: list[str]) -> tuple[dict, list[dict]]:
    """The entries at `paths` now, and the paths that cannot be reached (conflicts)."""
    from docket.snapshot.confine import lstat_at

    now, unreachable = {}, []
    for path in paths:
        try:
            with tree.parent(path) as (fd, name):
                st = lstat_at(fd, name)
                if st is None:
                    continue
                entry = _entry_at(fd, name, path, st)
        except Refused as exc:
            if exc.errno == errno.ENOENT:
                continue  # a directory above it is gone: so is it
            unreachable.append({"path": path, "why": f"cannot be reached: {exc.why}"})
            continue
        if entry is None:
            unreachable.append({"path": path, "why": "not a file, directory or link now"})
        else:
            now[path] = entry
    return now, unreachable


def states_from_rows(rows: list, side: str) -> dict:
    from docket.snapshot.manifest import entry_from_dict

    out = {}
    for row in rows:
        value = row.get(side) if isinstance(row, dict) else None
        path = row.get("path") if isinstance(row, dict) else None
        if value is not None:
            out[path] = entry_from_dict(f"snapshot.changes {path!r}", value)
    return out
