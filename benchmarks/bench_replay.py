"""What a replayed call costs, and what recording bodies costs.

Real processes on 127.0.0.1: a `docket stub`, boundaries with durable ledgers
(benchmarks/_harness.py), and a replay upstream (docket/replay/upstream.py) in its own
process, serving the answers a boundary recorded. One keep-alive client per path.

1. record_bodies off vs on: two boundaries over the same stub, one recording bodies;
   calls alternate between them (the order flips each pair). The figures: each path's
   latency percentiles, the paired difference, and ledger bytes per call.
2. A replayed call vs a call to the stub through a boundary (`docket run`'s path):
   the on boundary's ledger, read as `docket replay` reads it (recorded_calls), is
   served by a replay upstream behind a third boundary holding its key; calls
   alternate between that boundary and the off one. Every replayed answer must be
   the recorded one (the boundary records `replayed_from`), and the upstream must
   match every call.
3. Calls per second, each path alone: `load` (8 keep-alive connections) on the
   replay boundary, then on the stub boundary, the same number of calls.

The ledgers are read back at the end: one replayed_from per replayed call.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks import _harness as h

TOKEN = "docket-bench-run-token"
PATH = "/openai/v1/chat/completions"
CONCURRENCY = 8


def body() -> bytes:
    return h.chat_body(stream=False)


def paired(a_url: str, b_url: str, pairs: int, warmup: int, names: tuple[str, str]) -> dict:
    a, b = h.Connection(a_url), h.Connection(b_url)
    samples: dict[str, list[float]] = {names[0]: [], names[1]: []}
    diffs = []
    try:
        for i in range(warmup + pairs):
            took = {}
            order = ((names[0], a, a_url), (names[1], b, b_url))
            for name, conn, url in order if i % 2 == 0 else order[::-1]:
                status, seconds, answer = conn.call(h.request_bytes(url, PATH, TOKEN, body()))
                if status != 200:
                    raise RuntimeError(f"{name} answered {status}: {answer[:300]!r}")
                took[name] = seconds
            if i >= warmup:
                for name, seconds in took.items():
                    samples[name].append(seconds)
                diffs.append(took[names[1]] - took[names[0]])
    finally:
        a.close()
        b.close()
    ordered = sorted(diffs)
    return {
        f"{names[0]}_ms": h.percentiles(samples[names[0]]),
        f"{names[1]}_ms": h.percentiles(samples[names[1]]),
        f"{names[1]}_minus_{names[0]}_ms": {
            "p50": round(ordered[len(ordered) // 2] * 1000, 3),
            "mean": round(sum(diffs) / len(diffs) * 1000, 3),
        },
        "calls_each": warmup + pairs,
    }


class ReplayServer(h.Service):
    """The replay upstream in its own process, serving a ledger's recorded calls."""

    def __init__(self, ledger: Path, key: str) -> None:
        argv = [sys.executable, "-m", "benchmarks.bench_replay", "serve", str(ledger), key]
        super().__init__(argv, "replay upstream")
        self.url = json.loads(self.first_line)["url"]

    def stop(self, timeout_s: float = 60.0) -> dict:
        return json.loads(super().stop(timeout_s))


def serve(ledger: str, key: str) -> None:
    """The replay upstream's process: serve until stdin closes, then print its counts."""
    import trio

    from docket.ledger.chain import line_hash
    from docket.ledger.reader import Lines
    from docket.replay.match import Matcher, recorded_calls
    from docket.replay.upstream import ReplayUpstream

    calls = recorded_calls((json.loads(line), line_hash(line)) for line in Lines(Path(ledger)))
    upstream = ReplayUpstream(Matcher(calls), run_id="bench", key=key, kinds={"openai": "openai"})

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(upstream.serve)
            print(json.dumps({"url": url}), flush=True)
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            async with stdin:
                while await stdin.receive_some(4096):
                    pass
            nursery.cancel_scope.cancel()

    trio.run(main)
    counts = {"recorded": len(calls), "matched": upstream.matcher.matched}
    print(json.dumps(counts | {"missed": upstream.matcher.missed}), flush=True)


def types(ledger: Path) -> Counter:
    return Counter(json.loads(line)["type"] for line in ledger.read_bytes().splitlines())


