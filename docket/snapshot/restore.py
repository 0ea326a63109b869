"""A plan applied to a real tree, every step through confine.Tree and re-checked at write time.

Before each step the entry is looked at again under its parent's open fd: if
it is not what the plan expects (another process changed it since the plan
was made), the step fails with that reason instead of overwriting. Files and
links are written to a fresh name in the same directory and renamed over the
entry, so what is replaced is the directory entry itself: never the target of
a symlink, never an inode the run hard-linked elsewhere. Restored bytes are
re-hashed as they are copied out of the store; a damaged object is refused.
After each step the parent directory must still be where the walk found it
(a directory renamed out of the tree mid-restore is reported).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from dataclasses import dataclass, field

from docket.snapshot.confine import Refused, Tree, kind_of, lstat_at, open_regular
from docket.snapshot.confine import sweep as remove_tree
from docket.snapshot.manifest import DIR, FILE, LINK, OTHER, Entry, parents
from docket.snapshot.plan import CHMOD, MKDIR, REMOVE, SYMLINK, WRITE, Plan, Step
from docket.snapshot.store import CHUNK, NO_DEADLINE, Deadline, Store, StoreError, hash_fd, sync_fs


@dataclass
class Applied:
    applied: list[dict] = field(default_factory=list)  # {"op", "path"}
    failed: list[dict] = field(default_factory=list)  # {"op", "path", "why"}


class StepFailed(Exception):
    """One step of a plan could not be applied; its message is the reason recorded."""


def apply_plan(
    tree: Tree,
    store: Store,
    plan: Plan,
    *,
    sweep: bool = False,
    deadline: Deadline = NO_DEADLINE,
) -> Applied:
    """`sweep`: a directory to remove goes with whatever it still holds (the rollback:
    what the run made below the depth bound, or under a name made after its change
    scan); without it (docket restore, unless --force) a directory that is not empty
    fails its step. Past `deadline` every step left fails, said so."""
    out = Applied()
    for step in plan.steps:
        try:
            deadline.check(step.path)
            _apply(tree, store, step, sweep, deadline)
        except Refused as exc:
            out.failed.append({"op": step.op, "path": step.path, "why": exc.why})
        except (StepFailed, StoreError) as exc:
            out.failed.append({"op": step.op, "path": step.path, "why": str(exc)})
        except OSError as exc:
            out.failed.append({"op": step.op, "path": step.path, "why": exc.strerror or str(exc)})
        else:
            out.applied.append({"op": step.op, "path": step.path})
    if out.applied:
        # One syncfs for the whole restore, not an fsync per file (ten times faster on
        # this disk); a crash before it may leave a restored file short: restore again.
        sync_fs(tree.fd)
    return out


def _apply(tree: Tree, store: Store, step: Step, sweep: bool, deadline: Deadline) -> None:
    ups = parents(step.path)
    with tree.parent(step.path) as (fd, name):
        where = os.fstat(fd)
        current = lstat_at(fd, name)
        _recheck(fd, name, step, current)
        owner = _owner(current or where)
        if step.op == REMOVE:
            assert current is not None
            if stat.S_ISDIR(current.st_mode) and sweep:
                remove_tree(tree, fd, name, step.path, deadline)
            elif stat.S_ISDIR(current.st_mode):
                os.rmdir(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        elif step.op == MKDIR:
            os.mkdir(name, 0o700, dir_fd=fd)
            if owner is not None:
                os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
        elif step.op == CHMOD:
            assert step.want is not None
            sub = tree.open_dir(fd, name, step.path)
            try:
                os.fchmod(sub, step.want.mode)
            finally:
                os.close(sub)
        elif step.op in (WRITE, SYMLINK):
            assert step.want is not None
            tmp = f".docket-restore-{secrets.token_hex(8)}"
            if step.op == WRITE:
                _write_file(fd, tmp, store, step.want, owner, deadline)
            else:
                assert step.want.target is not None
                os.symlink(step.want.target, tmp, dir_fd=fd)
                if owner is not None:
                    os.chown(tmp, *owner, dir_fd=fd, follow_symlinks=False)
            try:
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except OSError:
                os.unlink(tmp, dir_fd=fd)
                raise
        if ups and not tree.still_at(ups[-1], where):
            raise StepFailed(f"the directory {ups[-1]} moved during the restore")


def _recheck(fd: int, name: str, step: Step, current: os.stat_result | None) -> None:
    """The entry must be what the plan was made against (kind, bytes or target)."""
    if step.op == CHMOD:
        if current is None or not stat.S_ISDIR(current.st_mode):
            raise StepFailed("no longer a directory")
        return
    expected = step.have
    if expected is None:
        if current is not None:
            raise StepFailed("something appeared here after the plan was made")
        return
    if current is None:
        raise StepFailed("gone since the plan was made")
    found = _entry_at(fd, name, step.path, current)
    if not found.same_content(expected):
        raise StepFailed("changed since the plan was made")


def _entry_at(fd: int, name: str, path: str, st: os.stat_result) -> Entry:
    """The entry at `name` under `fd` now, as a scan would record it."""
    if stat.S_ISDIR(st.st_mode):
        return Entry(DIR, stat.S_IMODE(st.st_mode))
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(name, dir_fd=fd)
        try:
            target.encode("utf-8")
        except UnicodeEncodeError:
            return Entry(OTHER, target="link-not-utf8")
        return Entry(LINK, target=target)
    if stat.S_ISREG(st.st_mode):
        f = open_regular(fd, name, path, expected=st)
        try:
            sha, size = hash_fd(f)
        finally:
            os.close(f)
        return Entry(FILE, stat.S_IMODE(st.st_mode), sha256=sha, size=size)
    return Entry(OTHER, target=kind_of(st.st_mode))  # never opened


def _owner(st: os.stat_result) -> tuple[int, int] | None:
    """Who a restored entry belongs to, when this process may choose (root): the owner of
    the entry it replaces, else of its directory. The manifest records no owners; as
    anyone else, what is written is the writer's, as it was when the run wrote it."""
    if os.geteuid() != 0:
        return None
    return st.st_uid, st.st_gid


def _write_file(
    fd: int,
    tmp: str,
    store: Store,
    want: Entry,
    owner: tuple[int, int] | None,
    deadline: Deadline,
) -> None:
    src = store.open_object(want.sha256 or "")
    try:
        dst = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=fd,
        )
        try:
            h, pos = hashlib.sha256(), 0
            while block := os.pread(src, CHUNK, pos):
                h.update(block)
                os.write(dst, block)
                pos += len(block)
                deadline.check(f"object {want.sha256}")
            if h.hexdigest() != want.sha256:
                raise StoreError(f"object {want.sha256}: its bytes do not hash to its name")
            if owner is not None:
                os.fchown(dst, *owner)  # before the mode: a chown clears setuid bits
            os.fchmod(dst, want.mode)
        except BaseException:
            os.close(dst)
            os.unlink(tmp, dir_fd=fd)
            raise
        os.close(dst)
    finally:
        os.close(src)
