"""What `docket run --snapshot` and `docket restore` call: the snapshot's files and events.

A run's folder holds snapshots/N.json (N: the root's index, in --snapshot's
order): the manifest, the root and the store it names. The sha256 of its
entries (manifest_sha256) and of its whole bytes (record_sha256) are in the
ledger's snapshot.taken, so `docket restore` refuses a record edited since.
Events (the ledger's, fields as below): snapshot.taken before process.spawn;
snapshot.changes once the child is reaped; snapshot.restored after a rollback.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from docket.snapshot.confine import Refused, Tree, read_regular
from docket.snapshot.excluded import MORE, excluded_changes
from docket.snapshot.excluded import identities as excluded_identities
from docket.snapshot.manifest import (
    Manifest,
    ManifestError,
    changes_event,
    diff,
    differences,
    manifest_from_dict,
    state,
)
from docket.snapshot.plan import Plan, make_plan
from docket.snapshot.restore import Applied, _entry_at, apply_plan
from docket.snapshot.scan import DEFAULT_EXCLUDE, Excluder, identities, scan
from docket.snapshot.store import Deadline, Store, StoreLock, TimedOut, record_run

SNAPSHOT_DIR = "snapshots"
STORE_NAME = ".docket-snapshot-store"
ROLLBACK_SECONDS = 300.0  # a rollback (its reads and its verifying scan) ends by then
MAX_DIFFERENCES = 1000  # named in snapshot.restored; differences_count has them all
MAX_RECORD_BYTES = 1 << 30  # snapshots/N.json: 1 GiB is some ten million entries
RECORD_SECONDS = 120.0  # to read it


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
    excluded_before: dict = field(default_factory=dict)  # excluded root -> its identity

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
    # Made absolute, not resolved: a store that is a symlink (one a previous run's agent
    # planted in docket-runs/) is refused by Store, never followed to wherever it leads.
    store = Store(Path(os.path.abspath(store_dir)))
    excluder = Excluder(tuple(exclude), identities([folder, store_dir, *also_skip]))
    # Shared: `docket prune` (exclusive) waits until the objects copied here are named
    # in the record below, or this waits for it.
    with StoreLock(store.root, exclusive=False, wait=None, create=True):
        snap, fields = _take_locked(index, root, folder, store, excluder, exclude)
    return snap, fields


def _take_locked(
    index: int,
    root: str,
    folder: Path,
    store: Store,
    excluder: Excluder,
    exclude: tuple[str, ...],
) -> tuple[RootSnapshot, dict]:
    with Tree(root) as tree:
        result = scan(tree, excluder, store)
        real = tree.root
        watched = excluded_identities(tree, result.excluded, result.excluded_count)
    store.sync()
    snap = RootSnapshot(index, real, store, excluder, result.manifest, result.skipped)
    snap.excluded_before = watched
    record = {
        **result.manifest.as_dict(),
        "root": real,
        "store": str(store.root),
        "exclude": list(exclude),
        "skipped": result.skipped,
    }
    data = (json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    path = snap.record_path(folder)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(data)
    record_run(store.root, folder.resolve())
    fields = {
        "index": index,
        "root": real,
        **result.manifest.totals(),
        "manifest_sha256": result.manifest.digest(),
        "manifest": f"{SNAPSHOT_DIR}/{index}.json",
        # The whole record's bytes: its store, exclude and skipped as much as its entries
        # (docket restore trusts no field the ledger does not vouch for).
        "record_sha256": hashlib.sha256(data).hexdigest(),
        "store": str(store.root),
        "exclude": list(exclude),
        "skipped": result.skipped,
        "copied": dict(store.methods),
        "deduped": store.deduped,
    }
    return snap, fields


def changes(snap: RootSnapshot) -> dict:
    """Scan the tree again (hashes only) and the excluded roots' identities (those met
    before, and any the run made); snapshot.changes' fields."""
    with snap.tree() as tree:
        result = scan(tree, snap.excluder)
        roots = [p for p in snap.excluded_before if p != MORE]
        roots += [p for p in result.excluded if p not in snap.excluded_before]
        total = max(len(roots), result.excluded_count)
        watched = excluded_identities(tree, roots, total)
    snap.after, snap.after_skipped = result.manifest, result.skipped
    found = diff(snap.before, result.manifest)
    return {
        "index": snap.index,
        **changes_event(snap.before, result.manifest, found),
        "skipped": result.skipped,
        "excluded_changed": excluded_changes(snap.excluded_before, watched),
    }


