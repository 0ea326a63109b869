"""A named cache store shared between runs on one machine: `[cache] scope = "NAME"`.

The store is one JSON file, DIR/NAME.json (DIR: the policy's `dir`), rewritten whole
on every change: written to a fresh 0600 file beside it, synced, renamed over it.
Every read-modify-write (a lookup counts a hit; a put may evict) holds an exclusive
flock on DIR/NAME.lock, so runs sharing the store on one machine take turns and none
loses another's entries. The file is bounded like the run's store (max_entries,
max_bytes: docket.cache.store does the bounding) and is never larger than what those
bounds allow, base64 and all.

Each entry carries the run that stored it (`run_id`) and the seq of its model.response
in that run's ledger, so a hit names both (`replays_run`, `replays_seq`). Ages are wall
clock seconds here: a monotonic reading means nothing to another process.

A store file that is not what this code writes (truncated, not JSON, a wrong format,
an entry of the wrong shape, group/other permissions) or that was written for another
policy (its `identity`: the scope, the providers' names, kinds and base URLs, and what
the [cache] table lets be served; an answer is only an answer from the upstream it came
from) is refused with one line naming the file and the problem (StoreProblem), never
read past: `docket run` refuses it before the run starts (exit 2); mid-run the call is
forwarded and its answer not stored (`cache_refused: "store_unreadable"`).
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from docket.cache.config import CachePolicy
from docket.cache.store import Entry, Hit, Key, Store
from docket.durable import replace_file
from docket.errors import InputError

FORMAT = "docket-cache-store-1"
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
# The file's bound: base64 inflates the answers by 4/3; each entry's other members and
# the JSON around it are counted generously per entry.
_PER_ENTRY = 4096


class StoreProblem(InputError):
    """A store file that is refused: one line naming the file and the problem."""


def identity(policy: CachePolicy, providers: Mapping[str, tuple[str, str]]) -> str:
    """What a store's entries are valid for: the scope, each provider's (kind, base URL),
    and what the [cache] table lets be served. A store written under another identity
    holds answers from other upstreams, or to requests this policy would not serve."""
    doc = {
        "scope": policy.scope,
        "providers": {name: list(kb) for name, kb in sorted(providers.items())},
        "models": sorted(policy.models),
        "serve_anyway": {m: list(k) for m, k in sorted(policy.serve_anyway.items())},
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Stored:
    """An entry as the file holds it: the entry, and its hits so far (every run's)."""

    entry: Entry
    hits: int


class SharedStore:
    def __init__(self, policy: CachePolicy, identity: str) -> None:
        assert policy.dir is not None and policy.scope != "run"
        self.policy = policy
        self.identity = identity
        folder = Path(policy.dir)
        self.path = folder / f"{policy.scope}.json"
        self.lock_path = folder / f"{policy.scope}.lock"
        self.max_file_bytes = (
            policy.max_bytes * 4 // 3 + policy.max_entries * _PER_ENTRY + _PER_ENTRY
        )

    def problem(self, reason: str) -> StoreProblem:
        return StoreProblem(f"cache store {self.path}: {reason}")

    # -- the file, under the lock

    def _locked(self) -> int:
        folder = self.path.parent
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise self.problem(
                f"cannot open its lock {self.lock_path.name}: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            os.close(fd)
            raise self.problem(f"cannot lock it: {exc.strerror}") from None
        return fd

    def _read(self) -> list[Stored]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return []  # a store not written yet: empty
        except OSError as exc:
            raise self.problem(f"cannot be read: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise self.problem("is not a regular file")
            if info.st_mode & 0o077:
                raise self.problem(
                    f"has group/other permissions ({stat.filemode(info.st_mode)}): a store"
                    " is the owner's alone (0600)"
                )
            if info.st_uid != os.getuid():
                raise self.problem("belongs to another user")
            data = f.read(self.max_file_bytes + 1)
        if len(data) > self.max_file_bytes:
            raise self.problem(
                f"is larger than max_entries and max_bytes allow ({self.max_file_bytes} bytes)"
            )
        return self._parse(data)

    def _parse(self, data: bytes) -> list[Stored]:
        if not data:
            raise self.problem("is empty (truncated?)")
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            raise self.problem("is not JSON (truncated or corrupt)") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise self.problem(f"is not a docket cache store (no format {FORMAT!r})")
        if doc.get("scope") != self.policy.scope:
            raise self.problem(
                f"is the store of scope {doc.get('scope')!r}, not {self.policy.scope!r}"
            )
        if doc.get("identity") != self.identity:
            raise self.problem(
                "holds another policy's entries (other providers, base URLs or [cache]"
                " models/serve_anyway): use another scope, or remove the file"
            )
        entries = doc.get("entries")
        if not isinstance(entries, list):
            raise self.problem("entries is not a list")
        out = []
        for i, item in enumerate(entries):
            try:
                out.append(_entry(item))
            except (KeyError, TypeError, ValueError, binascii.Error) as exc:
                raise self.problem(f"entry {i} is malformed ({exc})") from None
        return out

    def _write(self, stored: list[Stored]) -> None:
        doc = {
            "format": FORMAT,
            "scope": self.policy.scope,
            "identity": self.identity,
            "entries": [_entry_doc(s) for s in stored],
        }
        data = json.dumps(doc, separators=(",", ":")).encode()
        try:
            replace_file(self.path, data)  # under the lock: one writer at a time
        except OSError as exc:
            raise self.problem(f"cannot be written: {exc.strerror}") from None

    def _store(self, stored: list[Stored]) -> Store:
        p = self.policy
        store = Store(
            max_entries=p.max_entries, max_bytes=p.max_bytes, ttl=p.ttl, max_hits=p.max_hits
        )
        for s in stored:
            store.restore(s.entry, s.hits)
        return store

    # -- what the boundary asks (each from a worker thread: they wait on the lock)

    def check(self) -> int:
        """Read the whole store once (at the run's start): its entries, or StoreProblem."""
        fd = self._locked()
        try:
            return len(self._read())
        finally:
            os.close(fd)

    def lookup(self, key: Key, now: float) -> Hit | None:
        fd = self._locked()
        try:
            store = self._store(self._read())
            before = list(store.entries())
            hit = store.lookup(key, now)
            after = list(store.entries())
            if after != before:  # a hit counted, an entry expired or used up
                self._write([Stored(e, n) for e, n in after])
            return hit
        finally:
            os.close(fd)

    def put(self, entry: Entry, now: float) -> bool:
        fd = self._locked()
        try:
            store = self._store(self._read())
            kept = store.put(entry, now)
            if kept:
                self._write([Stored(e, n) for e, n in store.entries()])
            return kept
        finally:
            os.close(fd)


def _b64(text: object) -> bytes:
    if not isinstance(text, str):
        raise TypeError("not base64 text")
    return base64.b64decode(text.encode("ascii"), validate=True)


def _int(value: object, name: str) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} is not a whole number")
    return value


def _str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} is not a string")
    return value


def _entry(item: object) -> Stored:
    if not isinstance(item, dict):
        raise ValueError("not an object")
    sha = _str(item["request_sha256"], "request_sha256")
    if not _HEX64.match(sha):
        raise ValueError("request_sha256 is not 64 hex digits")
    headers = item["headers"]
    if not isinstance(headers, list) or not all(
        isinstance(h, list) and len(h) == 2 for h in headers
    ):
        raise ValueError("headers is not a list of pairs")
    stored_at = item["stored_at"]
    if type(stored_at) not in (int, float):
        raise ValueError("stored_at is not a number")
    stream = item["stream"]
    if type(stream) is not bool:
        raise ValueError("stream is not true/false")
    entry = Entry(
        key=Key(_str(item["provider"], "provider"), _str(item["path"], "path"), sha),
        status=_int(item["status"], "status"),
        headers=tuple((_b64(k), _b64(v)) for k, v in headers),
        body=_b64(item["body"]),
        stream=stream,
        seq=_int(item["seq"], "seq"),
        stored_at=float(stored_at),
        cost_nusd=_int(item["cost_nusd"], "cost_nusd"),
        model=_str(item["model"], "model"),
        run_id=_str(item["run_id"], "run_id"),
    )
    return Stored(entry, _int(item["hits"], "hits"))


def _entry_doc(s: Stored) -> dict:
    e = s.entry

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "provider": e.key.provider,
        "path": e.key.path,
        "request_sha256": e.key.request_sha256,
        "status": e.status,
        "headers": [[b64(k), b64(v)] for k, v in e.headers],
        "body": b64(e.body),
        "stream": e.stream,
        "seq": e.seq,
        "stored_at": e.stored_at,
        "cost_nusd": e.cost_nusd,
        "model": e.model,
        "run_id": e.run_id,
        "hits": s.hits,
    }
