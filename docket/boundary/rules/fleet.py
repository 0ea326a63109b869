"""fleet: the fleet budget's slice covers the call's worst case.  503 docket_fleet_unavailable

Asked after caps (it draws the caps' reservation out of the slice this boundary
leased, docs/fleet.md): a call the slice cannot cover, when no more can be leased
(the budget is spent, or its database is unreachable or late), is refused with
Retry-After; a slice already leased keeps serving until its lease runs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from docket.boundary.calls import CallFacts, Fact
from docket.boundary.rules.base import Refusal, Rule, denied
from docket.fleet.amounts import Amounts
from docket.fleet.lease import RETRY_AFTER_S

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost


@dataclass(frozen=True)
class Uncovered:
    """The slice cannot cover the call (escrow.Short's code), and why, in words."""

    code: str
    reason: str


# None: covered (or no [fleet] table)
FACT: Fact[Uncovered | None] = Fact("fleet")


def check(uncovered: Uncovered | None, f: CallFacts) -> Refusal | None:
    if uncovered is None:
        return None
    return denied(
        f,
        f"fleet.{uncovered.code}",
        "docket_fleet_unavailable",
        uncovered.reason,
        extra={"code": uncovered.code},
        retry_after_s=RETRY_AFTER_S,
    )


async def learn(host: AdmissionHost, call: Admitting) -> None:
    fleet, held = host.fleet, call.reservation
    if fleet is None or held is None:
        call.facts[FACT] = None
        return
    need = Amounts(held.nusd, held.tokens, 1)
    short = await fleet.cover(held.id, need)
    call.facts[FACT] = None if short is None else Uncovered(short.code, fleet.refusal_reason(short))


RULE = Rule("fleet", FACT, check, learn)
