"""The boundary's cost: added latency, throughput, and what it does to a stream.

Three processes, each with its own event loop: the boundary (with its ledger
durable: real fdatasync on the disk $DOCKET_BENCH_DIR is on), the stub provider
(`docket stub`), and this one, the client. The client is plain sockets (a
selectors loop under load), so it costs little next to what it measures
(about a tenth of the boundary's CPU per call). Nothing is pinned: on two
cores the scheduler places the three better than a fixed split did.

- Added latency: one client, non-streamed; a call through the boundary and the
  same call straight to the stub alternate (the order flips every pair), so
  drift on this noisy machine hits both alike. Added = the boundary's
  percentile minus the direct one's; the paired differences are kept too.
- Throughput: 32 keep-alive connections, each sending its next call as soon as
  its answer is in; the same load straight at the stub, in the same round, is
  the ceiling the stub itself sets. The ledger's fsyncs and events over the
  boundary's run come from the boundary process.
- Streaming: time to the first SSE event, boundary against direct,
  alternating; and a stub that holds its second token back 500 ms: the gap
  between the two tokens as the client sees them must survive the boundary.

At the end the ledger is read back from disk and verified: a model.request and
a model.response for every call the client made through the boundary.

The machine is shared, so the run also records what it was up against: the
load average before it, the disk's own write+fdatasync time and the CPU's
speed (a fixed Python loop) before and after. CPU per call (from /proc) for
each process, and for the boundary's event loop alone, is kept with the
throughput. DOCKET_BENCH_PROFILE=FILE runs the boundary under cProfile (on the
main thread's CPU clock) and dumps the stats there; that slows it several times.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks import _harness as h

TOKEN = "docket-bench-run-token"
CHAT = "/v1/chat/completions"
TARGET_ADDED_P50_MS = 1.5
TARGET_ADDED_P99_MS = 5.0
TARGET_CALLS_PER_S = 1500
TARGET_TTFB_ADDED_MS = 2.0
HOLD_S = 0.5
TARGET_HOLD_GAP_MS = 450.0
CONCURRENCY = 32


def mark(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


class Paths:
    """Where each path's calls go: through the boundary, or straight to the stub."""

    def __init__(self, boundary_url: str, stub_url: str) -> None:
        self.urls = {"boundary": boundary_url, "direct": stub_url}
        self.paths = {"boundary": "/openai" + CHAT, "direct": CHAT}


def added_latency(paths: Paths, pairs: int, warmup: int) -> dict:
    body = h.chat_body(stream=False)
    conns = {name: h.Connection(url) for name, url in paths.urls.items()}
    requests = {
        name: h.request_bytes(paths.urls[name], paths.paths[name], TOKEN, body) for name in conns
    }
    samples: dict[str, list[float]] = {"boundary": [], "direct": []}
    paired: list[float] = []
    try:
        for i in range(warmup + pairs):
            order = ("boundary", "direct") if i % 2 else ("direct", "boundary")
            took = {}
            for name in order:
                status, seconds, answer = conns[name].call(requests[name])
                if status != 200:
                    raise RuntimeError(f"{name} call answered {status}: {answer[:300]!r}")
                took[name] = seconds
            if i >= warmup:
                for name, seconds in took.items():
                    samples[name].append(seconds)
                paired.append(took["boundary"] - took["direct"])
    finally:
        for conn in conns.values():
            conn.close()
    boundary, direct = h.percentiles(samples["boundary"]), h.percentiles(samples["direct"])
    return {
        "pairs": pairs,
        "boundary_ms": boundary,
        "direct_ms": direct,
        "added_ms": {q: round(boundary[q] - direct[q], 3) for q in ("p50", "p90", "p99")},
        "paired_difference_ms": h.percentiles(paired),
        "boundary_calls": warmup + pairs,
    }


def streamed_ttfb(paths: Paths, pairs: int, warmup: int) -> dict:
    body = h.chat_body(stream=True)
    conns = {name: h.StreamConnection(url) for name, url in paths.urls.items()}
    first: dict[str, list[float]] = {"boundary": [], "direct": []}
    head: dict[str, list[float]] = {"boundary": [], "direct": []}
    try:
        for i in range(warmup + pairs):
            order = ("boundary", "direct") if i % 2 else ("direct", "boundary")
            for name in order:
                timing = conns[name].call(paths.paths[name], TOKEN, body)
                tokens = h.token_arrivals(timing)
                if timing.status != 200 or len(tokens) != 16:
                    raise RuntimeError(
                        f"{name} stream: status {timing.status}, {len(tokens)} tokens of 16"
                    )
                if i >= warmup:
                    first[name].append(timing.first_body_s)
                    head[name].append(timing.head_s)
    finally:
        for conn in conns.values():
            conn.close()
    b_first, d_first = h.percentiles(first["boundary"]), h.percentiles(first["direct"])
    return {
        "pairs": pairs,
        "first_event_ms": {"boundary": b_first, "direct": d_first},
        "head_ms": {
            "boundary": h.percentiles(head["boundary"]),
            "direct": h.percentiles(head["direct"]),
        },
        "added_first_event_ms": {
            q: round(b_first[q] - d_first[q], 3) for q in ("p50", "p90", "p99")
        },
        "boundary_calls": warmup + pairs,
    }


