"""`docket show` (and `docket explain`) over a ~100 MB ledger: MB/s and peak RSS.

Builds the ledger bench_verify builds (a seeded mix of calls over three models,
errors, refusals, faults), at two sizes, and runs the real command in a child
process with its output going to /dev/null: wall time gives MB/s, the child's
ru_maxrss (os.wait4) its peak memory. The same command on a ledger 10x smaller
shows whether memory grows with the ledger (it should not: show streams).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_verify import build

COMMANDS = {
    "show": ["show"],
    "show --json": ["show", "--json"],
    "show --errors": ["show", "--errors"],
    "explain --json": ["explain", "--json"],
}


def _measure(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one child run."""
    with open(os.devnull, "wb") as sink:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        err = child.stderr.read().decode() if child.stderr else ""
        raise RuntimeError(f"{argv} exited {child.returncode}: {err}")
    if child.stderr:
        child.stderr.close()
    return wall, usage.ru_maxrss / 1024  # KiB on Linux


def run(quick: bool) -> dict:
    big = (10 if quick else 100) * 1_000_000
    sizes = {"small": big // 10, "big": big}
    repeats = 1 if quick else 2
    results: dict = {}
    summary: dict = {}
    with tempfile.TemporaryDirectory(prefix="docket-bench-show-") as tmp:
        for label, target in sizes.items():
            folder = Path(tmp) / label
            folder.mkdir()
            ledger, _, events = build(folder, target)
            size = ledger.stat().st_size
            row: dict = {"bytes": size, "events": events}
            for name, args in COMMANDS.items():
                argv = [sys.executable, "-m", "docket", *args, str(ledger)]
                runs = [_measure(argv) for _ in range(repeats)]
                wall = min(r[0] for r in runs)
                rss = max(r[1] for r in runs)
                row[name] = {
                    "seconds": round(wall, 3),
                    "mb_per_s": round(size / 1e6 / wall, 1),
                    "peak_rss_mib": round(rss, 1),
                }
            results[label] = row
    for name in COMMANDS:
        b, s = results["big"][name], results["small"][name]
        summary[name] = (
            f"{b['mb_per_s']} MB/s on {results['big']['bytes'] / 1e6:.0f} MB, peak RSS "
            f"{b['peak_rss_mib']} MiB (vs {s['peak_rss_mib']} MiB on "
            f"{results['small']['bytes'] / 1e6:.0f} MB)"
        )
    return {"results": results, "summary": summary}
