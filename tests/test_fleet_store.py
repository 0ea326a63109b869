"""The fleet budget in a real PostgreSQL (tests/postgres_server.py): the schema and its
migration from version 1, the conditional lease, reports, give-backs, server-time
expiry, dead runs' candidates and settles, and many threads at once."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import psycopg
import pytest

from docket.cli import main as cli_main
from docket.errors import InputError
from docket.fleet.amounts import Amounts, Caps
from docket.fleet.schema import SCHEMA_VERSION, V1_TABLES
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
    # a report is the lease's whole use: N // 2 and 3 calls were taken already
    store.give_back("b", lease, Amounts(nusd=3 * N // 4, calls=4))
    s = store.status("b")
    assert s["spent"] == {"nusd": 3 * N // 4, "tokens": 0, "calls": 4}
    assert s["leased"] == {"nusd": 0, "tokens": 0, "calls": 0} and s["leases"] == []


def test_an_exchange_sent_again_after_its_answer_was_lost_counts_nothing_twice(fleet_dsn):
    # The boundary sends an exchange again when it heard no answer, though the first
    # may have committed: the same whole use, and perhaps more since.
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=5 * N))
    lease = exchange(store, None, Amounts(), Amounts(nusd=2 * N)).grant.lease_id
    for _ in range(3):  # the first committed, its answer lost; sent twice more
        exchange(store, lease, Amounts(nusd=N // 4), Amounts())
    s = store.status("b")
    assert s["spent"]["nusd"] == N // 4 and s["leased"]["nusd"] == 2 * N - N // 4
    exchange(store, lease, Amounts(nusd=N // 2), Amounts())  # a quarter more since
    exchange(store, lease, Amounts(nusd=N // 3), Amounts())  # an old one, arriving late
    s = store.status("b")
    assert s["spent"]["nusd"] == N // 2 and s["leased"]["nusd"] == 2 * N - N // 2
    store.give_back("b", lease, Amounts(nusd=N // 2))
    store.give_back("b", lease, Amounts(nusd=N // 2))  # its answer lost too
    s = store.status("b")
    assert s["spent"]["nusd"] == N // 2 and s["leased"]["nusd"] == 0 and s["lapsed"]["nusd"] == 0


def test_a_lease_a_lost_answer_opened_is_given_back_with_the_run(fleet_dsn):
    # The first exchange committed (a lease, a grant) but its answer was lost: the run
    # asks again and gets another lease. At its end both are given back.
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=5 * N))
    exchange(store, None, Amounts(), Amounts(nusd=N))  # never heard of
    other = exchange(store, None, Amounts(), Amounts(nusd=N), run="r2")  # another run's
    lease = exchange(store, None, Amounts(), Amounts(nusd=N)).grant.lease_id
    assert store.status("b")["leased"]["nusd"] == 3 * N
    done = store.give_back("b", lease, Amounts(nusd=N // 10))
    assert (done.other_leases, done.others) == (1, Amounts(nusd=N))
    s = store.status("b")
    assert s["spent"]["nusd"] == N // 10 and s["leased"]["nusd"] == N  # r2's stays
    assert [x["run_id"] for x in s["leases"]] == ["r2"]
    assert store.give_back("b", other.grant.lease_id, Amounts()).other_leases == 0


def test_a_boundary_of_version_1_still_reports_use_since_its_last_report(fleet_dsn):
    # A rolling upgrade: version 1's exchange and give-back keep their meaning.
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=5 * N))
    with psycopg.connect(fleet_dsn, autocommit=True) as conn:
        (lease, granted) = conn.execute(
            "SELECT lease, gn FROM fleet_exchange('b', NULL, 0, 0, 0, %s, 0, 0, 'v1', 'h', 30)",
            (2 * N,),
        ).fetchone()
        assert granted == 2 * N
        for _ in range(2):
            conn.execute(
                "SELECT * FROM fleet_exchange('b', %s, %s, 0, 1, 0, 0, 0, 'v1', 'h', 30)",
                (lease, N // 4),
            )
        conn.execute("SELECT fleet_give_back('b', %s, %s, 0, 1)", (lease, N // 4))
    s = store.status("b")
    assert s["spent"] == {"nusd": 3 * N // 4, "tokens": 0, "calls": 3}
    assert s["leased"]["nusd"] == 0 and s["leases"] == []


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
        # the version 2 functions: a dead run found and settled, a run's end recorded
        dead = runs.exchange("b", None, Amounts(), Amounts(nusd=100), run_id="dead", host="h",
                             lease_seconds=0.001, folder="/d", pin=(1, "a" * 64)).grant  # fmt: skip
        runs.run_ended("b", "r1", "0" * 64)
        time.sleep(0.01)
        folded = exchange(runs, None, Amounts(), Amounts(), run="r2").folded  # as a boundary would
        assert [f.run_id for f in folded] == ["dead"]
        assert [c.run_id for c in runs.lapsed_here("b", "h")] == ["dead"]
        with pytest.raises(FleetStoreError, match="amounts must be >= 0"):
            runs.settle_dead("b", "dead", Amounts(nusd=-1))
        assert runs.settle_dead("b", "dead", Amounts(nusd=40)).given_back == Amounts(nusd=60)
        assert dead.granted == Amounts(nusd=100)
        with pytest.raises(psycopg.errors.InsufficientPrivilege), psycopg.connect(runs.dsn) as c:
            c.execute("UPDATE fleet_runs SET receipt_sha256 = NULL")
    finally:
        with psycopg.connect(fleet_dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


@pytest.fixture
def empty_dsn(postgres_cluster):
    """A new database with nothing in it (fleet_dsn's already holds the schema)."""
    name = f"fleet_v1_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_cluster.dsn(), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_cluster.dsn(name)
    finally:
        with psycopg.connect(postgres_cluster.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_version_1_database_is_migrated_with_its_data(empty_dsn, capsys):
    fleet_dsn = empty_dsn
    with psycopg.connect(fleet_dsn) as conn:  # version 1, as it shipped
        conn.execute(V1_TABLES)
        conn.execute("INSERT INTO fleet_schema_version VALUES (1)")
        conn.execute(
            "INSERT INTO fleet_budgets (name, cap_nusd, spent_nusd, leased_nusd) "
            "VALUES ('old', 1000000, 100, 5000)"
        )
        conn.execute(
            "INSERT INTO fleet_leases (budget, run_id, host, state, amount_nusd, used_nusd, "
            "expires_at) VALUES ('old', 'run-v1', 'h1', 'active', 5000, 100, "
            "now() + interval '1 hour')"
        )
    assert cli_main(["fleet", "--dsn", fleet_dsn, "init"]) == 0
    assert f"fleet schema version {SCHEMA_VERSION} is in place" in capsys.readouterr().out
    with psycopg.connect(fleet_dsn) as conn:
        assert conn.execute("SELECT version FROM fleet_schema_version").fetchall() == [(2,)]
        (lease,) = conn.execute(
            "SELECT id, run_id, amount_nusd, folder, pin_seq FROM fleet_leases"
        ).fetchall()
    assert lease[1:] == ("run-v1", 5000, None, None)  # kept; the new columns empty
    store = FleetStore(fleet_dsn)
    s = store.status("old")
    assert s["spent"]["nusd"] == 100 and s["leased"]["nusd"] == 5000
    assert s["leases"][0]["run_id"] == "run-v1" and not s["leases"][0]["expiring"]
    # A boundary of version 1 during a rolling upgrade: the 11-argument exchange.
    with psycopg.connect(fleet_dsn) as conn:
        row = conn.execute(
            "SELECT lease, gn FROM fleet_exchange('old', %s, 200, 0, 0, 0, 0, 0, "
            "'run-v1', 'h1', 0.001)",
            (lease[0],),
        ).fetchone()
    assert row == (lease[0], 0)
    # It lapses; no folder, so no live boundary is offered it; an operator settles it.
    assert store.runs("old", 10)[0]["run_id"] == "run-v1"
    store.status("old")  # folds the expired lease
    assert store.lapsed_here("old", "h1") == ()
    done = store.settle_dead("old", "run-v1", Amounts(nusd=900))
    assert done.reported == Amounts(nusd=300) and done.more == Amounts(nusd=600)
    assert done.given_back == Amounts(nusd=4200)
    s = store.status("old")
    assert s["spent"]["nusd"] == 900 and s["lapsed"]["nusd"] == 0 and s["leased"]["nusd"] == 0
    assert store.runs("old", 10)[0]["state"] == "settled"
    # A second init finds version 2 and changes nothing.
    assert store.init() == SCHEMA_VERSION
    assert store.status("old")["spent"]["nusd"] == 900


def test_a_newer_database_is_refused_by_name_and_left_as_it_is(fleet_dsn, capsys):
    FleetStore(fleet_dsn).init()
    with psycopg.connect(fleet_dsn) as conn:
        conn.execute("UPDATE fleet_schema_version SET version = 3")
    assert cli_main(["fleet", "--dsn", fleet_dsn, "init"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fleet schema version 3, newer than this docket's 2" in err[0]
    with psycopg.connect(fleet_dsn) as conn:
        assert conn.execute("SELECT version FROM fleet_schema_version").fetchall() == [(3,)]
    FleetStore(fleet_dsn).set_budget("b", Caps(nusd=10))  # the tables are untouched


def test_lapsed_here_offers_a_hosts_dead_runs_a_few_at_a_time_least_recently_tried_first(
    fleet_dsn,
):
    store = FleetStore(fleet_dsn)
    store.set_budget("b", Caps(nusd=N))
    for i in range(6):
        host = "other" if i == 5 else "h"
        store.exchange("b", None, Amounts(), Amounts(nusd=10), run_id=f"dead{i}", host=host,
                       lease_seconds=0.001, folder=f"/runs/dead{i}", pin=(i, "a" * 64))  # fmt: skip
    alive = exchange(store, None, Amounts(), Amounts(nusd=10), run="alive")  # not a candidate
    time.sleep(0.01)
    # An exchange says whether dead runs wait on its caller's host, whoever folded them.
    assert exchange(store, None, Amounts(), Amounts(), run="x").dead_here  # host h
    assert not store.exchange("b", None, Amounts(), Amounts(), run_id="y", host="nowhere",
                              lease_seconds=30).dead_here  # fmt: skip
    first = store.lapsed_here("b", "h")
    assert len(first) == 4 and "alive" not in {c.run_id for c in first}
    assert all(c.folder == f"/runs/{c.run_id}" and c.pin[0] == int(c.run_id[4:]) for c in first)
    second = store.lapsed_here("b", "h")
    assert second[0].run_id == ({f"dead{i}" for i in range(5)} - {c.run_id for c in first}).pop()
    assert {c.run_id for c in store.lapsed_here("b", "other")} == {"dead5"}
    # settled, it is offered no more; a settle twice is refused, naming why
    store.settle_dead("b", "dead0", Amounts())
    assert "dead0" not in {
        c.run_id for c in store.lapsed_here("b", "h") + store.lapsed_here("b", "h")
    }
    with pytest.raises(InputError, match="has no lapsed lease"):
        store.settle_dead("b", "dead0", Amounts())
    with pytest.raises(InputError, match="still holds an active lease"):
        store.settle_dead("b", "alive", Amounts())
    assert alive.grant.granted == Amounts(nusd=10)


def test_a_boundarys_store_keeps_one_connection_until_it_is_closed(fleet_dsn):
    store = FleetStore(fleet_dsn, keep=True)
    store.set_budget("b", Caps(nusd=5 * N))
    lease = exchange(store, None, Amounts(), Amounts(nusd=N)).grant.lease_id
    kept = store._idle
    assert kept is not None and not kept.closed
    exchange(store, lease, Amounts(nusd=1), Amounts())
    assert store._idle is kept  # the same connection, one call after another
    store.close()
    assert kept.closed and store._idle is None
    # a call after the close (the run's end recorded, or one abandoned finishing late)
    # closes its own connection: nothing is left open
    exchange(store, lease, Amounts(nusd=2), Amounts())
    assert store._idle is None
    assert store.status("b")["spent"]["nusd"] == 2