def held_back_chunk(boundary_url: str, slow_stub_url: str, reps: int) -> dict:
    """The stub waits HOLD_S before the second token; measure the gap the client sees."""
    body = h.chat_body(stream=True, max_tokens=2)
    routes = {"boundary": (boundary_url, "/slow" + CHAT), "direct": (slow_stub_url, CHAT)}
    gaps: dict[str, list[float]] = {"boundary": [], "direct": []}
    for name, (url, path) in routes.items():
        conn = h.StreamConnection(url)
        try:
            for _ in range(reps):
                timing = conn.call(path, TOKEN, body)
                tokens = h.token_arrivals(timing)
                if timing.status != 200 or len(tokens) != 2:
                    raise RuntimeError(f"{name} held stream: {timing.status}, {tokens}")
                gaps[name].append(round((tokens[1][0] - tokens[0][0]) * 1000, 3))
        finally:
            conn.close()
    return {
        "hold_ms": HOLD_S * 1000,
        "gap_ms": gaps,
        "boundary_calls": reps,
    }


def throughput(
    paths: Paths, boundary: h.BoundaryProcess, stub: h.Stub, calls: int, rounds: int
) -> dict:
    body = h.chat_body(stream=False)
    requests = {
        name: h.request_bytes(paths.urls[name], paths.paths[name], TOKEN, body)
        for name in paths.urls
    }
    runs: dict[str, list[dict]] = {"boundary": [], "direct": []}
    for _ in range(rounds):
        for name in ("direct", "boundary"):
            before = boundary.stats()
            cpu_before = cpu_now(boundary, stub)
            result = h.load(
                paths.urls[name],
                requests[name],
                concurrency=CONCURRENCY,
                calls=calls,
                timeout_s=300,
            )
            after = boundary.stats()
            result["cpu_us_per_call"] = {
                who: round((spent - cpu_before[who]) / calls * 1e6)
                for who, spent in cpu_now(boundary, stub).items()
            }
            if result["non_200"]:
                raise RuntimeError(f"{name} load: answers other than 200: {result['non_200']}")
            if name == "boundary":
                events = after["count"] - before["count"]
                fsyncs = after["fsyncs"] - before["fsyncs"]
                result["ledger"] = {
                    "events": events,
                    "fsyncs": fsyncs,
                    "events_per_s": round(events / result["elapsed_s"]),
                    "events_per_fsync": round(events / fsyncs, 1) if fsyncs else None,
                    "fsyncs_per_s": round(fsyncs / result["elapsed_s"]),
                }
            runs[name].append(result)
    # the median round of each path, by throughput
    median = {
        name: sorted(results, key=lambda r: r["calls_per_s"])[len(results) // 2]
        for name, results in runs.items()
    }
    return {
        "calls": calls,
        "rounds": rounds,
        "concurrency": CONCURRENCY,
        "boundary": median["boundary"],
        "direct": median["direct"],
        "calls_per_s_all": {n: [r["calls_per_s"] for r in rs] for n, rs in runs.items()},
        "boundary_calls": calls * rounds,
    }


def cpu_now(boundary: h.BoundaryProcess, stub: h.Stub) -> dict[str, float]:
    """CPU seconds used so far by each process in the measurement, and by the
    boundary's event loop alone (its main thread: the one that saturates)."""
    return {
        "boundary": h.cpu_seconds(boundary.process.pid),
        "boundary_event_loop": h.cpu_seconds(boundary.process.pid, boundary.process.pid),
        "stub": h.cpu_seconds(stub.process.pid),
        "client": time.process_time(),
    }


def verify_ledger(path: Path) -> dict:
    """Read the ledger back from disk: a valid chain, and how many events of each type."""
    from docket.ledger.chain import ChainVerifier
    from docket.ledger.reader import iter_lines

    verifier = ChainVerifier()
    types: Counter[str] = Counter()
    for line in iter_lines(path):
        if not line.complete:
            raise RuntimeError(f"ledger {path}: torn last line at byte {line.offset}")
        types[verifier.feed(line.data)["type"]] += 1
    return {"lines": verifier.count, "bytes": verifier.offset, "types": dict(types)}


def run(quick: bool) -> dict:
    pairs, ttfb_pairs, holds, calls, rounds = (
        (300, 100, 3, 2000, 1) if quick else (3000, 600, 5, 15000, 3)
    )
    profile = os.environ.get("DOCKET_BENCH_PROFILE")  # cProfile the boundary into this file
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOCKET_BENCH_DIR")) as name:
        ledger = Path(name) / "ledger.jsonl"
        disk_before = h.fdatasync_probe(Path(name), 200)
        speed_before = h.python_speed_probe()
        with h.Stub() as stub, h.Stub(f"{HOLD_S}s") as slow:
            upstreams = {"openai": stub.url, "slow": slow.url}
            with h.spawn_boundary(
                ledger, upstreams, TOKEN, Path(profile) if profile else None
            ) as b:
                paths = Paths(b.url, stub.url)
                latency = added_latency(paths, pairs, warmup=50)
                ttfb = streamed_ttfb(paths, ttfb_pairs, warmup=20)
                held = held_back_chunk(b.url, slow.url, holds)
                load = throughput(paths, b, stub, calls, rounds)
                final = b.stop()
            slow.stop()
            stub.stop()
        on_disk = verify_ledger(ledger)
        disk_after = h.fdatasync_probe(Path(name), 200)
        speed_after = h.python_speed_probe()
    load_after = os.getloadavg()
    made = sum(part["boundary_calls"] for part in (latency, ttfb, held, load))
    for kind in ("model.request", "model.response"):
        if on_disk["types"].get(kind) != made:
            raise RuntimeError(
                f"ledger holds {on_disk['types'].get(kind)} {kind} events for {made} calls"
            )
    if final["stops"] or not final["complete"]:
        raise RuntimeError(f"the boundary asked to stop or lost evidence: {final}")

    added = latency["added_ms"]
    ttfb_added = ttfb["added_first_event_ms"]
    gap = min(held["gap_ms"]["boundary"])
    tp, ceiling = load["boundary"], load["direct"]
    loop_us = tp["cpu_us_per_call"]["boundary_event_loop"]
    summary = {
        f"added latency p50 ms (target <= {TARGET_ADDED_P50_MS})": (
            f"{added['p50']} {mark(added['p50'] <= TARGET_ADDED_P50_MS)}"
        ),
        f"added latency p99 ms (target <= {TARGET_ADDED_P99_MS})": (
            f"{added['p99']} {mark(added['p99'] <= TARGET_ADDED_P99_MS)}"
        ),
        "non-streamed p50/p99 ms boundary vs direct": (
            f"{latency['boundary_ms']['p50']}/{latency['boundary_ms']['p99']} vs "
            f"{latency['direct_ms']['p50']}/{latency['direct_ms']['p99']}"
        ),
        f"c{CONCURRENCY} calls/s through the boundary (target >= {TARGET_CALLS_PER_S})": (
            f"{tp['calls_per_s']} {mark(tp['calls_per_s'] >= TARGET_CALLS_PER_S)}"
        ),
        f"c{CONCURRENCY} calls/s straight to the stub (its own ceiling here)": ceiling[
            "calls_per_s"
        ],
        f"c{CONCURRENCY} p50/p99 ms boundary vs direct": (
            f"{tp['latency_ms']['p50']}/{tp['latency_ms']['p99']} vs "
            f"{ceiling['latency_ms']['p50']}/{ceiling['latency_ms']['p99']}"
        ),
        f"c{CONCURRENCY} CPU us per call: boundary, stub, client": (
            ", ".join(str(tp["cpu_us_per_call"][who]) for who in ("boundary", "stub", "client"))
        ),
        # One event loop does a boundary's work, so with a core of its own it could not
        # pass this many calls a second: the figure a faster or quieter machine moves.
        "boundary event loop CPU us per call, and the calls/s it allows on one core": (
            f"{loop_us}, {round(1e6 / loop_us) if loop_us else None}"
        ),
        "ledger during the throughput run: events/s, fsyncs, events per fsync": (
            f"{tp['ledger']['events_per_s']}, {tp['ledger']['fsyncs']}, "
            f"{tp['ledger']['events_per_fsync']}"
        ),
        f"streamed first-event added ms p50 (target <= {TARGET_TTFB_ADDED_MS})": (
            f"{ttfb_added['p50']} {mark(ttfb_added['p50'] <= TARGET_TTFB_ADDED_MS)}"
        ),
        "streamed first-event added ms p90/p99": f"{ttfb_added['p90']}/{ttfb_added['p99']}",
        f"held-back chunk: min gap ms via boundary (held {HOLD_S * 1000:g}, target >= "
        f"{TARGET_HOLD_GAP_MS:g})": f"{gap} {mark(gap >= TARGET_HOLD_GAP_MS)}",
        "ledger read back": (
            f"{on_disk['lines']} lines, chain valid, {made} requests and responses for {made} calls"
        ),
        "1-min load average before the run (2 cores; others' work, not ours)": round(
            load_before[0], 2
        ),
        "disk write+fdatasync p50 ms before/after the run": (
            f"{disk_before['p50']}/{disk_after['p50']}"
        ),
        "CPU speed before/after: us for sum(range(1000)), lower is faster": (
            f"{speed_before}/{speed_after}"
        ),
    }
    return {
        "processes": "boundary | stub (+ slow stub) | client: three processes, unpinned",
        "latency": latency,
        "streaming": {"ttfb": ttfb, "held_back_chunk": held},
        "throughput": load,
        "ledger": {"on_disk": on_disk, "final": final},
        "load_average_1m": {"before": load_before[0], "after": load_after[0]},
        "disk_fdatasync_ms": {"before": disk_before, "after": disk_after},
        "python_speed_us": {"before": speed_before, "after": speed_after},
        "summary": summary,
    }
