"""The dependencies of a chaos run: stub providers, the fault proxy in front of them,
the policy that points the boundary at them, and the net faults on the proxy.

Each provider is a chaos.stub.server.Stub whose behaviour comes from the schedule's
upstream faults (chaos.faults.upstream) and whose fault records go to the run's
ledger before it answers. With `via_proxy`, a Toxiproxy proxy (the embedded one,
or a real one given its URL) stands between the boundary and the stub, and the
schedule's net faults are its toxics (chaos.faults.net).

A real Toxiproxy may be shared: by runs going at once, and with proxies left by a
run killed before its teardown. So there a run's proxies carry a tag of its own
(`docket_TAG_PROVIDER`), it removes only those, and any other `docket_` proxy it
finds is a note naming it, never deleted: it may belong to a run still going.
Each of its proxies' names is on file (PROXIES_FILE) before the proxy is made, so
when a run is killed outright by its own fault (a worker: chaos.run.worker), its
caller can still take them away (remove_listed_proxies).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import secrets
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import trio

from chaos.faults.grammar import Fault
from chaos.faults.net import schedule_roll, time_window, toxic_name
from chaos.faults.schedule import FaultSchedule
from chaos.faults.triggers import injection_fields, timer_only
from chaos.faults.upstream import chooser
from chaos.run.evidence import FaultEvidence
from chaos.scenario import ProviderSpec, Scenario
from chaos.stub.server import Behaviour, RequestLog, Stub, StubConfig
from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.driver import ToxiproxyDriver, ToxiproxyError
from docket.errors import InputError
from docket.policy import policy_from_dict

STUB_KEY = "sk-chaos-stub-key"  # what the boundary sends the stubs; never the agent's token
PROXY_TIMEOUT = 10.0  # seconds for one Toxiproxy API call
PROXY_PREFIX = "docket_"  # every proxy a docket run makes starts so
TAG_BYTES = 3  # a run's tag on a shared Toxiproxy: 6 hex digits
PROXIES_FILE = "proxies.txt"  # a run's proxies on a real Toxiproxy, one a line
ADDRESSES_FILE = "addresses.json"  # where the run's stubs and proxies listened


def key_env(index: int) -> str:
    return f"DOCKET_CHAOS_KEY_{index}"


def stub_log_path(folder: Path, name: str) -> Path:
    return folder / f"stub-{name}.jsonl"


@dataclass
class Upstreams:
    stubs: dict[str, Stub] = field(default_factory=dict)
    base_urls: dict[str, str] = field(default_factory=dict)  # what the policy points at
    proxies: dict[str, str] = field(default_factory=dict)  # provider -> its proxy's name
    stub_urls: dict[str, str] = field(default_factory=dict)  # provider -> where its stub listens
    addresses: dict[str, dict] = field(default_factory=dict)  # provider -> its proxy's addresses
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
        listening = await nursery.start(partial(stub.serve, host=scenario.hosts.stubs))
        upstreams.stubs[provider.name] = stub
        upstreams.base_urls[provider.name] = listening.url
        upstreams.stub_urls[provider.name] = listening.url


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


def toxiproxy_driver(url: str) -> ToxiproxyDriver:
    """A driver for a real Toxiproxy's API URL; a malformed URL is one line (InputError)."""
    try:
        urlsplit(url).port  # noqa: B018 - raises ValueError on a bad host or port
    except ValueError as exc:
        raise InputError(f"toxiproxy URL {url!r}: expected http://HOST:PORT ({exc})") from None
    return ToxiproxyDriver(url)


async def check_toxiproxy(url: str, schedule: FaultSchedule) -> None:
    """Before anything starts: the URL is well formed, the schedule is one a real
    Toxiproxy can perform, and the server answers (one line, exit 2, if not)."""
    driver = toxiproxy_driver(url)
    check_real_toxiproxy(schedule)
    try:
        await _proxy_call(driver.version)
    except trio.TooSlowError:
        raise InputError(f"toxiproxy {url}: no answer within {PROXY_TIMEOUT:g} s") from None
    except ToxiproxyError as exc:
        cause = _os_error_under(exc)
        if cause is None:
            raise
        raise InputError(f"toxiproxy {url}: cannot connect ({cause.strerror})") from None


def _os_error_under(exc: BaseException) -> OSError | None:
    """The socket error at the bottom of requests' wrappers, for a short message."""
    stack: list[object] = [exc]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError) and item.strerror:
            return item
        stack += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]
    return None


