"""A tree read into a manifest, through confine.Tree's walk (never across a link or a mount).

`scan(tree, store=...)` is the snapshot (each file's bytes copied into the
store, the manifest naming them by hash); `scan(tree)` alone hashes, which is
the change scan at the end of a run. Excluded: whatever `exclude` names (a
pattern without "/" matches a name at any depth, as `.git` does; one with "/"
matches the path from the root) and the directories in `skip_dirs` by identity
(the run's evidence folder, the store). What cannot be snapshotted (a device,
a FIFO, a socket, a mount point, a name that is not UTF-8) is listed in
`skipped` with its reason, never dropped silently.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from docket.snapshot.confine import Refused, Tree, open_regular
from docket.snapshot.manifest import DIR, FILE, LINK, Entry, Manifest
from docket.snapshot.store import Store, hash_fd

DEFAULT_EXCLUDE = (".git",)


@dataclass
class ScanResult:
    manifest: Manifest
    skipped: list[dict] = field(default_factory=list)  # {"path", "why"}


@dataclass(frozen=True)
class Excluder:
    patterns: tuple[str, ...] = DEFAULT_EXCLUDE
    skip_dirs: frozenset[tuple[int, int]] = frozenset()  # (st_dev, st_ino)

    def excluded(self, path: str, name: str) -> bool:
        for pattern in self.patterns:
            subject = path if "/" in pattern else name
            if fnmatch.fnmatchcase(subject, pattern.strip("/")):
                return True
        return False


def identities(paths: Iterable[str | os.PathLike]) -> frozenset[tuple[int, int]]:
    out = set()
    for p in paths:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue  # not made yet: nothing of it to exclude
        out.add((st.st_dev, st.st_ino))
    return frozenset(out)


def scan(tree: Tree, excluder: Excluder | None = None, store: Store | None = None) -> ScanResult:
    excluder = excluder or Excluder()
    entries: dict[str, Entry] = {}
    skipped: list[dict] = []
    _walk(tree, os.dup(tree.fd), "", excluder, store, entries, skipped)
    return ScanResult(Manifest(entries), skipped)


def _walk(tree, fd, prefix, excluder, store, entries, skipped) -> None:
    try:
        with os.scandir(fd) as it:
            names = sorted(e.name for e in it)
        for name in names:
            path = f"{prefix}{name}"
            if excluder.excluded(path, name):
                continue
            try:
                path.encode("utf-8")
            except UnicodeEncodeError:
                skipped.append({"path": ascii(path), "why": "name is not UTF-8"})
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since the listing: absent, as it is now
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                if (st.st_dev, st.st_ino) in excluder.skip_dirs:
                    continue
                if st.st_dev != tree.dev:
                    skipped.append({"path": path, "why": "a mount point (another filesystem)"})
                    continue
                try:
                    sub = tree.open_dir(fd, name, path)
                except Refused as exc:  # swapped between the listing and the open
                    skipped.append({"path": path, "why": exc.why})
                    continue
                entries[path] = Entry(DIR, stat.S_IMODE(os.fstat(sub).st_mode))
                _walk(tree, sub, path + "/", excluder, store, entries, skipped)
            elif stat.S_ISLNK(mode):
                try:
                    target = os.fsdecode(os.readlink(name, dir_fd=fd))
                except OSError as exc:  # replaced since the stat (by a directory, a file)
                    skipped.append({"path": path, "why": f"changed while read ({exc.strerror})"})
                    continue
                try:
                    target.encode("utf-8")
                except UnicodeEncodeError:
                    skipped.append({"path": path, "why": "link target is not UTF-8"})
                    continue
                entries[path] = Entry(LINK, target=target)
            elif stat.S_ISREG(mode):
                try:
                    f = open_regular(fd, name, path, expected=st)
                except Refused as exc:
                    skipped.append({"path": path, "why": exc.why})
                    continue
                try:
                    sha, size = store.put_fd(f) if store is not None else hash_fd(f)
                    fmode = stat.S_IMODE(os.fstat(f).st_mode)
                finally:
                    os.close(f)
                entries[path] = Entry(FILE, fmode, sha256=sha, size=size)
            else:
                skipped.append(
                    {"path": path, "why": f"not a file, directory or link ({_kind(mode)})"}
                )
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "unknown type"