def rollback(snap: RootSnapshot, seconds: float | None = ROLLBACK_SECONDS) -> dict:
    """Restore what the run changed (the tree as the change scan saw it), then scan again:
    `verified` is true only when the tree's manifest is the snapshot's once more, every
    entry of any name and kind included; else `differences` names each path that is not
    as in the snapshot, with both states. What the run made under a directory it made is
    removed with it, whatever it is. Bounded by `seconds` (reads included): past it, the
    steps left fail and `error` says so; it always returns."""
    assert snap.after is not None, "changes() first"
    deadline = Deadline(seconds)
    found = diff(snap.before, snap.after)
    paths = found.paths()
    end = {p: e for p, e in snap.after.entries.items() if p in set(paths)}
    plan = make_plan(paths, snap.before.entries, end, end)
    out: dict = {"index": snap.index}
    with snap.tree() as tree:
        applied = apply_plan(tree, snap.store, plan, sweep=True, deadline=deadline)
        out.update(
            applied=len(applied.applied),
            paths=[a["path"] for a in applied.applied],
            failed=applied.failed,
        )
        try:
            result = scan(tree, snap.excluder, deadline=deadline)
        except TimedOut as exc:
            return {**out, "verified": False, "differences": [], "error": str(exc)}
    now = result.manifest
    named = differences(snap.before, now)
    # A path the scan could not read now (a mount, a file swapped mid-read) that it
    # could before is not known to be as in the snapshot: named too.
    was = {s["path"] for s in snap.skipped}
    named += [
        {
            "path": s["path"],
            "snapshot": state(snap.before.entries.get(s["path"])),
            "now": None,
            "why": s["why"],
        }  # fmt: skip
        for s in result.skipped
        if s["path"] not in was
    ]
    return {
        **out,
        "verified": not named and now.digest() == snap.before.digest(),
        "differences": named[:MAX_DIFFERENCES],
        "differences_count": len(named),
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
    """snapshots/N.json, read without blocking (a FIFO, a link, a device is refused) and
    only if its bytes hash to the record_sha256 snapshot.taken recorded: every field of
    it (its store, its exclude) is the run's, not an edit.
    The store is opened, never made: a dry run writes nothing there."""
    rel = taken.get("manifest")
    if type(rel) is not str or rel != f"{SNAPSHOT_DIR}/{taken.get('index')}.json":
        raise RestoreInputError("snapshot.taken names no manifest file of this run")
    want = taken.get("record_sha256")
    if type(want) is not str:
        raise RestoreInputError(
            "snapshot.taken has no record_sha256 (a run recorded before Docket vouched for "
            "the whole record): its store and exclude cannot be trusted"
        )
    path = folder / rel
    try:
        raw = read_regular(path, MAX_RECORD_BYTES, Deadline(RECORD_SECONDS))
    except OSError as exc:
        raise RestoreInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except TimedOut as exc:
        raise RestoreInputError(f"{path}: {exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
        manifest = manifest_from_dict(data)
    except RecursionError:
        raise RestoreInputError(f"{path}: JSON nested too deeply") from None
    except (ValueError, ManifestError) as exc:
        raise RestoreInputError(f"{path}: {exc}") from None
    if manifest.digest() != taken.get("manifest_sha256"):
        raise RestoreInputError(
            f"{path}: its entries do not hash to the manifest_sha256 the ledger recorded (edited?)"
        )
    if hashlib.sha256(raw).hexdigest() != want:
        raise RestoreInputError(
            f"{path}: its bytes do not hash to the record_sha256 the ledger recorded (edited?)"
        )
    root, store = data.get("root"), data.get("store")
    if root != taken.get("root") or type(store) is not str or store != taken.get("store"):
        raise RestoreInputError(f"{path}: its root or store is not the one the ledger recorded")
    exclude = data.get("exclude")
    return (
        manifest,
        root,
        Store(store, create=False),
        list(exclude) if isinstance(exclude, list) else [],
    )


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
                now[path] = _entry_at(fd, name, path, st)
        except Refused as exc:
            if exc.errno == errno.ENOENT:
                continue  # a directory above it is gone: so is it
            unreachable.append({"path": path, "why": f"cannot be reached: {exc.why}"})
            continue
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
