"""verify-js beside `docket verify` on one ledger: MB/s each, in one run.

    python verify-js/bench.py [--mb 100] [--repeats 3]

Builds a ledger of about --mb megabytes with a real chain and its receipt
(benchmarks/bench_verify.py's generator: a seeded mix of calls over three
models, errors, refusals, faults), checks that both verifiers say ok, then
times each as a command (`docket verify RECEIPT`, `node verify-js/verify.mjs
RECEIPT`), best of --repeats, wall and CPU (the child's user + system time,
since the machine is shared). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0 or not done.stdout.startswith("ok: "):
        raise SystemExit(f"bench: {argv[0]} did not verify the ledger: {done.stdout}{done.stderr}")
    return wall, cpu, done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    node = shutil.which("node")
    if node is None:
        raise SystemExit("bench: node is not installed")
    docket = str(Path(sys.executable).parent / "docket")
    with tempfile.TemporaryDirectory(prefix="docket-bench-verify-js-") as tmp:
        ledger, receipt, events = build(Path(tmp), args.mb * 1_000_000)
        mb = os.path.getsize(ledger) / 1e6
        commands = {
            "python (docket verify)": [docket, "verify", str(receipt)],
            "javascript (node verify.mjs)": [
                node,
                str(ROOT / "verify-js" / "verify.mjs"),
                str(receipt),
            ],
        }
        results, lines = {}, set()
        for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits both
            for name, argv in commands.items():
                wall, cpu, line = timed(argv)
                best = results.setdefault(name, [wall, cpu])
                best[0], best[1] = min(best[0], wall), min(best[1], cpu)
                lines.add(line)
        if len(lines) != 1:
            raise SystemExit(f"bench: the verifiers' ok lines differ: {sorted(lines)}")
    print(
        json.dumps(
            {
                "ledger_mb": round(mb, 1),
                "events": events,
                "repeats": args.repeats,
                "mb_per_s_wall": {n: round(mb / r[0], 1) for n, r in results.items()},
                "mb_per_s_cpu": {n: round(mb / r[1], 1) for n, r in results.items()},
                "seconds_wall": {n: round(r[0], 2) for n, r in results.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
