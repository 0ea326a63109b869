"""The evidence of faults: every injection the harness performs, in the run's ledger.

Each fault the harness performs becomes a `fault.injected` event in the same
chain as its effects, through the recorder's hook (docket.run.hooks.RunHandle).
`record` is awaited by a layer that can wait (the stub, before it answers; a
signal, before it is sent), so the record is durable before the effect.
`record_soon` is for a layer that cannot wait (the fault proxy's toxicity roll
runs inside a synchronous call): the record is queued and written by `pump`,
shortly after. Both also keep the fields, with the seq they got (None when the
ledger could not take them), in `injected` and in injected.jsonl.

Ledger write faults cannot be in the ledger they break: `unwritable` keeps them
here only, and the run's evidence.gap / receipt (`ledger_complete: false`) is
their record in the chain.

The recorder takes records only while its run is open (`open` ... `close`):
before the boundary listens there is no ledger to write to, and after the run
ends a line would follow session.end.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import trio

from docket.run.hooks import RunHandle


class FaultEvidence:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.injected: list[dict] = []
        self._handle: RunHandle | None = None
        self._opened = trio.Event()
        self._closed = False
        self._send, self._receive = trio.open_memory_channel[dict](math.inf)

    def open(self, handle: RunHandle) -> None:
        self._handle = handle
        self._opened.set()

    async def close(self) -> None:
        """Write what is queued, then refuse further records (the run is ending)."""
        if self._opened.is_set():
            await self.flush()
        self._closed = True
        self._opened.set()  # a record still waiting for the run now knows it is over
        while True:
            try:
                fields = self._receive.receive_nowait()
            except trio.WouldBlock:
                return
            self._keep(fields, None, "the run had ended: not recorded in the ledger")

    async def record(self, fields: Mapping[str, object]) -> int | None:
        """Append `fault.injected` and wait until it is durable; its seq, or None."""
        await self._opened.wait()
        if self._closed:
            self._keep(fields, None, "the run had ended: not recorded in the ledger")
            return None
        assert self._handle is not None
        seq = await self._handle.record_fault(fields)
        self._keep(fields, seq, None if seq is not None else "the ledger did not take it")
        return seq

    def record_soon(self, fields: Mapping[str, object]) -> None:
        """Queue a record from code that cannot wait; `pump` writes it."""
        self._send.send_nowait(dict(fields))

    def unwritable(self, fields: Mapping[str, object], why: str) -> None:
        """A fault whose record cannot be in the ledger (it breaks the ledger)."""
        self._keep(fields, None, why)

    async def pump(self) -> None:
        """Write queued records as they come, until cancelled."""
        async for fields in self._receive:
            await self.record(fields)

    async def flush(self) -> None:
        while True:
            try:
                fields = self._receive.receive_nowait()
            except trio.WouldBlock:
                return
            await self.record(fields)

    def _keep(self, fields: Mapping[str, object], seq: int | None, note: str | None) -> None:
        entry = {**fields, "ledger_seq": seq}
        if note is not None:
            entry["note"] = note
        self.injected.append(entry)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry, separators=(",", ":")) + "\n")
