"""`docket game-day`: run the phases one after another, judge each from its evidence, report.

Each phase runs in a temporary directory of its own, removed when the phase
ends, Ctrl-C included, under its own deadline (`budget:`). Its runs (one, or
the several of `runs:`) go one after another, each in a folder inside it, each
torn down by the engine before the next starts. An in-process phase calls the
chaos engine (chaos.run.engine.run_chaos) in this process; a subprocess phase runs
`python -m docket chaos` as a child, because its fault kills the supervisor and
that must be a real process (chaos.gameday.aftermath reads what it left). Then
each run's evidence is completed with the derived facts (chaos.gameday.derive)
and every assertion is evaluated over the evidence of the run it names. A run
that cannot run, or is cut off by the budget, leaves its assertions unknown,
with the reason; it never stops the runs and phases after it.

Exit status: 0 every phase passed, 1 one failed, 2 one is unknown (or the input
was bad), 130 interrupted (the report of the phases that ran is still written).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio
import yaml

from chaos.cli import last_line
from chaos.faults.schedule import FaultSchedule
from chaos.gameday import aftermath
from chaos.gameday.assertions import UNKNOWN, Check, evaluate, with_preconditions
from chaos.gameday.derive import derive
from chaos.gameday.fmea import fmea_rows
from chaos.gameday.journal import JOURNAL_SUFFIX, journals
from chaos.gameday.phase import Phase, RunSpec, load_phases
from chaos.gameday.progress import Progress
from chaos.gameday.report import write_file, write_reports
from chaos.gameday.results import CheckResult, GameDayResult, PhaseResult, PhaseRun
from chaos.gameday.review import facts_for_review
from chaos.gameday.timeline import timeline_of
from chaos.gameday.your_agent import findings_for_run, for_user, user_agent_from_args
from chaos.run.collect import collect
from chaos.run.engine import run_chaos
from chaos.run.here import GRACE_SECONDS, repro_command
from chaos.run.upstreams import check_toxiproxy, left_alone_notes
from chaos.scenario import Scenario, with_hosts
from docket import __version__
from docket.clock import rfc3339
from docket.errors import DocketError, InputError

if TYPE_CHECKING:
    from chaos.scenario import Scenario

DEFAULT_REPORT_DIR = "gameday-report"
EVIDENCE_DIR = "evidence"  # REPORT/evidence/PHASE/RUN/run: each run's files, unless --keep
INTERRUPTED = 130


@dataclass
class Outcome:
    """What running a phase produced, before judging: the evidence, or why there is none."""

    evidence: dict | None
    error: str | None
    exit_status: int | None = None
    reason: str = ""
    schedule: tuple[str, ...] = ()
    engine_repro: str = ""
    duration_s: float = 0.0
    evidence_dir: str = ""  # the run's folder, when it is kept
    your_agent: dict | None = None  # the user's agent's findings (chaos.gameday.your_agent)


def resolved_policy(scenario: Scenario) -> dict:
    """The phase's policy with every default filled in (what the run was held to): the
    object the scenario built when it was read, not the mapping parsed again."""
    resolved = scenario.held_policy.to_dict()
    resolved.pop("providers", None)  # the harness fills these with its stubs' addresses
    return resolved


def complete_evidence(evidence: dict, scenario: Scenario) -> dict:
    """The engine's evidence plus the derived facts and the policy, under their own names."""
    out = dict(evidence)
    names = [p.name for p in scenario.providers]
    for key, value in derive(evidence, names).items():
        out.setdefault(key, value)
    out.setdefault("policy", resolved_policy(scenario))
    return out


SHOWN_FACTS = ("doctor", "quarantine", "verify", "orphans", "stub_rate", "mono", "stub_match",
               "agent_stderr")  # fmt: skip


