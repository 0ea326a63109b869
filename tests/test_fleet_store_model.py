"""The SQL keeps the pool's arithmetic: any sequence of exchanges, give-backs and
expiries run against PostgreSQL (docket/fleet/schema.py's functions) and against
docket/fleet/pool.py gives the same grants and the same spent, leased and lapsed
(releases included: a lease's free amount given back to the room)."""

from __future__ import annotations

import itertools

from helpers import io_examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docket.fleet.amounts import Amounts, Caps
from docket.fleet.pool import Pool
from docket.fleet.store import FleetStore

NAMES = itertools.count()
SMALL = st.integers(0, 40)
AMOUNTS = st.builds(Amounts, SMALL, SMALL, st.integers(0, 4))
# (which lease: None new, else an index into those opened; its whole use; want; expires at
# once; release: free amount given back to the room first)
EXCHANGE = st.tuples(st.none() | st.integers(0, 5), AMOUNTS, AMOUNTS, st.booleans(), AMOUNTS)
GIVE_BACK = st.tuples(st.integers(0, 5), AMOUNTS)
OPS = st.lists(st.one_of(EXCHANGE, GIVE_BACK), min_size=1, max_size=12)
CAPS = st.builds(
    Caps, st.integers(1, 120), st.none() | st.integers(1, 120), st.none() | st.integers(1, 9)
)


@settings(
    max_examples=io_examples(),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(caps=CAPS, ops=OPS)
def test_the_database_keeps_the_pools_arithmetic(fleet_dsn, caps, ops):
    store, budget = FleetStore(fleet_dsn), f"model{next(NAMES)}"
    store.set_budget(budget, caps)
    pool = Pool(caps, lease_seconds=3600)
    db_ids: list[str] = []  # the leases opened, in order, on each side
    pool_ids: list[str] = []
    for now, op in enumerate(ops, start=1):
        if len(op) == 5:
            which, report, want, at_once, release = op
            lease_s = 0.001 if at_once else 3600  # 1 ms: expired by the next call, on both sides
            known = which is not None and which < len(db_ids)
            got = store.exchange(
                budget, db_ids[which] if known else None, report, want,
                run_id="r", host="h", lease_seconds=lease_s, release=release,
            ).grant  # fmt: skip
            expected = pool.exchange(
                pool_ids[which] if known else None,
                report,
                want,
                now,
                lease_s,
                release=release,
                run="r",
            )
            assert (got.granted, got.lapsed) == (expected.granted, expected.lapsed), op
            if not known or got.lease_id != db_ids[which]:
                db_ids.append(got.lease_id)
                pool_ids.append(expected.lease_id)
        elif db_ids:
            which, report = op
            store.give_back(budget, db_ids[which % len(db_ids)], report)
            pool.give_back(pool_ids[which % len(pool_ids)], report, now)
        status = store.status(budget)
        pool.reclaim(now + 1)  # status folds what has expired, as every call does
        for part, model in (
            ("spent", pool.spent),
            ("leased", pool.leased),
            ("lapsed", pool.lapsed),
        ):
            assert status[part] == model.as_dict(), (part, op)
