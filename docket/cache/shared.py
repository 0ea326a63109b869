"""A named cache store shared between runs on one machine: `[cache] scope = "NAME"`.

The store is one JSON file, DIR/NAME.json (DIR: the policy's `dir`), rewritten whole
on every change: written to a fresh 0600 file beside it, synced, renamed over it.
Every read-modify-write (a lookup counts a hit; a put may evict) holds an exclusive
flock on DIR/NAME.lock, so runs sharing the store on one machine take turns and none
loses another's entries. The file is bounded like the run's store (max_entries,
max_bytes: docket.cache.store does the bounding) and is never larger than what those
bounds allow, base64 and all.

Each entry carries the run that stored it (`run_id`), the seq of its model.response
in that run's ledger and the SHA-256 of the answer's bytes that closing event recorded
(`cache_body_sha256`), so a hit names all three and a verifier holding both ledgers
can tell a genuine hit from a forged one (docket.cache.origin). Ages are wall clock
seconds here: a monotonic reading means nothing to another process.

The file is sealed: an HMAC-SHA256 over the whole document, under a key derived from
the providers' keys (seal_key), which the agent never holds, so an agent that rewrites
the file (attacker text as an answer, a saving of $10^6) makes a file no run reads.

Nothing here is taken on trust: the folder must be a directory of the
running user's that group and other cannot write; the lock and the store are opened
without following a symbolic link and without blocking (a FIFO put in their place is
refused, not waited on), and must be regular files of the running user's that group
and other cannot write (the store: not even read). Every entry is checked field by
field before it is served (docket.cache.entries). The lock is waited for at most
`lock_wait` seconds, and never past the run's deadline; the caller is told when the
wait begins (`on_wait`) so the run can say what it waits for.

A store refused for any of these reasons, or written for another policy (its
`identity`: the scope, the providers' names, kinds and base URLs, a keyed digest of
each provider's key, and what the [cache] table lets be served; an answer is only an
answer from the upstream and the account that bought it), is one StoreProblem line
naming the file and the problem, never read past and never written over: the run says
it (stderr and a `cache.refused` event) and goes on without the store.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import os
import stat
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from docket.cache.config import CachePolicy
from docket.cache.entries import Stored, entry_doc, entry_from_doc
from docket.cache.store import Entry, Hit, Key, Store
from docket.durable import replace_file_at
from docket.errors import InputError

FORMAT = "docket-cache-store-2"
# The file's bound: base64 inflates the answers by 4/3; each entry's other members and
# the JSON around it are counted generously per entry.
_PER_ENTRY = 4096
LOCK_WAIT_S = 10.0  # the longest a run waits for another run's turn on the store
_POLL_S = (0.005, 0.1)  # the lock is polled (flock takes no deadline): from, doubling to
_CREDENTIAL_LABEL = b"docket-cache-credential-1"
_SEAL_LABEL = b"docket-cache-seal-1"


class StoreProblem(InputError):
    """A store that is refused: one line naming the file and the problem."""


class StoreBusy(StoreProblem):
    """The lock is held by another process, and the caller asked not to wait."""


def credential_digest(key: str) -> str:
    """Which credential bought an answer, without the credential: the HMAC-SHA256 of a
    fixed label under the key ("" for a provider without a key)."""
    if not key:
        return ""
    return hmac.new(key.encode("utf-8"), _CREDENTIAL_LABEL, hashlib.sha256).hexdigest()


def seal_key(keys: Mapping[str, str]) -> bytes:
    """The key a store's seal is made with, from the providers' keys (name -> key): no
    process without them (an agent holds only its run token) can seal a file. Another
    label than credential_digest's, so the identity, which is written in the file,
    says nothing of it. A policy whose providers have no key seals with a known key:
    then the seal proves nothing (docs/cache.md)."""
    parts = [
        name.encode() + b"=" + hmac.new(key.encode(), _SEAL_LABEL, hashlib.sha256).digest()
        for name, key in sorted(keys.items())
        if key
    ]
    return hashlib.sha256(_SEAL_LABEL + b"".join(parts)).digest()


def _sealed_text(doc: Mapping[str, object]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def seal(doc: Mapping[str, object], key: bytes) -> str:
    """The HMAC-SHA256 of the store's document (all but its `seal`) under seal_key."""
    return hmac.new(key, _sealed_text(doc), hashlib.sha256).hexdigest()