def judge_run(spec: RunSpec, outcome: Outcome, *, phase: Phase, seed: int) -> PhaseRun:
    """What one run showed, for the report (its checks are judged by `judge`)."""
    evidence = outcome.evidence
    facts = facts_for_review(evidence or {})
    if evidence is not None:
        for key in SHOWN_FACTS:
            if key in evidence:
                facts[key] = evidence[key]
    scenario = spec.scenario
    return PhaseRun(
        name=spec.name,
        title=spec.title,
        repro=phase.repro(seed, spec.name) if phase.several_runs else "",
        engine_repro=outcome.engine_repro,
        duration_s=outcome.duration_s,
        error=outcome.error if evidence is None else None,
        exit_status=outcome.exit_status,
        run_reason=outcome.reason,
        schedule=outcome.schedule,
        injected=tuple((evidence or {}).get("injected") or ()),
        timeline=timeline_of((evidence or {}).get("events") or []),
        policy=(evidence or {}).get("policy") or _safe_policy(scenario),
        providers=tuple(
            {"name": p.name, "kind": p.kind, "via_proxy": p.via_proxy}
            for p in getattr(scenario, "providers", ())
        ),
        agents=tuple(_agent_view(a) for a in getattr(scenario, "agents", ())),
        facts=facts,
        evidence_dir=outcome.evidence_dir,
        your_agent=outcome.your_agent or {},
    )


def judge(
    phase: Phase, outcomes: Mapping[str, Outcome], *, seed: int, duration_s: float
) -> PhaseResult:
    """Evaluate every assertion of the phase over the evidence of the run it names."""
    plain: list[Check] = []
    for expectation in phase.expect:
        a = expectation.assertion
        outcome = outcomes.get(expectation.run) or Outcome(None, "the run did not run")
        if outcome.evidence is None:
            check = Check(a.name, a.query, a.op, a.expected, None, UNKNOWN, outcome.error or "")
        else:
            check = evaluate(a, outcome.evidence)
        plain.append(check)
    judged = with_preconditions(plain, [e.requires for e in phase.expect])
    checks = [
        CheckResult(check, e.line, e.run, e.requires)
        for check, e in zip(judged, phase.expect, strict=True)
    ]
    runs = tuple(
        judge_run(
            spec,
            outcomes.get(spec.name) or Outcome(None, "the run did not run"),
            phase=phase,
            seed=seed,
        )
        for spec in phase.runs
    )
    return PhaseResult(
        name=phase.name,
        title=phase.title,
        about=phase.about,
        fmea=phase.fmea,
        seed=seed,
        mode=phase.mode,
        source=phase.source,
        repro=phase.repro(seed, phase.selected_run),
        duration_s=duration_s,
        budget_s=phase.budget_s,
        checks=tuple(checks),
        runs=runs,
        your_agent=dict(phase.user_view),
    )


def _safe_policy(scenario) -> dict:
    try:
        return resolved_policy(scenario)
    except DocketError as exc:  # checked when the phase was read; say so if it is not
        return {"error": str(exc)}


def _agent_view(agent) -> dict:
    return {
        "name": agent.name,
        "mode": agent.mode,
        "provider": agent.provider,
        "calls": agent.calls,
        "concurrency": agent.concurrency,
        "timeout": agent.timeout,
    }


# ---------------------------------------------------------------- running one phase


def _outcome(result) -> Outcome:
    """An Outcome from the engine's RunResult (chaos.run.collect)."""
    evidence = result.evidence()
    evidence["ledger_path"] = str(result.ledger_path)
    evidence["notes"] = list(getattr(result, "notes", ()))
    return Outcome(
        evidence=evidence,
        error=None,
        exit_status=result.exit_status,
        reason=result.reason,
        schedule=tuple(result.schedule),
        # result.repro names the scenario's source, which for a phase is the phase file
        # (not a scenario `docket chaos` reads): the game-day command is the repro.
        engine_repro="",
    )


def _scenario(spec: RunSpec) -> Scenario:
    """The run's scenario as the engine's type. RunSpec holds it as `object` (phase.py
    leaves the engine unimported until a file is read); the phase reader builds every
    one with chaos.scenario.scenario_from_data, so the check always holds."""
    assert isinstance(spec.scenario, Scenario), type(spec.scenario)
    return spec.scenario


