"""One way to put a whole file in place: written beside its target, synced, renamed
over it, and the folder synced, so a reader (or a crash) sees the old file or the
new one, never a part. Owner-only (0600): what Docket writes this way is evidence
(a receipt, restore.json) or holds answers (the shared cache store)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_file(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically and durably. Raises OSError; the temporary
    file is removed on any failure, so nothing half-written is left behind."""
    target = Path(path)
    folder = target.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)  # the rename itself, durable
    finally:
        os.close(dir_fd)


def replace_file_at(dir_fd: int, name: str, data: bytes) -> None:
    """replace_file for `name` in the folder open as `dir_fd`: every step relative to
    that descriptor, so a folder checked when it was opened (the shared cache store's)
    cannot be swapped for another under the write. The fresh file is created with
    O_EXCL and O_NOFOLLOW under a random name. Raises OSError; nothing half-written
    is left behind."""
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # renamed already: nothing to remove
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)  # the rename itself, durable
