"""`docket chaos`: one supervised run under seeded faults, against stub providers.

    docket chaos --seed N [--scenario FILE] [--fault SPEC ...] [--agent MODE | -- CMD ...]
                 [--toxiproxy URL] [--dir DIR]

Everything the user typed is checked before anything starts (a bad scenario,
fault or agent mode is one line naming the problem, exit 2). Then it prints the
seed and the resolved schedule, runs, and prints the receipt's summary and the
exact command that reproduces the run. It exits with the supervised run's status.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
import time
from decimal import Decimal
from pathlib import Path

import trio

from chaos.faults.schedule import FaultSchedule
from chaos.run.engine import run_chaos
from chaos.run.here import RESOLVE_UP_TO, check_folder
from chaos.run.upstreams import check_real_toxiproxy, toxiproxy_driver
from chaos.scenario import (
    SEED_LIMIT,
    AgentSpec,
    Scenario,
    check_faults,
    load_scenario,
    with_hosts,
)
from docket.agent.config import MODES
from docket.errors import InputError
from docket.values import format_usd


def build_scenario(args) -> Scenario:
    scenario = load_scenario(args.scenario) if args.scenario else Scenario(source="<flags>")
    extra = check_faults(args.fault or [])
    repeated = sorted(set(extra) & set(scenario.faults))
    if repeated:
        raise InputError(f"--fault {repeated[0]!r}: already in the scenario")
    changes: dict = {"faults": scenario.faults + extra}
    command = [c for c in (args.command or []) if c != "--"] if args.command else []
    if args.agent is not None and command:
        raise InputError("give --agent MODE or -- CMD, not both")
    if args.agent is not None:
        if args.agent not in MODES:
            raise InputError(f"--agent {args.agent!r}: not one of {', '.join(MODES)}")
        changes["agents"] = (AgentSpec(name="agent", mode=args.agent),)
    elif command:
        changes["agents"] = (AgentSpec(name="agent", mode=None, command=tuple(command)),)
    scenario = dataclasses.replace(scenario, **changes)
    return with_hosts(
        scenario,
        getattr(args, "stub_host", None),
        getattr(args, "proxy_host", None),
        getattr(args, "boundary_host", None),
    )


def pick_seed(args, scenario: Scenario) -> tuple[int, bool]:
    """The seed to use and whether it was drawn here."""
    if args.seed is not None:
        if not 0 <= args.seed < SEED_LIMIT:
            raise InputError(f"--seed {args.seed}: must be in [0, 2**53)")
        return args.seed, False
    if scenario.seed is not None:
        return scenario.seed, False
    return secrets.randbelow(SEED_LIMIT), True


def ranges(ordinals: list[int]) -> str:
    """[1, 2, 3, 7] -> "1..3, 7"."""
    out: list[list[int]] = []  # [first, last] of each run of consecutive ordinals
    for n in ordinals:
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in out)


def schedule_lines(schedule: FaultSchedule, up_to: int) -> list[str]:
    """The resolved schedule, one line per fault: where it fires (ordinals up to `up_to`)."""
    fired: dict[str, list[int]] = {}
    for ordinal, text in schedule.resolve(up_to):
        fired.setdefault(text, []).append(ordinal)
    lines = [f"fault schedule: seed {schedule.seed}, {len(schedule.faults)} fault(s)"]
    for fault in schedule.faults:
        if fault.trigger.timed is not None:
            lines.append(f"  {fault.text}: timed (which ordinals it meets varies by run)")
            continue
        where = ranges(fired.get(fault.text, []))
        lines.append(f"  {fault.text}: {fault.counter} {where or 'none'} (of the first {up_to})")
    return lines


def repro_argv(args, seed: int) -> list[str]:
    argv = ["docket", "chaos", "--seed", str(seed)]
    if args.scenario:
        argv += ["--scenario", args.scenario]
    for text in args.fault or []:
        argv += ["--fault", text]
    if args.agent:
        argv += ["--agent", args.agent]
    if args.toxiproxy:
        argv += ["--toxiproxy", args.toxiproxy]
    hosts = (
        ("--stub-host", args.stub_host),
        ("--proxy-host", args.proxy_host),
        ("--boundary-host", args.boundary_host),
    )
    for flag, value in hosts:
        if value is not None:
            argv += [flag, value]
    command = [c for c in (args.command or []) if c != "--"]
    if command:
        argv += ["--", *command]
    return argv


def chaos_command(args) -> int:
    scenario = build_scenario(args)
    seed, drawn = pick_seed(args, scenario)
    folder = (
        Path(args.dir)
        if args.dir
        else Path("docket-runs") / time.strftime(f"chaos-%Y%m%dT%H%M%S-{seed}")
    )
    schedule = FaultSchedule.parse(seed, scenario.faults)
    check_folder(folder)
    if getattr(args, "replay", None) is None and (
        getattr(args, "policy", None) or getattr(args, "on_miss", None)
    ):
        raise InputError("--policy and --on-miss go with --replay RUN")
    if getattr(args, "replay", None) is not None:
        from chaos.replay import replay_chaos  # the faults on a recorded run's answers

        return replay_chaos(args, seed, schedule, folder, schedule_lines(schedule, RESOLVE_UP_TO))
    if args.toxiproxy is not None:  # refused before anything is printed; run_chaos dials it
        toxiproxy_driver(args.toxiproxy)
        check_real_toxiproxy(schedule)
    print(f"seed {seed}" + (" (drawn: pass --seed to repeat it)" if drawn else ""))
    for line in schedule_lines(schedule, RESOLVE_UP_TO):
        print(line)
    try:
        result = trio.run(
            lambda: run_chaos(scenario, seed=seed, folder=folder, toxiproxy_url=args.toxiproxy)
        )
    except BaseExceptionGroup as group:
        # A Ctrl-C outside the supervised part (start-up, teardown) comes out of the
        # nurseries wrapped; everything has been torn down by then: say "interrupted".
        if group.subgroup(KeyboardInterrupt) is not None:
            raise KeyboardInterrupt from None
        refused, other = group.split(InputError)
        if refused is None or other is not None:
            raise
        raise _first_leaf(refused) from None
    summary = result.summary()
    by_rule = ", ".join(f"{rule} {n}" for rule, n in summary["refused_by_rule"].items())
    print(
        f"run: {summary['calls']} call(s), {summary['ok']} ok, {summary['errors']} error(s), "
        f"{summary['refused']} refused{f' ({by_rule})' if by_rule else ''}; "
        f"{summary['faults_injected']} fault record(s) in the "
        f"ledger, {summary['faults_performed']} fault(s) performed"
    )
    if summary["ledger_complete"] is False:
        print("ledger: incomplete (write faults): see the receipt's ops.evidence")
    cached = cache_line(result.receipt)
    if cached is not None:
        print(cached)
    for line in agent_lines(result):
        print(line)
    for note in result.notes:
        print(f"note: {note}")
    print(f"exit {result.exit_status}: {result.reason}")
    print(f"folder: {result.folder}")
    print(f"reproduce: {shlex.join(repro_argv(args, seed))}")
    return result.exit_status


def cache_line(receipt: dict | None) -> str | None:
    """The receipt's ops.cache in one line (None when the run had no [cache]): the hits are
    not among the line above's calls, since nothing was forwarded for them."""
    cache = ((receipt or {}).get("ops") or {}).get("cache")
    if not isinstance(cache, dict):
        return None
    saved = format_usd(Decimal(cache["saved_nusd"]) / 10**9)
    refused = ", ".join(f"{r} {n}" for r, n in sorted(cache["refused_by_reason"].items()))
    return (
        f"cache: {cache['hits']} hit(s) saving ${saved}, {cache['misses']} miss(es), "
        f"{cache['stored']} stored" + (f", not stored: {refused}" if refused else "")
    )


def agent_lines(result) -> list[str]:
    """One line per agent saying where its output went (agents/NAME.out and .err in the
    run folder) and what it reported: its JSON report is the last JSON line of its
    stdout; a command that prints none (any program given after --) is not a failure."""
    lines = []
    for name, report in result.agent_reports.items():
        out = result.folder / "agents" / f"{name}.out"
        err = result.folder / "agents" / f"{name}.err"
        where = f"output in {out} and {err.name}"
        if report is not None:
            lines.append(f"agent {name!r}: report {json.dumps(report)} ({where})")
            continue
        # the agent's last word on stderr is usually why it printed no report (a bad
        # command, a crash); a program that is not docket's reference agent prints none
        said = last_line(err)
        text = f"agent {name!r}: printed no JSON report ({where})"
        if said:
            text += f"; its last stderr line: {said}"
        lines.append(text)
    return lines


def last_line(path: Path, limit: int = 200) -> str | None:
    """The last non-blank line of a text file, shortened; None if there is none."""
    if not path.exists():
        return None
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return lines[-1].strip()[:limit] if lines else None


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
