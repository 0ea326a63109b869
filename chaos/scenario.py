"""A chaos scenario: the seed, the faults, the stub providers, the agents, the policy.

Scenarios are small YAML files (scenarios/*.yaml, or the `run:` block of a
game-day phase) that a person edits by hand, so every key is checked before
anything starts: an unknown key, a wrong type, a bad duration, a fault that
does not parse or that its layer cannot perform is refused as `FILE:LINE: at
PATH reason` (chaos.yamldoc), exit 2.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from chaos.faults.grammar import parse_fault
from chaos.faults.net import check_performable
from chaos.faults.schedule import FaultSchedule
from chaos.yamldoc import Where, load
from docket.agent.config import MODES
from docket.errors import InputError
from docket.fields import Fields
from docket.policy import Policy, policy_from_dict
from docket.values import host_problem

# A seed must survive the receipt: its `faults.seed` is a JSON integer, exact only
# below 2^53 (spec/docket-receipt-1.md), a narrower range than the schedule's 2^64.
SEED_LIMIT = 1 << 53
AGENT_COUNT_LIMIT = 1 << 31  # calls, workers, tokens: the agent reads them as C-sized ints
DEFAULT_WALL_CLOCK = 60.0
DEFAULT_PROBE_EVERY = 0.1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # also a file name and a route
_KINDS = ("openai", "anthropic")


@dataclass(frozen=True)
class ProviderSpec:
    name: str = "openai"  # the policy's provider name and the boundary route /<name>/
    kind: str = "openai"
    latency: float = 0.0  # the stub's steady delay before the first byte, seconds
    token_delay: float = 0.0  # between streamed tokens
    via_proxy: bool = True  # through the fault proxy (net faults act only then)
    faults: bool = True  # whether the scenario's upstream and net faults act on it


LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Hosts:
    """Where the harness binds, which is also the address it gives others.

    `stubs`: the stub providers listen here, and a Toxiproxy is told to forward to
    it, so a Toxiproxy on another host must be able to reach it. `proxies`: the
    fault proxies listen here (created with listen HOST:0 on a real Toxiproxy; the
    embedded one also serves its API here), and the boundary dials it. Loopback by
    default; in staging, addresses the other host can reach (docs/gamedays.md).
    The boundary's own address is the policy's `boundary.host`.
    """

    stubs: str = LOOPBACK
    proxies: str = LOOPBACK

    def flags(self) -> list[str]:
        """The `docket chaos` flags that give these hosts (none for the defaults)."""
        out = []
        if self.stubs != LOOPBACK:
            out += ["--stub-host", self.stubs]
        if self.proxies != LOOPBACK:
            out += ["--proxy-host", self.proxies]
        return out


def check_host(value: object) -> str | None:
    """The problem with a bind address, or None: an IP address or a host name."""
    return host_problem(value)


def with_hosts(
    scenario: Scenario, stubs: str | None, proxies: str | None, boundary: str | None = None
) -> Scenario:
    """The scenario with the hosts given on the command line (None: as the file says).
    `boundary` is the policy's `boundary.host` (where the agents dial the boundary)."""
    flags = (("--stub-host", stubs), ("--proxy-host", proxies), ("--boundary-host", boundary))
    for flag, value in flags:
        problem = None if value is None else check_host(value)
        if problem is not None:
            raise InputError(f"{flag} {problem}")
    hosts = Hosts(stubs=stubs or scenario.hosts.stubs, proxies=proxies or scenario.hosts.proxies)
    if boundary is None:
        return dataclasses.replace(scenario, hosts=hosts)
    edited: dict[str, Any] = copy.deepcopy(dict(scenario.policy))
    edited["boundary"] = {**edited.get("boundary", {}), "host": boundary}
    moved = dataclasses.replace(scenario, hosts=hosts, policy=edited)
    try:
        moved.held_policy  # noqa: B018 - built once here, kept for the run's report
    except InputError as exc:
        raise InputError(f"--boundary-host {boundary}: {exc}") from None
    return moved


@dataclass(frozen=True)
class AgentSpec:
    name: str = "agent"
    mode: str | None = "once"  # a docket agent mode, or None with `command`
    command: tuple[str, ...] = ()
    provider: str | None = None  # default: the first provider
    calls: int | None = None
    concurrency: int | None = None
    timeout: float | None = None
    max_tokens: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def settings(self) -> dict[str, str]:
        """The DOCKET_AGENT_* environment this agent runs with (the mode's part)."""
        out = dict(self.env)
        if self.mode is not None:
            out["DOCKET_AGENT_MODE"] = self.mode
        for key, value in (
            ("DOCKET_AGENT_CALLS", self.calls),
            ("DOCKET_AGENT_CONCURRENCY", self.concurrency),
            ("DOCKET_AGENT_TIMEOUT", self.timeout),
            ("DOCKET_AGENT_MAX_TOKENS", self.max_tokens),
        ):
            if value is not None:
                # seconds in plain decimals (:g would print 1e-06, 1e+06)
                out[key] = (
                    f"{value:.9f}".rstrip("0").rstrip(".")
                    if isinstance(value, float)
                    else str(value)
                )
        return out


