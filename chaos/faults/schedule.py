"""The seeded schedule: whether a fault fires at an ordinal, as a pure function.

A decision depends on (seed, fault text, ordinal) only: a keyed BLAKE2b of the
fault's canonical text and the ordinal, read as a 64-bit integer and compared
exactly against the fault's percentage. No global random state, no floats in the
decision, so the same seed gives the same schedule on any platform and Python,
whatever the timing and whatever order the questions are asked in. The one
exception is a `@t` condition, which asks the run's elapsed time: it is
documented as not reproducible at the same ordinals.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from chaos.faults.grammar import Fault, parse_fault
from chaos.faults.values import Instant, Window

SEED_LIMIT = 1 << 64  # the seed is a key of 8 bytes
_UNIT = 1 << 64


def _first_ordinal(counter: str) -> int:
    # call ordinals are 1-based (the first request is call 1); seq is the ledger's own, from 0
    return 1 if counter == "call" else 0


def _check_ordinal(fault: Fault, ordinal: int) -> None:
    first = _first_ordinal(fault.counter)
    if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < first:
        raise ValueError(f"{fault.counter} ordinals are integers from {first}, got {ordinal!r}")


@dataclass(frozen=True)
class FaultSchedule:
    seed: int
    faults: tuple[Fault, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        object.__setattr__(self, "faults", tuple(self.faults))
        texts = [f.text for f in self.faults]
        repeated = sorted({t for t in texts if texts.count(t) > 1})
        if repeated:
            # two equal faults would make the same decisions and one indistinct record
            raise ValueError(f"fault listed twice: {repeated[0]}")

    @classmethod
    def parse(cls, seed: int, texts: Iterable[str]) -> FaultSchedule:
        return cls(seed, tuple(parse_fault(t) for t in texts))

    # -- the pure source

    def _u64(self, fault: Fault, ordinal: int, purpose: str) -> int:
        _check_ordinal(fault, ordinal)
        digest = hashlib.blake2b(
            f"{purpose}\0{fault.text}\0{ordinal}".encode(),
            key=self.seed.to_bytes(8, "big"),
            digest_size=8,
        ).digest()
        return int.from_bytes(digest, "big")

    def draw(self, fault: Fault | int, ordinal: int, purpose: str = "draw") -> float:
        """A number in [0, 1) for a fault's random magnitude (jitter, a size variation).

        Drawn apart from the firing decision (a different `purpose`), so how much
        jitter a call gets is independent of whether it was chosen.
        """
        u = self._u64(self._fault(fault), ordinal, purpose)
        return (u >> 11) / (1 << 53)  # 53 bits: exact in a float, never 1.0

    def decide(self, fault: Fault | int, ordinal: int, *, elapsed_s: float | None = None) -> bool:
        """Whether `fault` fires at `ordinal` (of its counter: see Fault.counter).

        `elapsed_s` (seconds since the run's start, or since the anchor of a
        `@t ... after call N` window) is needed only when the trigger has a `@t`
        condition; asking such a fault without it is an error.
        """
        fault = self._fault(fault)
        _check_ordinal(fault, ordinal)
        trigger = fault.trigger
        ordinals = trigger.ordinals
        if ordinals is not None and not (
            ordinal >= ordinals.first and (ordinals.last is None or ordinal <= ordinals.last)
        ):
            return False
        timed = trigger.timed
        if timed is not None:
            if elapsed_s is None:
                raise ValueError(f"{fault.text} is time-triggered: decide() needs elapsed_s")
            elapsed_ms = elapsed_s * 1000
            if isinstance(timed, Instant):
                if elapsed_ms < timed.at_ms:
                    return False
            elif isinstance(timed, Window) and not (
                timed.start_ms <= elapsed_ms and (timed.end_ms is None or elapsed_ms < timed.end_ms)
            ):
                return False
        chance = trigger.chance
        if chance is None:
            return True
        # exact: u / 2**64 < bp / 10000, in integers
        return self._u64(fault, ordinal, "decide") * 10_000 < chance.basis_points * _UNIT

    # -- what gets printed and recorded

    def resolve(self, max_ordinal: int) -> list[tuple[int, str]]:
        """Every (ordinal, fault text) that fires up to `max_ordinal`, inclusive.

        Only ordinal-triggered faults: a `@t` fault depends on timing and is listed
        by `timed_faults()` instead. Sorted by counter (`call` before `seq`, two
        separate ordinal spaces), then ordinal, then the fault's place in the
        schedule, so the output is stable.
        """
        fired = []
        for index, fault in enumerate(self.faults):
            if fault.trigger.timed is not None:
                continue
            start = _first_ordinal(fault.counter)
            ordinals = fault.trigger.ordinals
            if ordinals is not None:
                start = max(start, ordinals.first)
            stop = max_ordinal if ordinals is None or ordinals.last is None else ordinals.last
            for ordinal in range(start, min(stop, max_ordinal) + 1):
                if self.decide(fault, ordinal):
                    fired.append((fault.counter, ordinal, index, fault.text))
        fired.sort()
        return [(ordinal, text) for _, ordinal, _, text in fired]

    def timed_faults(self) -> list[str]:
        return [f.text for f in self.faults if f.trigger.timed is not None]

    def describe(self, max_ordinal: int) -> str:
        """The resolved schedule as lines for a terminal or a log."""
        lines = [f"fault schedule: seed {self.seed}, {len(self.faults)} fault(s)"]
        counters = {f.text: f.counter for f in self.faults}
        for ordinal, text in self.resolve(max_ordinal):
            lines.append(f"  {counters[text]} {ordinal}: {text}")
        for text in self.timed_faults():
            lines.append(f"  timed (not reproducible at the same ordinals): {text}")
        return "\n".join(lines)

    def receipt_entry(self, max_ordinal: int) -> dict:
        """What the receipt states about the faults: the seed, the texts, the plan."""
        counters = {f.text: f.counter for f in self.faults}
        return {
            "seed": self.seed,
            "faults": [f.text for f in self.faults],
            "max_ordinal": max_ordinal,
            "resolved": [
                {"counter": counters[t], "ordinal": o, "fault": t}
                for o, t in self.resolve(max_ordinal)
            ],
            "timed": self.timed_faults(),
        }

    def injection_event(self, fault: Fault | int, ordinal: int) -> dict:
        """The fields of the `fault.injected` event recorded when `fault` fires."""
        fault = self._fault(fault)
        return {
            "fault": fault.text,
            "seed": self.seed,
            "ordinal": ordinal,
            "counter": fault.counter,
            "target": fault.target,
            "kind": fault.kind,
        }

    def _fault(self, fault: Fault | int) -> Fault:
        if isinstance(fault, Fault):
            return fault
        if isinstance(fault, int) and not isinstance(fault, bool) and 0 <= fault < len(self.faults):
            return self.faults[fault]
        raise ValueError(f"no fault {fault!r} in a schedule of {len(self.faults)}")
