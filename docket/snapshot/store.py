"""The content-addressed object store: a file's bytes kept once, named by their sha256.

objects/ab/cdef... holds the bytes whose sha256 is "abcdef...". A snapshot
copies a file into tmp/ first (a reflink, FICLONE, where the filesystem shares
blocks; else copy_file_range, in the kernel; else a plain read/write loop),
then hashes the copy and renames it into place: the name is always the hash of
what is stored, even when the agent rewrites the source during the copy. A
store shared between runs keeps each content once (a second copy is dropped).
Reading an object back (restore) re-hashes it: a damaged or tampered object is
refused, never restored.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import time
from pathlib import Path

FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
CHUNK = 1 << 20


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OBJECT = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class StoreError(Exception):
    """The snapshot store cannot hold or give back an object; the message says why."""


class TimedOut(StoreError):
    """A read or a walk that went on past its deadline (the rest is not done: said so)."""


class Deadline:
    """A monotonic deadline that loops check between blocks (None: none)."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    def check(self, what: str) -> None:
        if self.at is not None and time.monotonic() > self.at:
            raise TimedOut(f"{what}: not done within {self.seconds:g} s")


NO_DEADLINE = Deadline()


LOCK_NAME = "lock"
RUNS_NAME = "runs.jsonl"  # one {"folder": ABSOLUTE PATH} a line: each run that used it


class StoreBusy(StoreError):
    """Another process holds the store's lock (a snapshot under way, or a prune)."""


class StoreLock:
    """flock(2) on the store's `lock` file, opened under the store's fd without following
    a link. A snapshot holds it shared from its first copy until its record and its
    line in runs.jsonl are written (snapshots of several runs go on together); `docket
    prune` holds it exclusive, so it never sees objects a snapshot has copied but not
    yet named in a record, and a snapshot never names an object prune is removing.
    `create=False`: no lock file is made (a dry run writes nothing); without one, no
    snapshot of this version is under way, and the lock is not taken."""

    def __init__(
        self, root: str | os.PathLike, *, exclusive: bool, wait: float | None, create: bool
    ) -> None:
        self.root, self.exclusive, self.wait, self.create = Path(root), exclusive, wait, create
        self.fd: int | None = None

    def __enter__(self) -> StoreLock:
        try:
            top = os.open(self.root, _DIR)
        except OSError as exc:
            raise StoreError(f"store {self.root}: cannot open ({exc.strerror})") from None
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        try:
            self.fd = os.open(
                LOCK_NAME, flags | (os.O_CREAT if self.create else 0), 0o600, dir_fd=top
            )
        except FileNotFoundError:
            return self
        except OSError as exc:
            why = "a symlink: not followed" if exc.errno == errno.ELOOP else exc.strerror
            raise StoreError(f"store {self.root}/{LOCK_NAME}: cannot open ({why})") from None
        finally:
            os.close(top)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            self.close()
            raise StoreError(f"store {self.root}/{LOCK_NAME}: not a regular file")
        mode = fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH
        deadline = None if self.wait is None else time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(self.fd, mode | (0 if deadline is None else fcntl.LOCK_NB))
                return self
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    self.close()
                    raise StoreBusy(
                        f"store {self.root}: in use (a run is taking a snapshot, or another "
                        f"prune runs) for more than {self.wait:g} s"
                    ) from None
                time.sleep(0.05)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only fd releases the flock
            self.fd = None

    def __exit__(self, *exc: object) -> None:
        self.close()


def record_run(root: str | os.PathLike, folder: Path) -> None:
    """Name `folder` in the store's runs.jsonl (one write with O_APPEND: lines of runs
    snapshotting together do not interleave), so `docket prune` finds the run wherever
    its folder is, not only beside the store."""
    import json

    line = (json.dumps({"folder": str(folder)}, ensure_ascii=False) + "\n").encode("utf-8")
    top = os.open(root, _DIR)
    try:
        fd = os.open(
            RUNS_NAME,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
            0o600,
            dir_fd=top,
        )
    except OSError as exc:
        why = "a symlink: not followed" if exc.errno == errno.ELOOP else exc.strerror
        raise StoreError(f"store {root}/{RUNS_NAME}: cannot open ({why})") from None
    finally:
        os.close(top)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoreError(f"store {root}/{RUNS_NAME}: not a regular file")
        os.write(fd, line)
    finally:
        os.close(fd)