@dataclass(frozen=True)
class Scenario:
    seed: int | None = None
    faults: tuple[str, ...] = ()  # canonical texts
    providers: tuple[ProviderSpec, ...] = (ProviderSpec(),)
    agents: tuple[AgentSpec, ...] = (AgentSpec(),)
    policy: Mapping[str, object] = field(default_factory=dict)
    max_wall_clock: float = DEFAULT_WALL_CLOCK
    probe_every: float = DEFAULT_PROBE_EVERY
    source: str | None = None  # the file it came from, for the repro command
    hosts: Hosts = Hosts()

    @cached_property
    def held_policy(self) -> Policy:
        """`policy` as the Policy object it builds, every default filled in: built once per
        scenario (the reader builds it to check the file; the game day's report reads this
        one back rather than parsing the mapping again). Without providers: the harness
        adds its stubs' addresses for each run (chaos.run.upstreams.run_policy)."""
        return policy_from_dict(copy.deepcopy(dict(self.policy)), source="policy")

    def provider(self, name: str | None) -> ProviderSpec:
        if name is None:
            return self.providers[0]
        return next(p for p in self.providers if p.name == name)


# ---------------------------------------------------------------- checking


class _Check:
    """One mapping of a YAML document, read through docket.fields.Fields (the checks and
    their wording every config reader shares); a problem names its line (chaos.yamldoc)."""

    def __init__(
        self, data: object, where: Where, path: tuple[str | int, ...], allowed: tuple[str, ...]
    ) -> None:
        self.where, self.path = where, path
        if not isinstance(data, dict):
            raise where.error(path, f"must be a mapping, got {_kind(data)}")
        self.data: dict = data
        self.fields = Fields(data, lambda key, reason: self.fail(key, reason))
        self.fields.known(allowed)

    def fail(self, key: str | tuple, reason: str) -> InputError:
        keys = key if isinstance(key, tuple) else (key,)
        return self.where.error((*self.path, *keys), reason)

    def has(self, key: str) -> bool:
        return key in self.data

    def name(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str) or not _NAME.match(value):
            raise self.fail(key, "must be a name of letters, digits, '-' and '_' (at most 64)")
        return value

    def listing(self, key: str) -> list:
        value = self.data.get(key, [])
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list, got {_kind(value)}")
        return value


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false"}.get(
        type(value), f"a {type(value).__name__}"
    )


_TOP = (
    "seed", "faults", "providers", "agents", "policy", "max_wall_clock", "probe_every", "hosts",
)  # fmt: skip
_HOSTS_KEYS = ("stubs", "proxies")
_PROVIDER_KEYS = ("name", "kind", "latency", "token_delay", "via_proxy", "faults")
_AGENT_KEYS = (
    "name", "mode", "command", "provider", "calls", "concurrency", "timeout", "max_tokens", "env",
)  # fmt: skip


def scenario_from_data(data: object, where: Where, path: tuple = ()) -> Scenario:
    """Check a parsed scenario (a whole file, or a block at `path` inside a bigger one)."""
    top = _Check(data, where, tuple(path), _TOP)
    seed = top.fields.integer("seed", None, maximum=SEED_LIMIT - 1)
    faults = _faults(top)
    providers = _providers(top)
    if any(f.startswith("net:") for f in faults) and not any(
        p.via_proxy and p.faults for p in providers
    ):
        raise top.fail("faults", "net faults need a provider with via_proxy: true")
    agents = _agents(top, providers)
    policy = top.data.get("policy", {})
    if not isinstance(policy, dict):
        raise top.fail("policy", f"must be a mapping, got {_kind(policy)}")
    if "providers" in policy:
        raise top.fail(("policy", "providers"), "is filled in by the harness: use `providers:`")
    scenario = Scenario(
        seed=seed,
        faults=faults,
        providers=providers,
        agents=agents,
        policy=policy,
        max_wall_clock=top.fields.duration("max_wall_clock", DEFAULT_WALL_CLOCK),
        probe_every=top.fields.duration("probe_every", DEFAULT_PROBE_EVERY, positive=False),
        source=where.file,
        hosts=_hosts(top),
    )
    try:
        scenario.held_policy  # noqa: B018 - built once here, kept for the run's report
    except InputError as exc:
        raise top.fail("policy", str(exc).removeprefix("policy ")) from None
    return scenario


def _hosts(top: _Check) -> Hosts:
    if not top.has("hosts"):
        return Hosts()
    c = _Check(top.data["hosts"], top.where, (*top.path, "hosts"), _HOSTS_KEYS)
    for key in _HOSTS_KEYS:
        problem = check_host(c.data[key]) if key in c.data else None
        if problem is not None:
            raise c.fail(key, problem)
    return Hosts(**{k: c.data[k] for k in _HOSTS_KEYS if k in c.data})