async def start_proxies(
    nursery: trio.Nursery,
    scenario: Scenario,
    schedule: FaultSchedule,
    upstreams: Upstreams,
    *,
    elapsed: Callable[[], float],
    evidence: FaultEvidence,
    toxiproxy_url: str | None,
    folder: Path,
    note: Callable[[str], None],
) -> None:
    """One proxy per via_proxy provider, in front of its stub; base_urls then point at it.

    On a real Toxiproxy each docket proxy already there is one `note` (it is left
    alone), ours are tagged with a tag none of them has, and each one's name is in
    `folder`/PROXIES_FILE before it is made."""
    proxied = [p for p in scenario.providers if p.via_proxy]
    if not proxied:
        write_addresses(folder, upstreams, toxiproxy_url)
        return
    tag = None
    if toxiproxy_url is None:
        roll = _recording_roll(schedule, elapsed, evidence)
        server = await nursery.start(
            partial(serve_toxiproxy, host=scenario.hosts.proxies, port=0, roll=roll)
        )
        upstreams.driver = ToxiproxyDriver(server.url)
    else:
        check_real_toxiproxy(schedule)
        upstreams.driver = toxiproxy_driver(toxiproxy_url)
        upstreams.embedded = False
        present = await _proxy_call(upstreams.driver.proxy_names)
        for name in present:
            if name.startswith(PROXY_PREFIX):
                note(left_alone(toxiproxy_url, name))
        tag = run_tag(present, [p.name for p in proxied])
    for provider in proxied:
        stub_address = upstreams.base_urls[provider.name].removeprefix("http://")
        name = proxy_name(provider.name, tag)
        if tag is not None:
            with (folder / PROXIES_FILE).open("a", encoding="utf-8") as listed:
                listed.write(name + "\n")
        listen = f"{_bracketed(scenario.hosts.proxies)}:0"
        info = await _proxy_call(upstreams.driver.create_proxy, name, stub_address, listen)
        upstreams.proxies[provider.name] = name
        upstreams.base_urls[provider.name] = f"http://{info.listen}"
        upstreams.addresses[provider.name] = {
            "proxy": name,
            "listen": info.listen,
            "upstream": stub_address,
        }
    write_addresses(folder, upstreams, toxiproxy_url)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def write_addresses(folder: Path, upstreams: Upstreams, toxiproxy_url: str | None) -> None:
    """addresses.json in the run's folder: where each stub and proxy listened, and which
    Toxiproxy held the proxies: what a staging run reads when a host could not reach
    another (docs/gamedays.md)."""
    data = {
        "toxiproxy": toxiproxy_url or (upstreams.driver.url if upstreams.driver else None),
        "embedded": upstreams.embedded,
        "stubs": {n: s for n, s in upstreams.stub_urls.items()},
        "proxies": upstreams.addresses,
    }
    (folder / ADDRESSES_FILE).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def proxy_name(provider: str, tag: str | None = None) -> str:
    """The run's proxy in front of `provider`. Untagged on the run's own embedded
    proxy: nobody else uses that server, and a seeded rerun records the same name."""
    return f"{PROXY_PREFIX}{tag}_{provider}" if tag else f"{PROXY_PREFIX}{provider}"


def run_tag(
    taken: Collection[str],
    providers: Sequence[str],
    draw: Callable[[], str] | None = None,
) -> str:
    """A tag for this run's proxies on a shared Toxiproxy, none of whose names is
    taken already. Random, not seeded: no fault decision depends on a proxy's name
    (toxics are named by their fault), so it changes only the records' `proxy`."""
    while True:
        tag = draw() if draw is not None else secrets.token_hex(TAG_BYTES)
        if not any(proxy_name(p, tag) in taken for p in providers):
            return tag


def left_alone(url: str, name: str) -> str:
    """The note for a docket proxy on a shared Toxiproxy that is not this run's."""
    url = url.rstrip("/")
    return (
        f"toxiproxy {url}: proxy {name} is another docket run's (still going, or killed "
        f"before its teardown); left alone: if no run is using it, remove it with "
        f"curl -X DELETE {url}/proxies/{name}"
    )


async def left_alone_notes(url: str) -> list[str]:
    """A note (left_alone) for each docket proxy on the Toxiproxy at `url` now."""
    names = await _proxy_call(toxiproxy_driver(url).proxy_names)
    return [left_alone(url, n) for n in names if n.startswith(PROXY_PREFIX)]


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
    scenario: Scenario,
    schedule: FaultSchedule,
    upstreams: Upstreams,
    *,
    evidence: FaultEvidence,
) -> None:
    """Add the toxics that hold from the start, each recorded before it is added.

    They stay until the proxy goes: the embedded one dies with the run, and
    remove_proxies destroys ours on a real Toxiproxy. `@t` windows are not
    armed here: net_windows lists them for hold_window.
    """
    if upstreams.driver is None:
        return
    for index, fault, proxy in _net_targets(scenario, schedule, upstreams):
        if timer_only(fault):
            continue
        await evidence.record(
            injection_fields(schedule, fault, None, action="toxic_added", proxy=proxy)
        )
        await _proxy_call(upstreams.driver.apply, proxy, fault, toxic_name(index, fault))


def net_windows(
    scenario: Scenario, schedule: FaultSchedule, upstreams: Upstreams
) -> list[tuple[int, Fault, str]]:
    """(index, fault, proxy) for each `@t` net fault on each proxy it acts on."""
    if upstreams.driver is None:
        return []
    return [t for t in _net_targets(scenario, schedule, upstreams) if timer_only(t[1])]


