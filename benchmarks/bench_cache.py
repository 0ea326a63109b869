"""The response cache's costs: memory, and the latency of a hit.

- Memory: the pure store (docket/cache/store.py) takes 100,000 distinct answers
  of 1 KiB under max_entries 1,000 and max_bytes 2 MiB; the Python heap
  (tracemalloc) is read every 10,000 puts. Flat means the last reading is within
  a few percent of the first: the bounds, not the run's length, set the memory.
- Latency: a real boundary process with [cache] on, over a `docket stub`
  process, one keep-alive client: a forwarded call (a request never seen: its
  model.request, the upstream, its model.response) alternates with a hit (the
  same request every time: one cache.hit, nothing upstream). Both write and
  fsync the ledger before answering; a hit writes one event instead of two.
  The figures are each path's percentiles and the paired difference.

At the end the ledger is read back: one cache.hit per hit and one
model.request per forwarded call.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

from benchmarks import _harness as h
from docket.cache.store import Entry, Key, Store

TOKEN = "docket-bench-run-token"
PATH = "/openai/v1/chat/completions"
ANSWER = 1024


def memory(puts: int) -> dict:
    store = Store(max_entries=1000, max_bytes=2 << 20, ttl=3600, max_hits=100)
    headers = ((b"content-type", b"application/json"),)
    readings = []
    tracemalloc.start()
    started = time.perf_counter()
    try:
        for i in range(puts):
            key = Key("openai", "/v1/chat/completions", f"{i:064x}")
            body = (b"%08d" % i) * (ANSWER // 8)
            store.put(Entry(key, 200, headers, body, False, i, float(i) / 1000, 1000), i / 1000)
            if (i + 1) % 10_000 == 0:
                readings.append(
                    {
                        "puts": i + 1,
                        "heap_bytes": tracemalloc.get_traced_memory()[0],
                        "entries": len(store),
                        "store_bytes": store.bytes,
                    }
                )
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - started
    first, last = readings[0]["heap_bytes"], readings[-1]["heap_bytes"]
    return {
        "readings": readings,
        "growth_first_to_last": round(last / first - 1, 4),
        "us_per_put_traced": round(elapsed / puts * 1e6, 2),
        "evicted": store.evicted,
    }


def body(n: int | None) -> bytes:
    content = "Say hello." if n is None else f"Say hello, number {n}."
    return json.dumps(
        {
            "model": "gpt-4o-mini",
            "temperature": 0,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": content}],
        },
        separators=(",", ":"),
    ).encode()


def hit_latency(url: str, pairs: int, warmup: int) -> dict:
    conn = h.Connection(url)
    same = h.request_bytes(url, PATH, TOKEN, body(None))
    samples: dict[str, list[float]] = {"hit": [], "forwarded": []}
    paired = []
    try:
        status, _, _ = conn.call(same)  # the one miss that stores the answer
        assert status == 200
        for i in range(warmup + pairs):
            fresh = h.request_bytes(url, PATH, TOKEN, body(i))
            order = ("hit", "forwarded") if i % 2 else ("forwarded", "hit")
            took = {}
            for name in order:
                status, seconds, answer = conn.call(same if name == "hit" else fresh)
                if status != 200:
                    raise RuntimeError(f"{name} call answered {status}: {answer[:300]!r}")
                if name == "hit" and b"x-docket-cache: hit" not in answer.lower():
                    raise RuntimeError("the repeated call was not served from the cache")
                took[name] = seconds
            if i >= warmup:
                for name, seconds in took.items():
                    samples[name].append(seconds)
                paired.append(took["hit"] - took["forwarded"])
    finally:
        conn.close()
    return {
        "hit_ms": h.percentiles(samples["hit"]),
        "forwarded_ms": h.percentiles(samples["forwarded"]),
        "hit_minus_forwarded_ms": {
            "p50": round(sorted(paired)[len(paired) // 2] * 1000, 3),
            "mean": round(sum(paired) / len(paired) * 1000, 3),
        },
        "hits": warmup + pairs,
        "forwarded": warmup + pairs + 1,
    }


def run(quick: bool) -> dict:
    puts, pairs = (30_000, 200) if quick else (100_000, 2000)
    mem = memory(puts)
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOCKET_BENCH_DIR")) as name:
        ledger = Path(name) / "ledger.jsonl"
        cache = {"cache": {"enabled": True, "max_hits": 1_000_000, "ttl": "1h"}}
        stub = h.Stub()
        with stub:
            b = h.spawn_boundary(ledger, {"openai": stub.url}, TOKEN, policy=cache)
            with b:
                latency = hit_latency(b.url, pairs, warmup=50)
                final = b.stop()
            stub.stop()
        types = Counter(json.loads(line)["type"] for line in ledger.read_bytes().splitlines())
    if types["cache.hit"] != latency["hits"] or types["model.request"] != latency["forwarded"]:
        raise RuntimeError(f"the ledger does not hold the calls made: {dict(types)}")
    if final["stops"] or not final["complete"]:
        raise RuntimeError(f"the boundary asked to stop or lost evidence: {final}")
    hit, fwd = latency["hit_ms"], latency["forwarded_ms"]
    summary = {
        f"heap over {puts} distinct puts, growth first to last reading": (
            f"{mem['readings'][0]['heap_bytes']} -> {mem['readings'][-1]['heap_bytes']} bytes "
            f"({mem['growth_first_to_last']:+.2%})"
        ),
        "entries / store bytes at the end": (
            f"{mem['readings'][-1]['entries']} / {mem['readings'][-1]['store_bytes']}"
        ),
        "hit p50/p99 ms vs forwarded p50/p99 ms": (
            f"{hit['p50']}/{hit['p99']} vs {fwd['p50']}/{fwd['p99']}"
        ),
        "hit minus forwarded, paired p50 ms": latency["hit_minus_forwarded_ms"]["p50"],
    }
    return {"summary": summary, "memory": mem, "latency": latency, "ledger_types": dict(types)}
