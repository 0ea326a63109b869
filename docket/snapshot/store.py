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
from pathlib import Path

FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
CHUNK = 1 << 20


class StoreError(Exception):
    """The snapshot store cannot hold or give back an object; the message says why."""


class Store:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        (self.root / "objects").mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(mode=0o700, exist_ok=True)
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
        if final.exists():
            tmp.unlink()
            self.deduped += 1
        else:
            if final.parent.name not in self._made:
                final.parent.mkdir(mode=0o700, exist_ok=True)
                self._made.add(final.parent.name)
            os.replace(tmp, final)
            self.added += 1
        return sha, size

    def open_object(self, sha: str) -> int:
        try:
            return os.open(self.object_path(sha), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreError(f"object {sha[:12]}: cannot open ({exc.strerror})") from None

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


def hash_fd(fd: int) -> tuple[str, int]:
    h, pos = hashlib.sha256(), 0
    while block := os.pread(fd, CHUNK, pos):
        h.update(block)
        pos += len(block)
    return h.hexdigest(), pos
