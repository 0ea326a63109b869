"""`docket fleet init` on a database of schema version 1: migrated to version 2 in one
transaction, its budgets and leases kept, and the new functions working on them."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from docket.cli import main as cli_main
from docket.fleet.amounts import Amounts, Caps
from docket.fleet.schema import SCHEMA_VERSION, V1_TABLES
from docket.fleet.store import FleetStore


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
