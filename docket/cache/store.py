"""A bounded store of answers, pure: every method takes the clock reading it needs.

Bounded three ways, checked after every put: at most `max_entries` entries, at
most `max_bytes` bytes (an entry's `size`: its answer, headers and a fixed
overhead), and each entry served at most `max_hits` times. An entry is never
served once `ttl` seconds have passed since it was stored (a clock reading
before its storing, as a stepped clock may give, counts as expired too: a
cache that cannot tell an entry's age does not serve it). Eviction is least
recently used.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

# What an entry costs beyond its bytes (the key, the Entry object, the dict slot):
# counted so that a flood of empty answers is bounded by max_bytes too.
ENTRY_OVERHEAD = 256


@dataclass(frozen=True, slots=True)
class Key:
    """What a hit must match exactly: the route (provider), the path (with its
    query), the SHA-256 of the request's bytes, as model.request records it, and
    the digest of the request headers that shape the answer (decide.shaping_headers:
    "" when the request carried none)."""

    provider: str
    path: str
    request_sha256: str
    headers_sha256: str = ""


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored answer, as it was relayed to the agent (keys already scrubbed)."""

    key: Key
    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    stream: bool
    seq: int  # the model.response this answer was recorded in
    stored_at: float  # the clock reading (seconds, monotonic) when it was stored
    cost_nusd: int  # what the call was charged: a hit's saving
    model: str = ""
    # The run whose ledger holds `seq`: set by a store shared between runs
    # (docket/cache/shared.py), so its hits name it; "" in the run's own store.
    run_id: str = ""

    @property
    def body_sha256(self) -> str:
        """The digest of the answer's bytes as relayed: on the closing event that
        stored it (cache_body_sha256) and on every cache.hit that serves it."""
        return hashlib.sha256(self.body).hexdigest()

    @property
    def size(self) -> int:
        return ENTRY_OVERHEAD + len(self.body) + sum(len(k) + len(v) for k, v in self.headers)


@dataclass(frozen=True, slots=True)
class Hit:
    entry: Entry
    age_s: float
    hits: int  # this entry's hits, this one included


class Store:
    def __init__(self, *, max_entries: int, max_bytes: int, ttl: float, max_hits: int) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl <= 0 or max_hits < 1:
            raise ValueError("a store's bounds must be positive")
        self.max_entries, self.max_bytes, self.ttl, self.max_hits = (
            max_entries,
            max_bytes,
            ttl,
            max_hits,
        )
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._hits: dict[Key, int] = {}
        self.bytes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[tuple[Entry, int]]:
        """Every entry with its hits so far, least recently used first."""
        return [(e, self._hits.get(k, 0)) for k, e in self._entries.items()]

    def restore(self, entry: Entry, hits: int) -> None:
        """Put back an entry read from a shared store's file, as the most recently used,
        with its hits; the bounds are enforced by the next put (the file was written by
        a store under the same bounds, or one smaller now: then the next put trims it)."""
        if entry.key in self._entries:
            self._drop(entry.key)
        self._entries[entry.key] = entry
        if hits:
            self._hits[entry.key] = hits
        self.bytes += entry.size

    def fits(self, size: int) -> bool:
        """Whether an entry of `size` bytes can be stored at all."""
        return size <= self.max_bytes

    def _fresh(self, entry: Entry, now: float) -> bool:
        return 0 <= now - entry.stored_at < self.ttl

    def _drop(self, key: Key) -> None:
        entry = self._entries.pop(key)
        self._hits.pop(key, None)
        self.bytes -= entry.size

    def lookup(self, key: Key, now: float) -> Hit | None:
        """The entry stored under exactly `key`, counted as a hit, if it is fresh; an
        expired entry is dropped. The hit that reaches max_hits drops the entry."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if not self._fresh(entry, now):
            self._drop(key)
            return None
        hits = self._hits.get(key, 0) + 1
        if hits >= self.max_hits:
            self._drop(key)
        else:
            self._hits[key] = hits
            self._entries.move_to_end(key)
        return Hit(entry, now - entry.stored_at, hits)

    def put(self, entry: Entry, now: float) -> bool:
        """Store `entry` (replacing one under its key); False if it is larger than
        max_bytes. Expired entries at the least recently used end go first, then the least recently used, until
        both bounds hold."""
        size = entry.size
        if not self.fits(size):
            return False
        if entry.key in self._entries:
            self._drop(entry.key)
        while self._entries:  # expired entries at the cold end go first, uncounted
            oldest = next(iter(self._entries.values()))
            if self._fresh(oldest, now):
                break
            self._drop(oldest.key)
        while self._entries and (
            len(self._entries) >= self.max_entries or self.bytes + size > self.max_bytes
        ):
            self._drop(next(iter(self._entries)))
            self.evicted += 1
        self._entries[entry.key] = entry
        self.bytes += size
        return True
