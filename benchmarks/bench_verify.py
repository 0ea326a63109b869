"""`docket verify` throughput over a realistic ledger (target: at least 50 MB/s).

Builds a ledger in a temporary folder with chain.encode_line (a seeded mix of
model calls over three models, errors, refusals, faults, cap warnings), writes
its receipt, and times `receipt.verify` end to end: reading, strict JSON,
SHA-256 per line, the tally fold and every claim. Alongside, on the same lines,
it times the pieces (the reference ChainVerifier, and the strict decoder with
and without its duplicate-key check) so the cost of each is a ratio measured
in one run. CPU time (process_time) is reported next to wall time because the
machine is shared.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import tempfile
import time
from pathlib import Path

import docket.ledger.strict_json as strict_json_module
from docket import __version__
from docket.clock import rfc3339
from docket.ledger.chain import GENESIS, ChainVerifier, encode_body, encode_line, line_hash
from docket.ledger.strict_json import decode_json
from docket.receipts.receipt import build_receipt, write_receipt
from docket.receipts.tally import Tally
from docket.receipts.verify import verify

MODELS = {
    "gpt-4o": {"input": "2.50", "output": "10.00", "cached_input": "1.25"},
    "gpt-4o-mini": {"input": "0.15", "output": "0.60", "cached_input": "0.075"},
    "claude-sonnet-4": {"input": "3.00", "output": "15.00", "cached_input": "0.30"},
}


def _cost(prices: dict, tokens_in: int, tokens_out: int, cached: int) -> int:
    # nano-USD: a price per million tokens times 1000 is the price per token in nano-USD
    per = {k: round(float(v) * 1000) for k, v in prices.items()}
    return (
        (tokens_in - cached) * per["input"]
        + cached * per["cached_input"]
        + tokens_out * per["output"]
    )


def events(calls: int, seed: int = 7):
    """(type, fields) pairs for a run of `calls` model calls."""
    rng = random.Random(seed)
    yield (
        "session.start",
        {
            "run_id": "run-bench",
            "docket_version": __version__,
            "policy_digest": "sha256:" + hashlib.sha256(b"policy").hexdigest(),
            "pricing": {"table_date": "2026-11-01", "provenance": "vendor price pages, 2026-11-01"},
            "caps": {"usd": "500.00", "calls": calls * 2},
            "chaos": {"seed": seed, "faults": ["upstream:status(503)@2%"]},
        },
    )
    yield "process.spawn", {"pid": 4242, "argv": ["python", "-m", "agent", "--task", "bench"]}
    faults = 0
    for i in range(calls):
        model = rng.choice(list(MODELS))
        provider = "anthropic" if model.startswith("claude") else "openai"
        call_id = f"call-{i:08d}"
        roll = rng.random()
        if roll < 0.01:
            yield "policy.denied", {"rule": "egress", "provider": provider, "model": model}
            continue
        yield (
            "model.request",
            {
                "call_id": call_id,
                "provider": provider,
                "model": model,
                "endpoint": "/v1/messages" if provider == "anthropic" else "/v1/chat/completions",
                "stream": roll < 0.5,
                "request_bytes": rng.randint(800, 9000),
                "request_sha256": hashlib.sha256(call_id.encode()).hexdigest(),
                "max_output_tokens": 1024,
            },
        )
        tokens_in, tokens_out = rng.randint(200, 6000), rng.randint(10, 900)
        cached = rng.randint(0, tokens_in // 2)
        if roll < 0.03:
            faults += 1
            yield (
                "fault.injected",
                {"fault": "upstream:status(503)@2%", "seed": seed, "ordinal": faults},
            )
            yield (
                "model.error",
                {
                    "call_id": call_id,
                    "provider": provider,
                    "model": model,
                    "reason": "upstream answered 503 Service Unavailable",
                    "status": 503,
                    "usage": {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0},
                    "cost_nusd": 0,
                    "bytes": 187,
                    "duration_ms": rng.randint(5, 80),
                },
            )
            continue
        prices = MODELS[model]
        yield (
            "model.response",
            {
                "call_id": call_id,
                "provider": provider,
                "model": model,
                "status": 200,
                "usage": {
                    "input_tokens": tokens_in,
                    "output_tokens": tokens_out,
                    "cached_tokens": cached,
                },
                "cost_nusd": _cost(prices, tokens_in, tokens_out, cached),
                "priced": True,
                "unit_prices": prices,
                "duration_ms": rng.randint(300, 9000),
                "ttfb_ms": rng.randint(80, 900),
                "bytes": rng.randint(400, 6000),
            },
        )
    yield "process.exit", {"pid": 4242, "status": 0, "reason": "exited"}
    yield (
        "session.end",
        {
            "reason": "child exited",
            "exit_status": 0,
            "cap": None,
            "evidence": {
                "ledger_complete": True,
                "unwritten_events": 0,
                "first_failing_seq": None,
                "write_failures": 0,
            },
        },
    )


def build(folder: Path, target_bytes: int) -> tuple[Path, Path, int]:
    """Write ledger.jsonl and receipt.json of about target_bytes; return paths and event count."""
    ledger = folder / "ledger.jsonl"
    calls = max(10, target_bytes // 900)  # about 900 bytes of ledger per call
    tally = Tally()
    prev, size, seq = GENESIS, 0, 0
    wall = 1_800_000_000.0
    with open(ledger, "wb") as f:
        for seq, (kind, fields) in enumerate(events(calls)):
            mono_ms = seq * 37
            ts = rfc3339(wall + mono_ms / 1000)
            line = encode_line(
                seq=seq, ts=ts, mono_ms=mono_ms, type=kind, prev=prev, body=encode_body(fields)
            )
            tally.add({"v": 1, "seq": seq, "ts": ts, "mono_ms": mono_ms, "type": kind, **fields})
            f.write(line + b"\n")
            prev, size = line_hash(line), size + len(line) + 1
    count = seq + 1
    evidence = {
        "ledger_complete": True,
        "unwritten_events": 0,
        "first_failing_seq": None,
        "write_failures": 0,
    }
    receipt = build_receipt(
        tally,
        ledger_path=ledger,
        head=prev,
        count=count,
        size=size,
        evidence=evidence,
        version=__version__,
    )
    write_receipt(folder / "receipt.json", receipt)
    return ledger, folder / "receipt.json", count


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _best(fn, repeats: int) -> tuple[float, float]:
    runs = [_timed(fn) for _ in range(repeats)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def run(quick: bool) -> dict:
    target = (10 if quick else 100) * 1_000_000
    repeats = 2 if quick else 3
    with tempfile.TemporaryDirectory(prefix="docket-bench-verify-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        ledger, receipt, count = build(folder, target)
        build_s = time.perf_counter() - started
        size = os.path.getsize(ledger)
        mb = size / 1e6

        verdict = verify(receipt)
        if not verdict.ok:
            raise RuntimeError(f"the benchmark's own ledger does not verify: {verdict.summary()}")
        wall, cpu = _best(lambda: verify(receipt), repeats)

        # The pieces, over the same lines held in memory (no I/O).
        lines = ledger.read_bytes().split(b"\n")[:-1]

        def each(fn):
            def loop() -> None:
                for line in lines:
                    fn(line)

            return loop

        def reference_chain() -> None:
            v = ChainVerifier()
            for line in lines:
                v.feed(line)

        # The same parser with and without its duplicate-key check: that check's cost.
        if strict_json_module.jiter is not None:
            decoder = "jiter"
            options = {"allow_inf_nan": False, "cache_mode": "keys", "float_mode": "decimal"}
            checked = functools.partial(
                strict_json_module.jiter.from_json, catch_duplicate_keys=True, **options
            )
            unchecked = functools.partial(strict_json_module.jiter.from_json, **options)
        else:
            decoder = "stdlib"
            checked = strict_json_module.decode_json_stdlib
            plain = json.JSONDecoder().scan_once
            unchecked = lambda line: plain(line.decode("utf-8"), 0)  # noqa: E731

        _, ref_cpu = _best(reference_chain, repeats)
        _, strict_cpu = _best(each(decode_json), repeats)
        _, stdlib_cpu = _best(each(strict_json_module.decode_json_stdlib), repeats)
        _, checked_cpu = _best(each(checked), repeats)
        _, unchecked_cpu = _best(each(unchecked), repeats)
        _, sha_cpu = _best(each(lambda line: hashlib.sha256(line).hexdigest()), repeats)

    dup_check_cpu = max(0.0, checked_cpu - unchecked_cpu)
    return {
        "decoder": decoder,
        "ledger_bytes": size,
        "events": count,
        "mean_line_bytes": round(size / count, 1),
        "build_seconds": round(build_s, 2),
        "verify_wall_seconds": round(wall, 3),
        "verify_cpu_seconds": round(cpu, 3),
        "summary": {
            "verify_mb_per_s_wall": round(mb / wall, 1),
            "verify_mb_per_s_cpu": round(mb / cpu, 1),
            "target_mb_per_s": 50,
            "ledger_mb": round(mb, 1),
            "reference_chain_verifier_mb_per_s_cpu": round(mb / ref_cpu, 1),
            "strict_json_us_per_line": round(strict_cpu / count * 1e6, 2),
            "strict_json_stdlib_fallback_us_per_line": round(stdlib_cpu / count * 1e6, 2),
            "sha256_us_per_line": round(sha_cpu / count * 1e6, 2),
            "verify_us_per_line": round(cpu / count * 1e6, 2),
            "duplicate_key_check_share_of_verify_pct": round(100 * dup_check_cpu / cpu, 1),
        },
    }
