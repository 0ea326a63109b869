"""Slices drawn per second: N clients each doing a boundary's exchange with the budget.

A client does what a boundary's lease task does when it draws a slice
(docket/fleet/lease.py): one `FleetStore.exchange`, one `fleet_exchange` call in
autocommit on the connection the store keeps (`kept`, as a boundary's does), or on a
new connection each time (as `docket fleet` does, and boundaries did before they
kept one), reporting the lease's whole use and asking for a slice's half again. It opens its lease before the clock starts and gives it
back after, so the measured window holds only steady-state exchanges. The clients
start together on a signal and stop starting exchanges at the window's end; an
exchange counts when it ended inside the window.

The cap is far beyond what a run can report (`HUGE_CAP`), so every grant is whole
and nothing runs short; each shape has budgets of its own, so one shape's leases
never sit in another's rows.

Clients are processes (spawned, each its own interpreter, as boundaries are) or
threads of this process (a boundary runs each exchange in a worker thread);
bench_fleet.py measures both and says which it keeps, and why.
"""

from __future__ import annotations

import multiprocessing
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

HUGE_CAP = 10**18  # nano-USD: a billion dollars; a run reports ~1e12 at most
SLICE_NUSD = 1_000_000_000  # what a client asks for each time ($1; the size costs nothing)
LEASE_S = 30.0  # the policy's default lease_seconds: no lease lapses within a window
TIMEOUT_S = 2.0  # the policy's default timeout (statement and lock timeouts)
START_DELAY_S = 0.2  # between the go signal and the window's start: every client is waiting


@dataclass(frozen=True)
class Shape:
    name: str
    clients: int
    budgets: int  # 1: every client on one budget (its row lock); clients: one each


def client(
    dsn: str,
    budget: str,
    index: int,
    window_s: float,
    kept: bool,
    ready: Callable[[dict], None],
    wait_start: Callable[[], float],
) -> None:
    """One client: open a lease, say ready, exchange from the start time until the
    window ends, give the lease back; its figures go to `ready`'s second call.
    `kept`: on the connection its store keeps (a boundary's path), else a new one each time."""
    from docket.fleet.amounts import Amounts
    from docket.fleet.store import FleetStore, FleetStoreError

    store = FleetStore(dsn, timeout_s=TIMEOUT_S, keep=kept)
    used = Amounts(nusd=SLICE_NUSD // 2)  # the half of a slice a low-water exchange refills
    whole = Amounts()  # what is sent: the lease's whole use (a repeat adds nothing)
    who = {"run_id": f"bench-{budget}-{index}", "host": "bench", "lease_seconds": LEASE_S}
    try:
        first = store.exchange(budget, None, Amounts(), Amounts(nusd=SLICE_NUSD), **who)
    except FleetStoreError as exc:
        ready({"index": index, "error": f"first exchange: {exc}"})
        return
    lease = first.grant.lease_id
    ready({"index": index, "ready": True})
    start = wait_start()
    end = start + window_s
    time.sleep(max(0.0, start - time.perf_counter()))
    latencies: list[float] = []
    failures: list[str] = []
    short = done_all = 0
    while True:
        began = time.perf_counter()
        if began >= end:
            break
        try:
            done = store.exchange(budget, lease, whole + used, used, **who)
        except FleetStoreError as exc:
            failures.append(str(exc))
            continue
        ended = time.perf_counter()
        if ended <= end:
            latencies.append(ended - began)
        done_all += 1  # with the last one, which may end past the window
        if done.grant.granted.nusd != used.nusd:
            short += 1  # a grant less than asked: the cap was not large enough after all
        whole = whole + used if done.grant.lease_id == lease else Amounts()
        lease = done.grant.lease_id
    store.give_back(budget, lease, whole)
    store.close()
    ready(
        {"index": index, "latencies": latencies, "failures": failures[:3],
         "failed": len(failures), "short_grants": short, "done": done_all}
    )  # fmt: skip


def _guarded(dsn, budget, index, window_s, kept, put, wait_start) -> None:
    try:
        client(dsn, budget, index, window_s, kept, put, wait_start)
    except BaseException as exc:  # the parent reports it and fails the run, never waits on it
        put({"index": index, "error": f"{type(exc).__name__}: {exc}"})
        raise


def _process_client(dsn, budget, index, window_s, kept, out, go, start_at) -> None:
    def wait_start() -> float:
        go.wait()
        return start_at.value

    _guarded(dsn, budget, index, window_s, kept, out.put, wait_start)


def measure(
    dsn: str, shape: Shape, window_s: float, mode: str, *, kept: bool = False
) -> list[dict]:
    """One shape's exchanges over a window of window_s, with clients as `mode`
    ("processes" or "threads"): each client's figures (`summarise` adds them up)."""
    from docket.fleet.amounts import Caps
    from docket.fleet.store import FleetStore

    run = uuid.uuid4().hex[:8]  # each window its own budgets: no lease of another's in its rows
    budgets = [f"rate-{run}-{b}" for b in range(shape.budgets)]
    admin = FleetStore(dsn)
    for name in budgets:
        admin.set_budget(name, Caps(nusd=HUGE_CAP))
    assign = [budgets[i % shape.budgets] for i in range(shape.clients)]
    if mode == "processes":
        return _run_processes(dsn, assign, window_s, kept)
    if mode == "threads":
        return _run_threads(dsn, assign, window_s, kept)
    raise ValueError(f"mode must be processes or threads, not {mode!r}")


def _run_processes(dsn: str, assign: list[str], window_s: float, kept: bool) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that ran threads
    out = ctx.Queue()
    go = ctx.Event()
    start_at = ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_process_client, args=(dsn, b, i, window_s, kept, out, go, start_at))
        for i, b in enumerate(assign)
    ]
    for p in procs:
        p.start()
    try:
        dead = _dead(procs)
        _collect(out.get, len(procs), 120.0, "ready", dead)
        # perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process
        start_at.value = time.perf_counter() + START_DELAY_S
        go.set()
        results = _collect(out.get, len(procs), window_s + 60.0, "figures", dead)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return results


