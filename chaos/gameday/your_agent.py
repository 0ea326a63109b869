"""Game days with the team's own agent and policy (`docket game-day --agent-command CMD`).

Every phase takes the user's agent, BESIDE Docket's reference agents, never in their
place: the reference agents (`docket agent`) still drive each mechanism the phase
must show working (the breaker opens, the cap is reached, the stream is cut,
whatever the user's agent does), and the user's agent lives through the same
faults on the same boundary and is judged on its own. It gets two routes of its
own, an OpenAI-shaped one (`your-openai`) and an Anthropic-shaped one
(`your-anthropic`), each to a stub of its own behind the same fault proxy, so the
ledger's `provider` tells its calls from the reference agents' exactly, the
reference agents' exact counts still hold on theirs, and an agent on either SDK is
driven and judged alike. A phase file names the reference agent whose workload the
user's agent is given as a hint (DOCKET_AGENT_CALLS, ...) and the agent checks:

    your_agent:
      workload: polite            # the DOCKET_AGENT_* hints come from this agent
      checks: [honours_retry_after, backs_off_with_jitter, {max_attempts: 3}]

An `expect:` item marked `about: agent` is a claim that holds only while the
reference agents have the boundary to themselves (an exact count under a cap, a
rate limit or ledger seqs that every route shares, the run's exit status that the
user's agent's own exit moves): beside the user's agent it is not judged (the
report lists it as skipped); every other check is a boundary invariant, judged
over all the calls of the run, the user's included. The agent checks are
chaos.gameday.agent_checks; whatever the phase declares, the user's agent also gets
a finding when it gives up or crashes (its exit status, the call it stopped at,
its last stderr line).

The user's command runs under `python -m chaos.gameday.agent_env`, which drops
any URL in its environment that does not point at the boundary, so an agent
configured for a real provider cannot reach it: the boundary's egress allows
only the phase's stubs (a team policy's providers and `[egress] allow` are not
carried over), and HTTP(S)_PROXY sends anything else through that rule.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos.gameday.agent_checks import (
    ALWAYS,
    CHECKS,
    NEEDS_NUMBER,
    Facts,
    Finding,
    attempts_of,
    retry_budget,
    run_check,
)
from chaos.yamldoc import Where
from docket.errors import InputError

KEY = "your_agent"
ABOUT = ("boundary", "agent")  # an `expect:` item's `about:` (default boundary)
FINDINGS_MODES = ("warn", "fail")
STDERR_TAIL_LINES = 5
MAX_ATTEMPTS_LIMIT = 1000


@dataclass(frozen=True)
class CheckDecl:
    name: str
    number: int | None = None  # max_attempts: N

    @property
    def shown(self) -> str:
        return self.name if self.number is None else f"{self.name}: {self.number}"


@dataclass(frozen=True)
class Declaration:
    """A phase's `your_agent:`: the reference agent whose workload the user's agent gets
    as its hint, and the agent checks; or, with no workload, why a user agent has no
    place in this phase (a phase file outside gamedays/ may still say so)."""

    workload: str = ""
    checks: tuple[CheckDecl, ...] = ()
    why_not: str = ""

    @property
    def takes_agent(self) -> bool:
        return bool(self.workload)


NOT_DECLARED = Declaration(why_not="the phase file does not say where a user agent may run")
USER_ROOM_S = 30.0  # per run, over max_wall_clock: the stop's grace, set-up and the aftermath
# (on a runner at load 13, 16 s beyond a run stopped at its wall clock were measured)
YOURS = "yours"  # the user's agent's name in the run (agents/yours.out, .err, .exit)
# The user's agent's own routes: one of each shape, so either SDK is driven alike.
YOUR_PROVIDERS = (("your-openai", "openai"), ("your-anthropic", "anthropic"))


# ---------------------------------------------------------------- the phase file's key


def declaration_from_data(value: object, where: Where, runs: Sequence) -> Declaration:
    """Check a phase's `your_agent:` against its runs (chaos.gameday.phase.RunSpec)."""
    at = (KEY,)
    if not isinstance(value, dict):
        raise where.error(at, "your_agent must be a mapping: {workload, checks} or {none: why}")
    if "none" in value:
        if set(value) != {"none"}:
            raise where.error(at, "your_agent: `none: why` stands alone")
        why = value["none"]
        if not isinstance(why, str) or not why.strip():
            raise where.error((*at, "none"), "say why a user agent has no place in this phase")
        return Declaration(why_not=why.strip())
    for key in value:
        if key not in ("workload", "checks"):
            raise where.error((*at, key), f"unknown key {key!r} (workload, checks, or none)")
    workload = value.get("workload")
    if not isinstance(workload, str) or not workload:
        raise where.error(
            (*at, "workload"),
            "workload names the reference agent whose DOCKET_AGENT_* hints your agent gets",
        )
    for spec in runs:
        if not any(a.name == workload and a.mode is not None for a in spec.scenario.agents):
            raise where.error(
                (*at, "workload"),
                f"no reference agent named {workload!r} in run {spec.name!r} of this phase",
            )
        taken = {p.name for p in spec.scenario.providers} | {a.name for a in spec.scenario.agents}
        for name in (YOURS, *(n for n, _ in YOUR_PROVIDERS)):
            if name in taken:
                raise where.error(
                    (*at, "workload"), f"{name!r} is the user's agent's own name: rename yours"
                )
    checks = _checks(value.get("checks", []), where, (*at, "checks"))
    return Declaration(workload=workload, checks=checks)


