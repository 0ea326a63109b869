"""The game day, N times, on a machine kept busy: is every verdict the same every run?

    python -m chaos.gameday.load --runs 20 [--hogs 2] [--phase NAME]... [--keep DIR]

A game day is an oracle only if its verdicts do not depend on the machine's speed.
This runs `docket game-day` `--runs` times, one after another, while `--hogs`
processes spin on the CPU (`python -c 'while 1: pass'`, killed at the end by their
pid), and prints per phase how many runs gave each verdict, with the checks that
failed in any run that differed. Exit 0 if every phase gave one verdict in every
run, 1 if any phase's verdict changed between runs (or a run gave no results).

The counting is pure (`tally`, `table`); the rest starts processes and reads the
JSON each game day writes. Used by `nox -s gameday-load` and the slow test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HOG = "while 1: pass"
RUN_TIMEOUT = 900  # seconds for one whole game day under load: far past its ~1-2 min


@dataclass
class PhaseTally:
    verdicts: Counter = field(default_factory=Counter)
    failing: Counter = field(default_factory=Counter)  # check names that did not pass
    seconds: list[float] = field(default_factory=list)

    @property
    def steady(self) -> bool:
        return len(self.verdicts) == 1


def tally(days: list[dict]) -> dict[str, PhaseTally]:
    """Per phase, the verdicts of each game day's results (gameday.json, parsed)."""
    out: dict[str, PhaseTally] = {}
    for day in days:
        for phase in day.get("phases", []):
            entry = out.setdefault(phase["name"], PhaseTally())
            entry.verdicts[phase["verdict"]] += 1
            entry.seconds.append(float(phase.get("duration_s") or 0.0))
            for check in phase.get("checks", []):
                if check.get("verdict", "pass") != "pass":
                    entry.failing[f"{check.get('run') or ''}:{check.get('name')}"] += 1
    return out


def table(tallies: dict[str, PhaseTally], runs: int, hogs: int) -> str:
    lines = [f"game day x{runs} under {hogs} CPU hog(s): verdicts per phase"]
    for name, entry in tallies.items():
        counts = ", ".join(f"{v} {n}" for v, n in sorted(entry.verdicts.items()))
        slowest = max(entry.seconds, default=0.0)
        mark = "same" if entry.steady and sum(entry.verdicts.values()) == runs else "CHANGED"
        lines.append(f"  {name:<20} {counts:<28} {mark:<8} slowest {slowest:.1f} s")
        for check, n in entry.failing.most_common():
            lines.append(f"      not pass in {n} run(s): {check.lstrip(':')}")
    return "\n".join(lines)


def steady(tallies: dict[str, PhaseTally], runs: int) -> bool:
    return bool(tallies) and all(
        t.steady and sum(t.verdicts.values()) == runs for t in tallies.values()
    )


def start_hogs(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


def docket_command() -> list[str]:
    """The `docket` installed beside this Python (in a nox session: the wheel's), not
    `-m docket`, which would import the source tree in the current folder instead."""
    script = Path(sys.executable).with_name("docket")
    return [str(script)] if script.exists() else [sys.executable, "-m", "docket"]


def run_day(folder: Path, phases: list[str], extra: list[str]) -> dict:
    """One game day in a child process; its JSON results (exit 0, 1 and 2 all write them)."""
    report = folder / "report"
    argv = [*docket_command(), "game-day", "--report", str(report)]
    for phase in phases:
        argv += ["--phase", phase]
    done = subprocess.run(
        [*argv, *extra], capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )
    results = report / "gameday.json"
    if not results.exists():
        raise RuntimeError(
            f"game day exit {done.returncode} wrote no results: {done.stderr.strip()[-400:]}"
        )
    return json.loads(results.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.gameday.load", description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--phase", action="append", default=[])
    parser.add_argument("--keep", type=Path, help="keep each run's report under DIR/NN/")
    parser.add_argument("extra", nargs="*", help="more `docket game-day` arguments, after --")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        parser.error("--runs must be 1 or more and --hogs 0 or more")
    days: list[dict] = []
    hogs = start_hogs(args.hogs)
    try:
        with tempfile.TemporaryDirectory(prefix="gameday-load-") as scratch:
            base = args.keep or Path(scratch)
            for n in range(1, args.runs + 1):
                day = run_day(base / f"{n:02d}", args.phase, args.extra)
                days.append(day)
                verdicts = Counter(p["verdict"] for p in day.get("phases", []))
                print(f"run {n}/{args.runs}: {dict(verdicts)}", flush=True)
    finally:
        stop_hogs(hogs)
    tallies = tally(days)
    print(table(tallies, args.runs, args.hogs))
    if steady(tallies, args.runs):
        print("every phase gave the same verdict in every run")
        return 0
    print("some phase's verdict changed between runs (see CHANGED above)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
