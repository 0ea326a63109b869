"""One writer per ledger: an exclusive flock on a sidecar `<ledger>.lock` holding the pid.

flock locks belong to an open file description, so a second open in the same
process conflicts just as another process does, and the kernel drops the lock
when its holder dies: a stale lock file never blocks a new writer.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from docket.errors import DocketError


class LedgerLocked(DocketError):
    """Another writer holds the ledger; the message names its pid."""


def lock_path(ledger: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(ledger)}.lock")


def _read_pid(fd: int) -> int | None:
    raw = os.pread(fd, 32, 0).strip()
    return int(raw) if raw.isdigit() else None


class LedgerLock:
    """Held from acquire() to release(); refuses, naming the holder, if taken."""

    def __init__(self, ledger: str | os.PathLike[str]) -> None:
        self.ledger = Path(ledger)
        self.path = lock_path(ledger)
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            who = f"pid {pid}" if pid is not None else "a process that has not written its pid yet"
            raise LedgerLocked(f"ledger {self.ledger} is locked by {who}") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            os.close(fd)  # on a full disk, say: do not keep a lock we cannot name
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            # Closing the descriptor drops the flock; the file stays (harmless, and
            # removing it would race with a writer that has just opened it).
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> LedgerLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder_pid(ledger: str | os.PathLike[str]) -> int | None:
    """The pid of a live writer holding the ledger, or None if nobody holds it.

    Read from /proc/locks, which only observes: probing by taking the lock
    ourselves (even shared, for an instant) would make a writer that starts in
    that instant be refused as "locked". Falls back to that probe where
    /proc/locks is missing.
    """
    try:
        st = os.stat(lock_path(ledger))
    except FileNotFoundError:
        return None
    try:
        with open("/proc/locks", encoding="ascii") as locks:
            table = locks.read()
    except OSError:
        return _probe_holder(ledger)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 19299 fe:00:2148766 0 EOF" (blocked waiters have "->")
        fields = line.split()
        if (
            len(fields) >= 6
            and fields[1] == "FLOCK"
            and fields[5] == wanted
            and fields[3] == "WRITE"
        ):
            return int(fields[4])
    return None


def _probe_holder(ledger: str | os.PathLike[str]) -> int | None:
    try:
        fd = os.open(lock_path(ledger), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
