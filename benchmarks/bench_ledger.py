"""The ledger writer: durable appends per second at 1, 8 and 64 appenders, and memory.

Every append counted here returned only after an fdatasync covered its line;
the fsync count shows how many appends each one carried (group commit). Next to
them, in the same run, the disk's own figure: one thread doing write+fdatasync
of the same lines in a loop, with no event loop and no hand-off, which is the
ceiling a single appender could reach. Each figure is the median of a few
repetitions, as this machine is shared and noisy.

Memory: a fresh process appends N events and reports its resident set (VmRSS
from /proc/self/status) with the ledger still open; 1,000 against 1,000,000
events (quick: 100,000).

Files go to a temporary folder ($DOCKET_BENCH_DIR, or the system's default):
put it on the disk you mean to measure (a tmpfs makes fdatasync free).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

TARGET_1 = 4000
TARGET_64 = 20000
TARGET_RSS_GROWTH_KIB = 10 * 1024

FIELDS = {  # a typical model.request: the line is about 330 bytes
    "call_id": "c-000000",
    "provider": "openai",
    "model": "gpt-4o-mini",
    "endpoint": "chat.completions",
    "stream": False,
    "request_bytes": 4812,
    "request_sha256": "9f" * 32,
    "max_output_tokens": 1024,
}


async def _appends(path: Path, appenders: int, per_appender: int) -> tuple[float, int]:
    from docket.ledger.limits import LedgerLimits
    from docket.ledger.writer import open_ledger

    limits = LedgerLimits(max_ledger_bytes=1 << 40)
    async with open_ledger(path, limits=limits) as ledger:

        async def appender(n: int) -> None:
            for k in range(per_appender):
                await ledger.append("model.request", **(FIELDS | {"call_id": f"c{n}-{k}"}))

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for n in range(appenders):
                nursery.start_soon(appender, n)
        elapsed = time.perf_counter() - started
        assert ledger.count == appenders * per_appender
        return elapsed, ledger.fsyncs


def _throughput(folder: Path, appenders: int, total: int, reps: int) -> dict:
    rates, fsyncs = [], []
    for rep in range(reps):
        path = folder / f"tp-{appenders}-{rep}.jsonl"
        elapsed, syncs = trio.run(_appends, path, appenders, total // appenders)
        rates.append(total / elapsed)
        fsyncs.append(syncs)
        path.unlink()
    return {
        "appenders": appenders,
        "events": total,
        "appends_per_s": round(statistics.median(rates)),
        "appends_per_s_all": [round(r) for r in rates],
        "fsyncs": fsyncs,
        "events_per_fsync": round(total / statistics.median(fsyncs), 1),
    }


def _raw_fdatasync(folder: Path, count: int, reps: int) -> int:
    """The disk's own ceiling for one appender: write+fdatasync in a loop, nothing else."""
    from docket.ledger.chain import GENESIS, encode_body, encode_line

    line = encode_line(
        seq=123456,
        ts="2026-11-29T21:52:28.123Z",
        mono_ms=1234567,
        type="model.request",
        prev=GENESIS,
        body=encode_body(FIELDS),
    )
    data = line + b"\n"
    rates = []
    for rep in range(reps):
        path = folder / f"raw-{rep}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            started = time.perf_counter()
            for _ in range(count):
                os.write(fd, data)
                os.fdatasync(fd)
            rates.append(count / (time.perf_counter() - started))
        finally:
            os.close(fd)
            path.unlink()
    return round(statistics.median(rates))


def _rss_child(events: int, path: str) -> None:
    """Run in a fresh process: append `events`, print the resident set as JSON."""

    def status(key: str) -> int:
        for row in Path("/proc/self/status").read_text().splitlines():
            if row.startswith(key + ":"):
                return int(row.split()[1])  # kB
        raise KeyError(key)

    async def main() -> dict:
        from docket.ledger.limits import LedgerLimits
        from docket.ledger.writer import open_ledger

        appenders = 64
        async with open_ledger(path, limits=LedgerLimits(max_ledger_bytes=1 << 40)) as ledger:

            async def appender(n: int) -> None:
                for k in range(n, events, appenders):
                    await ledger.append("model.request", call_id=f"c{k}", tokens=k)

            async with trio.open_nursery() as nursery:
                for n in range(appenders):
                    nursery.start_soon(appender, n)
            return {"events": ledger.count, "rss_kib": status("VmRSS"), "hwm_kib": status("VmHWM")}

    print(json.dumps(trio.run(main)))


def _rss_after(folder: Path, events: int) -> dict:
    path = folder / f"rss-{events}.jsonl"
    code = f"from benchmarks.bench_ledger import _rss_child; _rss_child({events}, {str(path)!r})"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=1800,
        check=True,
    )
    path.unlink()
    return json.loads(done.stdout)


def run(quick: bool) -> dict:
    reps = 3
    sizes = {1: 1000, 8: 4000, 64: 12800} if quick else {1: 4000, 8: 16000, 64: 64000}
    big = 100_000 if quick else 1_000_000
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOCKET_BENCH_DIR")) as name:
        folder = Path(name)
        raw = _raw_fdatasync(folder, sizes[1], reps)
        runs = [_throughput(folder, n, total, reps) for n, total in sizes.items()]
        small, large = _rss_after(folder, 1000), _rss_after(folder, big)
    by = {r["appenders"]: r for r in runs}
    growth = large["rss_kib"] - small["rss_kib"]
    return {
        "throughput": runs,
        "raw_write_fdatasync_per_s": raw,
        "memory": {"small": small, "large": large},
        "summary": {
            "appends_per_s_1": by[1]["appends_per_s"],
            "appends_per_s_8": by[8]["appends_per_s"],
            "appends_per_s_64": by[64]["appends_per_s"],
            "fsyncs_1_8_64": [by[n]["fsyncs"][0] for n in (1, 8, 64)],
            "events_per_fsync_64": by[64]["events_per_fsync"],
            "raw_write_fdatasync_per_s (1 thread, no loop: the 1-appender ceiling)": raw,
            "target_1 (>= 4000/s)": "met" if by[1]["appends_per_s"] >= TARGET_1 else "missed",
            "target_64 (>= 20000/s)": "met" if by[64]["appends_per_s"] >= TARGET_64 else "missed",
            f"rss_kib_after_1000_vs_{big}": [small["rss_kib"], large["rss_kib"]],
            "rss_growth_kib (target <= 10240)": growth,
            "target_rss": "met" if growth <= TARGET_RSS_GROWTH_KIB else "missed",
        },
    }
