"""The net fault family: a `net:` Fault as a Toxiproxy toxic, and the seeded roll.

Pure: nothing here opens a socket. chaos.toxiproxy.driver sends what
`toxic_request` returns to a Toxiproxy (the embedded one or a real one).

Naming. A toxic is named `docket<INDEX>_<kind>`, INDEX being the fault's place
in its FaultSchedule. Not the fault's text: toxiproxy-python puts the name into
the URL path unescaped, and a text holds '%', '@', '(' and spaces.

Triggers. Toxiproxy decides per connection and direction whether a toxic is
active, by `rand < toxicity`, once, when the toxic meets the connection.
- `N%` maps to `toxicity = N/100`. A real Toxiproxy rolls its own dice, so its
  choice of connections is not reproducible; the embedded proxy takes
  `schedule_roll(schedule)`, which returns 0.0 where the schedule fires the
  fault at that connection and 1.0 where it does not, so the proxy's comparison
  reproduces `FaultSchedule.decide` exactly (integer arithmetic, no float edge).
- `@call A..B` counts connections through the proxy (call 1 is the proxy's
  connection 0). The embedded proxy realises it exactly through the same roll.
  A real Toxiproxy has no notion of connection ordinals: there the toxic is
  added with `toxicity` from the chance alone (1.0 without one) and the harness
  must add and remove it around the calls it observes, which is only as exact
  as its view of which call uses which connection (pooled connections blur it).
- `@t A..B` / `@t A`: the harness adds the toxic at A and removes it at B
  (`time_window`), counted from the run's start or, with `after call N`, from
  the moment the run's ledger records its N-th model.request (chaos.run.here);
  connections opened before A or kept after B see the toxic only while it
  exists, as on a real Toxiproxy. With the embedded proxy the roll also asks
  the elapsed time, when given a clock (an anchored toxic: its presence alone).
- `down` is the whole proxy (enabled=false), not a per-connection toxic: it
  takes `always` or a `@t` window; `check_performable` refuses a chance or an
  ordinal on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from chaos.faults import KindSpec
from chaos.faults.grammar import Fault
from chaos.faults.schedule import FaultSchedule
from chaos.faults.table import FAMILIES
from chaos.faults.values import Duration, Instant, Rate, Size
from docket.errors import InputError

target = "net"
kinds: dict[str, KindSpec] = dict(FAMILIES["net"].kinds)

# Toxiproxy's type name and, per grammar argument, (attribute, scale to its unit).
# Durations are whole ms in the grammar; slicer's delay is microseconds in Toxiproxy.
_TOXICS: dict[str, tuple[str, dict[str, tuple[str, int]]]] = {
    "latency": ("latency", {"delay": ("latency", 1), "jitter": ("jitter", 1)}),
    "bandwidth": ("bandwidth", {"rate": ("rate", 1)}),
    "slow_close": ("slow_close", {"delay": ("delay", 1)}),
    "timeout": ("timeout", {"timeout": ("timeout", 1)}),
    "reset_peer": ("reset_peer", {"timeout": ("timeout", 1)}),
    "slicer": (
        "slicer",
        {
            "average_size": ("average_size", 1),
            "size_variation": ("size_variation", 1),
            "delay": ("delay", 1000),
        },
    ),
    "limit_data": ("limit_data", {"bytes": ("bytes", 1)}),
}


@dataclass(frozen=True)
class ToxicRequest:
    """One toxic as Toxiproxy's API takes it (POST /proxies/{proxy}/toxics)."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


def toxic_name(index: int, fault: Fault) -> str:
    return f"docket{index}_{fault.kind}"


def check_performable(fault: Fault) -> None:
    """Raise InputError (one line) for a net fault no Toxiproxy can perform."""
    if fault.target != target:
        raise InputError(f"fault {fault.text!r} is not a net fault")
    trigger = fault.trigger
    if fault.kind == "down" and (trigger.chance is not None or trigger.ordinals is not None):
        raise InputError(
            f"fault {fault.text!r}: net:down disables the whole proxy, so it takes "
            "`always` or a `@t` window, not a chance or call ordinals"
        )


