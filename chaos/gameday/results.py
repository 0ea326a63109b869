"""What a game day found: per phase its checks and its runs' facts, and the whole day's verdict.

Plain data, JSON both ways, so the report (HTML, JSON, JUnit) is rendered from
the same values whether they were just measured or built by hand in a test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from chaos.gameday.assertions import FAIL, PASS, UNKNOWN, Check, expectation, worst

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNKNOWN = 2
FORMAT = "docket-gameday-2"  # 2: a phase holds its runs (`runs`), each check names its run


@dataclass(frozen=True)
class CheckResult:
    """A check, the line of the phase file its assertion is on, and the run it read."""

    check: Check
    line: int
    run: str = "run"
    requires: tuple[str, ...] = ()  # the checks it is meaningful only after (`requires:`)

    @property
    def verdict(self) -> str:
        return self.check.verdict

    def to_json(self) -> dict:
        out = {**self.check.to_json(), "line": self.line, "run": self.run}
        # what the check expects in words (`is false` for op is_false, expected true)
        out["expects"] = expectation(self.check.op, self.check.expected)
        if self.requires:
            out["requires"] = list(self.requires)
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> CheckResult:
        fields = {k: data[k] for k in ("name", "query", "op", "expected", "observed", "verdict")}
        return cls(
            Check(**fields, reason=data.get("reason", ""), unmet=str(data.get("unmet", ""))),
            int(data.get("line", 0)),
            str(data.get("run", "run")),
            tuple(data.get("requires", ())),
        )


@dataclass(frozen=True)
class TimelineEvent:
    seq: int
    mono_ms: float
    type: str
    label: str = ""  # a few words on what it was (a fault's text, a breaker's new state)

    def to_json(self) -> dict:
        return {"seq": self.seq, "mono_ms": self.mono_ms, "type": self.type, "label": self.label}


@dataclass(frozen=True)
class PhaseRun:
    """One supervised run of a phase: how it ended, its faults, its timeline, its facts."""

    name: str  # "run" for a phase's only run; else the name under `runs:`
    title: str = ""
    repro: str = ""  # `docket game-day --phase NAME:RUN --seed N` (a phase with several runs)
    engine_repro: str = ""  # the engine's own `docket chaos ...` command, when it ran
    duration_s: float = 0.0
    error: str | None = None  # the run could not run (or was cut off): its checks are unknown
    exit_status: int | None = None  # the supervised run's
    run_reason: str = ""
    schedule: tuple[str, ...] = ()  # the resolved faults, canonical texts
    injected: tuple[Mapping, ...] = ()  # fault.injected records
    timeline: tuple[TimelineEvent, ...] = ()
    policy: Mapping = field(default_factory=dict)  # the resolved policy the run ran under
    providers: tuple[Mapping, ...] = ()  # [{"name", "kind", "via_proxy"}]
    agents: tuple[Mapping, ...] = ()  # [{"name", "mode", ...}] as the scenario declares them
    facts: Mapping = field(default_factory=dict)  # derived evidence worth showing (latency, ...)
    # the run's folder, kept (`--keep`, default REPORT/evidence): ledger, receipt, stub
    # logs, metrics, probes, agents' output; "" when the run was in a temporary folder
    evidence_dir: str = ""
    # with the user's own agent (chaos.gameday.your_agent.findings_for_run): its agents,
    # exit codes, stderr tails and findings; {} when the phase's own agents ran
    your_agent: Mapping = field(default_factory=dict)

    @property
    def findings(self) -> list[Mapping]:
        return [f for f in self.your_agent.get("findings", ()) if f.get("verdict") == "finding"]

    def to_json(self) -> dict:
        out = self._to_json()
        if self.your_agent:
            out["your_agent"] = dict(self.your_agent)
        return out

    def _to_json(self) -> dict:
        return {
            "name": self.name,
            "evidence_dir": self.evidence_dir,
            "title": self.title,
            "repro": self.repro,
            "engine_repro": self.engine_repro,
            "duration_s": round(self.duration_s, 3),
            "error": self.error,
            "exit_status": self.exit_status,
            "run_reason": self.run_reason,
            "schedule": list(self.schedule),
            "injected": [dict(i) for i in self.injected],
            "timeline": [t.to_json() for t in self.timeline],
            "policy": dict(self.policy),
            "providers": [dict(p) for p in self.providers],
            "agents": [dict(a) for a in self.agents],
            "facts": dict(self.facts),
        }

    @classmethod
    def from_json(cls, data: Mapping) -> PhaseRun:
        return cls(
            name=data["name"],
            title=data.get("title", ""),
            repro=data.get("repro", ""),
            engine_repro=data.get("engine_repro", ""),
            duration_s=data.get("duration_s", 0.0),
            error=data.get("error"),
            exit_status=data.get("exit_status"),
            run_reason=data.get("run_reason", ""),
            schedule=tuple(data.get("schedule", ())),
            injected=tuple(data.get("injected", ())),
            timeline=tuple(TimelineEvent(**t) for t in data.get("timeline", ())),
            policy=data.get("policy", {}),
            providers=tuple(data.get("providers", ())),
            agents=tuple(data.get("agents", ())),
            facts=data.get("facts", {}),
            evidence_dir=data.get("evidence_dir", ""),
            your_agent=data.get("your_agent", {}),
        )


@dataclass(frozen=True)
class PhaseResult:
    name: str
    title: str
    about: str
    fmea: tuple[str, ...]
    seed: int
    mode: str
    source: str
    repro: str  # `docket game-day --phase NAME --seed N`
    duration_s: float
    budget_s: float
    checks: tuple[CheckResult, ...]
    runs: tuple[PhaseRun, ...]  # one, or the phase's `runs:` in the order they ran
    # with --agent-command / --policy: the reference agent the user's runs beside (or why
    # none),
    # the checks about the reference agent left unjudged, the agent checks, the policy
    your_agent: Mapping = field(default_factory=dict)

    @property
    def several_runs(self) -> bool:
        return len(self.runs) > 1 or any(r.name != "run" for r in self.runs)

    @property
    def error(self) -> str | None:
        """Why some run has no evidence (its checks are then unknown), or None."""
        failed = [r for r in self.runs if r.error is not None]
        if not failed:
            return None
        if not self.several_runs:
            return failed[0].error
        return "; ".join(f"run {r.name}: {r.error}" for r in failed)

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return UNKNOWN
        return worst(c.verdict for c in self.checks)

    def run_verdict(self, run: str) -> str:
        """The verdict of one run's checks (unknown if it has no evidence)."""
        if any(r.name == run and r.error is not None for r in self.runs):
            return UNKNOWN
        return worst(c.verdict for c in self.checks if c.run == run)

    @property
    def anchor(self) -> str:
        return f"phase-{self.name}"

    def check_anchor(self, index: int) -> str:
        return f"phase-{self.name}-check-{index + 1}"

    def run_anchor(self, run: str) -> str:
        return f"phase-{self.name}-run-{run}"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "about": self.about,
            "fmea": list(self.fmea),
            "seed": self.seed,
            "mode": self.mode,
            "source": self.source,
            "repro": self.repro,
            "verdict": self.verdict,
            "duration_s": round(self.duration_s, 3),
            "budget_s": self.budget_s,
            "error": self.error,
            "checks": [c.to_json() for c in self.checks],
            "runs": [r.to_json() for r in self.runs],
        } | ({"your_agent": dict(self.your_agent)} if self.your_agent else {})

    @classmethod
    def from_json(cls, data: Mapping) -> PhaseResult:
        return cls(
            name=data["name"],
            title=data["title"],
            about=data.get("about", ""),
            fmea=tuple(data["fmea"]),
            seed=data["seed"],
            mode=data["mode"],
            source=data["source"],
            repro=data["repro"],
            duration_s=data["duration_s"],
            budget_s=data["budget_s"],
            checks=tuple(CheckResult.from_json(c) for c in data["checks"]),
            runs=tuple(PhaseRun.from_json(r) for r in data.get("runs", ())),
            your_agent=data.get("your_agent", {}),
        )


