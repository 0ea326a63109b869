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
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FORMAT = "docket/snapshot/v1"
FILE, DIR, LINK = "file", "dir", "link"
# What a tree holds that is recorded but never copied nor made back: a FIFO, a socket,
# a device, or a link whose target is not UTF-8. Recorded so that a rollback removes
# one the run added, and a verification sees one left behind.
OTHER = "other"
OTHER_TYPES = ("fifo", "socket", "char-device", "block-device", "link-not-utf8", "unknown")
KINDS = (FILE, DIR, LINK, OTHER)
RESTORABLE = (FILE, DIR, LINK)
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX2 = re.compile(r"[0-9a-f]{2}")
_PLAIN = re.compile(r"[^\\\x00-\x1f\x7f]*\Z")  # a name spelled as its UTF-8 text
MAX_NAME_BYTES = 255
# Entries deeper than this are not recorded: the directory at this depth is, and a
# `skipped` row says its contents were not entered (a walk never recurses, but a plan's
# step walks its path from the root, so depth costs every step).
MAX_DEPTH = 256


class ManifestError(ValueError):
    """A manifest (or a path in one) that is not well formed: refused, never guessed at."""


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: int = 0  # permission bits (st_mode & 0o7777); 0 for links
    sha256: str | None = None  # files only
    size: int = 0  # files only
    target: str | None = None  # links only (for OTHER: its type, one of OTHER_TYPES)

    def as_dict(self) -> dict:
        if self.kind == FILE:
            return {"kind": FILE, "mode": self.mode, "sha256": self.sha256, "size": self.size}
        if self.kind == DIR:
            return {"kind": DIR, "mode": self.mode}
        if self.kind == OTHER:
            return {"kind": OTHER, "type": self.target}
        return {"kind": LINK, "target": self.target}

    def same_content(self, other: Entry) -> bool:
        """Same kind and bytes (or target), whatever the permission bits."""
        return (self.kind, self.sha256, self.target) == (other.kind, other.sha256, other.target)


def name_text(raw: bytes) -> str:
    """A file name as the manifest and the ledger spell it: its UTF-8 text, except that
    a backslash is written "\\\\" and each byte that is not valid UTF-8, or is a control
    character, "\\xNN" (two lowercase hex digits). Any name a kernel gives has exactly
    one spelling, and every name is recorded: paths are bytes."""
    try:
        plain = raw.decode("utf-8")
    except UnicodeDecodeError:
        plain = None
    if plain is not None and _PLAIN.match(plain):
        return plain  # the common case, and the spelling of every name in ledgers written before bytes paths
    out = []
    for c in raw.decode("utf-8", "surrogateescape"):
        n = ord(c)
        if 0xDC80 <= n <= 0xDCFF:  # a byte the UTF-8 decoder could not take
            out.append(f"\\x{n - 0xDC00:02x}")
        elif n < 0x20 or n == 0x7F:
            out.append(f"\\x{n:02x}")
        elif c == "\\":
            out.append("\\\\")
        else:
            out.append(c)
    return "".join(out)


def name_bytes(text: str) -> bytes:
    """The bytes `name_text` spelled as `text`; ManifestError for any other spelling."""
    if _PLAIN.match(text):
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            raise ManifestError(f"name {text!r}: not UTF-8 text") from None
    out = bytearray()
    i = 0
    try:
        while i < len(text):
            c = text[i]
            if c != "\\":
                out += c.encode("utf-8")
                i += 1
            elif text[i + 1 : i + 2] == "\\":
                out += b"\\"
                i += 2
            elif text[i + 1 : i + 2] == "x" and _HEX2.match(text, i + 2):
                out.append(int(text[i + 2 : i + 4], 16))
                i += 4
            else:
                raise ManifestError(f"name {text!r}: a backslash that is no escape")
    except UnicodeEncodeError:
        raise ManifestError(f"name {text!r}: not UTF-8 text") from None
    raw = bytes(out)
    if name_text(raw) != text:
        raise ManifestError(f"name {text!r}: not the one spelling of its bytes")
    return raw


def kernel_name(text: str) -> str:
    """A checked component as os.* functions take it (undecodable bytes as surrogates)."""
    return os.fsdecode(name_bytes(text))


def text_of(kernel: str) -> str:
    """A name os.scandir gave, spelled as the manifest spells it."""
    return name_text(os.fsencode(kernel))


def check_path(path: object) -> str:
    """`path` if it is a relative path of plain components; ManifestError otherwise.

    Refused: absolute paths, "", ".", "..", empty components, names that are not
    name_text's one spelling of their bytes (so NUL and stray backslashes), names
    longer than the kernel takes, and paths deeper than MAX_DEPTH. A whole path has
    no length bound of its own: every path is walked one component at a time from a
    directory fd, so the kernel never sees more than one name.
    """
    if type(path) is not str or path == "":
        raise ManifestError(f"path {path!r}: must be a non-empty string")
    if path.startswith("/"):
        raise ManifestError(f"path {path[:80]!r}: absolute paths are refused")
    parts = path.split("/")
    if len(parts) > MAX_DEPTH:
        raise ManifestError(f"path {path[:80]!r}...: deeper than {MAX_DEPTH} levels")
    for part in parts:
        if part in ("", ".", ".."):
            raise ManifestError(f"path {path[:200]!r}: component {part!r} is refused")
        raw = name_bytes(part)
        if b"\0" in raw:
            raise ManifestError(f"path {path[:200]!r}: holds NUL")
        if len(raw) > MAX_NAME_BYTES:
            raise ManifestError(f"path {path[:80]!r}: a name longer than {MAX_NAME_BYTES} bytes")
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
    if kind == OTHER:
        kind_of = d.get("type")
        if kind_of not in OTHER_TYPES:
            raise ManifestError(f"{where}.type: must be one of {', '.join(OTHER_TYPES)}")
        return Entry(OTHER, target=kind_of)
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


def differences(before: Manifest, now: Manifest) -> list[dict]:
    """Each path whose entry now is not the snapshot's, with both states (None: absent):
    what a rollback that is not verified names (snapshot.restored's `differences`)."""
    return [
        {"path": p, "snapshot": state(before.entries.get(p)), "now": state(now.entries.get(p))}
        for p in diff(before, now).paths()
    ]
