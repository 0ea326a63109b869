"""The shared budget's arithmetic, in memory: the model store.py's SQL keeps.

A budget has caps, `spent` (reported use), `leased` (the leases' amounts: slices
held by boundaries, part of which may be in flight or used and not yet reported)
and `lapsed` (the amounts of leases that expired without being given back: what
their boundaries used of them is unknown, so it is counted as spent until the
boundary reports it). A lease is granted only out of the room under every cap:

    spent + leased + lapsed + grant <= cap        (in every capped dimension)

and a boundary spends only out of its lease, so what is spent never passes the
cap. An expired lease is folded into `lapsed`, not given back to the room: its
boundary may have spent any of it before it died, and no one else may spend that
again (docs/fleet.md, "why overshoot stays zero"). A late report from a boundary
that lived (it was cut off from the budget) settles it: the lapsed amount goes,
what it used is spent, and the rest is room again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from docket.fleet.amounts import ZERO, Amounts, Caps, least
from docket.fleet.escrow import Grant

ACTIVE, LAPSED, RETURNED = "active", "lapsed", "returned"


@dataclass
class PoolLease:
    id: str
    amount: Amounts
    expires_at: float
    state: str = ACTIVE


@dataclass
class Pool:
    caps: Caps
    lease_seconds: float
    spent: Amounts = ZERO
    leased: Amounts = ZERO
    lapsed: Amounts = ZERO
    leases: dict[str, PoolLease] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count)

    def reclaim(self, now: float) -> list[str]:
        """Fold every lease past its expiry into `lapsed` (any caller does this)."""
        folded = []
        for lease in self.leases.values():
            if lease.state == ACTIVE and lease.expires_at <= now:
                lease.state = LAPSED
                self.leased -= lease.amount
                self.lapsed += lease.amount
                folded.append(lease.id)
        return folded

    def exchange(
        self,
        lease_id: str | None,
        report: Amounts,
        want: Amounts,
        now: float,
        lease_seconds: float | None = None,
        release: Amounts = ZERO,
    ) -> Grant:
        """Take `report` as spent from the lease, give `release` of it back to the
        room, then add what room allows of `want` and extend it; a lapsed or unknown
        lease is settled and a new one opened."""
        self.reclaim(now)
        lease = self.leases.get(lease_id) if lease_id is not None else None
        lapsed = False
        if lease is not None and lease.state == ACTIVE:
            taken = least(report, lease.amount)  # never below zero (use over a reservation)
            self.leased -= taken
            lease.amount -= taken
            self.spent += report
            freed = least(release, lease.amount)
            lease.amount -= freed
            self.leased -= freed
        else:
            lapsed = lease_id is not None
            if lease is not None:
                self._settle_closed(lease, report)
            else:
                self.spent += report
            lease = PoolLease(f"L{next(self._ids)}", ZERO, now)
            self.leases[lease.id] = lease
        held = self.spent + self.leased + self.lapsed
        grant = self._capped(least(want, self.caps.room(held)))
        if not self._within(held + grant):
            grant = ZERO  # a dimension already past its cap (a report over a reservation)
        lease.amount += grant
        self.leased += grant
        lease.expires_at = now + (self.lease_seconds if lease_seconds is None else lease_seconds)
        return Grant(lease.id, grant, self.caps, lapsed=lapsed)

    def give_back(self, lease_id: str, report: Amounts, now: float) -> None:
        """The run is over: `report` is spent, the rest of the lease is room again."""
        self.reclaim(now)
        lease = self.leases[lease_id]
        if lease.state == ACTIVE:
            self.leased -= lease.amount
            self.spent += report
            lease.state = RETURNED
        else:
            self._settle_closed(lease, report)

    def _settle_closed(self, lease: PoolLease, report: Amounts) -> None:
        if lease.state == LAPSED:
            self.lapsed -= lease.amount
            lease.state = RETURNED
        self.spent += report

    def _within(self, a: Amounts) -> bool:
        room = self.caps.room(a)
        return room.nusd >= 0 and room.tokens >= 0 and room.calls >= 0

    def _capped(self, a: Amounts) -> Amounts:
        c = self.caps
        return Amounts(
            a.nusd if c.nusd is not None else 0,
            a.tokens if c.tokens is not None else 0,
            a.calls if c.calls is not None else 0,
        )