class Store:
    """`create=False` (docket restore) makes nothing: a store that is not there is an
    error at the first object read, and a dry run writes nowhere."""

    def __init__(self, root: str | os.PathLike, *, create: bool = True) -> None:
        self.root = Path(root)
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            for sub in (self.root, self.root / "objects", self.root / "tmp"):
                sub.mkdir(mode=0o700, exist_ok=True)
                if not stat.S_ISDIR(os.lstat(sub).st_mode):
                    # a link planted where the store (or its objects/ or tmp/) goes: the
                    # copies of the tree would be written wherever it leads
                    raise StoreError(f"store {sub}: a symlink or not a directory: not followed")
        self.methods: dict[str, int] = {"reflink": 0, "copy_file_range": 0, "copy": 0}
        self.added = 0  # objects new to the store
        self.deduped = 0  # copies dropped: the content was stored already
        self._made: set[str] = set()  # objects/xx folders known to exist (a mkdir each is slow)

    def object_path(self, sha: str) -> Path:
        return self.root / "objects" / sha[:2] / sha[2:]

    def has(self, sha: str) -> bool:
        return self.object_path(sha).exists()

    def put_fd(self, src: int) -> tuple[str, int]:
        """Store the bytes of the open regular file `src`; (sha256, size) of what was stored."""
        tmp = self.root / "tmp" / secrets.token_hex(12)
        dst = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400)
        try:
            self.methods[copy_fd(src, dst)] += 1
            sha, size = hash_fd(dst)
        except BaseException:
            os.close(dst)
            tmp.unlink(missing_ok=True)
            raise
        os.close(dst)
        final = self.object_path(sha)
        if final.parent.name not in self._made:
            final.parent.mkdir(mode=0o700, exist_ok=True)
            if not stat.S_ISDIR(os.lstat(final.parent).st_mode):  # a link planted there
                tmp.unlink()
                raise StoreError(f"store {final.parent}: not a directory (a symlink?)")
            self._made.add(final.parent.name)
        try:
            there = os.lstat(final)
        except FileNotFoundError:
            there = None
        if there is not None and stat.S_ISREG(there.st_mode) and there.st_size == size:
            tmp.unlink()  # stored already: the copy just made is dropped, never written out
            self.deduped += 1
        else:
            # Absent, or something else has the name (a FIFO, a link, a file of another
            # size, planted by another process of the user): what a snapshot names is
            # what it wrote. An object of the right size but other
            # bytes is caught when read back (re-hashed), never restored.
            if there is not None and stat.S_ISDIR(there.st_mode):
                tmp.unlink()
                raise StoreError(f"store {final}: a directory where an object belongs")
            os.replace(tmp, final)
            self.added += 1
        return sha, size

    def open_object(self, sha: str) -> int:
        """The object's fd: each folder on the way from the store's root opened without
        following a link, the object itself without blocking (a FIFO swapped in opens at
        once) and only if it is a regular file."""
        parts = ["objects", sha[:2], sha[2:]]
        try:
            fd = os.open(self.root, _DIR)
        except OSError as exc:
            raise StoreError(f"store {self.root}: cannot open ({exc.strerror})") from None
        try:
            for part in parts[:-1]:
                step = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd = step
            f = os.open(parts[-1], _OBJECT, dir_fd=fd)
        except OSError as exc:
            why = (
                "a symlink or not a directory"
                if exc.errno in (errno.ELOOP, errno.ENOTDIR)
                else exc.strerror
            )
            raise StoreError(f"object {sha[:12]}: cannot open ({why})") from None
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(f).st_mode):
            os.close(f)
            raise StoreError(f"object {sha[:12]}: not a regular file (swapped?): not read")
        return f

    def sync(self) -> None:
        """One syncfs for the whole snapshot rather than an fsync per object."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            sync_fs(fd)
        finally:
            os.close(fd)


def sync_fs(fd: int) -> None:
    """syncfs(2) on the filesystem holding `fd`: everything written there reaches the disk."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def copy_fd(src: int, dst: int) -> str:
    """Copy `src` to the empty `dst`; the method that did it."""
    try:
        fcntl.ioctl(dst, FICLONE, src)
        return "reflink"
    except OSError as exc:
        if exc.errno not in (
            errno.EOPNOTSUPP,
            errno.EXDEV,
            errno.EINVAL,
            errno.ENOTTY,
            errno.EBADF,
        ):
            raise
    offset = 0
    try:
        while True:
            n = os.copy_file_range(src, dst, CHUNK * 16, offset, offset)
            if n == 0:
                return "copy_file_range"
            offset += n
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    os.ftruncate(dst, 0)
    pos = 0
    while block := os.pread(src, CHUNK, pos):
        os.pwrite(dst, block, pos)
        pos += len(block)
    return "copy"


def hash_fd(fd: int, deadline: Deadline = NO_DEADLINE, what: str = "a file") -> tuple[str, int]:
    h, pos = hashlib.sha256(), 0
    while block := os.pread(fd, CHUNK, pos):
        h.update(block)
        pos += len(block)
        deadline.check(what)
    return h.hexdigest(), pos