@dataclass(frozen=True)
class GameDayResult:
    phases: tuple[PhaseResult, ...]
    started_at: str  # RFC 3339, for readers
    duration_s: float
    seed: int | None  # the --seed that overrode every phase's own, if one did
    docket_version: str
    interrupted: bool = False  # Ctrl-C: the phases not run are missing, so the day is unknown
    # --agent-findings with the user's agent: "warn" (findings are reported, the exit
    # is the boundary checks') or "fail" (a finding fails the day); None without one
    agent_findings: str | None = None

    def findings(self) -> int:
        return sum(len(r.findings) for p in self.phases for r in p.runs)

    @property
    def verdict(self) -> str:
        if self.interrupted:
            return UNKNOWN
        return worst(p.verdict for p in self.phases)

    def whose_failures(self) -> dict[str, list[str]]:
        """Whose failure each FAIL is: Docket's (a boundary check, an invariant over every
        call of the run, broke: "PHASE: CHECK") or the agent's (a finding about the
        user's agent, a failure only under --agent-findings fail: "PHASE: CHECK")."""
        docket = [
            f"{p.name}: {(c.run + ': ') if p.several_runs else ''}{c.check.name}"
            for p in self.phases
            for c in p.checks
            if c.check.verdict == FAIL
        ]
        agent = [
            f"{p.name}: {(r.name + ': ') if p.several_runs else ''}{f.get('check')}"
            for p in self.phases
            for r in p.runs
            for f in r.findings
        ]
        return {"docket": docket, "agent": agent if self.agent_findings == "fail" else []}

    def whose(self) -> str:
        """One line for the report's head: whose failure the day's FAIL is, or ""."""
        blame = self.whose_failures()
        parts = []
        if blame["docket"]:
            n = len(blame["docket"])
            parts.append(f"Docket's: {n} boundary check{'' if n == 1 else 's'} broke")
        if blame["agent"]:
            n = len(blame["agent"])
            parts.append(
                f"your agent's: {n} finding{'' if n == 1 else 's'} (--agent-findings fail)"
            )
        if not parts:
            return ""
        if not blame["docket"]:
            parts.append("Docket's boundary checks held")
        return "; ".join(parts)

    @property
    def exit_code(self) -> int:
        if self.agent_findings == "fail" and self.findings():
            return EXIT_FAIL  # a finding is a regression found, as a failed check is
        return {PASS: EXIT_PASS, UNKNOWN: EXIT_UNKNOWN}.get(self.verdict, EXIT_FAIL)

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "unknown": 0}
        for p in self.phases:
            out[p.verdict] += 1
        return out

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "docket_version": self.docket_version,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "seed": self.seed,
            "interrupted": self.interrupted,
            "verdict": self.verdict,
            "counts": self.counts(),
            "phases": [p.to_json() for p in self.phases],
        } | (
            {
                "agent_findings": self.agent_findings,
                "findings": self.findings(),
                "whose_failures": self.whose_failures(),
            }
            if self.agent_findings is not None
            else {}
        )

    @classmethod
    def from_json(cls, data: Mapping) -> GameDayResult:
        return cls(
            phases=tuple(PhaseResult.from_json(p) for p in data["phases"]),
            started_at=data["started_at"],
            duration_s=data["duration_s"],
            seed=data.get("seed"),
            docket_version=data["docket_version"],
            interrupted=data.get("interrupted", False),
            agent_findings=data.get("agent_findings"),
        )


def phases_for_fmea(phases: Sequence[PhaseResult]) -> dict[str, list[PhaseResult]]:
    """FMEA row id -> the phases that name it, in run order."""
    out: dict[str, list[PhaseResult]] = {}
    for phase in phases:
        for row in phase.fmea:
            out.setdefault(row, []).append(phase)
    return out
