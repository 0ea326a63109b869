"""The three verifiers side by side on one ledger of about 100 MB (10 MB with --quick).

The ledger and its receipt come from bench_verify.build (a real chain: a seeded mix
of model calls, errors, refusals and faults, each line hashed into the next). Each
verifier is timed as the command a third party runs (`python -m docket verify`,
`node verify-js/verify.mjs`, the binary built from verify-go/ into a temporary
folder), best of a few runs, taking turns so that drift on this shared machine
falls on all three alike. Wall time and the child's CPU time are both reported;
every run must say ok with the same events and head, or the figure is refused.
A verifier that is absent (its folder, or node or go) is reported skipped with
the reason.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_verify import build
from chaos.verifiers import Verifier, find_go, find_js, python_command


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(verifier: Verifier, receipt: Path) -> tuple[float, float, tuple]:
    wall, cpu = time.perf_counter(), _child_cpu()
    answer = verifier.run(receipt, timeout_s=600)
    wall, cpu = time.perf_counter() - wall, _child_cpu() - cpu
    if answer.code != "ok":
        raise RuntimeError(f"{verifier.name} does not verify the benchmark's ledger: {answer.said}")
    return wall, cpu, answer.key()


def run(quick: bool) -> dict:
    target = (10 if quick else 100) * 1_000_000
    repeats = 2 if quick else 3
    with tempfile.TemporaryDirectory(prefix="docket-bench-verifiers-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        ledger, receipt, count = build(folder, target)
        build_s = time.perf_counter() - started
        size = os.path.getsize(ledger)
        mb = size / 1e6
        verifiers = [python_command(sys.executable), find_js(), find_go(build_dir=folder / "go")]
        skipped = {v.name: v.absent for v in verifiers if v.absent}
        broken = {v.name: v.broken for v in verifiers if v.broken}
        if broken:
            raise RuntimeError(f"verifiers present but unable to run: {broken}")
        present = [v for v in verifiers if v.runnable]
        best: dict[str, tuple[float, float]] = {}
        keys = set()
        for _ in range(repeats):
            for v in present:  # in turns: a slow moment of the machine hits each alike
                wall, cpu, key = _timed(v, receipt)
                keys.add(key)
                old = best.get(v.name, (float("inf"), float("inf")))
                best[v.name] = (min(old[0], wall), min(old[1], cpu))
        if len(keys) != 1:
            raise RuntimeError(f"the verifiers disagree on the benchmark's ledger: {keys}")

    summary: dict = {"ledger_mb": round(mb, 1), "events": count}
    for v in verifiers:
        if v.name in best:
            wall, cpu = best[v.name]
            summary[f"{v.name}_mb_per_s_wall"] = round(mb / wall, 1)
            summary[f"{v.name}_mb_per_s_cpu"] = round(mb / cpu, 1) if cpu > 0 else None
        else:
            summary[f"{v.name}"] = f"skipped: {skipped[v.name]}"
    return {
        "ledger_bytes": size,
        "events": count,
        "build_seconds": round(build_s, 2),
        "repeats": repeats,
        "seconds": {
            name: {"wall": round(w, 3), "cpu": round(c, 3)} for name, (w, c) in best.items()
        },
        "skipped": skipped,
        "summary": summary,
    }
