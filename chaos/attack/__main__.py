"""`python -m chaos.attack [--quick] [--json PATH] [--only FAMILY]`: every probe family,
one table of figures, the failures' reproductions, and the figures as JSON.

Exit 0 when every family's good count equals what it tried, 1 when one does not,
2 when a family could not run at all (a harness failure, said in one line).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

from rich.console import Console
from rich.table import Table

from chaos.attack import Figures

# family -> (module, what its good figure counts)
FAMILIES = {
    "http": (
        "chaos.attack.http",
        "answered 4xx in the provider's shape (or the close wanted), boundary still serving",
    ),
    "mutations": ("chaos.attack.mutations", "detected by docket verify"),
    "secrets": ("chaos.attack.secrets", "secrets planted and found nowhere on disk"),
    "inputs": ("chaos.attack.inputs", "exit 2, one stderr line, no traceback"),
    "diskfull": ("chaos.attack.diskfull", "receipts that disclose the loss"),
    "cache": (
        "chaos.attack.cache",
        "a spoiled shared cache store never served, refused with its reason, run goes on",
    ),
    "exhaustion": (
        "chaos.attack.exhaustion",
        "a real call answered and recorded, each episode an event, no traceback",
    ),
    "snapshot": (
        "chaos.attack.snapshot",
        "ended in bounded time, nothing written outside, verified only when the tree "
        "equals the snapshot, differences named; prune removes no referenced object and "
        "nothing through a link",
    ),
    "excluded": (
        "chaos.attack.excluded",
        "an excluded root spoiled: named as it is (a link as a link), within the identity "
        "step's bound, nothing outside read into or changed",
    ),
    "numbers": (
        "chaos.attack.numbers",
        "number forms on which the three verifiers agree, none exits 70, each within its bound",
    ),
    "orphans": (
        "chaos.attack.orphans",
        "nothing of the run alive after docket run exits, no key read",
    ),
    "attest": (
        "chaos.attack.attest",
        "a readable key refused; a signed run swapped, re-signed or bloated: each verifier's "
        "named verdict in one line, in bounded time",
    ),
    "replay": (
        "chaos.attack.replay",
        "a planted recording refused in one line before any answer is served, in bounded time",
    ),
    "fleet": (
        "chaos.attack.fleet",
        "the fleet DSN kept from the agent and off disk, the cap held through the boundary, "
        "a runs' role unable to touch the tables",
    ),
}
# Family-specific figures worth a column of their own.
NOTES = {
    "fleet": lambda x: (
        f"spent {x.get('calls_spent_nusd')} of {x.get('calls_cap_nusd')} nusd; open: "
        f"{'; '.join(x.get('open', [])) or 'none'}"
    ),
    "http": lambda x: (
        f"4xx {x.get('answered_4xx')}, in provider shape {x.get('provider_shape_4xx')}"
        f", still serving {x.get('still_serving')}"
    ),
    "mutations": lambda x: f"seed {x.get('seed')}, verify exits {x.get('verify_exit_codes')}",
    "secrets": lambda x: (
        f"bytes of secrets found {x.get('bytes_of_secrets_found')} in "
        f"{x.get('bytes_searched')} bytes; files not 0600: {len(x.get('files_readable_by_group_or_other', []))}"
    ),
    "inputs": lambda x: f"{x.get('exit_codes')}",
    "diskfull": lambda x: f"exit codes {x.get('exit_codes')}",
    "cache": lambda x: (
        f"{x.get('probes')} probes ({', '.join(x.get('classes', []))}),"
        f" {x.get('through_docket_run')} through docket run"
    ),
    "exhaustion": lambda x: (
        f"{x.get('connections_opened')} connections, {x.get('pressure_events')} pressure "
        f"events counting {x.get('pressure_counted')}"
    ),
    "snapshot": lambda x: f"held {x.get('held')}",
    "excluded": lambda x: f"slowest probe {x.get('slowest_probe_s')} s",
    "numbers": lambda x: (
        f"verifiers {x.get('verifiers')}, verdicts {x.get('verdicts')}, slowest "
        f"{x.get('slowest_s')}, skipped {x.get('skipped_verifiers')}"
    ),
    "replay": lambda x: f"slowest probe {x.get('slowest_probe_s')} s",
    "orphans": lambda x: (
        f"outlived {x.get('outlived')}, orphans recorded {x.get('orphans_recorded')}, "
        f"isolation {x.get('isolation')}"
    ),
    "attest": lambda x: (
        f"verifiers {x.get('verifiers')}, slowest {x.get('slowest_s')} s; a same-user agent "
        f"read the 0600 key: {x.get('same_user_read_0600_key')} (documented: keep it out of reach)"
    ),
}


def run_family(name: str, folder: Path, quick: bool) -> Figures:
    module = importlib.import_module(FAMILIES[name][0])
    started = time.monotonic()
    try:
        figures = module.run(folder, quick)
    except Exception as exc:  # noqa: BLE001 - a family that cannot run is reported, not hidden
        figures = Figures(name, failures=[f"{name}: the family could not run: "
                                          f"{type(exc).__name__}: {exc}"])  # fmt: skip
        figures.extra = {"error": traceback.format_exc(limit=3)}
    figures.seconds = time.monotonic() - started
    return figures


def table(results: list[Figures], quick: bool) -> Table:
    grid = Table(title=f"docket attack suite ({'quick' if quick else 'full'} form)")
    for column in ("family", "tried", "good", "good means", "failed", "s", "notes"):
        grid.add_column(
            column, justify="right" if column in ("tried", "good", "failed", "s") else "left"
        )
    for f in results:
        if f.skipped:
            grid.add_row(f.family, "-", "-", FAMILIES[f.family][1], "-", f"{f.seconds:.0f}",
                         f"skipped: {f.skipped}")  # fmt: skip
            continue
        style = "green" if f.good == f.tried and not f.failures else "red"
        grid.add_row(f.family, str(f.tried), f"[{style}]{f.good}[/]", FAMILIES[f.family][1],
                     str(len(f.failures)), f"{f.seconds:.0f}", NOTES[f.family](f.extra))  # fmt: skip
    return grid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.attack", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="the fast form the suite runs")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument("--only", action="append", choices=list(FAMILIES), help="repeat")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args(argv)
    names = args.only or list(FAMILIES)
    console = Console(width=200)
    results = []
    with tempfile.TemporaryDirectory(prefix="docket-attack-") as tmp:
        base = args.keep or Path(tmp)
        for name in names:
            console.print(f"[bold]{name}[/] ...", highlight=False)
            results.append(run_family(name, base / name, args.quick))
    console.print(table(results, args.quick))
    for f in results:
        for line in f.failures:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if args.json:
        args.json.write_text(json.dumps(
            {"quick": args.quick, "families": [f.as_dict() for f in results]}, indent=2) + "\n")  # fmt: skip
    if any(f.extra.get("error") for f in results):
        return 2
    return 0 if all(f.good == f.tried and not f.failures for f in results) else 1


if __name__ == "__main__":
    sys.exit(main())
