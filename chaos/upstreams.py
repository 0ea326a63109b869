"""The dependencies of a chaos run: stub providers, the fault proxy in front of them,
the policy that points the boundary at them, and the net faults on the proxy.

Each provider is a chaos.stub.Stub whose behaviour comes from the schedule's
upstream faults (chaos.faults.upstream) and whose fault records go to the run's
ledger before it answers. With `via_proxy`, a Toxiproxy proxy (the embedded one,
or a real one given its URL) stands between the boundary and the stub, and the
schedule's net faults are its toxics (chaos.faults.net).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from chaos.evidence import FaultEvidence
from chaos.faults.net import schedule_roll, time_window, toxic_name
from chaos.faults.triggers import injection_fields, timer_only
from chaos.faults.upstream import chooser
from chaos.grammar import Fault
from chaos.scenario import ProviderSpec, Scenario
from chaos.schedule import FaultSchedule
from chaos.stub import Behaviour, RequestLog, Stub, StubConfig
from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.driver import ToxiproxyDriver
from docket.errors import InputError
from docket.policy import policy_from_dict

STUB_KEY = "sk-chaos-stub-key"  # what the boundary sends the stubs; never the agent's token
PROXY_TIMEOUT = 10.0  # seconds for one Toxiproxy API call


def key_env(index: int) -> str:
    return f"DOCKET_CHAOS_KEY_{index}"


def stub_log_path(folder: Path, name: str) -> Path:
    return folder / f"stub-{name}.jsonl"


@dataclass
class Upstreams:
    stubs: dict[str, Stub] = field(default_factory=dict)
    base_urls: dict[str, str] = field(default_factory=dict)  # what the policy points at
    proxies: dict[str, str] = field(default_factory=dict)  # provider -> its proxy's name
    driver: ToxiproxyDriver | None = None
    embedded: bool = True
    logs: list[RequestLog] = field(default_factory=list)

    def env(self, scenario: Scenario) -> dict[str, str]:
        return {key_env(i): STUB_KEY for i in range(len(scenario.providers))}

    def close(self) -> None:
        for log in self.logs:
            log.close()


def run_policy(scenario: Scenario, upstreams: Upstreams):
    data = copy.deepcopy(dict(scenario.policy))
    data["providers"] = {
        p.name: {"kind": p.kind, "base_url": upstreams.base_urls[p.name], "key_env": key_env(i)}
        for i, p in enumerate(scenario.providers)
    }
    return policy_from_dict(data, source=scenario.source or "<scenario>")


def _with_steady(choose, provider: ProviderSpec):
    """The schedule's behaviour on top of the provider's steady delays."""

    def choose_with_delays(arrival) -> Behaviour:
        b = choose(arrival)
        return dataclasses.replace(
            b,
            first_byte_delay=b.first_byte_delay + provider.latency,
            token_delay=b.token_delay or provider.token_delay,
        )

    return choose_with_delays


async def start_stubs(
    nursery: trio.Nursery,
    scenario: Scenario,
    schedule: FaultSchedule,
    upstreams: Upstreams,
    *,
    folder: Path,
    elapsed: Callable[[], float],
    evidence: FaultEvidence,
) -> None:
    has_upstream = any(f.target == "upstream" for f in schedule.faults)
    for provider in scenario.providers:
        config = StubConfig(
            kind=provider.kind, latency=provider.latency, token_delay=provider.token_delay
        )
        log = RequestLog(config.log_capacity, stub_log_path(folder, provider.name))
        upstreams.logs.append(log)
        choose = None
        if provider.faults and has_upstream:
            choose = _with_steady(chooser(schedule, elapsed=elapsed), provider)

        async def record(fields: dict, name: str = provider.name) -> None:
            await evidence.record(fields | {"provider": name})

        stub = Stub(config, choose=choose, log=log, record_fault=record)
        listening = await nursery.start(stub.serve)
        upstreams.stubs[provider.name] = stub
        upstreams.base_urls[provider.name] = listening.url


def net_faults(schedule: FaultSchedule) -> list[tuple[int, Fault]]:
    return [(i, f) for i, f in enumerate(schedule.faults) if f.target == "net"]


def check_real_toxiproxy(schedule: FaultSchedule) -> None:
    """A real Toxiproxy rolls its own dice and has no connection ordinals: refuse what
    it cannot perform as written, before the run starts."""
    for _, fault in net_faults(schedule):
        t = fault.trigger
        if t.ordinals is not None or (t.timed is not None and t.chance is not None):
            raise InputError(
                f"fault {fault.text!r}: a real Toxiproxy cannot count connections or mix a "
                "time window with a chance; use a chance, a `@t` window or `always` "
                "(or the embedded proxy)"
            )


async def start_proxies(
    nursery: trio.Nursery,
    scenario: Scenario,
    schedule: FaultSchedule,
    upstreams: Upstreams,
    *,
    elapsed: Callable[[], float],
    evidence: FaultEvidence,
    toxiproxy_url: str | None,
) -> None:
    """One proxy per via_proxy provider, in front of its stub; base_urls then point at it."""
    proxied = [p for p in scenario.providers if p.via_proxy]
    if not proxied:
        return
    if toxiproxy_url is None:
        roll = _recording_roll(schedule, elapsed, evidence)
        server = await nursery.start(partial(serve_toxiproxy, port=0, roll=roll))
        upstreams.driver = ToxiproxyDriver(server.url)
    else:
        check_real_toxiproxy(schedule)
        upstreams.driver = ToxiproxyDriver(toxiproxy_url)
        upstreams.embedded = False
    for provider in proxied:
        stub_address = upstreams.base_urls[provider.name].removeprefix("http://")
        name = f"docket_{provider.name}"
        info = await _proxy_call(upstreams.driver.create_proxy, name, stub_address)
        upstreams.proxies[provider.name] = name
        upstreams.base_urls[provider.name] = f"http://{info.listen}"


def _recording_roll(schedule: FaultSchedule, elapsed, evidence: FaultEvidence):
    """The embedded proxy's seeded roll, recording each connection a toxic acts on.

    The roll is asked inside a synchronous call, so the record is queued
    (record_soon) and lands in the ledger shortly after, not before, the effect.
    """
    roll = schedule_roll(schedule, elapsed)
    by_name = {toxic_name(i, f): f for i, f in net_faults(schedule)}

    def recording_roll(name: str, ordinal: int, direction: str) -> float:
        value = roll(name, ordinal, direction)
        fault = by_name.get(name)
        if fault is not None and value == 0.0 and not timer_only(fault):
            evidence.record_soon(
                injection_fields(
                    schedule, fault, ordinal + 1, action="connection", stream=direction
                )
            )
        return value

    return recording_roll


async def _proxy_call(fn, *args):
    with trio.fail_after(PROXY_TIMEOUT):
        return await trio.to_thread.run_sync(partial(fn, *args), abandon_on_cancel=True)


async def arm_net_faults(
    nursery: trio.Nursery,
    scenario: Scenario,
    schedule: FaultSchedule,
    upstreams: Upstreams,
    *,
    run_started: float,
    evidence: FaultEvidence,
) -> None:
    """Add the toxics that hold from the start (recorded first); start a task per `@t` window."""
    if upstreams.driver is None:
        return
    targets = [p.name for p in scenario.providers if p.via_proxy and p.faults]
    for index, fault in net_faults(schedule):
        for provider in targets:
            proxy = upstreams.proxies[provider]
            if timer_only(fault):
                nursery.start_soon(
                    _hold_window, upstreams, proxy, fault, index, schedule, run_started, evidence
                )
                continue
            await evidence.record(
                injection_fields(schedule, fault, None, action="toxic_added", proxy=proxy)
            )
            await _proxy_call(upstreams.driver.apply, proxy, fault, toxic_name(index, fault))


async def _hold_window(
    upstreams: Upstreams,
    proxy: str,
    fault: Fault,
    index: int,
    schedule: FaultSchedule,
    run_started: float,
    evidence: FaultEvidence,
) -> None:
    """Apply a `@t` net fault over its window, recording the start before it acts and
    the end after it is lifted; lifted however the task ends."""
    window = time_window(fault)
    assert window is not None
    start_s, end_s = window
    name = toxic_name(index, fault)
    driver = upstreams.driver
    assert driver is not None
    await trio.sleep_until(run_started + start_s)
    await evidence.record(
        injection_fields(schedule, fault, None, action="toxic_added", proxy=proxy, at_s=start_s)
    )
    await _proxy_call(driver.apply, proxy, fault, name)
    try:
        await trio.sleep_until(float("inf") if end_s is None else run_started + end_s)
    finally:
        with trio.CancelScope(shield=True):
            await _proxy_call(driver.lift, proxy, fault, name)
    await evidence.record(
        injection_fields(schedule, fault, None, action="toxic_removed", proxy=proxy, at_s=end_s)
    )


async def remove_proxies(upstreams: Upstreams) -> None:
    """On a real Toxiproxy, take our proxies away (the embedded one dies with the run)."""
    if upstreams.embedded or upstreams.driver is None:
        return
    with trio.CancelScope(shield=True):
        for name in upstreams.proxies.values():
            await _proxy_call(upstreams.driver.destroy, name)