async def run_in_process(spec: RunSpec, seed: int, folder: Path, toxiproxy: str | None) -> Outcome:
    run_dir = folder / "run"
    result = await run_chaos(_scenario(spec), seed=seed, folder=run_dir, toxiproxy_url=toxiproxy)
    if result.interrupted_by is not None:
        # The run's supervisor caught the user's Ctrl-C (it listens for SIGINT while it
        # runs, to stop the agent legibly): the day stops too, as if the KeyboardInterrupt
        # had reached this process directly.
        raise KeyboardInterrupt(f"{result.interrupted_by} during {spec.name}")
    return _outcome(result)


def chaos_argv(scenario: Path, seed: int, folder: Path, toxiproxy: str | None) -> list[str]:
    argv = [sys.executable, "-m", "docket", "chaos", "--scenario", str(scenario)]
    argv += ["--seed", str(seed), "--dir", str(folder)]
    if toxiproxy:
        argv += ["--toxiproxy", toxiproxy]
    return argv


async def run_in_subprocess(
    spec: RunSpec, seed: int, folder: Path, toxiproxy: str | None
) -> Outcome:
    """`docket chaos` as a child process, read back from its folder afterwards: the
    CLI path end to end, and a run whose supervisor may be killed outright."""

    scenario = folder / "run.yaml"
    scenario.write_text(yaml.safe_dump(dict(spec.data), sort_keys=False), encoding="utf-8")
    run_dir = folder / "run"
    argv = chaos_argv(scenario, seed, run_dir, toxiproxy)
    started = time.monotonic()
    done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    status = done.returncode
    stderr = done.stderr.decode("utf-8", "replace").strip().splitlines()
    why = (
        f"docket chaos exited with status {status}"
        if status >= 0
        else (f"docket chaos was killed by signal {-status}")
    )
    if stderr:
        why += f" ({stderr[-1][:200]})"
    if not (run_dir / "ledger.jsonl").exists():
        raise RuntimeError(f"{why}, and left no ledger")
    result = collect(
        run_dir,
        seed=seed,
        schedule=list(getattr(spec.scenario, "faults", ())),
        repro=repro_command(_scenario(spec), seed, toxiproxy),
        agents=[a.name for a in getattr(spec.scenario, "agents", ())],
        duration_s=time.monotonic() - started,
        killed=(status, why),
    )
    return _outcome(result)


async def add_aftermath(evidence: dict) -> None:
    """doctor, quarantine and verify for the ledger, and the processes that outlived the run."""
    ledger = Path(evidence["ledger_path"])
    notes = evidence.setdefault("notes", [])
    if ledger.is_file():
        evidence.setdefault("ledger_file", {"bytes": ledger.stat().st_size})
        evidence.update(aftermath.doctor_facts(ledger))
    # each agent's last word on stderr: why it exited as it did (the reference agent
    # prints its own verdict there, "agent: ..."), for the report's "run ended"

    evidence["agent_stderr"] = {
        err.stem: said
        for err in sorted((ledger.parent / "agents").glob("*.err"))
        if (said := last_line(err))
    }
    pids = aftermath.spawned_pids(evidence.get("events") or [], ledger.parent, notes)
    evidence["spawned"] = pids
    evidence["orphans"] = await aftermath.orphans(pids)


RUNNERS = {"in-process": run_in_process, "subprocess": run_in_subprocess}