def _run_threads(dsn: str, assign: list[str], window_s: float, kept: bool) -> list[dict]:
    out: queue.Queue[dict] = queue.Queue()
    go = threading.Event()
    start: list[float] = []

    def wait_start() -> float:
        go.wait()
        return start[0]

    threads = [
        threading.Thread(target=_guarded, args=(dsn, b, i, window_s, kept, out.put, wait_start))
        for i, b in enumerate(assign)
    ]
    for t in threads:
        t.start()
    try:
        _collect(out.get, len(threads), 120.0, "ready")
        start.append(time.perf_counter() + START_DELAY_S)
        go.set()
        results = _collect(out.get, len(threads), window_s + 60.0, "figures")
    finally:
        go.set()  # a client that failed to start leaves the rest waiting otherwise
        if not start:
            start.append(time.perf_counter())
        for t in threads:
            t.join(timeout=30)
    return results


def _dead(procs: list) -> Callable[[], str | None]:
    def dead() -> str | None:
        for i, p in enumerate(procs):
            if p.exitcode not in (None, 0):
                return f"client {i} exited with status {p.exitcode}"
        return None

    return dead


def _collect(
    get: Callable[..., dict],
    n: int,
    timeout_s: float,
    what: str,
    dead: Callable[[], str | None] = lambda: None,
) -> list[dict]:
    """n messages from the clients; RuntimeError naming the first client that failed
    (its message, or its process's exit), or how many were silent past timeout_s."""
    deadline = time.monotonic() + timeout_s
    got = []
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(
                f"{n - len(got)} of {n} clients sent no {what} within {timeout_s:g} s"
            )
        try:
            message = get(timeout=min(1.0, left))
        except queue.Empty:
            why = dead()
            if why is not None:
                raise RuntimeError(f"{why} before it sent its {what}") from None
            continue
        if "error" in message:
            raise RuntimeError(f"client {message['index']}: {message['error']}")
        got.append(message)
    return got


def summarise(shape: Shape, window_s: float, results: list[dict]) -> dict:
    """Clients' figures over windows of window_s in all (several rounds' add up)."""
    counts: dict[int, int] = {}
    for r in results:
        counts[r["index"]] = counts.get(r["index"], 0) + len(r["latencies"])
    per_client = list(counts.values())
    total = sum(per_client)
    every = sorted(x * 1000 for r in results for x in r["latencies"])
    return {
        "clients": shape.clients,
        "budgets": shape.budgets,
        "window_s": window_s,
        "exchanges": total,
        "exchanges_per_s": round(total / window_s, 1),
        "per_client_per_s": {
            "mean": round(total / window_s / shape.clients, 1),
            "min": round(min(per_client) / window_s, 1),
            "max": round(max(per_client) / window_s, 1),
        },
        "latency_ms": percentiles(every),
        "failed": sum(r["failed"] for r in results),
        "failures": [f for r in results for f in r["failures"]][:3],
        "short_grants": sum(r["short_grants"] for r in results),
    }


def percentiles(ms: list[float]) -> dict:
    """p50, p99 and mean of sorted milliseconds (nearest rank)."""
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50": round(statistics.median(ms), 3),
        "p99": round(ms[max(0, int(len(ms) * 0.99) - 1)], 3),
        "mean": round(statistics.fmean(ms), 3),
    }
