"""The resilience review: for each upstream, the defences the policy gave it and what the faults showed.

Pure, from the phase results: the settings are read from each phase's resolved
policy (connect and request timeouts, breaker, bulkhead, rate limit), the
stance on retries, fallback and idempotency is the boundary's by design
(docs/resilience.md: it never retries, falls back or deduplicates, because each
would make the record describe a run that did not happen; the agent's backoff is
the agent's), and the observations come from the phase's facts and verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chaos.gameday.assertions import UNKNOWN
from chaos.gameday.fmea import FmeaRow
from chaos.gameday.numbers import latency_text, plain
from chaos.gameday.results import PhaseResult, PhaseRun
from docket.policy import Policy

RETRIES = "none at the boundary: a retry is the agent's decision, and is recorded as a new call"
FALLBACK = (
    "none: the boundary never answers in a provider's place; a refusal says which guard refused"
)
IDEMPOTENCY = (
    "not deduplicated: each call is forwarded once and recorded once; "
    "the stub's log is checked against the ledger for amplification"
)


@dataclass(frozen=True)
class Setting:
    phase: str  # the phase's name, with the run's (`phase / run`) when it has several
    anchor: str
    connect_timeout: str
    request_timeout: str
    breaker: str
    bulkhead: str
    rate_limit: str
    agent_retries: str


@dataclass(frozen=True)
class Observation:
    phase: str
    anchor: str
    verdict: str
    faults: tuple[str, ...]
    outcomes: str  # model.error reasons and refusals, as counted in the ledger
    breaker: str  # the breaker's sequence of states
    latency: str


@dataclass(frozen=True)
class UpstreamReview:
    upstream: str
    kind: str
    settings: tuple[Setting, ...]
    observations: tuple[Observation, ...]
    retries: str = RETRIES
    fallback: str = FALLBACK
    idempotency: str = IDEMPOTENCY

    @property
    def anchor(self) -> str:
        return f"upstream-{self.upstream}"


def _request_timeout(boundary: dict) -> str:
    """Both bounds on one upstream call: between bytes, and in total (when the run's
    policy states it; a run recorded before the total existed has only the first)."""
    shown = f"{_seconds(boundary.get('upstream_timeout'))} between bytes"
    total = boundary.get("upstream_total_timeout")
    return shown if total is None else f"{shown}, {_seconds(total)} in total"


def _seconds(value: object) -> str:
    return (
        "none"
        if value is None
        else f"{plain(value)} s"
        if isinstance(value, int | float)
        else str(value)
    )


def _label(phase: PhaseResult, run: PhaseRun) -> tuple[str, str]:
    """How a row names the run, and where it links: the phase, or the run of several."""
    if phase.several_runs:
        return f"{phase.name} / {run.name}", phase.run_anchor(run.name)
    return phase.name, phase.anchor


def _setting(phase: PhaseResult, run: PhaseRun, upstream: str) -> Setting:
    policy = run.policy
    boundary = policy.get("boundary", {})
    r = policy.get("resilience", {})
    slow = r.get("breaker_slow_call_ms")
    breaker = (
        f"opens after {r.get('breaker_threshold')} consecutive failures or "
        f"{r.get('breaker_failure_rate')} of ≥{r.get('breaker_min_calls')} calls"
        + (
            f" or {r.get('breaker_slow_call_rate')} of them slower than {slow} ms"
            if slow is not None
            else ""
        )
        + f"; cooldown {_seconds(r.get('breaker_cooldown_seconds'))} doubling to "
        f"{_seconds(r.get('breaker_max_cooldown_seconds'))}"
        if r
        else "unknown"
    )
    if r.get("max_concurrent_upstream") is None:
        bulkhead = "none (waits bounded by the connect timeout)"
    else:
        bulkhead = f"{r['max_concurrent_upstream']} in flight, queue {r.get('max_queue')}"
    limits = [
        f"{plain(r['max_calls_per_second'])}/s"
        if r.get("max_calls_per_second") is not None
        else "",
        f"{r['max_calls_per_minute']}/min" if r.get("max_calls_per_minute") is not None else "",
    ]
    rate = ", ".join(x for x in limits if x) or "none"
    first = str(run.providers[0].get("name")) if run.providers else "openai"
    agents = [a for a in run.agents if (a.get("provider") or first) == upstream]  # None: the first
    retrying = [a for a in agents if a.get("mode") == "backoff"]
    agent_retries = (
        "backoff agent(s): " + ", ".join(str(a.get("name")) for a in retrying)
        if retrying
        else "none (agents do not retry)"
    )
    label, anchor = _label(phase, run)
    return Setting(
        phase=label,
        anchor=anchor,
        connect_timeout=_seconds(boundary.get("connect_timeout")),
        request_timeout=_request_timeout(boundary),
        breaker=breaker,
        bulkhead=bulkhead,
        rate_limit=rate,
        agent_retries=agent_retries,
    )


def _observation(phase: PhaseResult, run: PhaseRun, upstream: str) -> Observation:
    facts = run.facts
    errors = facts.get("errors_by_reason", {}).get(upstream, {})
    refusals = facts.get("refusals_by_type", {})
    parts = [f"{n} {reason}" for reason, n in sorted(errors.items())]
    parts += [f"{n} refused ({kind})" for kind, n in sorted(refusals.items())]
    faults = tuple(
        f
        for f in run.schedule
        if f.startswith(("upstream:", "net:", "ledger:", "process:", "clock:"))
    )
    label, anchor = _label(phase, run)
    return Observation(
        phase=label,
        anchor=anchor,
        verdict=phase.run_verdict(run.name),
        faults=faults,
        outcomes=", ".join(parts) or "no errors or refusals",
        breaker=facts.get("breaker_sequence", {}).get(upstream, "closed throughout"),
        latency=latency_text(facts.get("latency", {}).get("by_provider", {}).get(upstream)),
    )


def review(phases: Sequence[PhaseResult]) -> tuple[UpstreamReview, ...]:
    """One review per upstream some run used, in the order they first appear; a row per run."""
    order: list[str] = []
    kinds: dict[str, str] = {}
    users: dict[str, list[tuple[PhaseResult, PhaseRun]]] = {}
    for phase in phases:
        for run in phase.runs:
            for provider in run.providers or ({"name": "openai", "kind": "openai"},):
                name = str(provider.get("name"))
                if name not in users:
                    order.append(name)
                    users[name] = []
                    kinds[name] = str(provider.get("kind", name))
                users[name].append((phase, run))
    return tuple(
        UpstreamReview(
            upstream=name,
            kind=kinds[name],
            settings=tuple(_setting(p, r, name) for p, r in users[name]),
            observations=tuple(_observation(p, r, name) for p, r in users[name]),
        )
        for name in order
    )


def facts_for_review(evidence: Mapping) -> dict:
    """The few facts the review and the report show, taken from a phase's evidence."""
    errors: dict[str, dict[str, int]] = {}
    refusals: dict[str, int] = {}
    for e in evidence.get("events") or []:
        kind = e.get("type")
        if kind == "model.error":
            by = errors.setdefault(str(e.get("provider")), {})
            by[str(e.get("reason"))] = by.get(str(e.get("reason")), 0) + 1
        elif kind in (
            "policy.denied",
            "x-docket.breaker-open",
            "x-docket.rate-limited",
            "load.shed",
        ):
            refusals[kind] = refusals.get(kind, 0) + 1
    return {
        "errors_by_reason": errors,
        "refusals_by_type": refusals,
        "latency": evidence.get("latency", {}),
        "breaker_sequence": (evidence.get("breaker") or {}).get("sequence", {}),
        "counts": evidence.get("counts", {}),
        "stub_calls": evidence.get("stub_calls", {}),
    }


