"""Go verifier vs `docket verify`, side by side on one ~100 MB ledger with a real chain.

Usage (from the repository root, Docket installed, go on PATH):

    python verify-go/bench_side_by_side.py [--mb 100] [--repeats 3]

The ledger and its receipt come from benchmarks/bench_verify.build (a seeded
mix of model calls, errors, refusals and faults, chained by the reference
writer). Each verifier runs as a process, end to end, best of `--repeats`;
both must print ok, else the figure would measure a failure. Wall time and
the child's CPU time (the machine is shared) are reported.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_verify import build  # noqa: E402


def timed(argv: list[str]) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} did not verify: {done.stdout}{done.stderr}")
    return wall, cpu, done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="verify-go-bench-") as tmp:
        folder = Path(tmp)
        binary = folder / "docket-verify"
        subprocess.run(
            ["go", "build", "-o", str(binary), "."], cwd=ROOT / "verify-go", check=True, timeout=300
        )
        ledger, receipt, count = build(folder, args.mb * 1_000_000)
        size = ledger.stat().st_size
        print(f"ledger: {size / 1e6:.1f} MB, {count} events")
        runs = {
            "go  docket-verify": [str(binary), str(receipt)],
            "py  docket verify": [sys.executable, "-m", "docket", "verify", str(receipt)],
        }
        lines = {}
        for name, argv in runs.items():
            best = min((timed(argv) for _ in range(args.repeats)), key=lambda r: r[0])
            wall, cpu, lines[name] = best
            print(
                f"{name}: {size / 1e6 / wall:7.1f} MB/s wall ({wall:.2f} s), "
                f"{size / 1e6 / cpu:7.1f} MB/s of CPU ({cpu:.2f} s)"
            )
        same = len(set(lines.values())) == 1
        print(f"same ok line from both: {same}")
        print(f"cpus: {os.cpu_count()}, load: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
