"""The fleet budget's pure core: escrow slices against the pool, and the properties
that hold over any interleaving of boundaries, leases, renewals, expiries, returns
and deaths (docs/fleet.md)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from docket.fleet.amounts import UNCAPPED, ZERO, Amounts, Caps
from docket.fleet.escrow import EXPIRING, NO_LEASE, SLICE_SHORT, Escrow, EscrowConfig
from docket.fleet.pool import Pool

LEASE_S = 30.0
HORIZON_S = 5.0


def config(slice_nusd: int = 100, low_water: str = "1/2") -> EscrowConfig:
    return EscrowConfig(Amounts(nusd=slice_nusd), Fraction(low_water), LEASE_S, HORIZON_S)


def exchange(escrow: Escrow, pool: Pool, now: float, *, short: bool = False):
    ask = escrow.ask(now, short=short)
    assert ask is not None
    escrow.sent(ask, now)
    grant = pool.exchange(ask.lease_id, ask.used, ask.want, now, release=ask.release)
    escrow.exchanged(ask, grant)
    return ask, grant


def test_a_call_waits_for_a_lease_then_draws_from_the_slice():
    pool, escrow = Pool(Caps(nusd=1000), LEASE_S), Escrow(config())
    assert escrow.draw(Amounts(nusd=10, calls=1), 0.0).code == NO_LEASE
    ask, grant = exchange(escrow, pool, 0.0)
    assert ask.reason == "first" and grant.granted == Amounts(nusd=100)
    assert escrow.draw(Amounts(nusd=60, calls=1), 1.0) is None  # calls are not capped: masked
    short = escrow.draw(Amounts(nusd=60), 1.0)
    assert short.code == SLICE_SHORT and short.free == Amounts(nusd=40)
    assert pool.leased == Amounts(nusd=100) and pool.spent == ZERO


def test_an_exchange_whose_answer_was_lost_is_sent_again_and_counted_once():
    pool, escrow = Pool(Caps(nusd=1000), LEASE_S), Escrow(config())
    exchange(escrow, pool, 0.0)
    assert escrow.draw(Amounts(nusd=80), 1.0) is None
    escrow.settle(Amounts(nusd=80), Amounts(nusd=60))
    lost = escrow.ask(1.0)
    escrow.sent(lost, 1.0)
    pool.exchange(lost.lease_id, lost.used, lost.want, 1.0)  # committed, answer lost
    escrow.failed(1.5)
    assert pool.spent == Amounts(nusd=60)
    assert escrow.draw(Amounts(nusd=10), 2.0) is None
    escrow.settle(Amounts(nusd=10), Amounts(nusd=10))
    ask, _ = exchange(escrow, pool, 2.0)  # the same report again, and 10 more
    assert ask.report == Amounts(nusd=70) and ask.used == Amounts(nusd=70)
    assert pool.spent == Amounts(nusd=70)  # not 130
    escrow.draw(Amounts(nusd=5), 3.0)
    escrow.settle(Amounts(nusd=5), Amounts(nusd=5))
    ask, _ = exchange(escrow, pool, 30.0)  # the renewal: whole use 75, 5 of it new
    assert ask.report == Amounts(nusd=5) and ask.used == Amounts(nusd=75)
    assert pool.spent == Amounts(nusd=75)


def test_settling_reports_at_the_next_exchange_and_tops_up_to_one_slice():
    pool, escrow = Pool(Caps(nusd=1000), LEASE_S), Escrow(config())
    exchange(escrow, pool, 0.0)
    assert escrow.draw(Amounts(nusd=80), 1.0) is None
    escrow.settle(Amounts(nusd=80), Amounts(nusd=30))
    ask = escrow.ask(1.0)
    assert ask is None  # free is 70: above the low-water mark of 50
    assert escrow.draw(Amounts(nusd=40), 1.0) is None  # free 30 now: below it
    ask, grant = exchange(escrow, pool, 2.0)
    assert ask.reason == "low_water" and ask.report == Amounts(nusd=30)
    assert grant.granted == Amounts(nusd=70)  # back to one slice free
    assert pool.spent == Amounts(nusd=30) and pool.leased == Amounts(nusd=140)
    assert escrow.free == Amounts(nusd=100)


def test_a_lease_is_renewed_halfway_and_draws_stop_a_horizon_before_expiry():
    pool, escrow = Pool(Caps(nusd=1000), LEASE_S), Escrow(config())
    exchange(escrow, pool, 0.0)
    assert escrow.ask(LEASE_S / 2 - 0.1) is None
    assert escrow.draw(Amounts(nusd=1), LEASE_S - HORIZON_S - 0.1) is None
    assert escrow.draw(Amounts(nusd=1), LEASE_S - HORIZON_S + 0.1).code == EXPIRING
    ask, _ = exchange(escrow, pool, LEASE_S - 1)
    assert ask.reason == "renew"
    assert escrow.draw(Amounts(nusd=1), LEASE_S + 1) is None


def test_an_expired_lease_is_folded_into_lapsed_and_a_late_report_settles_it():
    pool, escrow = Pool(Caps(nusd=1000), LEASE_S), Escrow(config())
    exchange(escrow, pool, 0.0)
    escrow.draw(Amounts(nusd=40), 1.0)
    escrow.settle(Amounts(nusd=40), Amounts(nusd=40))
    assert pool.reclaim(LEASE_S + 1) == ["L0"]
    assert pool.lapsed == Amounts(nusd=100) and pool.leased == ZERO
    escrow.failed(LEASE_S + 1)  # the boundary's exchange went unanswered: lapsed here too
    assert escrow.draw(Amounts(nusd=1), LEASE_S + 1).code == NO_LEASE
    ask, grant = exchange(escrow, pool, LEASE_S + 2)
    assert ask.reason == "lapsed" and grant.lapsed and grant.lease_id != "L0"
    assert pool.lapsed == ZERO and pool.spent == Amounts(nusd=40)
    assert pool.leased == Amounts(nusd=100)


def test_a_dead_boundarys_lease_is_not_spent_twice():
    """Killed with 60 used and unreported: its lease lapses, and the other boundary
    can lease only what the dead one could not have spent."""
    pool = Pool(Caps(nusd=200), LEASE_S)
    dead, live = Escrow(config()), Escrow(config())
    exchange(dead, pool, 0.0)
    assert dead.draw(Amounts(nusd=60), 1.0) is None  # spent upstream, never reported
    pool.reclaim(LEASE_S + 1)
    spent = 0
    for t in range(40):
        now = LEASE_S + 1 + t
        if live.ask(now, short=True) is not None:
            exchange(live, pool, now, short=True)
        if live.draw(Amounts(nusd=10), now) is None:
            live.settle(Amounts(nusd=10), Amounts(nusd=10))
            spent += 10
    assert spent == 100 and 60 + spent <= 200  # the dead lease's 100 stays out of reach
    assert pool.lapsed == Amounts(nusd=100)


def test_the_last_grant_is_what_is_left_and_then_nothing():
    pool = Pool(Caps(nusd=250), LEASE_S)
    a, b, c = (Escrow(config()) for _ in range(3))
    grants = [exchange(e, pool, 0.0)[1].granted.nusd for e in (a, b, c)]
    assert grants == [100, 100, 50]
    assert c.ask(0.0) is None  # the budget is nearly spent: no low-water ask
    assert exchange(c, pool, 0.0, short=True)[1].granted == ZERO


def test_a_call_larger_than_a_slice_is_asked_for_whole():
    pool, escrow = Pool(Caps(nusd=1000), LEASE_S), Escrow(config(slice_nusd=100))
    exchange(escrow, pool, 0.0)
    assert escrow.draw(Amounts(nusd=250), 1.0).code == SLICE_SHORT
    ask, grant = exchange(escrow, pool, 1.0, short=True)
    assert ask.want == Amounts(nusd=150) and grant.granted == Amounts(nusd=150)
    assert escrow.draw(Amounts(nusd=250), 1.0) is None
    assert escrow.short_need == ZERO  # asked for once


def test_at_the_budgets_end_a_refused_boundary_releases_its_free_part_for_the_next():
    """Four boundaries each hold 30 free, the budget has no room, and a call costs up
    to 50: none can serve it alone. Refused, each gives its 30 back (asking nothing in
    the same exchange); the next one refused gathers them and serves."""
    pool = Pool(Caps(nusd=400), LEASE_S)
    es = [Escrow(config()) for _ in range(4)]
    for e in es:
        exchange(e, pool, 0.0)
        assert e.draw(Amounts(nusd=70), 0.0) is None  # 30 free left in each
        e.settle(Amounts(nusd=70), Amounts(nusd=70))
    need = Amounts(nusd=50)
    a, b = es[0], es[1]
    assert a.draw(need, 1.0).code == SLICE_SHORT
    ask, grant = exchange(a, pool, 1.0, short=True)  # asks the room for more: none
    assert ask.reason == "low_water" and grant.granted == ZERO
    assert a.draw(need, 1.0).code == SLICE_SHORT
    ask, _ = exchange(a, pool, 1.0, short=True)
    assert ask.reason == "release" and ask.want == ZERO and ask.release == Amounts(nusd=30)
    assert a.free == ZERO and pool.caps.room(pool.spent + pool.leased) == Amounts(
        nusd=30, tokens=UNCAPPED, calls=UNCAPPED
    )
    assert b.draw(need, 1.0).code == SLICE_SHORT
    ask, grant = exchange(b, pool, 1.0, short=True)
    assert grant.granted == Amounts(nusd=30) and b.draw(need, 1.0) is None
    assert a.ask(1.0, short=False) is None  # not refused since: it takes nothing back
    renewal = a.ask(1.0 + LEASE_S / 2 + 0.1)  # its lease was last extended at 1.0
    assert renewal.reason == "renew" and renewal.want == ZERO


def test_config_is_checked():
    with pytest.raises(ValueError, match="horizon_seconds"):
        EscrowConfig(Amounts(nusd=1), Fraction(1, 2), 10.0, 10.0)
    with pytest.raises(ValueError, match="low_water"):
        EscrowConfig(Amounts(nusd=1), Fraction(3, 2), 10.0, 1.0)


# ---------------------------------------------------------------- any interleaving

BOUNDARIES = 4
SLICE = Amounts(nusd=50, tokens=40, calls=3)


class FleetMachine(RuleBasedStateMachine):
    """N boundaries against one pool, over one clock. A call drawn at t runs no longer
    than the horizon (the boundary's deadline cuts it: used is then its worst case); a
    killed boundary's calls in flight are spent in full, its unreported use is lost to
    the pool, and it never reports again. What every call really used is `actual`."""

    @initialize(
        cap=st.integers(20, 200),
        low=st.sampled_from(["0", "1/4", "1/2", "1"]),
    )
    def setup(self, cap, low):
        self.pool = Pool(Caps(nusd=cap, tokens=cap, calls=cap // 10 + 1), LEASE_S)
        cfg = EscrowConfig(SLICE, Fraction(low), LEASE_S, HORIZON_S)
        self.escrows = [Escrow(cfg) for _ in range(BOUNDARIES)]
        self.alive = [True] * BOUNDARIES
        self.in_flight: list[list[tuple[Amounts, float]]] = [[] for _ in range(BOUNDARIES)]
        self.released = [ZERO] * BOUNDARIES  # worst case minus use, settled while asking
        self.refused = [0] * BOUNDARIES  # calls refused since the boundary's last exchange
        self.releases = [0] * BOUNDARIES
        self.holding_off = [False] * BOUNDARIES  # released: asks nothing until refused
        self.now = 0.0
        self.actual = ZERO

    def _settle(self, i: int, k: int, used: Amounts) -> None:
        need, _ = self.in_flight[i].pop(k)
        self.escrows[i].settle(need, used)
        self.actual += self.escrows[i].mask(used)
        if self.escrows[i].sending is not None:
            self.released[i] += self.escrows[i].mask(need - used)

    @rule(i=st.integers(0, BOUNDARIES - 1), nusd=st.integers(0, 30), tokens=st.integers(0, 20))
    def call(self, i, nusd, tokens):
        if self.alive[i]:
            need = Amounts(nusd, tokens, 1)
            if self.escrows[i].draw(need, self.now) is None:
                self.in_flight[i].append((need, self.now))
            else:
                self.refused[i] += 1

    @rule(i=st.integers(0, BOUNDARIES - 1), k=st.integers(0, 7), share=st.fractions(0, 1))
    def finish(self, i, k, share):
        if self.alive[i] and self.in_flight[i]:
            need, _ = self.in_flight[i][k % len(self.in_flight[i])]
            used = Amounts(int(need.nusd * share), int(need.tokens * share), 1)
            self._settle(i, k % len(self.in_flight[i]), used)

    @rule(
        i=st.integers(0, BOUNDARIES - 1),
        short=st.booleans(),
        answer=st.sampled_from(["now", "late", "never", "lost"]),
    )
    def go_to_budget(self, i, short, answer):
        e = self.escrows[i]
        if not self.alive[i] or e.sending is not None:
            return
        # The lease asks `short` only for a call refused since its last exchange.
        ask = e.ask(self.now, short=short and self.refused[i] > 0)
        if ask is None:
            return
        if ask.release != ZERO:
            # No ping-pong: a release follows a call refused since the boundary's last
            # exchange, and asks nothing back in the same exchange.
            assert self.refused[i] > 0 and ask.want == ZERO
            assert e.free.covers(ask.release) and ask.release.covers(ZERO)
            self.releases[i] += 1
        elif self.holding_off[i] and not ask.short:
            assert ask.want == ZERO  # what it released is not taken back unasked
        self.holding_off[i] = ask.release != ZERO or (self.holding_off[i] and not ask.short)
        self.refused[i] = 0
        asked_for = e.mask(e.short_need)  # a call larger than a slice is asked for whole
        e.sent(ask, self.now)
        self.released[i] = ZERO
        if answer == "never":
            e.failed(self.now)
            return
        if answer == "lost":  # the budget took it; its answer never came back
            self.pool.exchange(
                ask.lease_id, ask.used, ask.want, self.now, release=ask.release, run=f"b{i}"
            )
            e.failed(self.now)
            return
        if answer == "late":  # the server reads its clock after the client sent
            self.advance(min(HORIZON_S, 1.0))
            if not self.alive[i]:
                return
        grant = self.pool.exchange(
            ask.lease_id, ask.used, ask.want, self.now, release=ask.release, run=f"b{i}"
        )
        e.exchanged(ask, grant)
        # Slice sizing: never more than one slice free (or the one call larger than a
        # slice that was refused), but for what calls settled below their worst case
        # while the exchange was under way.
        size = e.slice_size()
        assert (e.free - self.released[i]).nusd <= max(size.nusd, asked_for.nusd)
        assert (e.free - self.released[i]).tokens <= max(size.tokens, asked_for.tokens)

    @rule(dt=st.floats(0.0, 20.0))
    def advance(self, dt):
        self.now += dt
        for i in range(BOUNDARIES):  # the deadline cuts a call at the horizon
            while self.alive[i] and any(t + HORIZON_S <= self.now for _, t in self.in_flight[i]):
                k = next(
                    k for k, (_, t) in enumerate(self.in_flight[i]) if t + HORIZON_S <= self.now
                )
                self._settle(i, k, self.in_flight[i][k][0])
            self.escrows[i].lapse_if_due(self.now)

    @rule()
    def reclaim(self):
        self.pool.reclaim(self.now)

    @rule(i=st.integers(0, BOUNDARIES - 1))
    def kill(self, i):
        if self.alive[i]:
            self.alive[i] = False
            for need, _ in self.in_flight[i]:
                self.actual += self.escrows[i].mask(need)
            self.in_flight[i] = []

    @precondition(lambda self: any(self.alive))
    @rule(i=st.integers(0, BOUNDARIES - 1))
    def give_back(self, i):
        e = self.escrows[i]
        if not self.alive[i] or e.sending is not None:
            return
        while self.in_flight[i]:
            self._settle(i, 0, self.in_flight[i][0][0])
        ask = e.closing()
        if ask is not None:
            self.pool.give_back(ask.lease_id, ask.used, self.now)
            # a lease a lost answer opened is closed with the run: nothing of it is held
            run = [lease for lease in self.pool.leases.values() if lease.run == f"b{i}"]
            assert all(lease.state == "returned" for lease in run)
        self.alive[i] = False

    @invariant()
    def never_over_the_cap(self):
        caps = self.pool.caps
        assert self.actual.nusd <= caps.nusd
        assert self.actual.tokens <= caps.tokens
        assert self.actual.calls <= caps.calls
        held = self.pool.spent + self.pool.leased + self.pool.lapsed
        assert held.nusd <= caps.nusd and held.tokens <= caps.tokens and held.calls <= caps.calls
        assert self.pool.spent.covers(ZERO) and self.pool.leased.covers(ZERO)

    @invariant()
    def nothing_is_counted_twice(self):
        # What the budget counts as spent was reported, and a report covers only use
        # that happened: an exchange sent again after its answer was lost adds nothing.
        spent, actual = self.pool.spent, self.actual
        assert spent.nusd <= actual.nusd and spent.tokens <= actual.tokens
        assert spent.calls <= actual.calls

    @invariant()
    def the_pool_counts_every_lease(self):
        total = ZERO
        for lease in self.pool.leases.values():
            if lease.state == "active":
                total += lease.amount
        assert total == self.pool.leased


TestFleetMachine = FleetMachine.TestCase
TestFleetMachine.settings = settings(stateful_step_count=60, deadline=None)
