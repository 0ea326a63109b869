"""The boundary's use of the response cache (docket/cache/, docs/cache.md).

`ResponseCache.consult` is asked once a call is admitted: a `Hit` is answered
from the store (a `cache.hit` event in place of the model.request, nothing
forwarded, the reservation cancelled: a hit spends nothing); otherwise the call
goes upstream with a `Lookup` that its ModelCall fills in (`Capture`: the bytes
relayed to the agent) and hands back at its close, when `close_fields` says, in
the closing event, whether the answer was stored or why not. The decisions are
docket.cache.decide's; this module only carries facts to them and bytes back.

Chaos faults: the harness records each `fault.injected` before the fault takes
effect, and tells the boundary (`note_fault`). An answer to a call during which
any fault was noted is never stored ("fault_injected"): which call a fault hit
is not knowable here, so every call in flight at the time is suspect.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from docket.cache.config import CachePolicy
from docket.cache.decide import (
    Answer,
    Keep,
    Refuse,
    request_refusal,
    shaping_headers,
    storable,
)
from docket.cache.entries import replayable_headers
from docket.cache.shared import SharedStore, StoreProblem
from docket.cache.store import ENTRY_OVERHEAD, Entry, Hit, Key, Store


@dataclass(slots=True)
class Capture:
    """The answer as relayed to the agent, up to a limit (past it: too large to store)."""

    limit: int
    status: int | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    chunks: list[bytes] = field(default_factory=list)
    size: int = ENTRY_OVERHEAD
    over: bool = False
    streamed: bool = False  # relayed as a stream (replayed as one)

    def head(
        self, status: int, headers: list[tuple[bytes, bytes]], *, streamed: bool = False
    ) -> None:
        self.status, self.headers, self.streamed = status, tuple(headers), streamed
        self.size += sum(len(k) + len(v) for k, v in headers)

    def add(self, data: bytes) -> None:
        if self.over or not data:
            return
        self.size += len(data)
        if self.size > self.limit:
            self.over, self.chunks = True, []  # nothing kept of what cannot be stored
        else:
            self.chunks.append(data)


@dataclass(slots=True)
class Lookup:
    """One forwarded call's dealings with the cache."""

    key: Key
    refusal: str | None  # why this request may not be served or stored (None: it may)
    faults_at_start: int
    capture: Capture


class ResponseCache:
    def __init__(
        self, policy: CachePolicy, on_outcome: Callable[[str, str], object] | None = None
    ) -> None:
        self.policy = policy
        self.on_outcome = on_outcome  # (provider, "stored" or a reason): the metrics' count
        self.store = Store(
            max_entries=policy.max_entries,
            max_bytes=policy.max_bytes,
            ttl=policy.ttl,
            max_hits=policy.max_hits,
        )
        self.faults_noted = 0
        # With a named scope: the store shared between runs (docket/cache/shared.py),
        # set by the supervisor once it has checked the file; `store` then stays empty.
        self.shared: SharedStore | None = None
        self.run_id = ""
        self.deadline: float | None = None  # the run's, on time.monotonic: no lock wait past it
        # A shared store refused at the run's start: the run goes on without it, every
        # call forwarded and not stored ("store_unreadable").
        self.refused: str | None = None
        self.problems: list[str] = []  # a shared store refused: said on stderr
        self.unrecorded: list[str] = []  # ... and not yet a cache.refused event (take_problems)

    def share(self, shared: SharedStore, run_id: str, deadline: float | None = None) -> None:
        self.shared, self.run_id, self.deadline = shared, run_id, deadline

    def refuse_store(self, text: str) -> None:
        """The shared store was refused at the start (said there): go on without it."""
        self.refused = text

    def take_problems(self) -> list[str]:
        """The store problems met since the last call: each becomes a cache.refused event."""
        taken, self.unrecorded = self.unrecorded, []
        return taken

    def note_fault(self) -> None:
        self.faults_noted += 1

    async def consult(
        self,
        provider: str,
        path: str,
        *,
        endpoint: str,
        model: str | None,
        choices: int,
        payload: dict[str, Any] | None,
        body: bytes,
        now: float,
        kind: str = "",
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> Hit | Lookup:
        """`kind` and `headers`: the provider's kind and the request's headers, of which
        those that shape the answer are part of the key (decide.shaping_headers)."""
        key = Key(provider, path, hashlib.sha256(body).hexdigest(), shaping_headers(kind, headers))
        refusal = request_refusal(endpoint, model, choices, payload, self.policy)
        if refusal is None and self.refused is not None:
            refusal = "store_unreadable"  # refused at the start: the run goes on without it
        if refusal is None:
            try:
                hit = await self._lookup(key, now)
            except StoreProblem as exc:
                self._problem(str(exc))
                refusal = "store_unreadable"  # forwarded; its answer is not stored either
            else:
                if hit is not None:
                    return hit
        return Lookup(key, refusal, self.faults_noted, Capture(self.policy.max_bytes))

    async def _lookup(self, key: Key, now: float) -> Hit | None:
        if self.shared is None:
            return self.store.lookup(key, now)
        # The shared file waits on other runs' lock: off the event loop.
        return await trio.to_thread.run_sync(self.shared.lookup, key, time.time(), self.deadline)

    def _problem(self, text: str) -> None:
        if not self.problems or self.problems[-1] != text:  # once, not once a call
            print(f"docket: {text}", file=sys.stderr, flush=True)
            self.unrecorded.append(text)
        self.problems.append(text)

    def decide(
        self, lookup: Lookup, *, complete: bool, usage_missing: bool
    ) -> tuple[Keep | Refuse, dict[str, Any]]:
        """The store decision for a call that is closing, and its closing event's fields."""
        capture = lookup.capture
        answer = Answer(
            status=capture.status,
            complete=complete,
            usage_missing=usage_missing,
            faulted=self.faults_noted != lookup.faults_at_start,
            size=self.policy.max_bytes + 1 if capture.over else capture.size,
        )
        decision = storable(lookup.refusal, answer, self.policy.max_bytes)
        outcome = decision.reason if isinstance(decision, Refuse) else "stored"
        if self.on_outcome is not None:
            self.on_outcome(lookup.key.provider, outcome)
        if isinstance(decision, Refuse):
            return decision, {"cache_refused": decision.reason}
        # The digest of what is stored, on the record: a hit served from it, in this run
        # or another, carries the same digest (a verifier holding both ledgers compares).
        body_sha256 = hashlib.sha256(b"".join(capture.chunks)).hexdigest()
        return decision, {"cache_stored": True, "cache_body_sha256": body_sha256}

    async def keep(
        self, lookup: Lookup, *, seq: int, cost_nusd: int, model: str, now: float
    ) -> None:
        capture = lookup.capture
        if self.shared is not None:
            now = time.time()  # a shared store's ages are wall clock: shared.py
        assert capture.status is not None and not capture.over
        entry = Entry(
            key=lookup.key,
            status=capture.status,
            headers=replayable_headers(capture.headers),
            body=b"".join(capture.chunks),
            stream=capture.streamed,
            seq=seq,
            stored_at=now,
            cost_nusd=cost_nusd,
            model=model,
            run_id=self.run_id if self.shared is not None else "",
        )
        if self.shared is None:
            self.store.put(entry, now)
            return
        try:
            await trio.to_thread.run_sync(self.shared.put, entry, time.time(), self.deadline)
        except StoreProblem as exc:  # the closing event said stored: say it was not
            self._problem(f"{exc}; the answer of seq {seq} was not stored")
