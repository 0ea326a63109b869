"""Game days with the team's own agent and policy (`docket game-day --agent-command CMD`).

A phase file says whether a user agent may take a place in it, and which checks
then become findings about that agent:

    your_agent:
      replaces: [polite]          # agents of the phase's runs the user's command replaces
      checks: [honours_retry_after, backs_off_with_jitter, {max_attempts: 3}]

or, where the phase's claims need Docket's reference agents (exact call counts,
a crash between two writes), says why not, and runs as it always does:

    your_agent:
      none: the assertions count the reference agent's exact calls

An `expect:` item marked `about: agent` is a claim about the reference agent's
behaviour (its report, its waits): with a user agent in its place it is not
judged (the report lists it as skipped); every other check is a boundary check
and keeps its verdict. The agent checks are chaos.gameday.agent_checks.

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
    CHECKS,
    NEEDS_NUMBER,
    Facts,
    Finding,
    attempts_of,
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
    """A phase's `your_agent:`: the agents a user agent may replace, and its checks;
    or, with no agents, why a user agent has no place in this phase."""

    replaces: tuple[str, ...] = ()
    checks: tuple[CheckDecl, ...] = ()
    why_not: str = ""

    @property
    def replaceable(self) -> bool:
        return bool(self.replaces)


NOT_DECLARED = Declaration(why_not="the phase file does not say where a user agent may run")


# ---------------------------------------------------------------- the phase file's key


def declaration_from_data(value: object, where: Where, runs: Sequence) -> Declaration:
    """Check a phase's `your_agent:` against its runs (chaos.gameday.phase.RunSpec)."""
    at = (KEY,)
    if not isinstance(value, dict):
        raise where.error(at, "your_agent must be a mapping: {replaces, checks} or {none: why}")
    if "none" in value:
        if set(value) != {"none"}:
            raise where.error(at, "your_agent: `none: why` stands alone")
        why = value["none"]
        if not isinstance(why, str) or not why.strip():
            raise where.error((*at, "none"), "say why a user agent has no place in this phase")
        return Declaration(why_not=why.strip())
    for key in value:
        if key not in ("replaces", "checks"):
            raise where.error((*at, key), f"unknown key {key!r} (replaces, checks, or none)")
    replaces = value.get("replaces")
    if isinstance(replaces, str):
        replaces = [replaces]
    if (
        not isinstance(replaces, list)
        or not replaces
        or not all(isinstance(n, str) for n in replaces)
    ):
        raise where.error((*at, "replaces"), "replaces names the phase's agents, e.g. [looper]")
    if len(set(replaces)) != len(replaces):
        raise where.error((*at, "replaces"), "replaces names an agent twice")
    for name in replaces:
        if not any(a.name == name for r in runs for a in r.scenario.agents):
            raise where.error((*at, "replaces"), f"no agent named {name!r} in this phase's runs")
    for spec in runs:
        _check_routes(spec, replaces, where, at)
    checks = _checks(value.get("checks", []), where, (*at, "checks"))
    return Declaration(replaces=tuple(replaces), checks=checks)


def _check_routes(spec, replaces: Sequence[str], where: Where, at: tuple) -> None:
    """A replaced agent's provider route is no other calling agent's: the ledger's
    `provider` then tells the user agent's calls apart, exactly."""
    scenario = spec.scenario
    mine = {scenario.provider(a.provider).name for a in scenario.agents if a.name in replaces}
    for agent in scenario.agents:
        if agent.name in replaces or agent.mode is None:
            continue  # a command agent of the phase (a sleeper) makes no calls
        if scenario.provider(agent.provider).name in mine:
            raise where.error(
                (*at, "replaces"),
                f"agent {agent.name!r} calls through the same provider route as a replaced "
                "agent: the user agent's calls could not be told apart (replace it too)",
            )


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
    """The phase as it runs with the user's policy and agent (chaos.gameday.phase.Phase)."""
    from chaos.scenario import AgentSpec
    from docket.policy import policy_from_dict

    decl: Declaration = getattr(phase, "your_agent", None) or NOT_DECLARED
    replace = bool(user.command) and decl.replaceable
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
        if replace:
            agents = tuple(
                AgentSpec(
                    name=a.name,
                    mode=None,
                    command=wrapped(user.command),
                    provider=a.provider,
                    calls=a.calls,
                    concurrency=a.concurrency,
                    timeout=a.timeout,
                    max_tokens=a.max_tokens,
                )
                if a.name in decl.replaces
                else a
                for a in scenario.agents
            )
            scenario = dataclasses.replace(scenario, agents=agents)
            data["agents"] = [_agent_data(a) for a in agents]
        runs.append(dataclasses.replace(spec, scenario=scenario, data=data))
    expect = phase.expect
    skipped: tuple[str, ...] = ()
    if replace:
        skipped = tuple(e.assertion.name for e in expect if getattr(e, "about", "") == "agent")
        expect = tuple(e for e in expect if getattr(e, "about", "") != "agent")
    view = {
        "replaced": list(decl.replaces) if replace else [],
        "why_not": "" if replace or not user.command else decl.why_not,
        "skipped_checks": list(skipped),
        "checks": [c.shown for c in decl.checks] if replace else [],
        "policy": user.policy_source,
        "command": user.shown,
    }
    return dataclasses.replace(phase, runs=tuple(runs), expect=expect, user_view=view)


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


def no_call_reason(view: Mapping) -> str | None:
    """Why the run says nothing about the boundary: the user's agent made no call at all
    (it crashed at start, or could not reach the boundary). Its checks are then unknown,
    not failed: nothing was asked of the boundary, so it cannot have regressed."""
    if not view or view.get("calls"):
        return None
    exits = ", ".join(f"{n} exit {s}" for n, s in view.get("exit", {}).items())
    said = next((lines[-1] for lines in view.get("stderr_tail", {}).values() if lines), "")
    return f"your agent made no call ({exits}{': ' + said[:200] if said else ''})"


def findings_for_run(phase, spec, evidence: Mapping, run_dir: Path, grace_s: float) -> dict:
    """The user agent's part of one run: its checks' findings, exit codes, stderr tails."""
    decl: Declaration = getattr(phase, "your_agent", None) or NOT_DECLARED
    replaced = [a for a in spec.scenario.agents if a.name in decl.replaces]
    if not replaced:
        return {}
    exits = agent_exits(run_dir / "agents")
    providers = tuple(sorted({spec.scenario.provider(a.provider).name for a in replaced}))
    statuses = [exits.get(a.name) for a in replaced]
    worst = next((s for s in statuses if s not in (None, 0)), statuses[0] if statuses else None)
    facts = Facts(providers=providers, exit_status=worst, grace_s=grace_s)
    events = list(evidence.get("events") or [])
    findings: list[Finding] = [run_check(c.name, events, facts, c.number) for c in decl.checks]
    return {
        "calls": len(attempts_of(events, providers)),
        "agents": [a.name for a in replaced],
        "providers": list(providers),
        "exit": {a.name: exits.get(a.name) for a in replaced},
        "stderr_tail": {
            a.name: stderr_tail(run_dir / "agents" / f"{a.name}.err") for a in replaced
        },
        "findings": [f.to_json() for f in findings],
    }


__all__ = [
    "ABOUT",
    "FINDINGS_MODES",
    "KEY",
    "CheckDecl",
    "Declaration",
    "UserAgent",
    "about_from_data",
    "declaration_from_data",
    "findings_for_run",
    "for_user",
    "merged_policy",
    "user_agent_from_args",
]