async def run_one(
    phase: Phase,
    spec: RunSpec,
    *,
    seed: int,
    folder: Path,
    toxiproxy: str | None,
    kept: bool = False,
) -> Outcome:
    """One run of a phase, in `folder`, with its aftermath and derived facts; never raises
    for a run that fails (that is an outcome without evidence, with the reason). A kept
    folder also gets the run's scenario block as run.yaml, so the engine's own `docket
    chaos` command can run it again."""
    started = time.monotonic()
    folder.mkdir(mode=0o700)  # owner only, like a docket run's folder
    engine_repro = ""
    if kept:
        engine_repro = write_scenario(spec, folder, seed, toxiproxy)
    try:
        outcome = await RUNNERS[phase.mode](spec, seed, folder, toxiproxy)
        # Both runners build their Outcome with _outcome, from a result's evidence.
        assert outcome.evidence is not None
        await add_aftermath(outcome.evidence)
    except Exception as exc:  # noqa: BLE001 - one run's crash is its verdict, not the day's end
        outcome = Outcome(None, f"the run could not run: {_leaves(exc)}")
    if outcome.evidence is not None:
        try:
            outcome.evidence = complete_evidence(outcome.evidence, _scenario(spec))
        except Exception as exc:  # noqa: BLE001 - a bug in a derivation: unknown, with why
            outcome = Outcome(None, f"deriving facts failed: {type(exc).__name__}: {exc}")
    if outcome.evidence is not None and phase.user_view.get("beside"):
        # The reference agents drove the phase beside the user's agent, so its checks
        # are judged whatever the user's agent did; an agent that crashed at start or
        # gave up is a finding about it (runs_to_the_end), never a Docket UNKNOWN.

        outcome.your_agent = findings_for_run(
            phase, spec, outcome.evidence, folder / "run", GRACE_SECONDS
        )
    outcome.duration_s = time.monotonic() - started
    if kept:
        outcome.evidence_dir = str(folder / "run")
        outcome.engine_repro = engine_repro
    return outcome


def write_scenario(spec: RunSpec, folder: Path, seed: int, toxiproxy: str | None) -> str:
    """The run's scenario block as FOLDER/run.yaml, and the `docket chaos` command that
    runs it again into a new folder beside it (the engine alone, without the game day)."""

    scenario = folder / "run.yaml"
    scenario.write_text(yaml.safe_dump(dict(spec.data), sort_keys=False), encoding="utf-8")
    argv = ["docket", "chaos", "--scenario", str(scenario), "--seed", str(seed)]
    argv += ["--dir", str(folder / "again")]
    if toxiproxy:
        argv += ["--toxiproxy", toxiproxy]
    return shlex.join(argv)


MARKER = ".docket-gameday-evidence"  # in a phase's kept folder: ours to replace next time


def evidence_folder(keep: Path, phase: Phase) -> Path:
    return keep / phase.name


def check_keep(keep: Path, phases: Sequence[Phase]) -> None:
    """The phases' evidence folders can be made: each is new, or one a game day left
    (it has MARKER), which the next game day replaces. Checked before anything runs."""
    writable_folder(keep, "--keep")
    for phase in phases:
        target = evidence_folder(keep, phase)
        if target.exists() and not (target / MARKER).is_file():
            raise InputError(
                f"--keep {keep}: {target} exists and was not left by a game day; "
                "give another folder"
            )


def fresh_evidence_folder(keep: Path, phase: Phase) -> Path:
    """The phase's evidence folder, empty, with its marker (a previous game day's is
    removed: the report that linked it was rewritten too)."""
    target = evidence_folder(keep, phase)
    if (target / MARKER).is_file():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    (target / MARKER).write_text(
        "evidence of a docket game-day phase; the next game day with this folder replaces it\n"
    )
    return target


async def run_phase(
    phase: Phase,
    *,
    seed: int | None = None,
    toxiproxy: str | None = None,
    keep: Path | None = None,
) -> PhaseResult:
    """Run a phase's runs one after another in a folder of its own (each run in a folder
    inside it, torn down by the engine before the next starts) and judge it; never raises
    for a phase that fails to run (that is an unknown verdict with the reason). The folder
    is KEEP/PHASE when `keep` is given (the evidence stays, for `docket verify` and a
    reader), else a temporary directory removed when the phase ends."""
    seed = phase.seed if seed is None else seed
    started = time.monotonic()
    cut = f"the phase did not finish within its budget of {phase.budget_s:g} s"
    outcomes = {spec.name: Outcome(None, cut) for spec in phase.runs}  # until each finishes

    async def run_all(base: Path) -> PhaseResult:
        with trio.move_on_after(phase.budget_s):
            for spec in phase.runs:
                outcomes[spec.name] = await run_one(
                    phase,
                    spec,
                    seed=seed,
                    folder=base / spec.name,
                    toxiproxy=toxiproxy,
                    kept=keep is not None,
                )
        return judge(phase, outcomes, seed=seed, duration_s=time.monotonic() - started)

    if keep is not None:
        return await run_all(fresh_evidence_folder(Path(keep), phase))
    with tempfile.TemporaryDirectory(prefix=f"docket-gameday-{phase.name}-") as tmp:
        return await run_all(Path(tmp))