# ---------------------------------------------------------------- changes made, open risks


@dataclass(frozen=True)
class Change:
    """A policy key a run set away from Docket's default (the review template's
    "Changes made"): what the phase changed to cause or to withstand its faults."""

    phase: str
    anchor: str
    key: str  # section.key
    value: str
    default: str


@dataclass(frozen=True)
class Risk:
    """Something this game day did not establish (the review template's "Open risks")."""

    kind: str  # "unjudged check", "no phase", "not run today"
    what: str
    anchor: str  # where the report shows it ("" when nowhere)


# The providers' table is the stubs the harness stands up, not a change a team makes.
_NOT_POLICY = frozenset({"providers"})


def changes_made(phases: Sequence[PhaseResult]) -> tuple[Change, ...]:
    """Each key of each run's resolved policy that differs from Docket's default."""
    defaults = Policy().to_dict()
    out: list[Change] = []
    for phase in phases:
        for run in phase.runs:
            label, anchor = _label(phase, run)
            for section, table in sorted(run.policy.items()):
                if section in _NOT_POLICY or not isinstance(table, Mapping):
                    continue
                base = defaults.get(section, {})
                for key, value in sorted(table.items()):
                    default = base.get(key) if isinstance(base, Mapping) else None
                    if value != default:
                        out.append(
                            Change(
                                label, anchor, f"{section}.{key}", _shown(value), _shown(default)
                            )
                        )
    return tuple(out)


def open_risks(phases: Sequence[PhaseResult], fmea: Sequence[FmeaRow]) -> tuple[Risk, ...]:
    """Checks that could not be judged, FMEA rows no phase exercises, and rows whose
    phases did not run in this game day (a `--phase` selection)."""
    risks: list[Risk] = []
    for phase in phases:
        for result in phase.checks:
            if result.verdict == UNKNOWN:
                why = f": {result.check.reason}" if result.check.reason else ""
                risks.append(
                    Risk("unjudged check", f"{phase.name}: {result.check.name}{why}", phase.anchor)
                )
    ran = {phase.name for phase in phases}
    for row in fmea:
        if not row.phases:
            risks.append(Risk("no phase", f"{row.id} {row.mode}", fmea_anchor(row.id)))
        elif not ran.intersection(row.phases):
            named = ", ".join(row.phases)
            risks.append(
                Risk("not run today", f"{row.id} {row.mode} ({named})", fmea_anchor(row.id))
            )
    return tuple(risks)


def fmea_anchor(row_id: str) -> str:
    return f"fmea-{row_id.lower()}"


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return plain(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return str(value)
