"""What the resilience guards cost a call: the boundary with every guard on, against
the same boundary with the guards a policy can turn off left off.

Four processes: a stub provider (`docket stub`), two boundaries over their own
durable ledgers, and this client. "on": rate limiter, bulkhead and a caller
deadline on every call (x-docket-deadline-ms), with limits set high enough
never to refuse; "off": no [resilience] limits and no deadline header. The
breaker has no off switch (every upstream has one), so it is in both; its own
cost is measured apart, in-process, next to the other guards' decisions.

One client, non-streamed calls, one keep-alive connection per path; each round
makes one call straight to the stub, one through "off" and one through "on",
in an order that rotates every round, so the machine's drift hits all three
alike. Added latency = a path's time minus the direct call's in the same round.
The figure: how much the added latency grows with the guards on, as the ratio
of the median paired differences, (on - off) / (off - direct); the target is
at most 10%.

At the end both ledgers are read back: a request and a response for every call,
and no refusal of any kind (the limits were never reached).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks import _harness as h

TOKEN = "docket-bench-run-token"
CHAT = "/openai/v1/chat/completions"
TARGET_GROWTH = 0.10
DEADLINE_MS = 60_000
ON = {
    "max_calls_per_second": 1_000_000,
    "max_calls_per_minute": 1_000_000_000,
    "max_concurrent_upstream": 64,
    "max_queue": 64,
}
ORDERS = (
    ("direct", "off", "on"),
    ("on", "direct", "off"),
    ("off", "on", "direct"),
    ("direct", "on", "off"),
    ("off", "direct", "on"),
    ("on", "off", "direct"),
)


# ---------------------------------------------------------------- the boundary's process


class GuardedBoundary(h.Service):
    def __init__(self, ledger: Path, stub_url: str, resilience: dict) -> None:
        config = {"ledger": str(ledger), "stub": stub_url, "resilience": resilience}
        code = "import sys; from benchmarks.bench_guards import boundary_main; boundary_main(sys.argv[1])"
        super().__init__([sys.executable, "-c", code, json.dumps(config)], "boundary")
        self.url = json.loads(self.first_line)["url"]


def boundary_main(config_json: str) -> None:
    """Serve until stdin closes, then print the ledger's counters and any stop request."""
    import trio

    config = json.loads(config_json)
    print(json.dumps(trio.run(_serve, config)), flush=True)


async def _serve(config: dict) -> dict:
    import trio

    from docket.boundary.app import Boundary
    from docket.clock import Clock
    from docket.ledger.limits import LedgerLimits
    from docket.ledger.writer import open_ledger
    from docket.policy import policy_from_dict

    providers = {
        "openai": {"kind": "openai", "base_url": config["stub"], "key_env": h.STUB_KEY_ENV}
    }
    policy = policy_from_dict(
        {"providers": providers, "resilience": config["resilience"]}, source="benchmark"
    )
    stops: list[str] = []
    async with open_ledger(config["ledger"], limits=LedgerLimits(max_ledger_bytes=1 << 36)) as led:
        boundary = Boundary(
            policy,
            led,
            token=TOKEN,
            clock=Clock(),
            stop=lambda request: stops.append(request.reason),
            env={h.STUB_KEY_ENV: "sk-docket-bench"},
        )
        async with trio.open_nursery() as nursery:
            url = await nursery.start(boundary.serve)
            print(json.dumps({"url": url}), flush=True)
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            async with stdin:
                while await stdin.receive_some(4096):
                    pass  # commands are not used here; EOF is the cue to stop
            nursery.cancel_scope.cancel()
    return {"count": led.count, "fsyncs": led.fsyncs, "stops": stops}


# ---------------------------------------------------------------- the client


def request(url: str, path: str, *, deadline_ms: int | None) -> bytes:
    raw = h.request_bytes(url, path, TOKEN, h.chat_body(stream=False))
    if deadline_ms is None:
        return raw
    line, _, rest = raw.partition(b"\r\n")
    return line + f"\r\nx-docket-deadline-ms: {deadline_ms}".encode() + b"\r\n" + rest


def rounds(urls: dict[str, str], count: int, warmup: int) -> dict[str, list[float]]:
    requests = {
        "direct": request(urls["direct"], "/v1/chat/completions", deadline_ms=None),
        "off": request(urls["off"], CHAT, deadline_ms=None),
        "on": request(urls["on"], CHAT, deadline_ms=DEADLINE_MS),
    }
    conns = {name: h.Connection(url) for name, url in urls.items()}
    took: dict[str, list[float]] = {name: [] for name in urls}
    try:
        for i in range(warmup + count):
            for name in ORDERS[i % len(ORDERS)]:
                status, seconds, answer = conns[name].call(requests[name])
                if status != 200:
                    raise RuntimeError(f"{name}: HTTP {status}: {answer[:300]!r}")
                if i >= warmup:
                    took[name].append(seconds)
    finally:
        for conn in conns.values():
            conn.close()
    return took