async def run_phases(
    phases: Sequence[Phase],
    *,
    seed: int | None,
    toxiproxy: str | None,
    done: list[PhaseResult],
    on_start: Callable[[Phase], None] = lambda phase: None,
    on_finish: Callable[[PhaseResult], None] = lambda result: None,
    keep: Path | None = None,
) -> None:
    """Run the phases in order, appending each result to `done` as it finishes (so an
    interrupted game day still has the phases that ran)."""
    for phase in phases:
        on_start(phase)
        result = await run_phase(phase, seed=seed, toxiproxy=toxiproxy, keep=keep)
        done.append(result)
        on_finish(result)


def game_day(
    phases: Sequence[Phase],
    *,
    seed: int | None = None,
    toxiproxy: str | None = None,
    on_start: Callable[[Phase], None] = lambda phase: None,
    on_finish: Callable[[PhaseResult], None] = lambda result: None,
    keep: Path | None = None,
    agent_findings: str | None = None,
) -> GameDayResult:
    """Run a game day (trio.run inside); Ctrl-C gives a result marked interrupted.
    With `keep`, each phase's evidence stays in KEEP/PHASE (see run_phase)."""
    started_at = rfc3339(time.time())
    started = time.monotonic()
    done: list[PhaseResult] = []
    interrupted = False
    try:
        trio.run(
            lambda: run_phases(
                phases,
                seed=seed,
                toxiproxy=toxiproxy,
                done=done,
                on_start=on_start,
                on_finish=on_finish,
                keep=keep,
            )
        )
    except KeyboardInterrupt:
        interrupted = True  # the temporary folders went with the unwinding; report what ran
    except BaseExceptionGroup as group:  # a Ctrl-C that unwound through a nursery comes wrapped
        interrupted = group.subgroup(KeyboardInterrupt) is not None
        rest = group.subgroup(
            lambda exc: not isinstance(exc, KeyboardInterrupt | BaseExceptionGroup)
        )
        if not interrupted or rest is not None:
            raise
    return GameDayResult(
        phases=tuple(done),
        started_at=started_at,
        duration_s=time.monotonic() - started,
        seed=seed,
        docket_version=__version__,
        interrupted=interrupted,
        agent_findings=agent_findings,
    )


# ---------------------------------------------------------------- the verb


