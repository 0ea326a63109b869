"""Upstream client throughput: httpx.AsyncClient against docket's own pool, side by side.

Docket's pool (docket/http/client.py) writes requests itself and parses answers with
llhttp through httptools (docs/adr/0008-upstream-wire-on-llhttp.md).

The stub provider runs in its own process (`docket stub`), so the client under
test has this process's event loop to itself. Each configuration makes the same
non-streamed chat-completion calls at concurrency 1 and 32; the two clients
alternate, so drift on this noisy machine hits both alike.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time

import httpx
import trio

from docket.http.client import UpstreamPool

BODY = json.dumps(
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hello."}]}
).encode()
HEADERS = [("authorization", "Bearer bench"), ("content-type", "application/json")]
CONCURRENCIES = (1, 32)


def start_stub() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "docket", "stub", "--kind", "openai", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline().strip()
    if "listening on " not in line:
        process.kill()
        raise RuntimeError(f"the stub did not start: {line!r}")
    return process, line.rsplit(" ", 1)[1]


def stop_stub(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def run_calls(one_call, calls: int, concurrency: int) -> dict:
    latencies: list[float] = []
    remaining = calls

    async def worker():
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await one_call()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "calls": calls,
        "concurrency": concurrency,
        "calls_per_s": round(calls / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 3),
    }


async def measure(url: str, calls: int, rounds: int) -> dict:
    pool = UpstreamPool(url, max_connections=max(CONCURRENCIES))
    limits = httpx.Limits(max_connections=max(CONCURRENCIES), max_keepalive_connections=64)
    client = httpx.AsyncClient(base_url=url, limits=limits, timeout=30)

    async def pool_call():
        async with pool.request("POST", "/v1/chat/completions", HEADERS, BODY) as resp:
            body = await resp.read()
        if resp.status != 200 or not body:
            raise RuntimeError(f"pool call failed: {resp.status}")

    async def httpx_call():
        resp = await client.post("/v1/chat/completions", headers=dict(HEADERS), content=BODY)
        if resp.status_code != 200 or not resp.content:
            raise RuntimeError(f"httpx call failed: {resp.status_code}")

    clients = {"pool": pool_call, "httpx": httpx_call}
    for one_call in clients.values():  # warm: connections made, code paths hot
        await run_calls(one_call, 64, 32)
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for concurrency in CONCURRENCIES:
            for name, one_call in clients.items():
                result = await run_calls(one_call, calls, concurrency)
                runs.setdefault(f"{name}_c{concurrency}", []).append(result)
    await client.aclose()
    await pool.aclose()
    # the median round of each configuration, by throughput
    return {
        key: sorted(results, key=lambda r: r["calls_per_s"])[len(results) // 2]
        for key, results in runs.items()
    }


def run(quick: bool) -> dict:
    calls, rounds = (300, 1) if quick else (3000, 3)
    process, url = start_stub()
    try:
        results = trio.run(measure, url, calls, rounds)
    finally:
        stop_stub(process)
    summary = {}
    for concurrency in CONCURRENCIES:
        ours, theirs = results[f"pool_c{concurrency}"], results[f"httpx_c{concurrency}"]
        summary[f"c{concurrency} calls/s pool vs httpx"] = (
            f"{ours['calls_per_s']} vs {theirs['calls_per_s']} "
            f"(x{ours['calls_per_s'] / theirs['calls_per_s']:.2f})"
        )
        summary[f"c{concurrency} p50/p99 ms pool vs httpx"] = (
            f"{ours['p50_ms']}/{ours['p99_ms']} vs {theirs['p50_ms']}/{theirs['p99_ms']}"
        )
    return {"calls": calls, "rounds": rounds, "results": results, "summary": summary}