def _net_targets(scenario: Scenario, schedule: FaultSchedule, upstreams: Upstreams):
    providers = [p.name for p in scenario.providers if p.via_proxy and p.faults]
    return [
        (index, fault, upstreams.proxies[name])
        for index, fault in net_faults(schedule)
        for name in providers
    ]


async def hold_window(
    upstreams: Upstreams,
    window: tuple[int, Fault, str],
    *,
    schedule: FaultSchedule,
    run_started: float,
    evidence: FaultEvidence,
    call_seen: Callable[[int], Awaitable[float]] | None = None,
) -> None:
    """Perform a `@t` net fault over its window: `toxic_added` is recorded before the
    toxic acts, `toxic_removed` after it is lifted.

    The caller runs this in a nursery that is cancelled while the proxy still
    serves and the run's ledger is open (chaos.run.here: the supervisor's `started`
    hook, cancelled when the agent is reaped). A window the run outlives is
    lifted then, and its `toxic_removed` says `teardown: true`. A window that
    had not begun leaves nothing (nor does an anchored one whose call never
    came). A proxy call that fails is recorded with its error, and the run goes
    on: the chain then says the fault was not (or no longer) in place.
    """
    index, fault, proxy = window
    span = time_window(fault)
    assert span is not None
    start_s, end_s = span
    name = toxic_name(index, fault)
    driver = upstreams.driver
    assert driver is not None
    origin = run_started
    after_call = fault.trigger.timed.after_call  # type: ignore[union-attr]
    if after_call is not None:
        # anchored to the traffic: the window counts from the run's N-th request,
        # however long the agents took to send it (a busy machine, a slow start)
        assert call_seen is not None, f"{fault.text}: hold_window needs call_seen"
        origin = await call_seen(after_call)
    await trio.sleep_until(origin + start_s)
    fields = partial(injection_fields, schedule, fault, None, proxy=proxy)
    start_at = round(origin - run_started + start_s, 3)
    end_at_s = None if end_s is None else round(origin - run_started + end_s, 3)
    await evidence.record(fields(action="toxic_added", at_s=start_at))
    with trio.CancelScope(shield=True):
        # shielded: an apply abandoned half way could leave a toxic nobody lifts
        problem = await _try_proxy_call(driver.apply, proxy, fault, name)
    if problem is not None:
        await evidence.record(fields(action="toxic_failed", at_s=start_at, error=problem))
        return
    end_at = math.inf if end_s is None else origin + end_s
    try:
        await trio.sleep_until(end_at)
    finally:
        with trio.CancelScope(shield=True):
            problem = await _try_proxy_call(driver.lift, proxy, fault, name)
            now = trio.current_time()
            extra: dict = {"at_s": end_at_s}
            if now < end_at:  # the run ended inside the window
                extra = {"at_s": round(now - run_started, 3), "teardown": True}
            if problem is not None:
                extra["error"] = problem
            await evidence.record(fields(action="toxic_removed", **extra))


async def _try_proxy_call(fn, *args) -> str | None:
    """A proxy call whose failure is a fact to record, not the end of the run."""
    try:
        await _proxy_call(fn, *args)
    except (ToxiproxyError, trio.TooSlowError) as exc:
        return str(exc) or f"no answer within {PROXY_TIMEOUT:g} s"
    return None


async def remove_proxies(upstreams: Upstreams) -> list[str]:
    """On a real Toxiproxy, take our proxies away, and only ours (the embedded one
    dies with the run).
    Returns what could not be removed, one line each: the run is over, so a
    Toxiproxy that went away is a note for the reader, not an error."""
    if upstreams.embedded or upstreams.driver is None:
        return []
    problems = []
    with trio.CancelScope(shield=True):
        for name in upstreams.proxies.values():
            problem = await _try_proxy_call(upstreams.driver.destroy, name)
            if problem is not None:
                problems.append(f"proxy {name} not destroyed: {problem}")
    return problems


async def remove_listed_proxies(url: str, folder: Path) -> list[str]:
    """After a run that could not tear itself down (its worker was killed): destroy
    the proxies it had on file that the Toxiproxy at `url` still holds. Returns what
    could not be done, one line each, as remove_proxies does."""
    listed = folder / PROXIES_FILE
    if not listed.exists():
        return []
    ours = set(listed.read_text(encoding="utf-8").split())
    driver = toxiproxy_driver(url)
    try:
        present = await _proxy_call(driver.proxy_names)
    except (ToxiproxyError, trio.TooSlowError) as exc:
        why = str(exc) or f"no answer within {PROXY_TIMEOUT:g} s"
        return [f"proxies {', '.join(sorted(ours))} not destroyed: {why}"]
    left = {name: name for name in sorted(ours.intersection(present))}
    return await remove_proxies(Upstreams(proxies=left, driver=driver, embedded=False))
