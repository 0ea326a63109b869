"""A tree read into a manifest, through confine.Tree's walk (never across a link or a mount).

`scan(tree, store=...)` is the snapshot (each file's bytes copied into the
store, the manifest naming them by hash); `scan(tree)` alone hashes, which is
the change scan at the end of a run. Excluded: whatever `exclude` names (a
pattern without "/" matches a name at any depth, as `.git` does; one with "/"
matches the path from the root) and the directories in `skip_dirs` by identity
(the run's evidence folder, the store). Every name is recorded, spelled by
manifest.name_text (bytes that are not UTF-8 as \\xNN). A device, a FIFO, a
socket or a link whose target is not UTF-8 is recorded by kind (OTHER), never
opened or copied; what cannot be read at all (a mount point, a directory
deeper than MAX_DEPTH, a file swapped mid-read) is listed in `skipped` with its
reason, never dropped silently.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from docket.snapshot.confine import Refused, Tree, kind_of, open_regular
from docket.snapshot.excluded import MAX_ROOTS
from docket.snapshot.manifest import DIR, FILE, LINK, MAX_DEPTH, OTHER, Entry, Manifest, text_of
from docket.snapshot.store import NO_DEADLINE, Deadline, Store, hash_fd

DEFAULT_EXCLUDE = (".git",)


@dataclass
class ScanResult:
    manifest: Manifest
    skipped: list[dict] = field(default_factory=list)  # {"path", "why"}
    # the excluded roots met (at most MAX_ROOTS listed) and how many there were
    excluded: list[str] = field(default_factory=list)
    excluded_count: int = 0


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


def scan(
    tree: Tree,
    excluder: Excluder | None = None,
    store: Store | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> ScanResult:
    """A loop over a stack of open directories, never a recursion: at
    most MAX_DEPTH fds open, a directory at that depth recorded but not entered."""
    excluder = excluder or Excluder()
    entries: dict[str, Entry] = {}
    skipped: list[dict] = []
    excluded: list[str] = []
    excluded_count = 0
    stack: list[tuple[int, str, list[str]]] = []  # (fd, its path + "/", names left)
    try:
        _push(stack, os.dup(tree.fd), "")
        while stack:
            fd, prefix, names = stack[-1]
            if not names:
                os.close(fd)
                stack.pop()
                continue
            name = names.pop()
            text = text_of(name)
            path = f"{prefix}{text}"
            if excluder.excluded(path, text):
                excluded_count += 1
                if len(excluded) < MAX_ROOTS:
                    excluded.append(path)
                continue
            deadline.check(path)
            sub = _entry(tree, fd, name, path, excluder, store, deadline, entries, skipped)
            if sub is None:
                continue
            if len(stack) >= MAX_DEPTH:
                os.close(sub)
                skipped.append(
                    {"path": path, "why": f"deeper than {MAX_DEPTH} levels: not entered"}
                )
                continue
            _push(stack, sub, path + "/")
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return ScanResult(Manifest(entries), skipped, excluded, excluded_count)


def _push(stack: list, fd: int, prefix: str) -> None:
    try:
        with os.scandir(fd) as it:
            names = sorted((e.name for e in it), reverse=True)  # popped in order
    except BaseException:
        os.close(fd)
        raise
    stack.append((fd, prefix, names))


def _entry(tree, fd, name, path, excluder, store, deadline, entries, skipped) -> int | None:
    """Record `name` under `fd` as `path`; the fd of a directory to enter, else None."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None  # gone since the listing: absent, as it is now
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        if (st.st_dev, st.st_ino) in excluder.skip_dirs:
            return None
        if st.st_dev != tree.dev:
            skipped.append({"path": path, "why": "a mount point (another filesystem)"})
            return None
        try:
            sub = tree.open_dir(fd, name, path)
        except Refused as exc:  # swapped between the listing and the open
            skipped.append({"path": path, "why": exc.why})
            return None
        entries[path] = Entry(DIR, stat.S_IMODE(os.fstat(sub).st_mode))
        return sub
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(name, dir_fd=fd)
        except OSError as exc:  # replaced since the stat (by a directory, a file)
            skipped.append({"path": path, "why": f"changed while read ({exc.strerror})"})
            return None
        try:
            target.encode("utf-8")
        except UnicodeEncodeError:
            # Recorded (a rollback removes one the run made), never made back.
            entries[path] = Entry(OTHER, target="link-not-utf8")
            return None
        entries[path] = Entry(LINK, target=target)
        return None
    if stat.S_ISREG(mode):
        try:
            f = open_regular(fd, name, path, expected=st)
        except Refused as exc:
            skipped.append({"path": path, "why": exc.why})
            return None
        try:
            sha, size = store.put_fd(f) if store is not None else hash_fd(f, deadline, path)
            fmode = stat.S_IMODE(os.fstat(f).st_mode)
        finally:
            os.close(f)
        entries[path] = Entry(FILE, fmode, sha256=sha, size=size)
        return None
    # A FIFO, a socket, a device: recorded by kind, never opened, never copied.
    entries[path] = Entry(OTHER, target=kind_of(mode))
    return None
