"""The fleet budget in a real PostgreSQL (tests/postgres_server.py): the schema, the
conditional lease, reports, give-backs, server-time expiry, and many threads at once."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import psycopg
import pytest

from docket.fleet.amounts import Amounts, Caps
from docket.fleet.store import FleetStore, FleetStoreError, NoSuchBudget

N = 1_000_000_000  # one USD in nano-USD


def exchange(store, lease_id, report, want, run="r1", lease_s=30.0, budget="b"):
    return store.exchange(
        budget, lease_id, report, want, run_id=run, host="h", lease_seconds=lease_s
    )


def test_init_is_idempotent_and_versioned(fleet_dsn):
    store = FleetStore(fleet_dsn)
    assert store.init() == 2 and store.init() == 2
    with psycopg.connect(fleet_dsn) as conn:
        conn.execute("UPDATE fleet_schema_version SET version = 99")
    with pytest.raises(FleetStoreError, match="schema version 99, newer than this docket.s 2"):
        store.init()


def test_lease_report_and_give_back(fleet_dsn):
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=5 * N, calls=100))
    got = exchange(store, None, Amounts(), Amounts(nusd=2 * N, tokens=999, calls=10))
    assert got.grant.granted == Amounts(nusd=2 * N, tokens=0, calls=10)  # tokens: no cap
    lease = got.grant.lease_id
    again = exchange(store, lease, Amounts(nusd=N // 2, calls=3), Amounts(nusd=N // 2, calls=3))
    assert again.grant.lease_id == lease and not again.grant.lapsed
    s = store.status("b")
    assert s["spent"]["nusd"] == N // 2 and s["leased"]["nusd"] == 2 * N
    assert s["leases"][0]["held"] == {"nusd": 2 * N, "tokens": 0, "calls": 10}
    store.give_back("b", lease, Amounts(nusd=N // 4, calls=1))
    s = store.status("b")
    assert s["spent"] == {"nusd": 3 * N // 4, "tokens": 0, "calls": 4}
    assert s["leased"] == {"nusd": 0, "tokens": 0, "calls": 0} and s["leases"] == []


def test_the_grant_is_what_room_is_left_then_nothing(fleet_dsn):
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=5 * N))
    grants = [
        exchange(store, None, Amounts(), Amounts(nusd=2 * N), run=f"r{i}").grant.granted.nusd
        for i in range(4)
    ]
    assert grants == [2 * N, 2 * N, N, 0]


def test_expiry_is_the_servers_and_folds_into_lapsed(fleet_dsn):
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=5 * N))
    first = exchange(store, None, Amounts(), Amounts(nusd=2 * N), lease_s=0.2).grant
    deadline = time.monotonic() + 10
    while store.status("b")["lapsed"]["nusd"] == 0:
        assert time.monotonic() < deadline, "the lease never lapsed"
        time.sleep(0.05)
    s = store.status("b")
    assert s["leased"]["nusd"] == 0 and s["lapsed"]["nusd"] == 2 * N
    assert (
        exchange(store, None, Amounts(), Amounts(nusd=5 * N), run="r2").grant.granted.nusd == 3 * N
    )
    late = exchange(store, first.lease_id, Amounts(nusd=N // 2), Amounts(), lease_s=30)
    assert late.grant.lapsed and late.grant.lease_id != first.lease_id
    s = store.status("b")
    assert s["lapsed"]["nusd"] == 0 and s["spent"]["nusd"] == N // 2


def test_two_budgets_do_not_touch(fleet_dsn):
    store = FleetStore(fleet_dsn)
    store.set_budget("a", Caps(nusd=N))
    store.set_budget("b", Caps(nusd=N))
    exchange(store, None, Amounts(), Amounts(nusd=N), budget="a")
    assert exchange(store, None, Amounts(), Amounts(nusd=N), budget="b").grant.granted.nusd == N
    assert store.status("a")["leased"]["nusd"] == N and store.status("b")["leased"]["nusd"] == N


def test_threads_racing_for_leases_never_pass_the_cap(fleet_dsn):
    store = FleetStore(fleet_dsn, timeout_s=20)
    store.set_budget("b", Caps(nusd=10 * N))
    granted: list[int] = []
    errors: list[BaseException] = []

    def lease_all(run: str) -> None:
        try:
            lease = None
            for _ in range(10):
                got = exchange(store, lease, Amounts(), Amounts(nusd=N // 3), run=run).grant
                lease = got.lease_id
                granted.append(got.granted.nusd)
        except Exception as exc:  # noqa: BLE001  (said by the assert below)
            errors.append(exc)

    threads = [threading.Thread(target=lease_all, args=(f"r{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sum(granted) == 10 * N  # 80 asks of a third: all of the cap and no more
    assert store.status("b")["leased"]["nusd"] == 10 * N


def test_unknown_budget_and_unreachable_database(fleet_dsn):
    with pytest.raises(NoSuchBudget, match="no fleet budget 'nope'"):
        FleetStore(fleet_dsn).status("nope")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(FleetStoreError):
        FleetStore(f"host=127.0.0.1 port={port} user=docket dbname=x", timeout_s=1).status("b")


def test_a_runs_role_can_lease_and_report_but_not_touch_the_tables(fleet_dsn):
    role = f"runs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        admin = FleetStore(fleet_dsn)
        admin.init(runs_role=role)
        admin.set_budget("b", Caps(nusd=N))
        runs = FleetStore(fleet_dsn.replace("user=docket", f"user={role}"))
        got = exchange(runs, None, Amounts(), Amounts(nusd=N // 2))
        assert got.grant.granted.nusd == N // 2
        runs.give_back("b", got.grant.lease_id, Amounts(nusd=N // 4))
        assert admin.status("b")["spent"]["nusd"] == N // 4
        with pytest.raises(psycopg.errors.InsufficientPrivilege), psycopg.connect(runs.dsn) as c:
            c.execute("UPDATE fleet_budgets SET cap_nusd = cap_nusd * 1000")
        with pytest.raises(FleetStoreError, match="permission denied"):
            runs.status("b")  # an admin's reading: the tables
        with pytest.raises(FleetStoreError, match="permission denied"):
            runs.set_budget("b", Caps(nusd=1000 * N))
        with pytest.raises(FleetStoreError, match="amounts must be >= 0"):
            exchange(runs, None, Amounts(nusd=-N), Amounts())  # no unreporting spend
        assert admin.status("b")["cap"]["nusd"] == N
    finally:
        with psycopg.connect(fleet_dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
