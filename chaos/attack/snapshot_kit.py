"""What the `snapshot` family's probes share: a tree to snapshot, a walk that reads a tree
by its bytes' names through fds, and a call bounded by a deadline (snapshot.py for
rollback and restore, snapshot_prune.py for `docket prune`)."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

DEADLINE = 60.0  # seconds a probe may take: each takes under 5 here, a hang forever


def fingerprint(root: Path) -> dict[bytes, tuple]:
    """Every entry under `root` by its path's bytes: kind, mode, bytes' hash or target.
    A loop over fds (paths longer than PATH_MAX, trees deeper than the recursion limit)."""
    out: dict[bytes, tuple] = {}
    stack = [(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW), b"")]
    while stack:
        fd, prefix = stack.pop()
        try:
            for name in sorted(os.listdir(fd)):
                raw = os.fsencode(name)
                path = prefix + raw
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    out[path] = ("dir", stat.S_IMODE(st.st_mode))
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    stack.append((sub, path + b"/"))
                elif stat.S_ISLNK(st.st_mode):
                    out[path] = ("link", os.fsencode(os.readlink(name, dir_fd=fd)))
                elif stat.S_ISREG(st.st_mode):
                    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
                    h = hashlib.sha256()
                    while block := os.read(f, 1 << 20):
                        h.update(block)
                    os.close(f)
                    out[path] = ("file", stat.S_IMODE(st.st_mode), h.hexdigest())
                else:
                    out[path] = ("other", stat.S_IFMT(st.st_mode))
        finally:
            os.close(fd)
    return out


def bounded(fn: Callable, *args, **kwargs) -> tuple[str, object]:
    """("ok", result), ("raised", exception) or ("hung", None) within DEADLINE."""
    out: dict = {}

    def body() -> None:
        try:
            out["ok"] = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the probe's outcome, judged by the caller
            out["raised"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    if thread.is_alive():
        return "hung", None
    return ("ok", out["ok"]) if "ok" in out else ("raised", out["raised"])


def make_tree(root: Path) -> Path:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "README").write_text("read me\n")
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "src" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "src" / "run.sh", 0o755)
    os.symlink("src/pkg/mod.py", root / "link")
    return root
