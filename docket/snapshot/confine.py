"""Every path a snapshot reads or a restore writes, resolved inside the root and nowhere else.

A path is never handed to the kernel whole: it is checked (manifest.check_path:
no "..", no absolute path, no empty component), then walked one component at a
time from the root's open directory fd, each with O_NOFOLLOW | O_DIRECTORY, so a
symlink anywhere on the way (a directory swapped for one between a check and a
write included) makes the open fail instead of leading elsewhere. Each directory
opened must be on the root's filesystem (same st_dev): a mount inside the tree
(/proc, /sys or /dev bind-mounted there) is not entered. The last component is
acted on through its parent's fd (dir_fd=, follow_symlinks=False), so what is
checked is what is written. A root under /proc, /sys or /dev, or on their
filesystems, is refused outright, as is "/".

Root bypasses permission checks, so none of this leans on them: the refusals
come from the walk itself.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from docket.snapshot.manifest import ManifestError, check_path, kernel_name
from docket.snapshot.store import CHUNK, Deadline

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")


class Refused(Exception):
    """A path the confinement will not touch, and why (recorded, never silent)."""

    def __init__(self, path: str, why: str, errno: int | None = None) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why
        self.errno = errno  # the OS's, when an open failed (ENOENT: a parent is absent)


def _forbidden_devices() -> set[int]:
    out = set()
    for name in FORBIDDEN_ROOTS:
        try:
            out.add(os.stat(name).st_dev)
        except OSError:
            continue  # not mounted here (a container without /sys): nothing to refuse by device
    return out


def check_root(root: str) -> str:
    """The root's real path, or Refused: "/", /proc, /sys, /dev or their filesystems."""
    real = os.path.realpath(root)
    if real == "/":
        raise Refused(real, "the whole filesystem cannot be a snapshot's root")
    for name in FORBIDDEN_ROOTS:
        if real == name or real.startswith(name + "/"):
            raise Refused(real, f"nothing under {name} is snapshotted or restored")
    try:
        st = os.stat(real)
    except OSError as exc:
        raise Refused(real, f"cannot read ({exc.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(real, "not a directory")
    if st.st_dev in _forbidden_devices():
        raise Refused(real, "on the filesystem of /proc, /sys or /dev")
    return real


class Tree:
    """An open root directory; every operation goes through `parent()`'s walk.

    Use as a context manager (the root's fd is closed at the end). `root` must
    pass check_root; the fd is opened with O_NOFOLLOW so a root swapped for a
    symlink after the check is not entered either.
    """

    def __init__(self, root: str, *, recorded: bool = False) -> None:
        self.root = check_root(root)
        if recorded and self.root != root:
            # A snapshot records its root's real path: one that resolves elsewhere now
            # (it, or a folder above it, swapped for a symlink since) is not that tree.
            raise Refused(
                root,
                f"now resolves to {self.root} (a symlink on the way?): not the snapshot's tree",
            )
        self.fd = os.open(self.root, DIR_FLAGS)
        self.dev = os.fstat(self.fd).st_dev

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open_dir(self, parent_fd: int, name: str, path: str) -> int:
        """`name` under `parent_fd`, a real directory on the root's filesystem; Refused otherwise."""
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            raise Refused(path, _why_not_dir(exc), exc.errno) from None
        if os.fstat(fd).st_dev != self.dev:
            os.close(fd)
            raise Refused(path, "another filesystem is mounted here: not entered")
        return fd

    @contextmanager
    def parent(self, path: str) -> Iterator[tuple[int, str]]:
        """(fd of `path`'s parent directory, its last component), walked without following links."""
        try:
            check_path(path)
        except ManifestError as exc:
            raise Refused(str(path), str(exc)) from None
        parts = path.split("/")
        names = [kernel_name(p) for p in parts]  # the bytes each component spells
        fd = os.dup(self.fd)
        try:
            for i, part in enumerate(names[:-1]):
                step = self.open_dir(fd, part, "/".join(parts[: i + 1]))
                os.close(fd)
                fd = step
            yield fd, names[-1]
        finally:
            os.close(fd)

    def lstat(self, path: str) -> os.stat_result | None:
        """The entry at `path` itself (a link is not followed); None if absent."""
        with self.parent(path) as (fd, name):
            return lstat_at(fd, name)

    def still_at(self, path: str, fd_stat: os.stat_result) -> bool:
        """Whether the directory `path` is still the one an fd was opened on (a rename
        of a directory out of the tree, mid-restore, is detected after the fact)."""
        try:
            st = self.lstat(path)
        except Refused:
            return False
        return st is not None and (st.st_dev, st.st_ino) == (fd_stat.st_dev, fd_stat.st_ino)


def lstat_at(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_regular(fd: int, name: str, path: str, expected: os.stat_result | None = None) -> int:
    """`name` under `fd` opened for reading, only if it is a regular file (never a device,
    a FIFO or a link); if `expected` is given, it must be that very inode."""
    try:
        f = os.open(name, FILE_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise Refused(path, f"cannot open ({exc.strerror})") from None
    st = os.fstat(f)
    if not stat.S_ISREG(st.st_mode) or (
        expected is not None and (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino)
    ):
        os.close(f)
        raise Refused(path, "not the regular file that was checked (swapped?)")
    return f


def read_regular(path: str | os.PathLike, limit: int, deadline: Deadline) -> bytes:
    """A run folder's or a store's file, whole: opened without blocking (a FIFO put in
    its place opens at once) and without following a link as its last component, read
    only if it is a regular file of at most `limit` bytes, and within `deadline`.
    OSError (its strerror says why) otherwise."""
    try:
        f = os.open(path, FILE_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "a symlink: not followed") from None
        raise
    try:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({kind_of(st.st_mode)})")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, more than the {limit} taken")
        chunks, got = [], 0
        while block := os.read(f, CHUNK):
            got += len(block)
            if got > limit:
                raise OSError(errno.EFBIG, f"grew past the {limit} bytes taken while read")
            chunks.append(block)
            deadline.check(str(path))
        return b"".join(chunks)
    finally:
        os.close(f)


def kind_of(mode: int) -> str:
    """What a non-regular, non-directory, non-link entry is (manifest.OTHER_TYPES)."""
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "char-device"
    if stat.S_ISBLK(mode):
        return "block-device"
    return "unknown"


def sweep(tree: Tree, fd: int, name: str, path: str, deadline: Deadline) -> None:
    """Remove the directory `name` under `fd` and everything in it, whatever it holds
    (any name, any kind, any depth). A loop, never a recursion,
    holding one directory open at a time (a chain deeper than the fd limit included):
    it goes back up through "..", checked to be the very directory it came down from, so
    a directory moved out of the tree mid-sweep is Refused, never followed out. Links
    are removed as links, never followed; another filesystem is never entered."""
    top = tree.open_dir(fd, name, path)
    idents = [_ident(top)]  # (st_dev, st_ino) of each directory from `name` down
    names: list[str] = []  # the name of each one below `name` in its parent
    try:
        while True:
            deadline.check(path)
            with os.scandir(top) as it:
                listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            below = next((n for n, is_dir in listed if is_dir), None)
            for child, is_dir in listed:
                if not is_dir:
                    os.unlink(child, dir_fd=top)
            if below is not None:
                sub = tree.open_dir(top, below, f"{path}/...")
                os.close(top)
                top = sub
                idents.append(_ident(top))
                names.append(below)
                continue
            if not names:
                break  # `name` itself is empty now
            up = os.open("..", DIR_FLAGS, dir_fd=top)
            os.close(top)
            top = up
            idents.pop()
            if _ident(top) != idents[-1]:
                raise Refused(path, "a directory moved during the removal: not followed")
            os.rmdir(names.pop(), dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=fd)


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _why_not_dir(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a component is a symlink or not a directory: not followed"
    return f"cannot open ({exc.strerror})"
