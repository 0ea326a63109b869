"""What the snapshot leaves out, watched: each excluded root's identity before and after a run.

`[snapshot] exclude` keeps paths out of the copy (`.git` by default), so a rollback
can never bring them back. A run that deletes or rewrites one must not do so in
silence: the snapshot notes every excluded root the scan met (up to MAX_ROOTS) and
takes a cheap identity of each before the child starts and again once it is reaped;
snapshot.changes' `excluded_changed` lists the roots whose identity differs, and
`docket run`'s last lines say so.

An identity is cheap and bounded, never a walk of the excluded tree:
  missing, a link (its target, never followed), a file (inode, size, mtime), other
    (a FIFO, a device: its kind);
  a `.git` directory: the SHA-256 of HEAD, of packed-refs and of the files under
    refs/ (names, link targets and contents; at most MAX_REF_ENTRIES entries,
    MAX_REF_DEPTH levels and MAX_FILE_BYTES a file), and the index's size and mtime. Not the directory's own
    mtime: every git command touches it (index.lock) without changing a ref;
  any other directory: its inode and mtime, and its top-level entries' names, kinds,
    sizes and mtimes (at most MAX_TOP_ENTRIES, read once; more is said as truncated).
Every open is through confine.Tree (one component at a time, O_NOFOLLOW, never
across a mount), so a root swapped for a symlink to elsewhere is recorded as that
link; and all the roots of one snapshot share a deadline (IDENTITY_SECONDS): a root
past it is recorded as unwatched, with why, never waited on.
"""

from __future__ import annotations

import hashlib
import os
import stat

from docket.snapshot.confine import DIR_FLAGS, Refused, Tree, kind_of, lstat_at, open_regular
from docket.snapshot.manifest import text_of
from docket.snapshot.store import CHUNK, Deadline, TimedOut

MAX_ROOTS = 64  # excluded roots watched per snapshot root
MAX_TOP_ENTRIES = 1000  # top-level entries of an excluded directory read
MAX_REF_ENTRIES = 10_000  # entries under .git/refs read
MAX_REF_DEPTH = 32  # directories under .git/refs entered, one inside another
MAX_FILE_BYTES = 16 << 20  # of HEAD, packed-refs or one ref, hashed at most
IDENTITY_SECONDS = 10.0  # for all the excluded roots of one snapshot root, each time
GIT = ".git"
UNWATCHED = "unwatched"


MORE = "..."  # the key standing for the excluded roots past MAX_ROOTS


def identities(
    tree: Tree, roots: list[str], total: int | None = None, seconds: float = IDENTITY_SECONDS
) -> dict:
    """path -> identity for each excluded root (relative to the tree), within `seconds`;
    `total` (the roots the scan met, if more than listed): those past MAX_ROOTS are
    counted under MORE as unwatched, never dropped in silence."""
    deadline = Deadline(seconds)
    out: dict[str, dict] = {}
    extra = max((total or len(roots)) - MAX_ROOTS, 0)
    if extra:
        why = f"{extra} excluded root(s) past the first {MAX_ROOTS}: not watched"
        out[MORE] = {"kind": UNWATCHED, "why": why}
    for path in roots[:MAX_ROOTS]:
        try:
            deadline.check(path)
            out[path] = identity(tree, path, deadline)
        except TimedOut as exc:
            out[path] = {"kind": UNWATCHED, "why": str(exc)}
        except (Refused, OSError) as exc:
            why = exc.why if isinstance(exc, Refused) else (exc.strerror or str(exc))
            out[path] = {"kind": UNWATCHED, "why": why}
    return out


def identity(tree: Tree, path: str, deadline: Deadline) -> dict:
    with tree.parent(path) as (fd, name):
        st = lstat_at(fd, name)
        if st is None:
            return {"kind": "missing"}
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            return {"kind": "link", "target": text_of(os.readlink(name, dir_fd=fd))}
        if stat.S_ISREG(mode):
            return {
                "kind": "file",
                "ino": st.st_ino,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
            }
        if not stat.S_ISDIR(mode):
            return {"kind": "other", "type": kind_of(mode)}
        if st.st_dev != tree.dev:
            return {"kind": "dir", "mount": True, "ino": st.st_ino}  # another filesystem: not read
        sub = tree.open_dir(fd, name, path)
    try:
        if os.path.basename(path) == GIT:
            return {"kind": "dir", "git": _git(tree, sub, path, deadline)}
        return {"kind": "dir", "ino": st.st_ino, "mtime_ns": st.st_mtime_ns,
                **_top(sub, deadline, path)}  # fmt: skip
    finally:
        os.close(sub)


def _top(fd: int, deadline: Deadline, path: str) -> dict:
    """The first MAX_TOP_ENTRIES top-level entries (in name order among those read)."""
    rows: list[tuple[str, str, int, int]] = []
    truncated = False
    with os.scandir(fd) as it:
        for entry in it:
            if len(rows) == MAX_TOP_ENTRIES:
                truncated = True
                break
            deadline.check(path)
            try:
                st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since the listing
            rows.append((entry.name, kind_of(st.st_mode), st.st_size, st.st_mtime_ns))
    digest = hashlib.sha256(repr(sorted(rows)).encode("utf-8", "surrogateescape")).hexdigest()
    return {"entries": len(rows), "entries_sha256": digest, "truncated": truncated}


