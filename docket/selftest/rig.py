"""A boundary and its upstream, in-process, on real sockets on 127.0.0.1.

    async with boundary_rig(folder, {"caps": {...}}) as rig:
        r = await rig.call()                      # one chat completion, as an agent sends it
    events = read_ledger(rig.ledger_path)        # read back from the bytes on disk

The boundary is docket.boundary.app.Boundary over a real ledger in `folder`,
exactly as `docket run` builds it, minus the child process: the selftest is the
agent. A stop the boundary asks for (a cap that kills, lost evidence) is kept
in rig.stops for the check to judge, as the supervisor would act on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from docket.boundary.app import Boundary
from docket.clock import Clock
from docket.http.server import Listening, serve
from docket.ledger.chain import ChainError, ChainVerifier
from docket.ledger.faults import WriteFaults
from docket.ledger.reader import iter_lines
from docket.ledger.writer import Ledger, open_ledger
from docket.policy import policy_from_dict
from docket.selftest.runner import CheckFailed
from docket.selftest.upstream import Upstream

TOKEN = "dkt-selftest-run-token-5f2a9c0e7b3d4a61"
REAL_KEY = "sk-selftest-provider-key-8c41e9a07d2b6f35"
KEY_ENV = "DOCKET_SELFTEST_KEY"
CHAT = "/openai/v1/chat/completions"


def chat(max_tokens: int = 64, content: str = "say ok", model: str = "gpt-4o-mini") -> dict:
    return {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}],
    }


@dataclass
class Rig:
    url: str
    boundary: Boundary
    ledger: Ledger
    ledger_path: Path
    upstream: Upstream
    http: httpx.AsyncClient
    stops: list = field(default_factory=list)

    async def call(self, body: dict | None = None, **kw: Any) -> httpx.Response:
        return await self.http.post(CHAT, json=body or chat(), **kw)


@asynccontextmanager
async def boundary_rig(
    folder: Path,
    policy: dict | None = None,
    *,
    upstream: Upstream | None = None,
    clock: Clock | None = None,
    faults: WriteFaults | None = None,
    observers: tuple = (),
) -> AsyncIterator[Rig]:
    upstream = upstream or Upstream()
    data = dict(policy or {})
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        listening: Listening = await nursery.start(partial(serve, upstream))
        data["providers"] = {
            "openai": {"kind": "openai", "base_url": listening.url, "key_env": KEY_ENV}
        }
        resolved = policy_from_dict(data, source="<selftest>")
        path = folder / "ledger.jsonl"
        clock = clock or Clock()
        async with open_ledger(
            path, limits=resolved.ledger_limits(), clock=clock, observers=observers, faults=faults
        ) as ledger:
            stops: list = []
            boundary = Boundary(
                resolved,
                ledger,
                token=TOKEN,
                clock=clock,
                stop=stops.append,
                env={KEY_ENV: REAL_KEY},
            )
            url = await nursery.start(boundary.serve)
            headers = {"authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=5.0) as http:
                try:
                    yield Rig(url, boundary, ledger, path, upstream, http, stops)
                except Exception as exc:  # noqa: BLE001 - re-raised below, outside the nursery
                    # so a check's CheckFailed reaches the runner as itself, not in a group
                    failure = exc
                finally:
                    nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


def read_ledger(path: Path) -> list[dict]:
    """Every event of a ledger, read from its bytes, the chain checked line by line;
    CheckFailed naming the first line that breaks it (or a torn tail)."""
    verifier = ChainVerifier()
    events = []
    for line in iter_lines(path):
        if not line.complete:
            raise CheckFailed(f"{path.name}: torn tail at byte {line.offset}")
        try:
            events.append(verifier.feed(line.data))
        except ChainError as exc:
            # Said in a plain exception of ours: ChainError is a frozen dataclass, and a
            # context manager on its way out cannot set the traceback of a frozen one.
            raise CheckFailed(f"the ledger on disk does not verify: {exc}") from None
    return events


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def error_type(response: httpx.Response) -> str | None:
    """The provider-shaped error's type (docket_* for the boundary's refusals), or None."""
    try:
        return response.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return None


__all__ = ["CHAT", "KEY_ENV", "REAL_KEY", "TOKEN", "Rig", "boundary_rig", "chat"]
