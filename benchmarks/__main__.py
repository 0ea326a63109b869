"""Run the benchmarks: `python -m benchmarks [NAME ...] [--quick]` (what `nox -s bench` runs).

Each module benchmarks/bench_<name>.py exposes `run(quick: bool) -> dict`. The
result, with the machine's description, goes to benchmarks/results/<name>.json
and a one-line summary per figure is printed. Ratios are measured side by side
inside one module's run, never across runs: this 2-core machine is noisy.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import NoReturn

from benchmarks._harness import how_run

HERE = Path(__file__).parent


def machine() -> dict:
    import httptools

    from docket.http.protocol import h11

    return {
        "python": sys.version.split()[0],
        "h11": f"{h11.__name__} {getattr(h11, '__version__', '?')}",  # h11_mypyc: the [fast] extra
        "httptools": httptools.__version__,  # the upstream client's parser (ADR 0008)
        "load_average": os.getloadavg(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (exit 2), like an unknown name."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def main() -> int:
    parser = _Parser(prog="python -m benchmarks")
    parser.add_argument("names", nargs="*", help="which benchmarks (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    available = sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))
    names = args.names or available
    unknown = [n for n in names if n not in available]
    if unknown:
        print(
            f"benchmarks: unknown {', '.join(unknown)}; have {', '.join(available)}",
            file=sys.stderr,
        )
        return 2
    command = how_run("bench", "benchmarks", sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        module = importlib.import_module(f"benchmarks.bench_{name}")
        print(f"== {name}", flush=True)
        result = {"benchmark": name, "machine": machine(), "quick": args.quick, "command": command}
        result.update(module.run(quick=args.quick))
        path = out / f"{name}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        for key, value in result.get("summary", {}).items():
            print(f"   {key}: {value}")
        print(f"   -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
