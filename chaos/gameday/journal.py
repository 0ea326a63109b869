"""A game-day phase as a Chaos Toolkit journal (the `journal.json` `chaos run` writes).

Pure but for the machine's platform and node names, read as chaoslib reads them:
`phase_journal(phase, started)` maps one PhaseResult to the dict chaoslib
builds while it runs an experiment (chaoslib.run.initialize_run_journal and
Runner._run), so a team that keeps Chaos Toolkit journals sees a game day's phases
beside its own experiments (`chaos report` reads them).

The experiment is the phase: its faults (each run's schedule, in the fault
grammar) are the method's actions, its checks are the steady-state hypothesis's
probes, each with the expected value as its tolerance. Chaos Toolkit probes the
hypothesis before and after the method; a phase judges its checks once, from the
run's evidence, so they are the "after" state, and "before" holds the checks'
preconditions (`requires:`) when the phase has them. Docket rolls nothing back:
each run is torn down with its folder, so `rollbacks` is empty and the
experiment's `docket` extension says where each run's ledger is kept and the
command that verifies it.

Status and deviation follow chaoslib's own rules (run_deviation_validation_hypothesis):
a tolerance not met is a deviation of a *completed* experiment; a probe that
could not run makes it *failed*. So: a run with no evidence (it could not run, or
the budget cut it off) is `aborted`; otherwise a check that could not be judged
(unknown) is a probe that failed, `failed`; else `completed`, and `deviated` is
true when a check failed.

Timestamps are ISO 8601 in UTC as chaoslib writes them. A phase's runs record
their durations, not their wall-clock starts: each start is the game day's start
plus the durations of the phases and runs before it (they run one after another).
"""

from __future__ import annotations

import math
import platform
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from chaos.gameday.assertions import FAIL, PASS, UNKNOWN, Assertion, evaluate
from chaos.gameday.results import CheckResult, GameDayResult, PhaseResult, PhaseRun

JOURNAL_SUFFIX = ".journal.json"
EXTENSION = "docket"  # the experiment's `extensions` entry with Docket's own facts
# A range tolerance needs two finite numbers (JSON has no Infinity): the largest float
# stands for "no bound".
NO_BOUND = sys.float_info.max
ROLLBACKS = (
    "Docket rolls nothing back: each run's boundary, stubs and agents are torn down "
    "with the run, and its ledger is kept (see the docket extension) for `docket verify`."
)


def journals(result: GameDayResult) -> dict[str, dict]:
    """Each phase's journal, by phase name, in run order."""
    started = parse_time(result.started_at)
    out = {}
    for phase in result.phases:
        out[phase.name] = phase_journal(phase, started, docket_version=result.docket_version)
        started += timedelta(seconds=phase.duration_s)
    return out


def phase_journal(phase: PhaseResult, started: datetime, *, docket_version: str = "") -> dict:
    """The journal chaoslib would have written had it run the phase as an experiment."""
    experiment = phase_experiment(phase, docket_version)
    runs, at = [], started
    for run, action in zip(phase.runs, _actions_by_run(phase), strict=True):
        runs.append(run_activity(run, action, at, phase.repro))
        at += timedelta(seconds=run.duration_s)
    # the phase's clock includes its runs; a run cut off by the budget may end after it
    end = max(started + timedelta(seconds=phase.duration_s), at)
    probes = [probe_run(phase, c, end) for c in phase.checks]
    before = [p for c, p in zip(phase.checks, probes, strict=True) if _is_precondition(phase, c)]
    return {
        # No chaoslib wrote this: `chaos report` picks its newest template for a
        # version it is not given, and the docket extension says who wrote it.
        "chaoslib-version": None,
        "platform": platform.platform(),
        "node": platform.node(),
        "experiment": experiment,
        "start": iso(started),
        "end": iso(end),
        "duration": (end - started).total_seconds(),
        "status": status_of(phase),
        "deviated": any(c.verdict == FAIL for c in phase.checks),
        "steady_states": {
            "before": {
                "steady_state_met": all(p["tolerance_met"] for p in before),
                "probes": before,
            },
            "after": {
                "steady_state_met": all(p["tolerance_met"] for p in probes),
                "probes": probes,
            },
            "during": [],
        },
        "run": runs,
        "rollbacks": [],
    }


def status_of(phase: PhaseResult) -> str:
    if phase.error is not None:
        return "aborted"
    if any(c.verdict == UNKNOWN for c in phase.checks):
        return "failed"
    return "completed"


def phase_experiment(phase: PhaseResult, docket_version: str = "") -> dict:
    about = phase.about.strip() or phase.title
    return {
        "title": phase.title,
        "description": f"{about}\n\nDocket game-day phase {phase.name} ({phase.source}). {ROLLBACKS}",
        "tags": ["docket", "game-day", phase.name, *phase.fmea],
        "steady-state-hypothesis": {
            "title": f"the checks of phase {phase.name} hold",
            "probes": [probe(phase, c) for c in phase.checks],
        },
        "method": [a for actions in _actions_by_run(phase) for a in actions],
        "rollbacks": [],
        "extensions": [
            {
                "name": EXTENSION,
                "docket_version": docket_version,
                "phase": phase.name,
                "source": phase.source,
                "seed": phase.seed,
                "verdict": phase.verdict,
                "repro": phase.repro,
                "fmea": list(phase.fmea),
                "rollbacks": ROLLBACKS,
                "ledgers": [
                    {
                        "run": r.name,
                        "folder": r.evidence_dir,
                        "verify": f"docket verify {r.evidence_dir}" if r.evidence_dir else "",
                        "error": r.error,
                    }
                    for r in phase.runs
                ],
            }
        ],
    }


