"""Shared by the snapshot tests: a tree's fingerprint (every entry's kind, mode, bytes'
hash or link target, read without following links) and a snapshot taken of it."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from docket.snapshot.run import RootSnapshot, take


def fingerprint(root: str | os.PathLike, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    root = str(root)
    for here, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            full = os.path.join(here, name)
            rel = os.path.relpath(full, root)
            if rel.split(os.sep)[0] in skip:
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            elif stat.S_ISREG(st.st_mode):
                data = Path(full).read_bytes()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(data).hexdigest())
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]
    return out


def make_tree(root: Path) -> Path:
    """A small tree with a file, a nested file, a link, an empty directory and odd modes."""
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "README").write_text("read me\n")
    (root / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "src" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "src" / "run.sh", 0o755)
    os.chmod(root / "README", 0o640)
    os.symlink("src/pkg/mod.py", root / "link")
    return root


def snapshot_of(tmp: Path, root: Path) -> RootSnapshot:
    snap, _ = take(0, str(root), tmp / "run", tmp / "store")
    return snap
