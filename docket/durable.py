"""One way to put a whole file in place: written beside its target, synced, renamed
over it, and the folder synced, so a reader (or a crash) sees the old file or the
new one, never a part. Owner-only (0600): what Docket writes this way is evidence
(a receipt, restore.json) or holds answers (the shared cache store)."""

from __future__ import annotations

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