def _checks(value: object, where: Where, at: tuple) -> tuple[CheckDecl, ...]:
    if not isinstance(value, list):
        raise where.error(at, "checks is a list of agent checks")
    out: list[CheckDecl] = []
    for i, item in enumerate(value):
        number = None
        if isinstance(item, dict) and len(item) == 1:
            ((name, number),) = item.items()
        else:
            name = item
        if not isinstance(name, str) or name not in CHECKS:
            raise where.error(
                (*at, i), f"{name!r} is not an agent check (one of {', '.join(CHECKS)})"
            )
        if name in NEEDS_NUMBER:
            if (
                isinstance(number, bool)
                or not isinstance(number, int)
                or not 1 <= number <= MAX_ATTEMPTS_LIMIT
            ):
                raise where.error((*at, i), f"write `{name}: N`, N a whole number from 1")
        elif number is not None:
            raise where.error((*at, i), f"{name} takes no value")
        if any(c.name == name for c in out):
            raise where.error((*at, i), f"agent check {name} listed twice")
        out.append(CheckDecl(name, number))
    return tuple(out)


def about_from_data(item: dict, where: Where, at: tuple) -> str:
    value = item.get("about", "boundary")
    if value not in ABOUT:
        raise where.error((*at, "about"), f"about is one of {', '.join(ABOUT)}, not {value!r}")
    return str(value)


# ---------------------------------------------------------------- the command line


@dataclass(frozen=True)
class UserAgent:
    """What --agent-command, --policy and --agent-findings asked for."""

    command: tuple[str, ...] = ()  # empty: the phases' own agents
    policy: Mapping = dataclasses.field(default_factory=dict)  # the team's docket.toml, as data
    policy_source: str = ""
    findings: str = "warn"

    @property
    def shown(self) -> str:
        import shlex

        return shlex.join(self.command)


