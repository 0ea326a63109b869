"""The caps guard of a boundary under a fleet budget: every reservation it settles,
fails or cancels is settled in the fleet escrow too (what the call drew of the
slice goes back, what it was charged is used), whichever path closes the call."""

from __future__ import annotations

from docket.fleet.amounts import ZERO, Amounts
from docket.fleet.lease import FleetLease
from docket.guards.caps import CapLimits, CapsGuard, Reservation, Settlement
from docket.pricing import PriceTable, Usage


class FleetCapsGuard(CapsGuard):
    def __init__(self, caps: CapLimits, prices: PriceTable, fleet: FleetLease) -> None:
        super().__init__(caps, prices)
        self.fleet = fleet

    def settle(self, reservation: Reservation, usage: Usage) -> Settlement:
        done = super().settle(reservation, usage)
        self.fleet.settle(reservation.id, Amounts(done.charged_nusd, done.charged_tokens, 1))
        return done

    def fail(self, reservation: Reservation) -> Settlement:
        done = super().fail(reservation)
        self.fleet.settle(reservation.id, Amounts(done.charged_nusd, done.charged_tokens, 1))
        return done

    def cancel(self, reservation: Reservation) -> None:
        super().cancel(reservation)
        self.fleet.settle(reservation.id, ZERO)