def decisions_us(calls: int) -> dict:
    """The guards' decisions alone, per call, in this process: what the boundary adds
    in CPU before and after each forwarded call (breaker included)."""
    from docket.guards.breaker import SUCCESS, CircuitBreaker
    from docket.guards.bulkhead import BulkheadCore
    from docket.guards.deadline import caller_budget, plan_attempt
    from docket.guards.limiter import RateLimiter

    breaker = CircuitBreaker("openai")
    limiter = RateLimiter(ON["max_calls_per_second"], ON["max_calls_per_minute"])
    bulkhead = BulkheadCore("openai", ON["max_concurrent_upstream"], ON["max_queue"])
    headers = [(b"x-docket-deadline-ms", str(DEADLINE_MS).encode())]
    out = {}
    for name in ("breaker", "all"):
        started = time.perf_counter()
        now = time.monotonic()
        for i in range(calls):
            t = now + i * 1e-3
            if name == "all":
                budget = caller_budget(headers, t)
                limiter.admit(t)
                plan_attempt(t, budget, reserve_s=0.02)
            verdict = breaker.before_call(t)
            if name == "all":
                entered = bulkhead.try_enter(t, t + 60)
                bulkhead.leave(entered.ticket, t, 1e-3)
            breaker.record(verdict.ticket, SUCCESS, t)
        out[name] = round((time.perf_counter() - started) / calls * 1e6, 2)
    return out


def read_ledger(path: Path) -> Counter:
    from docket.ledger.chain import ChainVerifier
    from docket.ledger.reader import iter_lines

    verifier, types = ChainVerifier(), Counter()
    for line in iter_lines(path):
        if not line.complete:
            raise RuntimeError(f"ledger {path}: torn last line at byte {line.offset}")
        types[verifier.feed(line.data)["type"]] += 1
    return types


def run(quick: bool) -> dict:
    count, warmup = (300, 50) if quick else (3000, 200)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOCKET_BENCH_DIR")) as name:
        folder = Path(name)
        with h.Stub() as stub:
            with (
                GuardedBoundary(folder / "off.jsonl", stub.url, {}) as off,
                GuardedBoundary(folder / "on.jsonl", stub.url, ON) as on,
            ):
                urls = {"direct": stub.url, "off": off.url, "on": on.url}
                took = rounds(urls, count, warmup)
                finals = {"off": json.loads(off.stop()), "on": json.loads(on.stop())}
            stub.stop()
        ledgers = {which: read_ledger(folder / f"{which}.jsonl") for which in ("off", "on")}
    made = warmup + count
    for which, types in ledgers.items():
        refusals = {t: n for t, n in types.items() if t not in ("model.request", "model.response")}
        if types["model.request"] != made or types["model.response"] != made or refusals:
            raise RuntimeError(f"{which} ledger: {dict(types)} for {made} calls")
        if finals[which]["stops"]:
            raise RuntimeError(f"{which} boundary asked to stop: {finals[which]['stops']}")
    added_off = [o - d for o, d in zip(took["off"], took["direct"], strict=True)]
    added_on = [o - d for o, d in zip(took["on"], took["direct"], strict=True)]
    on_minus_off = [a - b for a, b in zip(took["on"], took["off"], strict=True)]
    median_off = statistics.median(added_off)
    growth = statistics.median(on_minus_off) / median_off
    p = {name: h.percentiles(samples) for name, samples in took.items()}
    p50_growth = (p["on"]["p50"] - p["direct"]["p50"]) / (p["off"]["p50"] - p["direct"]["p50"]) - 1
    cost = decisions_us(20_000 if quick else 200_000)
    summary = {
        f"added latency growth with guards on, median paired (target <= {TARGET_GROWTH:.0%})": (
            f"{growth:+.1%} {'PASS' if growth <= TARGET_GROWTH else 'FAIL'}"
        ),
        "added latency p50 ms: off, on (growth by p50s)": (
            f"{round(p['off']['p50'] - p['direct']['p50'], 3)}, "
            f"{round(p['on']['p50'] - p['direct']['p50'], 3)} ({p50_growth:+.1%})"
        ),
        "p50/p99 ms direct, off, on": ", ".join(
            f"{p[n]['p50']}/{p[n]['p99']}" for n in ("direct", "off", "on")
        ),
        "guard decisions per call in-process, us: breaker alone, all guards": (
            f"{cost['breaker']}, {cost['all']}"
        ),
        "ledgers read back": f"{made} requests and responses each, no refusal",
        "1-min load average before the run (2 cores; others' work, not ours)": round(
            load_before[0], 2
        ),
    }
    return {
        "rounds": count,
        "warmup": warmup,
        "policy_on": ON,
        "deadline_ms_on": DEADLINE_MS,
        "latency_ms": p,
        "paired_ms": {
            "added_off": h.percentiles(added_off),
            "added_on": h.percentiles(added_on),
            "on_minus_off": h.percentiles(on_minus_off),
        },
        "growth_median_paired": round(growth, 4),
        "growth_p50": round(p50_growth, 4),
        "decisions_us": cost,
        "ledgers": {k: dict(v) for k, v in ledgers.items()},
        "finals": finals,
        "summary": summary,
    }