def user_agent_from_args(args) -> UserAgent | None:
    """The user agent and policy from the parsed flags; InputError (exit 2) for bad input."""
    import shlex

    from docket.run.child import command_missing

    findings = getattr(args, "agent_findings", None) or "warn"
    if findings not in FINDINGS_MODES:
        raise InputError(f"--agent-findings {findings!r}: one of {', '.join(FINDINGS_MODES)}")
    text = getattr(args, "agent_command", None)
    rest = list(getattr(args, "command", None) or [])
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if text is not None and rest:
        raise InputError('give the agent as --agent-command "CMD" or after --, not both')
    command: list[str] = rest
    if text is not None:
        try:
            command = shlex.split(text)
        except ValueError as exc:
            raise InputError(f"--agent-command: cannot split {text!r}: {exc}") from None
        if not command:
            raise InputError("--agent-command is empty: give the command that starts your agent")
    if any("\x00" in part for part in command):
        raise InputError("--agent-command must not hold a NUL byte")
    if command:
        import os

        if command_missing(command[0], os.environ.get("PATH", "")):
            raise InputError(f"--agent-command: {command[0]}: command not found")
    policy_path = getattr(args, "policy", None)
    policy: dict = {}
    if policy_path is not None:
        policy = team_policy(policy_path)
    if not command and not policy:
        return None  # the phases' own agents and policy: a game day as it always was
    return UserAgent(tuple(command), policy, str(policy_path or ""), findings)


def team_policy(path: str) -> dict:
    """The team's docket.toml as data, checked by docket.policy (one line on error)."""
    import tomllib

    from docket.policy import load_policy

    load_policy(path)  # every key and value checked: a PolicyError names the problem
    with open(path, "rb") as f:
        return tomllib.load(f)


CARRIED_NOT = ("providers",)  # the harness fills these with the phase's stubs


def merged_policy(team: Mapping, phase: Mapping) -> dict:
    """The team's policy as the base, the phase's own settings on top (table by table).
    Its providers and `[egress] allow` are dropped: the stubs are the only upstreams."""
    out = copy.deepcopy({k: v for k, v in team.items() if k not in CARRIED_NOT})
    egress = out.get("egress")
    if isinstance(egress, dict):
        egress.pop("allow", None)
        if not egress:
            out.pop("egress")
    for key, value in phase.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **copy.deepcopy(dict(value))}
        else:
            out[key] = copy.deepcopy(value)
    return out


# ---------------------------------------------------------------- a phase with the user's agent


def wrapped(command: Sequence[str]) -> tuple[str, ...]:
    """The user's command under the environment guard (chaos.gameday.agent_env)."""
    return (sys.executable, "-m", "chaos.gameday.agent_env", "--", *command)


def for_user(phase, user: UserAgent):
    """The phase as it runs with the user's policy and agent (chaos.gameday.phase.Phase):
    the user's agent is added beside the reference agents, on routes of its own."""
    from docket.policy import policy_from_dict

    decl: Declaration = getattr(phase, "your_agent", None) or NOT_DECLARED
    beside = bool(user.command) and decl.takes_agent
    runs = []
    for spec in phase.runs:
        scenario = spec.scenario
        data = dict(spec.data)
        if user.policy:
            policy = merged_policy(user.policy, scenario.policy)
            try:
                policy_from_dict(copy.deepcopy(policy), source="merged")
            except InputError as exc:
                raise InputError(
                    f"--policy {user.policy_source} under phase {phase.name}: {exc}"
                ) from None
            scenario = dataclasses.replace(scenario, policy=policy)
            data["policy"] = policy
        if beside:
            scenario = with_your_agent(scenario, decl.workload, wrapped(user.command))
            data["providers"] = [_provider_data(p) for p in scenario.providers]
            data["agents"] = [_agent_data(a) for a in scenario.agents]
        runs.append(dataclasses.replace(spec, scenario=scenario, data=data))
    expect = phase.expect
    skipped: tuple[str, ...] = ()
    if beside:
        skipped = tuple(e.assertion.name for e in expect if getattr(e, "about", "") == "agent")
        expect = tuple(e for e in expect if getattr(e, "about", "") != "agent")
    budget = phase.budget_s
    if beside:
        # A user's agent may run until each run's max_wall_clock stops it (SIGTERM, the
        # grace period, SIGKILL), where the reference agents finish early: a phase whose
        # budget is its runs' max_wall_clock would be cut off first, its checks unknown.
        walls = sum(getattr(r.scenario, "max_wall_clock", 0) or 0 for r in runs)
        budget = max(budget, walls + USER_ROOM_S * len(runs))
    view = {
        "beside": [decl.workload] if beside else [],
        "providers": [name for name, _ in YOUR_PROVIDERS] if beside else [],
        "why_not": "" if beside or not user.command else decl.why_not,
        "skipped_checks": list(skipped),
        "checks": [c.shown for c in decl.checks] if beside else [],
        "policy": user.policy_source,
        "command": user.shown,
    }
    return dataclasses.replace(
        phase, runs=tuple(runs), expect=expect, user_view=view, budget_s=budget
    )


