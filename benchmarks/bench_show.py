"""`docket show` (and `docket explain`) over a ~100 MB ledger: MB/s and peak RSS.

Builds the ledger bench_verify builds (a seeded mix of calls over three models,
errors, refusals, faults), at two sizes, and runs the real command in a child
process with its output going to /dev/null: wall time gives MB/s, the child's
VmHWM (reported by the child itself) its peak memory. The same command on a ledger 10x smaller
shows whether memory grows with the ledger (it should not: show streams).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_verify import build

# Each runs on the ledger; "verify" (the same strict read, on the receipt) is the yardstick:
# on a shared machine, show's MB/s means most as a ratio to verify's, measured alongside.
COMMANDS = {
    "verify": ["verify"],
    "show": ["show"],
    "show --json": ["show", "--json"],
    "show --errors": ["show", "--errors"],
    "explain --json": ["explain", "--json"],
}


# The child reports its own peak: VmHWM, its memory's high-water mark since exec. (A
# forked child's ru_maxrss would count the parent's pages it began as a copy of.)
PEAK = (
    "import sys\n"
    "from docket.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')][0]\n"
    "print(hwm.split()[1], file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _measure(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one child run of `docket ARGS`."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", PEAK, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"docket {args} exited {done.returncode}: {done.stderr.decode()}")
    return wall, int(done.stderr.split()[-1]) / 1024


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
            ledger, receipt, events = build(folder, target)
            # its output goes to /dev/null: the wall time includes Python's start (~0.3 s)
            size = ledger.stat().st_size
            row: dict = {"bytes": size, "events": events}
            for name, args in COMMANDS.items():
                target_file = receipt if args == ["verify"] else ledger
                runs = [_measure([*args, str(target_file)]) for _ in range(repeats)]
                wall = min(r[0] for r in runs)
                rss = max(r[1] for r in runs)
                row[name] = {
                    "seconds": round(wall, 3),
                    "mb_per_s": round(size / 1e6 / wall, 1),
                    "peak_rss_mib": round(rss, 1),
                }
            results[label] = row
    verify_s = results["big"]["verify"]["seconds"]
    for name in COMMANDS:
        b, s = results["big"][name], results["small"][name]
        b["vs_verify"] = round(verify_s / b["seconds"], 2)
        summary[name] = (
            f"{b['mb_per_s']} MB/s on {results['big']['bytes'] / 1e6:.0f} MB, peak RSS "
            f"{b['peak_rss_mib']} MiB (vs {s['peak_rss_mib']} MiB on "
            f"{results['small']['bytes'] / 1e6:.0f} MB); {b['vs_verify']}x verify's speed"
        )
    return {"results": results, "summary": summary}
