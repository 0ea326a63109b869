"""A fleet scenario: how many `docket run` boundaries share one budget, how hard their
agents call, the budget, and a timeline of faults on the budget's database.

A small YAML file (scenarios/fleet-partition.yaml) a person edits by hand, so every key
is checked before anything starts: an unknown key, a wrong type, a bad duration, a
fault that does not parse, windows that overlap or outlast the run are refused as
`FILE:LINE: at PATH reason` (chaos.yamldoc), exit 2. Pure: nothing here starts a thing.

    boundaries: 4           # `docket run` processes, one ledger and receipt each
    callers: 3              # reference agents per boundary (backoff mode: one call at a time)
    cap_usd: 0.015          # the budget all of them share
    slice_usd: 0.0003
    lease_seconds: 10
    timeout: 2s             # [fleet] timeout: the longest one exchange with the database may take
    call_deadline: 12s      # each agent's per-call timeout: no call may take longer
    stub_latency: 150ms     # the stub provider's delay before it answers
    duration: 40s           # from when every boundary has served a call; then the runs are stopped
    timeline:               # counted from the same moment; windows in order, not overlapping
      - {name: slow, at: 2s, for: 5s, fault: "net:latency(500ms)", expect: served}
      - {name: restart, at: 27s, for: 1s, fault: restart, expect: outage}

A `fault` is a net fault of the chaos grammar (spec/fault-grammar.md) without a trigger
(its window is `at` and `for`), performed by the embedded fault proxy in front of the
database, or `restart`: the database server is stopped at `at` and started `for` later.
`expect: outage` asks for the boundaries' failed exchanges (`fleet.store`) in the window
and for every boundary to reach the database again after it; `expect: served` asks for
calls served in the window and no failed exchange (a slow database, still in time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.faults.grammar import Fault, parse_fault
from chaos.faults.net import check_performable
from chaos.yamldoc import Where, load
from docket.errors import InputError
from docket.fields import Fields

RESTART = "restart"
EXPECTS = ("outage", "served")
MAX_BOUNDARIES = 16
MAX_CALLERS = 32
_TOP = (
    "boundaries", "callers", "cap_usd", "slice_usd", "lease_seconds", "timeout",
    "call_deadline", "stub_latency", "duration", "timeline",
)  # fmt: skip
_WINDOW = ("name", "at", "for", "fault", "expect")


@dataclass(frozen=True)
class Window:
    name: str
    at: float  # seconds from when every boundary has served a call
    length: float  # `for`
    fault: Fault | None  # None: restart the database server
    expect: str  # "outage" | "served"

    @property
    def end(self) -> float:
        return self.at + self.length

    @property
    def what(self) -> str:
        return RESTART if self.fault is None else self.fault.text.removesuffix("@always")


@dataclass(frozen=True)
class FleetScenario:
    boundaries: int = 4
    callers: int = 3
    cap_usd: float = 0.02
    slice_usd: float = 0.0005
    lease_seconds: float = 10.0
    timeout: float = 2.0
    call_deadline: float = 12.0
    stub_latency: float = 0.15
    duration: float = 40.0
    timeline: tuple[Window, ...] = ()
    source: str = "<scenario>"

    def scaled(self, time_scale: float = 1.0, boundaries: int | None = None) -> FleetScenario:
        """A shorter run of the same scenario: every window and the duration times
        `time_scale` (the database's timeouts and the lease are left as they are:
        they are what is under test), and optionally fewer boundaries."""
        return dataclasses.replace(
            self,
            boundaries=boundaries or self.boundaries,
            duration=self.duration * time_scale,
            timeline=tuple(
                dataclasses.replace(w, at=w.at * time_scale, length=w.length * time_scale)
                for w in self.timeline
            ),
        )


def load_fleet_scenario(path: str | Path) -> FleetScenario:
    """Read and check a fleet scenario file; InputError (exit 2) names FILE:LINE: reason."""
    data, where = load(path)
    return fleet_scenario_from(data, where)


def fleet_scenario_from(data: object, where: Where) -> FleetScenario:
    if not isinstance(data, dict):
        raise where.error((), "a fleet scenario must be a mapping of keys")
    fields = Fields(data, lambda key, reason: where.error((key,), reason))
    fields.known(_TOP)
    lease = fields.duration("lease_seconds", 10.0)
    timeout = fields.duration("timeout", 4.0)
    if timeout >= lease / 2:
        # the [fleet] policy's own rule: a renewal must fit before expiry
        raise where.error(("timeout",), f"must be under half of lease_seconds ({lease:g} s)")
    cap = fields.usd("cap_usd")
    slice_ = fields.usd("slice_usd")
    if cap is None or slice_ is None:
        raise where.error((), "cap_usd and slice_usd are required")
    if slice_ > cap:
        raise where.error(("slice_usd",), f"is more than cap_usd ({cap})")
    scenario = FleetScenario(
        boundaries=fields.integer("boundaries", 4, minimum=1, maximum=MAX_BOUNDARIES),
        callers=fields.integer("callers", 3, minimum=1, maximum=MAX_CALLERS),
        cap_usd=float(cap),
        slice_usd=float(slice_),
        lease_seconds=lease,
        timeout=timeout,
        call_deadline=fields.duration("call_deadline", 12.0),
        stub_latency=fields.duration("stub_latency", 0.15, positive=False),
        duration=fields.duration("duration", 40.0),
        source=where.file,
    )
    timeline = _timeline(data.get("timeline", []), where, scenario.duration)
    return dataclasses.replace(scenario, timeline=timeline)


def _timeline(items: object, where: Where, duration: float) -> tuple[Window, ...]:
    if not isinstance(items, list):
        raise where.error(("timeline",), "must be a list of windows")
    out: list[Window] = []
    for i, item in enumerate(items):
        path = ("timeline", i)
        if not isinstance(item, dict):
            raise where.error(path, "must be a mapping (name, at, for, fault, expect)")
        f = Fields(item, _located(where, path))
        f.known(_WINDOW)
        name = f.string("name", f"window{i}")
        if any(w.name == name for w in out):
            raise where.error((*path, "name"), f"window {name!r} named twice")
        expect = f.choice("expect", None, EXPECTS)
        text = f.string("fault", None)
        if expect is None or text is None or "at" not in item or "for" not in item:
            raise where.error(path, "needs at, for, fault and expect")
        window = Window(
            name=name,
            at=f.duration("at", 0.0, positive=False),
            length=f.duration("for", 1.0),
            fault=_fault(text, where, (*path, "fault")),
            expect=expect,
        )
        if out and window.at < out[-1].end:
            raise where.error((*path, "at"), f"starts before window {out[-1].name!r} ends")
        if window.end >= duration:
            raise where.error((*path, "for"), f"ends at {window.end:g} s, not before duration")
        out.append(window)
    return tuple(out)


def _located(where: Where, path: tuple) -> Callable[[str, str], InputError]:
    def fail(key: str, reason: str) -> InputError:
        return where.error((*path, key), reason)

    return fail


def _fault(text: str, where: Where, path: tuple) -> Fault | None:
    if text == RESTART:
        return None
    try:
        fault = parse_fault(text)
        check_performable(fault)
    except InputError as exc:
        raise where.error(path, f"{exc} (a net fault, or `{RESTART}`)") from None
    if fault.trigger.conditions:
        raise where.error(path, "takes no trigger: its window is `at` and `for`")
    return fault