def _file_sha(fd: int, name: str, path: str, deadline: Deadline) -> str | None:
    """SHA-256 of a regular file's first MAX_FILE_BYTES (None: absent; a link or other
    kind is named, not followed)."""
    st = lstat_at(fd, name)
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"not a file: {kind_of(st.st_mode)}"
    f = open_regular(fd, name, path, expected=st)
    try:
        h, left = hashlib.sha256(), MAX_FILE_BYTES
        while left > 0 and (block := os.read(f, min(CHUNK, left))):
            h.update(block)
            left -= len(block)
            deadline.check(path)
        return h.hexdigest()
    finally:
        os.close(f)


def _git(tree: Tree, fd: int, path: str, deadline: Deadline) -> dict:
    out: dict = {
        "head_sha256": _file_sha(fd, "HEAD", f"{path}/HEAD", deadline),
        "packed_refs_sha256": _file_sha(fd, "packed-refs", f"{path}/packed-refs", deadline),
    }
    index = lstat_at(fd, "index")
    out["index"] = None if index is None else {"size": index.st_size, "mtime_ns": index.st_mtime_ns}
    out.update(_refs(tree, fd, path, deadline))
    return out


def _listing(fd: int, limit: int) -> tuple[list[str], bool]:
    """At most `limit` names of a directory (sorted), and whether there were more: a
    directory of a million entries is never read whole."""
    names: list[str] = []
    with os.scandir(fd) as it:
        for entry in it:
            if len(names) == limit:
                return sorted(names), True
            names.append(entry.name)
    return sorted(names), False


def _refs(tree: Tree, git_fd: int, path: str, deadline: Deadline) -> dict:
    """A digest over refs/: every entry's path and kind, a file's content hash, a link's
    target (never followed). A loop over a stack of open directories, as the scan's:
    at most MAX_REF_DEPTH fds open, MAX_REF_ENTRIES entries read in all."""
    h = hashlib.sha256()
    seen, truncated = 0, False
    st = lstat_at(git_fd, "refs")
    if st is None or not stat.S_ISDIR(st.st_mode):
        return {"refs_sha256": None, "refs_entries": 0, "refs_truncated": False}
    stack: list[tuple[int, str, list[str]]] = []
    try:
        fd = tree.open_dir(git_fd, "refs", f"{path}/refs")
        names, more = _listing(fd, MAX_REF_ENTRIES)
        stack.append((fd, "refs", names[::-1]))
        truncated |= more
        while stack:
            fd, prefix, left = stack[-1]
            if not left:
                os.close(fd)
                stack.pop()
                continue
            if seen == MAX_REF_ENTRIES:
                truncated = True
                break
            name = left.pop()
            seen += 1
            where = f"{path}/{prefix}/{name}"
            deadline.check(where)
            est = lstat_at(fd, name)
            if est is None:
                continue  # gone since the listing
            h.update(
                f"{prefix}/{name}\0{kind_of(est.st_mode)}\0".encode("utf-8", "surrogateescape")
            )
            if stat.S_ISREG(est.st_mode):
                h.update((_file_sha(fd, name, where, deadline) or "").encode())
            elif stat.S_ISLNK(est.st_mode):
                h.update(os.fsencode(os.readlink(name, dir_fd=fd)))
            elif stat.S_ISDIR(est.st_mode) and est.st_dev == tree.dev:
                if len(stack) >= MAX_REF_DEPTH:
                    truncated = True  # deeper than any ref: named, not entered
                    continue
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
                try:
                    names, more = _listing(sub, MAX_REF_ENTRIES - seen)
                except BaseException:
                    os.close(sub)
                    raise
                stack.append((sub, f"{prefix}/{name}", names[::-1]))
                truncated |= more
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return {"refs_sha256": h.hexdigest(), "refs_entries": seen, "refs_truncated": truncated}


def _what(before: dict, after: dict) -> list[str]:
    """The facts that differ, by name (a kind change is the only thing said then)."""
    if before.get("kind") != after.get("kind"):
        return ["kind"]
    a, b = before.get("git") or before, after.get("git") or after
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def excluded_changes(before: dict, after: dict) -> list[dict]:
    """snapshot.changes' `excluded_changed`: each excluded root whose identity changed
    (one made by the run too: missing before), or that could not be watched."""
    out = []
    for path in sorted(set(before) | set(after)):
        was = before.get(path, {"kind": "missing"})
        now = after.get(path, {"kind": "missing"})
        if UNWATCHED in (was.get("kind"), now.get("kind")):
            why = was.get("why") or now.get("why")
            out.append({"path": path, "what": [UNWATCHED], "why": why, "before": was, "after": now})
        elif was != now:
            out.append({"path": path, "what": _what(was, now), "before": was, "after": now})
    return out


def said(root: str, changed: list[dict]) -> str | None:
    """The run's last-lines warning for one snapshot root, or None when nothing changed."""
    if not changed:
        return None
    parts = []
    for c in changed[:5]:
        if c["what"] == [UNWATCHED]:
            parts.append(f"{c['path']} (not watched: {c.get('why')})")
        elif c["what"] == ["kind"]:
            parts.append(f"{c['path']} ({c['before']['kind']} -> {c['after']['kind']})")
        else:
            parts.append(f"{c['path']} ({', '.join(c['what'])})")
    more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
    return (
        f"--snapshot {root}: the run changed what the snapshot excludes, which a rollback "
        f"cannot bring back: {'; '.join(parts)}{more} (snapshot.changes' excluded_changed)"
    )