def _repro_provider(repro: str) -> dict:
    """What injects the faults and observes the checks again: the phase's own command
    (`docket game-day --phase NAME --seed N`; its words never need quoting)."""
    words = repro.split()
    return {"type": "process", "path": words[0], "arguments": words[1:]}


def _actions_by_run(phase: PhaseResult) -> list[list[dict]]:
    out = []
    for run in phase.runs:
        prefix = f"{run.name}: " if phase.several_runs else ""
        out.append(
            [
                {
                    "type": "action",
                    "name": f"{prefix}{fault}",
                    "provider": _repro_provider(phase.repro),
                    "docket_fault": fault,
                    "docket_run": run.name,
                }
                for fault in run.schedule
            ]
        )
    return out


def run_activity(run: PhaseRun, actions: Sequence[Mapping], start: datetime, repro: str) -> dict:
    """One run of the phase as one activity of the journal's `run`: its faults were
    injected (succeeded) or it could not run (failed, with why as the exception)."""
    end = start + timedelta(seconds=run.duration_s)
    faults = "; ".join(str(a["docket_fault"]) for a in actions) or "no faults"
    activity = {
        "type": "action",
        "name": f"run {run.name}: {faults}",
        "provider": _repro_provider(run.repro or repro),
        "docket_run": run.name,
    }
    out = {
        "activity": activity,
        "output": {
            "exit_status": run.exit_status,
            "reason": run.run_reason,
            "injected": len(run.injected),
            "evidence": run.evidence_dir,
        },
        "start": iso(start),
        "status": "failed" if run.error is not None else "succeeded",
        "end": iso(end),
        "duration": run.duration_s,
    }
    if run.error is not None:
        out["exception"] = [f"docket: {run.error}\n"]
    return out


def probe(phase: PhaseResult, check: CheckResult) -> dict:
    c = check.check
    prefix = f"{check.run}: " if phase.several_runs else ""
    return {
        "type": "probe",
        "name": f"{prefix}{c.name}",
        "tolerance": tolerance(c.op, c.expected),
        "provider": _repro_provider(phase.repro),
        "docket_query": c.query,
        "docket_op": c.op,
        "docket_expected": c.expected,
        "docket_run": check.run,
        "docket_line": check.line,
    }


def probe_run(phase: PhaseResult, check: CheckResult, at: datetime) -> dict:
    """A check's verdict as chaoslib records a hypothesis probe: the observed value as
    its output, tolerance_met, and a check that could not be judged as a failed probe."""
    out = {
        "activity": probe(phase, check),
        "output": check.check.observed,
        "start": iso(at),
        "status": "failed" if check.verdict == UNKNOWN else "succeeded",
        "end": iso(at),
        "duration": 0.0,
        "tolerance_met": check.verdict == PASS,
    }
    if check.verdict == UNKNOWN:
        out["exception"] = [f"docket: {check.check.reason or 'could not be judged'}\n"]
    return out


def _is_precondition(phase: PhaseResult, check: CheckResult) -> bool:
    """Another check of the same run requires this one (`requires:`)."""
    return any(
        check.check.name in other.requires and other.run == check.run for other in phase.checks
    )


# ---------------------------------------------------------------- tolerances


def tolerance(op: str, expected: object) -> object:
    """Chaos Toolkit's tolerance for `query OP EXPECTED`: a plain value, a range or a
    regex where chaoslib's within_tolerance means what the operator does, else a probe
    tolerance that calls `tolerance_met` below with the value."""
    number = isinstance(expected, int | float) and not isinstance(expected, bool)
    if op in ("is_true", "is_false"):
        return op == "is_true"
    if op == "equals" and isinstance(expected, str | int):  # bool is an int
        return expected
    if number and op in _RANGES:
        assert isinstance(expected, int | float)
        low, high = _RANGES[op](float(expected))
        return {"type": "range", "range": [low, high]}
    if op == "matches" and isinstance(expected, str):
        return {"type": "regex", "pattern": expected}
    return {
        "type": "probe",
        "name": f"{op} {expected!r}",
        "provider": {
            "type": "python",
            "module": __name__,
            "func": "tolerance_met",
            "arguments": {"op": op, "expected": expected},
        },
    }


# inclusive bounds; a strict comparison starts at the next float past the value
_RANGES = {
    "equals": lambda e: (e, e),
    "at_least": lambda e: (e, NO_BOUND),
    "at_most": lambda e: (-NO_BOUND, e),
    "greater_than": lambda e: (math.nextafter(e, math.inf), NO_BOUND),
    "less_than": lambda e: (-NO_BOUND, math.nextafter(e, -math.inf)),
}


def tolerance_met(op: str, expected: object, value: object = None) -> bool:
    """Whether `value OP EXPECTED` holds by Docket's operator (JSON's comparisons): what a
    probe tolerance asks when chaoslib calls it with the probe's value. A value the
    operator cannot judge (null, a wrong type) is not within tolerance. `value` has a
    default because chaoslib binds a tolerance's written arguments to its signature when
    it validates an experiment, before a value exists."""
    return evaluate(Assertion("tolerance", "@", op, expected), value).verdict == PASS


def iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat()


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


__all__ = ["JOURNAL_SUFFIX", "journals", "phase_journal", "tolerance", "tolerance_met"]