def identity(
    policy: CachePolicy,
    providers: Mapping[str, tuple[str, str]],
    credentials: Mapping[str, str] | None = None,
) -> str:
    """What a store's entries are valid for: the scope, each provider's (kind, base URL)
    and credential (credential_digest of its key), and what the [cache] table lets be
    served. A store written under another identity holds answers from other upstreams,
    bought with another account, or to requests this policy would not serve."""
    doc = {
        "scope": policy.scope,
        "providers": {name: list(kb) for name, kb in sorted(providers.items())},
        "credentials": dict(sorted((credentials or {}).items())),
        "models": sorted(policy.models),
        "serve_anyway": {m: list(k) for m, k in sorted(policy.serve_anyway.items())},
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _not_private(info: os.stat_result, what: str, mask: int) -> str | None:
    """Why a folder or file is not the running user's alone (`mask`: the mode bits that
    must be clear), or None."""
    if info.st_uid != os.getuid():
        return f"{what} belongs to another user (uid {info.st_uid}, not {os.getuid()})"
    if info.st_mode & mask:
        who = "group/other permissions" if mask == 0o077 else "group/other write permission"
        return f"{what} has {who} ({stat.filemode(info.st_mode)}): it must be the owner's alone"
    return None


class SharedStore:
    def __init__(
        self,
        policy: CachePolicy,
        identity: str,
        *,
        providers: Collection[str] = ("openai", "anthropic"),
        lock_wait: float = LOCK_WAIT_S,
        seal_with: bytes = b"",
    ) -> None:
        assert policy.dir is not None and policy.scope != "run"
        self.policy = policy
        self.identity = identity
        self.providers = frozenset(providers)  # the names an entry's provider may be
        self.lock_wait = lock_wait
        self.seal_key = seal_with or seal_key({})
        folder = Path(policy.dir)
        self.path = folder / f"{policy.scope}.json"
        self.lock_path = folder / f"{policy.scope}.lock"
        self.max_file_bytes = (
            policy.max_bytes * 4 // 3 + policy.max_entries * _PER_ENTRY + _PER_ENTRY
        )

    def problem(self, reason: str) -> StoreProblem:
        return StoreProblem(f"cache store {self.path}: {reason}")

    # -- the folder and its two files, checked each time they are opened

    def _folder(self) -> int:
        """The folder, opened without following a link and checked: its descriptor."""
        folder = self.path.parent
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
                raise self.problem(
                    f"its folder {folder} is a symbolic link or not a folder: refused"
                ) from None
            raise self.problem(f"its folder {folder} cannot be opened: {exc.strerror}") from None
        why = _not_private(os.fstat(fd), f"its folder {folder}", 0o022)
        if why is not None:
            os.close(fd)
            raise self.problem(why)
        return fd

    def _open(self, name: str, flags: int, folder: int, mask: int) -> int:
        """A file of the folder opened no-follow and non-blocking, then checked: its
        descriptor, or -1 when it does not exist and `flags` do not create it."""
        flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o600, dir_fd=folder)
        except FileNotFoundError:
            if flags & os.O_CREAT:
                raise self.problem(f"{name} cannot be created") from None
            return -1
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self.problem(f"{name} is a symbolic link: refused, never followed") from None
            raise self.problem(f"{name} cannot be opened: {exc.strerror}") from None
        info = os.fstat(fd)
        why = _not_private(info, name, mask)
        if not stat.S_ISREG(info.st_mode):
            why = f"{name} is not a regular file"
        if why is not None:
            os.close(fd)
            raise self.problem(why)
        return fd

    def _locked(
        self, deadline: float | None, on_wait: Callable[[], object] | None
    ) -> tuple[int, int]:
        """(the folder, the lock) once the lock is ours. Waits at most lock_wait seconds
        and never past `deadline` (a time.monotonic reading); on_wait() is called once
        when the wait begins. on_wait None: no wait at all (StoreBusy)."""
        folder = self._folder()
        try:
            fd = self._open(self.lock_path.name, os.O_RDWR | os.O_CREAT, folder, 0o022)
        except BaseException:
            os.close(folder)
            raise
        start = time.monotonic()
        limit = start + self.lock_wait
        if deadline is not None:
            limit = min(limit, deadline)
        pause, waiting = _POLL_S[0], False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return folder, fd
            except BlockingIOError:
                now = time.monotonic()  # another process's turn: waited for below
            except OSError as exc:
                self._unlock((folder, fd))
                raise self.problem(f"cannot lock it: {exc.strerror}") from None
            if on_wait is None or now >= limit:
                self._unlock((folder, fd))
                if on_wait is None:
                    raise StoreBusy(f"cache store {self.path}: another process holds its lock")
                raise self.problem(
                    f"another process held its lock {self.lock_path.name} for"
                    f" {now - start:.1f} s, as long as this run waits for it"
                )
            if not waiting:
                waiting = True
                on_wait()
            time.sleep(max(0.0, min(pause, limit - now)))
            pause = min(pause * 2, _POLL_S[1])

    @staticmethod
    def _unlock(fds: tuple[int, int]) -> None:
        for fd in reversed(fds):
            os.close(fd)  # closing the lock's descriptor releases its flock

    def _read(self, folder: int) -> list[Stored]:
        fd = self._open(self.path.name, os.O_RDONLY, folder, 0o077)
        if fd < 0:
            return []  # a store not written yet: empty
        with os.fdopen(fd, "rb") as f:
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
            raise self.problem(
                f"is not a docket cache store of this version (no format {FORMAT!r}):"
                " remove it and the next run starts a new one"
            )
        if doc.get("scope") != self.policy.scope:
            raise self.problem(
                f"is the store of scope {doc.get('scope')!r}, not {self.policy.scope!r}"
            )
        if doc.get("identity") != self.identity:
            raise self.problem(
                "holds another policy's entries (other providers, base URLs, provider keys"
                " or [cache] models/serve_anyway): use another scope, or remove the file"
            )
        stated = doc.pop("seal", None)
        try:
            genuine = isinstance(stated, str) and hmac.compare_digest(
                stated, seal(doc, self.seal_key)
            )
        except ValueError:  # a value json.dumps refuses (NaN): not what this code writes
            genuine = False
        if not genuine:
            raise self.problem(
                "is not sealed with this policy's provider keys: written by something other"
                " than a docket run that holds them (an agent?); remove the file"
            )
        entries = doc.get("entries")
        if not isinstance(entries, list):
            raise self.problem("entries is not a list")
        out = []
        for i, item in enumerate(entries):
            try:
                out.append(entry_from_doc(item, providers=self.providers))
            except (KeyError, TypeError, ValueError) as exc:
                raise self.problem(f"entry {i} is refused: {exc}") from None
        return out

    def _write(self, folder: int, stored: list[Stored]) -> None:
        doc = {
            "format": FORMAT,
            "scope": self.policy.scope,
            "identity": self.identity,
            "entries": [entry_doc(s) for s in stored],
        }
        doc["seal"] = seal(doc, self.seal_key)
        data = _sealed_text(doc)
        try:
            # Under the lock, relative to the folder checked when it was opened: one
            # writer at a time, and no step another user can redirect.
            replace_file_at(folder, self.path.name, data)
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

    def check(
        self, deadline: float | None = None, on_wait: Callable[[], object] | None = None
    ) -> int:
        """Read the whole store once (at the run's start): its entries, or StoreProblem
        (StoreBusy when on_wait is None and another process holds the lock)."""
        fds = self._locked(deadline, on_wait)
        try:
            return len(self._read(fds[0]))
        finally:
            self._unlock(fds)

    def lookup(self, key: Key, now: float, deadline: float | None = None) -> Hit | None:
        fds = self._locked(deadline, _wait_quietly)
        try:
            store = self._store(self._read(fds[0]))
            before = list(store.entries())
            hit = store.lookup(key, now)
            after = list(store.entries())
            if after != before:  # a hit counted, an entry expired or used up
                self._write(fds[0], [Stored(e, n) for e, n in after])
            return hit
        finally:
            self._unlock(fds)

    def put(self, entry: Entry, now: float, deadline: float | None = None) -> bool:
        fds = self._locked(deadline, _wait_quietly)
        try:
            store = self._store(self._read(fds[0]))
            kept = store.put(entry, now)
            if kept:
                self._write(fds[0], [Stored(e, n) for e, n in store.entries()])
            return kept
        finally:
            self._unlock(fds)


def _wait_quietly() -> None:
    """Mid-run a call waits its turn on the lock silently (bounded by lock_wait): a
    wait that runs out is a cache.refused event."""