def toxicity(fault: Fault) -> float:
    """The fraction of connections the toxic acts on, as a real Toxiproxy reads it."""
    chance = fault.trigger.chance
    return 1.0 if chance is None else chance.basis_points / 10_000


def _unit_value(value: object) -> int:
    if isinstance(value, Duration):
        return value.ms
    if isinstance(value, Size):
        return value.bytes
    if isinstance(value, Rate):
        return value.kb_per_s
    if isinstance(value, int):
        return value
    raise TypeError(f"no Toxiproxy unit for {value!r}")


def toxic_request(fault: Fault, name: str) -> ToxicRequest:
    """The toxic that performs `fault` (any kind but `down`), in Toxiproxy's units."""
    check_performable(fault)
    if fault.kind not in _TOXICS:
        raise ValueError(f"{fault.text} is not a toxic (net:down disables the proxy)")
    toxic_type, scales = _TOXICS[fault.kind]
    attributes = {}
    for arg, (attribute, scale) in scales.items():
        value = fault.arg(arg)
        if value is not None:
            attributes[attribute] = _unit_value(value) * scale
    stream = fault.arg("stream")
    return ToxicRequest(name, toxic_type, str(stream), toxicity(fault), attributes)


def time_window(fault: Fault) -> tuple[float, float | None] | None:
    """(start, end) in seconds after the run's start for a `@t` fault; None otherwise.

    An instant `@t A` is the open window A.. (the fault holds from then on).
    """
    timed = fault.trigger.timed
    if timed is None:
        return None
    if isinstance(timed, Instant):
        return timed.at_ms / 1000, None
    return timed.start_ms / 1000, None if timed.end_ms is None else timed.end_ms / 1000


def anchored(fault: Fault) -> bool:
    """A `@t ... after call N` fault: its window counts from the run's N-th request."""
    timed = fault.trigger.timed
    return timed is not None and timed.after_call is not None


def _timed_from_start(fault: Fault) -> bool:
    return fault.trigger.timed is not None and not anchored(fault)


Roll = Callable[[str, int, str], float]


def schedule_roll(schedule: FaultSchedule, elapsed: Callable[[], float] | None = None) -> Roll:
    """The embedded proxy's roll, derived from the schedule so rolls reproduce from the seed.

    `roll(toxic_name, connection_ordinal, direction)`: the proxy counts
    connections from 0, the schedule's `call` from 1. A toxic the schedule did
    not name (one added by hand) gets a seeded hash of (name, ordinal,
    direction), still reproducible. `elapsed()` (seconds since the run's start)
    is required when a net fault is time-triggered.
    """
    by_name = {
        toxic_name(index, fault): fault
        for index, fault in enumerate(schedule.faults)
        if fault.target == target and fault.kind != "down"
    }
    if elapsed is None:
        timed = [f.text for f in by_name.values() if _timed_from_start(f)]
        if timed:
            raise ValueError(f"{timed[0]} is time-triggered: schedule_roll needs elapsed")
    key = schedule.seed.to_bytes(8, "big")

    def roll(name: str, ordinal: int, direction: str) -> float:
        fault = by_name.get(name)
        if fault is None:
            digest = hashlib.blake2b(
                f"roll\0{name}\0{ordinal}\0{direction}".encode(), key=key, digest_size=8
            ).digest()
            return (int.from_bytes(digest, "big") >> 11) / (1 << 53)
        if anchored(fault):
            # hold_window adds its toxic at the anchor's time and lifts it at the window's
            # end: while the toxic exists, every connection it meets is in the window
            return 0.0
        seconds = elapsed() if elapsed is not None and fault.trigger.timed else None
        return 0.0 if schedule.decide(fault, ordinal + 1, elapsed_s=seconds) else 1.0

    return roll
