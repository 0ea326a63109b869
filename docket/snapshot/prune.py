"""`docket prune [STORE] [--older-than DURATION] [--max-size SIZE] [--runs DIR] [--apply]`.

A snapshot store only grows: every run that takes a snapshot adds the objects its
tree had that the store lacked. An object is *referenced* while the record of some
run (its folder's snapshots/N.json) names its sha256; deleting a run's folder is how
a run stops being kept, and prune then frees what no kept run names. The runs a
store serves are found three ways, all of them read:

  - the folders beside the store (docket-runs/ by default: the store is
    docket-runs/.docket-snapshot-store);
  - the folders named in the store's runs.jsonl (each snapshot appends its run's
    folder there, so a run made with --ledger-dir elsewhere is found too);
  - the folders given with --runs DIR (a run's folder, or a folder of them).

Only unreferenced objects are candidates. With --older-than, those older than it
(by their mtime: when the object was stored) go; with --max-size, the oldest go
first until the store's objects fit in SIZE; with neither, every unreferenced one
goes. A dry run by default (what would go and the bytes freed); --apply removes.

Confined: the store is opened without following a link, every folder in it by
its fd (O_NOFOLLOW), and only a regular file named as an object (objects/xx/ and
62 hex digits) is ever unlinked, by name under its folder's fd: a link planted in
the store is never followed, nor removed, and nothing outside it is touched. The
store's lock is taken exclusive (a snapshot under way holds it shared until its
record is written), so no object a run is about to name is removed.
A record that cannot be read is bad input (exit 2, nothing removed): what it
references cannot be told from garbage.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, InputError
from docket.snapshot.confine import read_regular
from docket.snapshot.manifest import FILE, ManifestError, manifest_from_dict
from docket.snapshot.run import MAX_RECORD_BYTES, RECORD_SECONDS, SNAPSHOT_DIR, STORE_NAME
from docket.snapshot.store import (
    _DIR,
    RUNS_NAME,
    Deadline,
    StoreBusy,
    StoreError,
    StoreLock,
    TimedOut,
)

LOCK_WAIT_S = 10.0  # a snapshot under way for longer: prune says so and stops
MAX_RUNS_BYTES = 64 << 20  # runs.jsonl: a line per snapshot, a million of them
SHOWN = 20  # objects named one a line; the rest are counted
_OBJECT_NAME = re.compile(r"[0-9a-f]{62}")
_FOLDER_NAME = re.compile(r"[0-9a-f]{2}")


@dataclass(frozen=True)
class StoredObject:
    folder: str  # objects/xx
    name: str  # the other 62 hex digits
    size: int
    mtime: float

    @property
    def sha(self) -> str:
        return self.folder + self.name


@dataclass
class Survey:
    objects: list[StoredObject] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)  # "objects/ab/x: a symlink"


def default_store() -> Path:
    return Path("docket-runs") / STORE_NAME


def run_folders(store: Path, runs: list[Path]) -> list[Path]:
    """Every folder that may be a run this store serves (see the module's docstring)."""
    found: list[Path] = []
    try:
        beside = sorted(p for p in store.parent.iterdir() if p.name != store.name)
    except OSError as exc:
        raise InputError(f"prune: {store.parent}: cannot list ({exc.strerror})") from None
    found += beside
    found += _recorded_runs(store)
    for given in runs:
        if not given.is_dir():
            raise InputError(f"prune: --runs {given}: not a folder")
        found.append(given)
        if not (given / SNAPSHOT_DIR).is_dir():
            found += sorted(given.iterdir())
    return found


def _recorded_runs(store: Path) -> list[Path]:
    path = store / RUNS_NAME
    try:
        raw = read_regular(path, MAX_RUNS_BYTES, Deadline(RECORD_SECONDS))
    except FileNotFoundError:
        return []
    except (OSError, TimedOut) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise InputError(f"prune: {path}: cannot read ({why})") from None
    lines = raw.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line torn by a crash mid-append
    out = []
    for number, line in enumerate(lines, 1):
        try:
            folder = json.loads(line.decode("utf-8"))["folder"]
        except (ValueError, KeyError, TypeError):
            folder = None
        if not isinstance(folder, str):
            raise InputError(f'prune: {path}:{number}: not a {{"folder": PATH}} line')
        out.append(Path(folder))
    return out


def referenced(folders: list[Path]) -> tuple[set[str], int]:
    """The sha256 of every file the runs' snapshot records name, and how many records."""
    shas: set[str] = set()
    records = 0
    seen: set[tuple[int, int]] = set()
    for folder in folders:
        snaps = folder / SNAPSHOT_DIR
        try:
            st = os.stat(snaps)
        except OSError:
            continue  # not a run's folder (or not one that took a snapshot)
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        for record in sorted(snaps.glob("*.json")):
            shas |= _record_shas(record)
            records += 1
    return shas, records


def _record_shas(path: Path) -> set[str]:
    try:
        raw = read_regular(path, MAX_RECORD_BYTES, Deadline(RECORD_SECONDS))
        manifest = manifest_from_dict(json.loads(raw.decode("utf-8")))
    except (OSError, TimedOut) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise InputError(
            f"prune: {path}: cannot read ({why}): what it references is unknown; nothing removed"
        ) from None
    except (ValueError, ManifestError, RecursionError) as exc:
        raise InputError(f"prune: {path}: not a snapshot record ({exc}); nothing removed") from None
    return {e.sha256 for e in manifest.entries.values() if e.kind == FILE and e.sha256}


def survey(top: int, deadline: Deadline) -> Survey:
    """The store's objects, read through fds from the store's own (never a link)."""
    out = Survey()
    try:
        objects = os.open("objects", _DIR, dir_fd=top)
    except FileNotFoundError:
        return out
    except OSError as exc:
        why = (
            "a symlink or not a folder: not followed"
            if exc.errno in (errno.ELOOP, errno.ENOTDIR)
            else exc.strerror
        )
        raise InputError(f"prune: objects/: {why}") from None
    try:
        for folder in sorted(os.listdir(objects)):
            deadline.check("the store's objects")
            st = os.lstat(folder, dir_fd=objects)
            if not (_FOLDER_NAME.fullmatch(folder) and stat.S_ISDIR(st.st_mode)):
                out.left_alone.append(f"objects/{folder}: {_kind(st)}, not an object folder")
                continue
            sub = os.open(folder, _DIR, dir_fd=objects)
            try:
                for name in os.listdir(sub):
                    st = os.lstat(name, dir_fd=sub)
                    if _OBJECT_NAME.fullmatch(name) and stat.S_ISREG(st.st_mode):
                        out.objects.append(StoredObject(folder, name, st.st_size, st.st_mtime))
                    else:
                        out.left_alone.append(f"objects/{folder}/{name}: {_kind(st)}")
            finally:
                os.close(sub)
    finally:
        os.close(objects)
    return out


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symlink (not followed)"
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if stat.S_ISREG(st.st_mode):
        return "a file not named as an object"
    return "not a regular file"


def choose(
    candidates: list[StoredObject],
    total: int,
    now: float,
    older_than: float | None,
    max_size: int | None,
) -> list[StoredObject]:
    """Which unreferenced objects go, oldest first (pure)."""
    ordered = sorted(candidates, key=lambda o: (o.mtime, o.sha))
    if older_than is None and max_size is None:
        return ordered
    going = [o for o in ordered if older_than is not None and now - o.mtime > older_than]
    if max_size is not None:
        left = total - sum(o.size for o in going)
        chosen = {o.sha for o in going}
        for o in ordered:
            if left <= max_size:
                break
            if o.sha not in chosen:
                going.append(o)
                chosen.add(o.sha)
                left -= o.size
        going.sort(key=lambda o: (o.mtime, o.sha))
    return going


def prune_command(
    store_arg: str | None,
    *,
    older_than: float | None,
    max_size: int | None,
    runs: list[str],
    apply: bool,
    wait: float = LOCK_WAIT_S,
) -> int:
    store = Path(os.path.abspath(store_arg)) if store_arg else default_store().absolute()
    try:
        st = os.lstat(store)
    except OSError as exc:
        raise InputError(f"prune: {store}: no store here ({exc.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"prune: {store}: {_kind(st)}, not a snapshot store")
    try:
        top = os.open(store, _DIR)
    except OSError as exc:
        raise InputError(f"prune: {store}: cannot open ({exc.strerror})") from None
    try:
        with StoreLock(store, exclusive=True, wait=wait, create=apply):
            return _prune(top, store, older_than, max_size, [Path(r) for r in runs], apply)
    except StoreBusy as exc:
        print(f"docket: prune: {exc}; nothing removed, try again")
        return EXIT_CHECK_FAILED
    except StoreError as exc:
        raise InputError(f"prune: {exc}") from None
    finally:
        os.close(top)


def _prune(
    top: int,
    store: Path,
    older_than: float | None,
    max_size: int | None,
    runs: list[Path],
    apply: bool,
) -> int:
    folders = run_folders(store, runs)
    keep, records = referenced(folders)
    found = survey(top, Deadline(RECORD_SECONDS))
    total = sum(o.size for o in found.objects)
    candidates = [o for o in found.objects if o.sha not in keep]
    going = choose(candidates, total, time.time(), older_than, max_size)
    freed = sum(o.size for o in going)
    print(
        f"store {store}: {len(found.objects)} objects, {total} bytes; {records} snapshot "
        f"record(s) reference {len(found.objects) - len(candidates)} of them (kept)"
    )
    verb = "remove" if apply else "would remove"
    failed = remove(top, going) if apply else {}
    now = time.time()
    shown = [o for o in going if o.sha not in failed]
    for o in shown[:SHOWN]:
        age = max(0.0, now - o.mtime)
        print(f"  {verb} {o.sha[:16]}… ({o.size} bytes, stored {age / 3600:.1f} h ago)")
    if len(shown) > SHOWN:
        print(f"  … and {len(shown) - SHOWN} more")
    for line in found.left_alone[:SHOWN]:
        print(f"  left alone: {line}")
    if len(found.left_alone) > SHOWN:
        print(f"  left alone: … and {len(found.left_alone) - SHOWN} more")
    for sha, why in list(failed.items())[:SHOWN]:
        print(f"  FAILED objects/{sha[:2]}/{sha[2:]}: {why}")
    if apply:
        freed = sum(o.size for o in shown)
        print(f"removed {len(shown)} objects, {freed} bytes freed; {total - freed} bytes left")
    else:
        print(
            f"would remove {len(going)} objects, {freed} bytes freed; {total - freed} bytes "
            "left (dry run: nothing removed; --apply to do it)"
        )
    if max_size is not None and total - freed > max_size:
        print(
            f"note: the store stays above {max_size} bytes: the kept runs (or the newer "
            "objects --older-than keeps) hold the rest"
        )
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def remove(top: int, going: list[StoredObject]) -> dict[str, str]:
    """Remove each object by name under its folder's fd (one open per folder), if it is
    still a regular file: a link put in its place since the survey is left, not
    removed. A folder left empty goes too. {sha: why} for those not removed."""
    failed: dict[str, str] = {}
    by_folder: dict[str, list[StoredObject]] = {}
    for o in going:
        by_folder.setdefault(o.folder, []).append(o)
    try:
        objects = os.open("objects", _DIR, dir_fd=top)
    except OSError as exc:
        return {o.sha: exc.strerror or str(exc) for o in going}
    try:
        for folder, items in by_folder.items():
            try:
                sub = os.open(folder, _DIR, dir_fd=objects)
            except OSError as exc:
                failed.update((o.sha, exc.strerror or str(exc)) for o in items)
                continue
            try:
                for o in items:
                    try:
                        st = os.lstat(o.name, dir_fd=sub)
                        if not stat.S_ISREG(st.st_mode):
                            failed[o.sha] = f"{_kind(st)} now: left alone"
                            continue
                        os.unlink(o.name, dir_fd=sub)
                    except OSError as exc:
                        failed[o.sha] = exc.strerror or str(exc)
                empty = not os.listdir(sub)
            finally:
                os.close(sub)
            if empty:
                try:
                    os.rmdir(folder, dir_fd=objects)
                except OSError as exc:  # a file made in it meanwhile: the folder stays
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
    finally:
        os.close(objects)
    return failed