def load_scenario(path: str | Path) -> Scenario:
    """Read and check a scenario file; InputError (exit 2) names file:line:reason."""
    data, where = load(path)
    if isinstance(data, dict) and "boundaries" in data and "timeline" in data:
        # scenarios/fleet-*.yaml sit beside the chaos scenarios: say which command runs one
        raise where.error(
            ("boundaries",),
            f"a fleet scenario, not a chaos one: run it with python -m chaos.fleet {path}",
        )
    return scenario_from_data(data, where)


def check_faults(texts: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Parse fault texts (e.g. from --fault): canonical texts, or InputError naming the column."""
    faults = [parse_fault(t) for t in texts]
    for fault in faults:
        if fault.target == "net":
            check_performable(fault)
    try:
        FaultSchedule(0, tuple(faults))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return tuple(f.text for f in faults)


def _faults(top: _Check) -> tuple[str, ...]:
    texts = []
    for i, text in enumerate(top.listing("faults")):
        if not isinstance(text, str):
            raise top.fail(("faults", i), f"must be a fault text, got {_kind(text)}")
        try:
            (canonical,) = check_faults([text])
        except InputError as exc:
            raise top.fail(("faults", i), str(exc)) from None
        if canonical in texts:
            raise top.fail(("faults", i), f"fault listed twice: {canonical}")
        texts.append(canonical)
    return tuple(texts)


def _providers(top: _Check) -> tuple[ProviderSpec, ...]:
    if not top.has("providers"):
        return (ProviderSpec(),)
    items = top.listing("providers")
    if not items:
        raise top.fail("providers", "names no provider")
    out: list[ProviderSpec] = []
    for i, item in enumerate(items):
        c = _Check(item, top.where, (*top.path, "providers", i), _PROVIDER_KEYS)
        kind = c.fields.choice("kind", None, _KINDS)
        name = c.name("name", kind or "openai")
        kind = kind or (name if name in _KINDS else "openai")
        if any(p.name == name for p in out):
            raise c.fail("name", f"provider {name!r} named twice")
        out.append(
            ProviderSpec(
                name=name,
                kind=kind,
                latency=c.fields.duration("latency", 0.0, positive=False),
                token_delay=c.fields.duration("token_delay", 0.0, positive=False),
                via_proxy=c.fields.boolean("via_proxy", True),
                faults=c.fields.boolean("faults", True),
            )
        )
    return tuple(out)


def _agents(top: _Check, providers: tuple[ProviderSpec, ...]) -> tuple[AgentSpec, ...]:
    if not top.has("agents"):
        return (AgentSpec(),)
    items = top.listing("agents")
    if not items:
        raise top.fail("agents", "names no agent")
    names = [p.name for p in providers]
    out: list[AgentSpec] = []
    for i, item in enumerate(items):
        c = _Check(item, top.where, (*top.path, "agents", i), _AGENT_KEYS)
        name = c.name("name", "agent" if i == 0 else f"agent{i}")
        if any(a.name == name for a in out):
            raise c.fail("name", f"agent {name!r} named twice")
        command = c.listing("command") if c.has("command") else []
        if command and (not all(isinstance(x, str) and x for x in command)):
            raise c.fail("command", "must be a list of non-empty strings")
        if any("\x00" in x for x in command):
            # exec takes C strings: a NUL cannot be passed, and Popen raises on it
            raise c.fail("command", "must not hold a NUL byte (\\0)")
        if c.has("command") and not command:
            raise c.fail("command", "is empty")
        if command and c.has("mode"):
            raise c.fail("mode", "give a mode or a command, not both")
        mode = None if command else c.fields.choice("mode", "once", MODES)
        provider = c.data.get("provider")
        if provider is not None and provider not in names:
            raise c.fail("provider", f"no provider {provider!r} (have: {', '.join(names)})")
        env = c.data.get("env", {})
        if not isinstance(env, dict):
            raise c.fail("env", f"must be a mapping, got {_kind(env)}")
        for key, value in env.items():
            if not key.startswith("DOCKET_AGENT_") or not isinstance(value, str):
                raise c.fail(("env", key), "must be a DOCKET_AGENT_* setting with a string value")
            if "\x00" in key + value or "=" in key:
                raise c.fail(("env", key), "must not hold a NUL byte (\\0) or '=' in its name")
        out.append(
            AgentSpec(
                name=name,
                mode=mode,
                command=tuple(command),
                provider=provider,
                calls=c.fields.integer("calls", None, minimum=1, maximum=AGENT_COUNT_LIMIT - 1),
                concurrency=c.fields.integer(
                    "concurrency", None, minimum=1, maximum=AGENT_COUNT_LIMIT - 1
                ),
                timeout=c.fields.duration("timeout", None),
                max_tokens=c.fields.integer(
                    "max_tokens", None, minimum=1, maximum=AGENT_COUNT_LIMIT - 1
                ),
                env=dict(env),
            )
        )
    return tuple(out)
