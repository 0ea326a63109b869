"""The run's shared cache store (`[cache] scope = "NAME"`, docs/cache.md): made from
the policy and the provider keys, then read once the ledger is open.

A store that cannot be used (refused by docket.cache.shared: a poisoned entry, a
symbolic link, another owner, a lock held past the wait's bound...) never stops the
run: the problem is one line on stderr and a `cache.refused` event, and the run goes
on without the store (every call forwarded, none stored: `store_unreadable`). A lock
held by another run is waited for, at most the store's lock_wait and never past the
run's wall-clock limit (a quarter of it, at the start), and the wait is said first (a
line and a `cache.waiting` event): a run never hangs silently before its agent starts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping

import trio

from docket.cache.shared import (
    SharedStore,
    StoreBusy,
    StoreProblem,
    credential_digest,
    identity,
    seal_key,
)


def shared_cache(policy, env: Mapping[str, str] | None = None) -> SharedStore | None:
    """The policy's shared cache store, not read yet; None without one. Its identity
    covers which key buys the answers (a keyed digest of each provider's key from
    `env`, default os.environ: never the key), and its seal is made with those keys."""
    cache = getattr(policy, "cache", None)
    if cache is None or not cache.enabled or cache.scope == "run":
        return None
    env = os.environ if env is None else env
    providers = {p.name: (p.kind, p.base_url) for p in policy.providers.values()}
    keys = {p.name: env.get(p.key_env, "") for p in policy.providers.values()}
    credentials = {name: credential_digest(key) for name, key in keys.items()}
    return SharedStore(
        cache,
        identity(cache, providers, credentials),
        providers=tuple(providers),
        seal_with=seal_key(keys),
    )


def _said(line: str) -> None:
    print(f"docket: {line}", file=sys.stderr, flush=True)


async def open_shared_cache(
    store: SharedStore,
    cache,
    run_id: str,
    wall_limit: float | None,
    record: Callable[..., Awaitable[object]],
) -> bool:
    """Read the store once and hand it to the boundary's cache (`cache.share`), or say
    why not and go on without it (`cache.refuse_store`). True when it is shared."""
    # A lock held by another run is waited for at most a quarter of the run's wall clock:
    # the agent keeps the rest, and a run never ends waiting (the store's lock_wait bounds
    # it too). Each call's lookup waits no later than the run's deadline.
    deadline = None if wall_limit is None else time.monotonic() + wall_limit
    start_by = None if wall_limit is None else time.monotonic() + wall_limit / 4
    try:
        try:
            await trio.to_thread.run_sync(store.check)  # no wait: StoreBusy if held
        except StoreBusy:
            bound = store.lock_wait if wall_limit is None else min(store.lock_wait, wall_limit / 4)
            _said(
                f"waiting for the cache store {store.path}: another process holds its lock"
                f" {store.lock_path.name} (at most {bound:g} s, then the run goes on without it)"
            )
            await record(
                "cache.waiting", store=str(store.path), lock=str(store.lock_path), wait_s=bound
            )
            await trio.to_thread.run_sync(store.check, start_by, _already_said)
    except StoreProblem as exc:
        _said(f"{exc}; the run goes on without the store")
        await record("cache.refused", problem=str(exc))
        cache.refuse_store(str(exc))
        return False
    cache.share(store, run_id, deadline)
    return True


def _already_said() -> None:
    """The wait was said before it began (a line and cache.waiting)."""
