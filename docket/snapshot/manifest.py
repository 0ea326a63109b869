"""A tree's manifest and the diff of two manifests: pure, no I/O.

A manifest maps a relative POSIX path ("a/b.txt", never "", ".", ".." or
absolute) to an Entry: a regular file (its sha256, size and permission bits),
a directory (its bits) or a symbolic link (its target, never followed). The
root itself is not an entry. `diff` says what changed between two manifests,
which is what `snapshot.changes` records and what a restore undoes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FORMAT = "docket/snapshot/v1"
FILE, DIR, LINK = "file", "dir", "link"
KINDS = (FILE, DIR, LINK)
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


class ManifestError(ValueError):
    """A manifest (or a path in one) that is not well formed: refused, never guessed at."""


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: int = 0  # permission bits (st_mode & 0o7777); 0 for links
    sha256: str | None = None  # files only
    size: int = 0  # files only
    target: str | None = None  # links only

    def as_dict(self) -> dict:
        if self.kind == FILE:
            return {"kind": FILE, "mode": self.mode, "sha256": self.sha256, "size": self.size}
        if self.kind == DIR:
            return {"kind": DIR, "mode": self.mode}
        return {"kind": LINK, "target": self.target}

    def same_content(self, other: Entry) -> bool:
        """Same kind and bytes (or target), whatever the permission bits."""
        return (self.kind, self.sha256, self.target) == (other.kind, other.sha256, other.target)


def check_path(path: object) -> str:
    """`path` if it is a relative path of plain components; ManifestError otherwise.

    Refused: absolute paths, "", ".", "..", empty components, NUL, backslashes
    (never a separator here, but a trap for a reader on another system), and
    names or paths longer than the kernel takes.
    """
    if type(path) is not str or path == "":
        raise ManifestError(f"path {path!r}: must be a non-empty string")
    if path.startswith("/"):
        raise ManifestError(f"path {path!r}: absolute paths are refused")
    if "\0" in path or "\\" in path:
        raise ManifestError(f"path {path!r}: holds NUL or a backslash")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise ManifestError(f"path {path!r}: not UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise ManifestError(f"path {path[:40]!r}...: longer than {MAX_PATH_BYTES} bytes")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise ManifestError(f"path {path!r}: component {part!r} is refused")
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise ManifestError(f"path {path!r}: a name longer than {MAX_NAME_BYTES} bytes")
    return path


def parents(path: str) -> list[str]:
    """The proper ancestors of `path`, shallowest first ("a/b/c" -> ["a", "a/b"])."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def depth(path: str) -> int:
    return path.count("/")


def entry_from_dict(where: str, d: object) -> Entry:
    if type(d) is not dict:
        raise ManifestError(f"{where}: must be an object")
    kind = d.get("kind")
    if kind == FILE:
        sha, size, mode = d.get("sha256"), d.get("size"), d.get("mode")
        if type(sha) is not str or not _HEX64.match(sha):
            raise ManifestError(f"{where}.sha256: must be 64 lowercase hex digits")
        if type(size) is not int or size < 0:
            raise ManifestError(f"{where}.size: must be an integer >= 0")
        return Entry(FILE, _mode(where, mode), sha256=sha, size=size)
    if kind == DIR:
        return Entry(DIR, _mode(where, d.get("mode")))
    if kind == LINK:
        target = d.get("target")
        if type(target) is not str or target == "" or "\0" in target:
            raise ManifestError(f"{where}.target: must be a non-empty string without NUL")
        return Entry(LINK, target=target)
    raise ManifestError(f"{where}.kind: must be one of {', '.join(KINDS)}")


def _mode(where: str, mode: object) -> int:
    if type(mode) is not int or not 0 <= mode <= 0o7777:
        raise ManifestError(f"{where}.mode: must be an integer from 0 to 0o7777")
    return mode


@dataclass(frozen=True)
class Manifest:
    entries: Mapping[str, Entry]

    def as_dict(self) -> dict:
        return {
            "format": FORMAT,
            "entries": {p: self.entries[p].as_dict() for p in sorted(self.entries)},
        }

    def digest(self) -> str:
        """sha256 of the canonical JSON of the entries: what snapshot.taken records."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def totals(self) -> dict:
        files = [e for e in self.entries.values() if e.kind == FILE]
        return {
            "files": len(files),
            "dirs": sum(1 for e in self.entries.values() if e.kind == DIR),
            "links": sum(1 for e in self.entries.values() if e.kind == LINK),
            "bytes": sum(e.size for e in files),
        }


def manifest_from_dict(data: object) -> Manifest:
    """A manifest read back (snapshot.json): every path and entry checked, and every
    entry's parent must be a directory of the manifest (no entry under a file or a link)."""
    if type(data) is not dict or data.get("format") != FORMAT:
        raise ManifestError(f"not a {FORMAT} manifest")
    raw = data.get("entries")
    if type(raw) is not dict:
        raise ManifestError("entries: must be an object")
    entries = {check_path(p): entry_from_dict(f"entries[{p!r}]", e) for p, e in raw.items()}
    for path in entries:
        for parent in parents(path):
            if parent not in entries or entries[parent].kind != DIR:
                raise ManifestError(f"path {path!r}: its parent {parent!r} is not a directory")
    return Manifest(entries)


# ---------------------------------------------------------------- what changed


@dataclass(frozen=True)
class Changes:
    """Paths a run created, modified (bytes, target or kind), deleted, or chmod'ed only."""

    created: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    mode_changed: tuple[str, ...] = ()

    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.created, *self.modified, *self.deleted, *self.mode_changed}))

    def counts(self) -> dict[str, int]:
        return {
            "created": len(self.created),
            "modified": len(self.modified),
            "deleted": len(self.deleted),
            "mode_changed": len(self.mode_changed),
        }

    def __bool__(self) -> bool:
        return bool(self.created or self.modified or self.deleted or self.mode_changed)


def diff(before: Manifest, after: Manifest) -> Changes:
    b, a = before.entries, after.entries
    created = sorted(a.keys() - b.keys())
    deleted = sorted(b.keys() - a.keys())
    modified, mode_changed = [], []
    for path in sorted(a.keys() & b.keys()):
        x, y = b[path], a[path]
        if not x.same_content(y):
            modified.append(path)
        elif x.mode != y.mode:
            mode_changed.append(path)
    return Changes(tuple(created), tuple(modified), tuple(deleted), tuple(mode_changed))


def state(entry: Entry | None) -> dict | None:
    """One side of a change as the ledger records it (None: absent)."""
    return None if entry is None else entry.as_dict()


def changes_event(before: Manifest, after: Manifest, changes: Changes) -> dict:
    """snapshot.changes' fields: each changed path with its before and after state."""

    def rows(paths: Iterable[str]) -> list[dict]:
        return [
            {
                "path": p,
                "before": state(before.entries.get(p)),
                "after": state(after.entries.get(p)),
            }
            for p in paths
        ]

    return {
        "created": rows(changes.created),
        "modified": rows(changes.modified),
        "deleted": rows(changes.deleted),
        "mode_changed": rows(changes.mode_changed),
        "counts": changes.counts(),
        "after_manifest_sha256": after.digest(),
    }


def select(manifest: Manifest, paths: Iterable[str]) -> dict[str, Entry]:
    return {p: manifest.entries[p] for p in paths if p in manifest.entries}


def under(path: str, prefixes: Iterable[str]) -> bool:
    """Whether `path` is one of `prefixes` or inside one of them (whole components)."""
    return any(path == p or path.startswith(p + "/") for p in prefixes)