def writable_folder(folder: Path, what: str) -> None:
    """The folder exists and is writable, or could be created: checked, nothing created."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{what} {folder}: cannot create ({existing} is not a folder)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{what} {folder}: {existing} is not writable by this user")


async def check_toxiproxy_for(phases: Sequence[Phase], seed: int | None, url: str) -> list[str]:
    """Every run's faults are ones a real Toxiproxy can perform, and it answers.
    Returns a note for each docket proxy already on it (other runs', left alone)."""
    for phase in phases:
        for spec in phase.runs:
            schedule = FaultSchedule.parse(
                phase.seed if seed is None else seed, _scenario(spec).faults
            )
            await check_toxiproxy(url, schedule)
    return await left_alone_notes(url)


def phases_on_hosts(
    phases: list, stubs: str | None, proxies: str | None, boundary: str | None = None
) -> list:
    """Every run of every phase with the hosts given on the command line (the flags win
    over a phase's `hosts:`); a subprocess phase's block carries them to `docket chaos`."""

    if stubs is None and proxies is None and boundary is None:
        return phases
    out = []
    for phase in phases:
        runs = []
        for spec in phase.runs:
            scenario = with_hosts(spec.scenario, stubs, proxies, boundary)
            hosts = {"stubs": scenario.hosts.stubs, "proxies": scenario.hosts.proxies}
            data = {**spec.data, "hosts": hosts, "policy": dict(scenario.policy)}
            runs.append(dataclasses.replace(spec, scenario=scenario, data=data))
        out.append(dataclasses.replace(phase, runs=tuple(runs)))
    return out


def game_day_command(args) -> int:
    if args.seed is not None and not 0 <= args.seed < (1 << 53):
        raise InputError(f"--seed {args.seed}: a seed is a whole number from 0 to 2**53 - 1")

    attest_key = getattr(args, "attest", None)
    if attest_key is not None:
        check_attest_key(attest_key, args)  # a key that cannot sign is refused before the phases
    user = user_agent_from_args(args)  # --agent-command, --policy, --agent-findings
    phases = load_phases(args.phase or ())  # every phase file is checked before any runs
    if user is not None:
        phases = [for_user(phase, user) for phase in phases]
    phases = phases_on_hosts(
        phases,
        getattr(args, "stub_host", None),
        getattr(args, "proxy_host", None),
        getattr(args, "boundary_host", None),
    )
    rows = fmea_rows()  # and the FMEA table the report links to
    # and where the results go, and the Toxiproxy: a bad path or URL is found now,
    # not after the phases ran
    for folder, what in [(Path(args.report), "--report")] + [
        (Path(p).parent, flag) for p, flag in ((args.json, "--json"), (args.junit, "--junit")) if p
    ]:
        writable_folder(folder, what)
    journal_dir = getattr(args, "journal", None)
    if journal_dir is not None:
        writable_folder(Path(journal_dir), "--journal")
    # each phase's evidence stays beside the report (or in --keep DIR), linked from it
    keep = Path(getattr(args, "keep", None) or Path(args.report) / EVIDENCE_DIR)
    check_keep(keep, phases)
    if args.toxiproxy is not None:
        for note in trio.run(check_toxiproxy_for, phases, args.seed, args.toxiproxy):
            print(f"note: {note}")
    progress = Progress(len(phases))
    result = game_day(
        phases,
        seed=args.seed,
        toxiproxy=args.toxiproxy,
        on_start=progress.start,
        on_finish=progress.finish,
        keep=keep,
        agent_findings=user.findings if user is not None and user.command else None,
    )
    progress.close()
    try:
        written = write_reports(
            result,
            report_dir=args.report,
            json_path=args.json,
            junit_path=args.junit,
            rows=rows,
        )
        if journal_dir is not None:  # a Chaos Toolkit journal per phase (chaos.gameday.journal)
            for name, journal in journals(result).items():
                text = json.dumps(journal, indent=2, ensure_ascii=False) + "\n"
                write_file(Path(journal_dir) / f"{name}{JOURNAL_SUFFIX}", text)
    except OSError as exc:  # checked before the run; the disk or a race can still refuse
        where = exc.filename or args.report
        raise InputError(f"cannot write the report to {where}: {exc.strerror}") from None
    progress.summary(result, written, keep)
    if attest_key is not None:
        from docket.attest.command import attest_folder  # loads cryptography only when asked

        print(f"attested the report: {attest_folder(args.report, attest_key)}")
    return INTERRUPTED if result.interrupted else result.exit_code


def check_attest_key(key: str, args) -> None:
    """--attest KEY signs the report folder's gameday.json and junit.xml: refused (one
    line, exit 2) when --json or --junit would write them elsewhere, or when the key
    cannot sign (missing, not Ed25519, readable by group or others)."""
    if args.json or args.junit:
        raise InputError(
            "--attest signs the report folder's gameday.json and junit.xml: "
            "not with --json or --junit, which put them elsewhere"
        )
    from docket.attest.keys import load_private_key  # loads cryptography only when asked

    load_private_key(key)


__all__ = [
    "DEFAULT_REPORT_DIR",
    "Outcome",
    "complete_evidence",
    "game_day",
    "game_day_command",
    "judge",
    "judge_run",
    "run_one",
    "run_phase",
    "run_phases",
]


def _leaves(exc: BaseException) -> str:
    """What went wrong, in words: an exception group (a trio nursery's) as the exceptions
    inside it, so the cause is said rather than "Exceptions from Trio nursery (1 sub-exception)"."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_leaves(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
