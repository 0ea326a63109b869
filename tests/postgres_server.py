"""A real PostgreSQL for the tests: a cluster of the session's own, on 127.0.0.1.

`postgres_cluster` (session) runs initdb into a fresh folder and starts the server
on a free port (its unix socket in that folder), as `nobody` when the tests run as
root (initdb refuses root), and stops it at the end; every step is bounded in time.
It skips, saying why, when PostgreSQL's binaries are not installed. `fleet_dsn`
gives each test a database of its own in that cluster, with the fleet schema in it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
SUPERUSER = "docket"


@dataclass(frozen=True)
class Cluster:
    host: str
    port: int
    folder: Path

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={SUPERUSER} dbname={dbname}"


def postgres_bin() -> Path | None:
    """The folder holding initdb and pg_ctl: Debian's versioned one, else PATH's."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(candidate, "initdb"), os.X_OK):
            return Path(candidate)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_owner(argv: list[str]) -> list[str]:
    """argv run as `nobody` when we are root (postgres refuses to run as root)."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "nobody", "--", *argv]


def _run(argv: list[str], timeout: float) -> None:
    done = subprocess.run(_as_owner(argv), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()[-800:]}")


@contextmanager
def running_cluster(bindir: Path) -> Iterator[Cluster]:
    """A cluster of its own: initdb into a fresh folder, started on a free port of
    127.0.0.1 (its socket in that folder), stopped and removed on the way out."""
    # Not under the pytest basetemp: nobody must be able to reach the folder.
    folder = Path(tempfile.mkdtemp(prefix="docket-pg-"))
    data = folder / "data"
    if os.geteuid() == 0:
        os.chmod(folder, 0o700)
        shutil.chown(folder, "nobody", "nogroup")
    port = _free_port()
    log = folder / "server.log"
    started = False
    try:
        _run(
            [str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8"],
            START_TIMEOUT_S,
        )
        options = f"-h 127.0.0.1 -p {port} -k {folder} -c max_connections=200"
        _run(
            [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w",
             "-t", str(START_TIMEOUT_S), "start"],
            START_TIMEOUT_S + 10,
        )  # fmt: skip
        started = True
        yield Cluster("127.0.0.1", port, folder)
    finally:
        if started:
            _run(
                [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w",
                 "-t", str(STOP_TIMEOUT_S), "stop"],
                STOP_TIMEOUT_S + 10,
            )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)


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


def fresh_database(cluster: Cluster) -> str:
    """A new database in the cluster with the fleet schema in it; its DSN."""
    import psycopg

    from docket.fleet.store import FleetStore

    name = f"fleet_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(cluster.dsn(), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = cluster.dsn(name)
    FleetStore(dsn).init()
    return dsn


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