def with_your_agent(scenario, workload: str, command: Sequence[str]):
    """The scenario with the user's agent added last (the launcher's exit status is the
    first non-zero one in plan order: the reference agents' come first) and its two
    routes added last too: docket.run.child.child_env points OPENAI_BASE_URL and
    ANTHROPIC_BASE_URL at the last provider of each kind, so both of the agent's SDK
    variables name its own routes, while each reference agent is given its route's
    URL by the launcher. The routes' stubs have the workload agent's stub's delays and
    meet the same faults (each stub counts its own calls)."""
    from chaos.scenario import AgentSpec, ProviderSpec

    model = next(a for a in scenario.agents if a.name == workload)
    like = scenario.provider(model.provider)
    providers = tuple(scenario.providers) + tuple(
        ProviderSpec(
            name=name,
            kind=kind,
            latency=like.latency,
            token_delay=like.token_delay,
            via_proxy=like.via_proxy,
            faults=like.faults,
        )
        for name, kind in YOUR_PROVIDERS
    )
    yours = AgentSpec(
        name=YOURS,
        mode=None,
        command=tuple(command),
        provider=YOUR_PROVIDERS[0][0],
        calls=model.calls,
        concurrency=model.concurrency,
        timeout=model.timeout,
        max_tokens=model.max_tokens,
    )
    return dataclasses.replace(scenario, providers=providers, agents=(*scenario.agents, yours))


def _provider_data(provider) -> dict:
    """A ProviderSpec as a scenario block writes it (a subprocess phase hands it on)."""
    out: dict = {"name": provider.name, "kind": provider.kind}
    if provider.latency:
        out["latency"] = f"{provider.latency * 1000:g}ms"
    if provider.token_delay:
        out["token_delay"] = f"{provider.token_delay * 1000:g}ms"
    if not provider.via_proxy:
        out["via_proxy"] = False
    if not provider.faults:
        out["faults"] = False
    return out


def _agent_data(agent) -> dict:
    """An AgentSpec as a scenario block writes it (a subprocess phase hands it on)."""
    out: dict = {"name": agent.name}
    if agent.command:
        out["command"] = list(agent.command)
    elif agent.mode is not None:
        out["mode"] = agent.mode
    for key in ("provider", "calls", "concurrency", "timeout", "max_tokens"):
        value = getattr(agent, key)
        if value is not None:
            out[key] = f"{value:g}s" if key == "timeout" else value
    if agent.env:
        out["env"] = dict(agent.env)
    return out


# ---------------------------------------------------------------- after a run


def agent_exits(agents_dir: Path) -> dict[str, int]:
    """Each agent's own exit status (agents/NAME.exit, written by the launcher)."""
    out: dict[str, int] = {}
    for path in sorted(agents_dir.glob("*.exit")):
        try:
            out[path.stem] = int(path.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            continue  # not written whole (the launcher was killed): unknown, not a status
    return out


def stderr_tail(path: Path, lines: int = STDERR_TAIL_LINES) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line[:300] for line in text.splitlines()[-lines:]]


