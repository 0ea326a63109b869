"""`python -m chaos.fleet SCENARIO [--dir DIR] [--time-scale F] [--boundaries N]`

Runs a fleet scenario (chaos.fleet.scenario; scenarios/fleet-partition.yaml) against a
PostgreSQL cluster of its own, then prints one line per check and a verdict, read from
the ledgers, the receipts and the database (chaos.fleet.judge). The checks and figures
also go to DIR/fleet-verdict.json.

Exit 0 when every check held, 1 when one did not (or the harness could not set the
run up, said in one line), 2 for a bad scenario file or flag (one line, nothing run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import trio

from chaos.fleet.judge import judge
from chaos.fleet.postgres import postgres_bin, running_cluster
from chaos.fleet.runner import HarnessError, run_fleet
from chaos.fleet.scenario import FleetScenario, load_fleet_scenario
from docket.errors import InputError


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos.fleet", description=__doc__.split("\n")[0])
    p.add_argument("scenario", help="a fleet scenario file (YAML)")
    p.add_argument("--dir", help="where the run goes (must not exist); default docket-runs/fleet-…")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="windows and duration times this (0 < F <= 1): a shorter run")  # fmt: skip
    p.add_argument("--boundaries", type=int, default=None, help="override the scenario's count")
    return p.parse_args(argv)


def prepare(args: argparse.Namespace) -> tuple[FleetScenario, Path]:
    """The scenario as it will run and its folder; InputError (exit 2) for anything bad."""
    scenario = load_fleet_scenario(args.scenario)
    if not 0 < args.time_scale <= 1:
        raise InputError(f"--time-scale {args.time_scale:g}: must be above 0 and at most 1")
    if args.boundaries is not None and not 1 <= args.boundaries <= 16:
        raise InputError(f"--boundaries {args.boundaries}: must be from 1 to 16")
    folder = Path(args.dir or time.strftime("docket-runs/fleet-%Y%m%dT%H%M%S"))
    if folder.exists():
        raise InputError(f"--dir {folder}: already exists (a run's folder is made fresh)")
    return scenario.scaled(args.time_scale, args.boundaries), folder


def main(argv: list[str]) -> int:
    try:
        scenario, folder = prepare(_args(argv))
    except InputError as exc:
        print(f"chaos.fleet: {exc}", file=sys.stderr)
        return 2
    bindir = postgres_bin()
    if bindir is None:
        print("chaos.fleet: PostgreSQL is not installed (no initdb on PATH)", file=sys.stderr)
        return 1
    print(
        f"fleet scenario {scenario.source}: {scenario.boundaries} boundaries x "
        f"{scenario.callers} callers, cap ${scenario.cap_usd:g}, slice ${scenario.slice_usd:g}, "
        f"lease {scenario.lease_seconds:g} s, timeout {scenario.timeout:g} s, "
        f"{scenario.duration:g} s; folder {folder}"
    )
    for w in scenario.timeline:
        print(f"  window {w.name}: {w.what} at {w.at:g} s for {w.length:g} s ({w.expect})")
    try:
        with running_cluster(bindir) as cluster:
            evidence = trio.run(run_fleet, scenario, folder, cluster)
    except (HarnessError, RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        # a set-up step failed (initdb, pg_ctl or runuser missing or failing, a boundary
        # that never served): not a verdict
        print(f"chaos.fleet: the harness could not run the scenario: {exc}", file=sys.stderr)
        return 1
    verdict = judge(evidence)
    for line in verdict.lines():
        print(line)
    print(f"figures: {json.dumps(verdict.figures)}")
    (folder / "fleet-verdict.json").write_text(
        json.dumps(
            {"held": verdict.held, "checks": [c.__dict__ for c in verdict.checks],
             "figures": verdict.figures},
            indent=1,
        ) + "\n"
    )  # fmt: skip
    return 0 if verdict.held else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