def run(quick: bool) -> dict:
    pairs, warmup, load_calls = (200, 20, 400) if quick else (2000, 100, 4000)
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOCKET_BENCH_DIR")) as name:
        folder = Path(name)
        off_ledger, on_ledger, replay_ledger = (folder / f"{n}.jsonl" for n in ("off", "on", "rp"))
        key = secrets.token_hex(16)
        with h.Stub() as stub:
            off = h.spawn_boundary(off_ledger, {"openai": stub.url}, TOKEN)
            on = h.spawn_boundary(
                on_ledger, {"openai": stub.url}, TOKEN, policy={"ledger": {"record_bodies": True}}
            )
            with off, on:
                bodies = paired(off.url, on.url, pairs, warmup, ("off", "on"))
                off_after, on_after = off.stats(), on.stats()
                # more recorded calls for the replay's two sections: the same request each time
                extra = warmup + pairs + load_calls
                loaded = h.load(
                    on.url,
                    h.request_bytes(on.url, PATH, TOKEN, body()),
                    concurrency=CONCURRENCY,
                    calls=extra - (warmup + pairs),
                    timeout_s=600,
                )
                assert loaded, "recording the replay's calls"
                on.stop()
                with ReplayServer(on_ledger, key) as replay:
                    rp = h.spawn_boundary(
                        replay_ledger, {"openai": f"{replay.url}/openai"}, TOKEN, replay_key=key
                    )
                    with rp:
                        versus = paired(off.url, rp.url, pairs, warmup, ("stub", "replayed"))
                        rate_replayed = h.load(
                            rp.url,
                            h.request_bytes(rp.url, PATH, TOKEN, body()),
                            concurrency=CONCURRENCY,
                            calls=load_calls,
                            timeout_s=600,
                        )
                        rate_stub = h.load(
                            off.url,
                            h.request_bytes(off.url, PATH, TOKEN, body()),
                            concurrency=CONCURRENCY,
                            calls=load_calls,
                            timeout_s=600,
                        )
                        rp_final = rp.stop()
                    served = replay.stop()
                off.stop()
            stub.stop()
        replayed_from = sum(
            1 for line in replay_ledger.read_bytes().splitlines() if b'"replayed_from"' in line
        )
        rp_types = types(replay_ledger)
    calls_each = bodies["calls_each"]
    per_call = {
        "off": round(off_after["bytes"] / calls_each),
        "on": round(on_after["bytes"] / calls_each),
    }
    if served["missed"] or replayed_from != served["matched"] or rp_final["stops"]:
        raise RuntimeError(f"the replay did not serve every call from the record: {served}")
    if rp_types["model.request"] != served["matched"]:
        raise RuntimeError(f"the replay ledger does not hold the calls made: {dict(rp_types)}")
    on_ms, off_ms = bodies["on_ms"], bodies["off_ms"]
    rp_ms, st_ms = versus["replayed_ms"], versus["stub_ms"]
    summary = {
        "record_bodies on vs off, p50/p99 ms": (
            f"{on_ms['p50']}/{on_ms['p99']} vs {off_ms['p50']}/{off_ms['p99']}"
        ),
        "record_bodies on minus off, paired p50 ms": bodies["on_minus_off_ms"]["p50"],
        "ledger bytes per call, on vs off": f"{per_call['on']} vs {per_call['off']}",
        "replayed vs stub through a boundary, p50/p99 ms": (
            f"{rp_ms['p50']}/{rp_ms['p99']} vs {st_ms['p50']}/{st_ms['p99']}"
        ),
        "replayed minus stub, paired p50 ms": versus["replayed_minus_stub_ms"]["p50"],
        f"calls/s over {CONCURRENCY} connections, replayed vs stub": (
            f"{rate_replayed['calls_per_s']} vs {rate_stub['calls_per_s']}"
        ),
    }
    return {
        "summary": summary,
        "record_bodies": bodies | {"ledger_bytes_per_call": per_call},
        "replay_vs_stub": versus,
        "rate": {"replayed": rate_replayed, "stub": rate_stub},
        "replay_upstream": served,
        "replay_ledger_types": dict(rp_types),
    }


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(*sys.argv[2:4])
