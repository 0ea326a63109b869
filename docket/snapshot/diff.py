"""`docket restore RUN --diff [--only PATH ...] [--force]`: what a restore would change,
shown, not done.

The plan is the one `docket restore` makes (conflicts skipped unless --force). For
each step that writes a file back, a unified diff of the snapshot's bytes (`---`,
read from the store and re-hashed: a damaged object is said, not shown) against
the file now (`+++`, read through the confined walker, never following a link);
for a binary file (a NUL byte, or not UTF-8) or one over 1 MiB on either side,
sizes and sha256 digests instead, said why. Deletions show what would be lost the
same way; links, directories and modes are one line each. Nothing is written: not
the tree, not restore.json. Exit 0, or 1 when a conflict was skipped.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Iterator

from docket.errors import EXIT_CHECK_FAILED, EXIT_OK
from docket.snapshot.command import plan_roots
from docket.snapshot.confine import Refused, Tree, lstat_at, open_regular
from docket.snapshot.manifest import FILE, LINK, Entry
from docket.snapshot.plan import CHMOD, MKDIR, REMOVE, SYMLINK, WRITE, Step
from docket.snapshot.store import CHUNK, Store, StoreError

MAX_DIFF_BYTES = 1 << 20  # a file larger than this on either side: digests only


class Unreadable(Exception):
    """One side of a diff could not be read; the message says why."""


def restore_diff_command(run_dir: str, *, only: list[str] | None, force: bool) -> int:
    _, _, roots = plan_roots(run_dir, only, force)
    for r in roots:
        print(f"root {r.root}:")
        with Tree(r.root, recorded=True) as tree:
            for step in r.plan.steps:
                for line in step_lines(tree, r.store, step):
                    print(line)
        for c in r.plan.conflicts:
            print(f"conflict {c['path']}: {c['why']}; skipped (--force to include it)")
        if not r.plan.steps and not r.plan.conflicts:
            print("nothing to do: the tree's changed paths are as in the snapshot")
    print("(--diff: nothing was written; `docket restore RUN --apply` makes these changes)")
    return EXIT_CHECK_FAILED if any(r.plan.conflicts for r in roots) else EXIT_OK


def step_lines(tree: Tree, store: Store, step: Step) -> Iterator[str]:
    want, have, path = step.want, step.have, step.path
    if step.op == MKDIR:
        yield f"recreate directory {path}/"
    elif step.op == CHMOD:
        mode = want.mode if want else 0
        yield f"set mode of {path}/ to {mode:04o}"
    elif step.op == SYMLINK:
        assert want is not None
        now = _describe(have)
        yield f"recreate link {path} -> {want.target} (now: {now})"
    elif step.op == REMOVE and (have is None or have.kind != FILE):
        yield f"delete {path} ({_describe(have)}: not in the snapshot)"
    elif step.op in (WRITE, REMOVE):
        yield from _file_diff(tree, store, path, want if step.op == WRITE else None, have)


def _describe(e: Entry | None) -> str:
    if e is None:
        return "absent"
    if e.kind == FILE:
        return f"a file of {e.size} bytes"
    if e.kind == LINK:
        return f"a link to {e.target}"
    if e.kind == "dir":
        return "a directory"
    return f"a {e.target}"


def _file_diff(
    tree: Tree, store: Store, path: str, want: Entry | None, have: Entry | None
) -> Iterator[str]:
    """`want`: the snapshot's file (None: the restore deletes `path`); `have`: now."""
    verb = f"write {path}" if want is not None else f"delete {path} (not in the snapshot)"
    old_file = want if want is not None and want.kind == FILE else None
    new_file = have if have is not None and have.kind == FILE else None
    mode = ""
    if old_file is not None and new_file is not None and old_file.mode != new_file.mode:
        mode = f"; mode {new_file.mode:04o} -> {old_file.mode:04o}"
    if have is None:
        verb += " (absent now)"
    elif have.kind != FILE:
        verb += f" (now: {_describe(have)}, replaced)"
    big = max(old_file.size if old_file else 0, new_file.size if new_file else 0)
    if big > MAX_DIFF_BYTES:
        yield f"{verb}: over {MAX_DIFF_BYTES} bytes, digests only{mode}"
        yield from _digests(old_file, new_file)
        return
    try:
        old = _object_bytes(store, old_file) if old_file else b""
        new = _tree_bytes(tree, path) if new_file else b""
    except Unreadable as exc:
        yield f"{verb}: cannot show ({exc}){mode}"
        yield from _digests(old_file, new_file)
        return
    old_text, new_text = _text(old), _text(new)
    if old_text is None or new_text is None:
        yield f"{verb}: binary, digests only{mode}"
        yield from _digests(old_file, new_file)
        return
    yield f"{verb}{mode}"
    lines = difflib.unified_diff(
        old_text.splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        fromfile=f"a/{path} (snapshot)" if old_file else "/dev/null",
        tofile=f"b/{path} (now)" if new_file else "/dev/null",
    )
    for line in lines:
        yield line.rstrip("\n") if line.endswith("\n") else line + "\n\\ No newline at end of file"


def _digests(old: Entry | None, new: Entry | None) -> Iterator[str]:
    if old is not None:
        yield f"  snapshot: {old.size} bytes, sha256 {old.sha256}"
    if new is not None:
        yield f"  now:      {new.size} bytes, sha256 {new.sha256}"


def _text(data: bytes) -> str | None:
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _object_bytes(store: Store, want: Entry) -> bytes:
    """The snapshot's bytes, re-hashed: an object that does not hash to its name is refused."""
    try:
        fd = store.open_object(want.sha256 or "")
    except StoreError as exc:
        raise Unreadable(str(exc)) from None
    try:
        data = _read_bounded(fd)
    finally:
        os.close(fd)
    if hashlib.sha256(data).hexdigest() != want.sha256:
        raise Unreadable(f"object {want.sha256}: its bytes do not hash to its name")
    return data


def _tree_bytes(tree: Tree, path: str) -> bytes:
    try:
        with tree.parent(path) as (fd, name):
            st = lstat_at(fd, name)
            if st is None:
                raise Unreadable("gone since the plan was made")
            f = open_regular(fd, name, path, expected=st)
            try:
                return _read_bounded(f)
            finally:
                os.close(f)
    except Refused as exc:
        raise Unreadable(exc.why) from None


def _read_bounded(fd: int) -> bytes:
    chunks, got = [], 0
    while block := os.read(fd, CHUNK):
        got += len(block)
        if got > MAX_DIFF_BYTES:
            raise Unreadable(f"grew past {MAX_DIFF_BYTES} bytes while read")
        chunks.append(block)
    return b"".join(chunks)
