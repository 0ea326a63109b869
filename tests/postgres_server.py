"""A real PostgreSQL for the tests: a cluster of the session's own, on 127.0.0.1.

`postgres_cluster` (session) runs initdb into a fresh folder and starts the server
on a free port (its unix socket in that folder), as `nobody` when the tests run as
root (initdb refuses root), and stops it at the end; every step is bounded in time.
It skips, saying why, when PostgreSQL's binaries are not installed. `fleet_dsn`
gives each test a database of its own in that cluster, with the fleet schema in it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# The cluster itself is the harness's (the fleet scenario stops and starts it mid-run);
# re-exported here for the tests, the attack family and the fleet benchmark.
from chaos.fleet.postgres import (  # noqa: F401
    SUPERUSER,
    Cluster,
    fresh_database,
    postgres_bin,
    running_cluster,
)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install -y postgresql): no initdb")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install 'docket[fleet]')")
    with running_cluster(bindir) as cluster:
        yield cluster


@pytest.fixture
def fleet_dsn(postgres_cluster: Cluster) -> Iterator[str]:
    """A fresh database with the fleet schema in it; dropped after the test."""
    import psycopg

    dsn = fresh_database(postgres_cluster)
    name = dsn.rsplit("dbname=", 1)[1]
    try:
        yield dsn
    finally:
        with psycopg.connect(postgres_cluster.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