def findings_for_run(phase, spec, evidence: Mapping, run_dir: Path, grace_s: float) -> dict:
    """The user agent's part of one run: its checks' findings (the declared ones, and
    runs_to_the_end for every run), its exit code, its stderr tail and what it did: how
    many calls it made on its routes, which of the run's mechanisms met its calls, and
    whether its retries stayed within the reference agent's retry budget."""
    decl: Declaration = getattr(phase, "your_agent", None) or NOT_DECLARED
    if not any(a.name == YOURS for a in spec.scenario.agents):
        return {}
    exits = agent_exits(run_dir / "agents")
    providers = tuple(name for name, _ in YOUR_PROVIDERS)
    tail = stderr_tail(run_dir / "agents" / f"{YOURS}.err")
    facts = Facts(
        providers=providers,
        exit_status=exits.get(YOURS),
        grace_s=grace_s,
        last_stderr=last_said(tail),
    )
    events = list(evidence.get("events") or [])
    declared = [c for c in decl.checks if c.name not in ALWAYS]
    findings: list[Finding] = [run_check(c.name, events, facts, c.number) for c in declared]
    findings += [run_check(name, events, facts, None) for name in ALWAYS]
    calls = attempts_of(events, providers)
    return {
        "calls": len(calls),
        "calls_by_route": {p: sum(1 for a in calls if a.provider == p) for p in providers},
        "agents": [YOURS],
        "beside": decl.workload,
        "providers": list(providers),
        "exit": {YOURS: exits.get(YOURS)},
        "stderr_tail": {YOURS: tail},
        "met": mechanisms_met(events, providers, facts, len(calls)),
        "retry_budget": retry_budget(events, providers),
        "findings": [f.to_json() for f in findings],
    }


def last_said(lines: Sequence[str]) -> str:
    """The agent's last stderr line worth quoting: not the environment guard's own note."""
    for line in reversed(lines):
        if line.strip() and not line.startswith("docket game-day: not passed"):
            return line.strip()
    return ""


def mechanisms_met(events: Sequence[Mapping], providers: Sequence[str], facts, calls: int) -> dict:
    """Which of the boundary's mechanisms met the user's agent's own calls, each a count
    from the ledger, or "not exercised" with the reason from the record (the reference
    agents drive every mechanism the phase must show working; this says what the
    user's agent itself went through)."""
    mine = set(providers)
    counted = {
        "upstream failures": sum(
            1 for e in events if e.get("type") == "model.error" and e.get("provider") in mine
        ),
        "breaker openings": sum(
            1
            for e in events
            if e.get("type") == "breaker.state" and e.get("upstream") in mine and e.get("to") == "open"
        ),
        "refusals": sum(
            1
            for e in events
            if e.get("type") in ("policy.denied", "x-docket.rate-limited", "x-docket.breaker-open",
                                 "load.shed")
            and (e.get("provider") or e.get("upstream")) in mine
        ),
    }  # fmt: skip
    reason = _why_little(events, providers, facts, calls)
    return {k: (v if v else f"not exercised: {reason}") for k, v in counted.items()}


def _why_little(events: Sequence[Mapping], providers: Sequence[str], facts, calls: int) -> str:
    last = next(
        (e for e in reversed(events) if e.get("type") == "model.request"
         and e.get("provider") in providers),
        None,
    )  # fmt: skip
    status = facts.exit_status
    exited = "its exit status is unknown" if status is None else f"your agent exited {status}"
    if calls == 0:
        return f"{exited} without a call" + (
            f" ({facts.last_stderr[:120]})" if facts.last_stderr else ""
        )
    at = f" at seq {last.get('seq')}" if last is not None else ""
    return f"{exited} after {calls} call{'' if calls == 1 else 's'}, the last{at}"


__all__ = [
    "ABOUT",
    "FINDINGS_MODES",
    "KEY",
    "CheckDecl",
    "Declaration",
    "USER_ROOM_S",
    "YOURS",
    "YOUR_PROVIDERS",
    "UserAgent",
    "about_from_data",
    "declaration_from_data",
    "findings_for_run",
    "for_user",
    "mechanisms_met",
    "merged_policy",
    "user_agent_from_args",
    "with_your_agent",
]
