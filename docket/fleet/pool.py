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

A report is a lease's whole use so far, never use since the last report: the
budget counts only what the lease does not yet record, so an exchange sent again
after its answer was lost (it had committed) adds nothing (schema.fleet_report).
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
    used: Amounts = ZERO  # the whole use reported on it
    run: str = ""


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
        used: Amounts,
        want: Amounts,
        now: float,
        lease_seconds: float | None = None,
        release: Amounts = ZERO,
        run: str = "",
    ) -> Grant:
        """Take `used` (the lease's whole use) as spent, give `release` of the lease
        back to the room, then add what room allows of `want` and extend it; a lapsed
        or unknown lease is settled and a new one opened."""
        self.reclaim(now)
        lease = self.leases.get(lease_id) if lease_id is not None else None
        if lease is not None and self._report(lease, used) == ACTIVE:
            freed = least(release, lease.amount)
            lease.amount -= freed
            self.leased -= freed
            lapsed = False
        else:
            lapsed = lease_id is not None
            if lease is None:
                self.spent += used  # no lease the budget knows: charged whole
            lease = PoolLease(f"L{next(self._ids)}", ZERO, now, run=run)
            self.leases[lease.id] = lease
        held = self.spent + self.leased + self.lapsed
        grant = self._capped(least(want, self.caps.room(held)))
        if not self._within(held + grant):
            grant = ZERO  # a dimension already past its cap (a report over a reservation)
        lease.amount += grant
        self.leased += grant
        lease.expires_at = now + (self.lease_seconds if lease_seconds is None else lease_seconds)
        return Grant(lease.id, grant, self.caps, lapsed=lapsed)

    def give_back(self, lease_id: str, used: Amounts, now: float) -> None:
        """The run is over: `used` (the lease's whole use) is spent, the rest of the
        lease is room again; so are its run's other leases still active or lapsed (ones
        an exchange whose answer was lost opened: the run never drew on them)."""
        self.reclaim(now)
        lease = self.leases[lease_id]
        if self._report(lease, used) == ACTIVE:
            self.leased -= lease.amount
            lease.state = RETURNED
        for other in self.leases.values():
            if other.run == lease.run and other is not lease:
                if other.state == ACTIVE:
                    self.leased -= other.amount
                elif other.state == LAPSED:
                    self.lapsed -= other.amount
                other.state = RETURNED

    def _report(self, lease: PoolLease, used: Amounts) -> str:
        """Count what `used` adds to the lease's recorded use; its state before."""
        more = _above(used, lease.used)
        lease.used += more
        self.spent += more
        state = lease.state
        if state == ACTIVE:
            taken = least(more, lease.amount)  # never below zero (use over a reservation)
            lease.amount -= taken
            self.leased -= taken
        elif state == LAPSED:
            self.lapsed -= lease.amount
            lease.state = RETURNED
        return state

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


def _above(a: Amounts, b: Amounts) -> Amounts:
    """What `a` has beyond `b`, in each dimension (never negative)."""
    return Amounts(max(0, a.nusd - b.nusd), max(0, a.tokens - b.tokens), max(0, a.calls - b.calls))
