"""A PostgreSQL cluster of the harness's own, on 127.0.0.1: initdb into a fresh
folder, started on a free port (its unix socket in that folder), as `nobody` when
run as root (initdb refuses root), stopped and removed at the end. Every step is
bounded in time. The fleet scenario (chaos.fleet) stops and starts it mid-run;
the tests' fixtures (tests/postgres_server.py) and the fleet benchmark use it too.
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

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
SUPERUSER = "docket"


@dataclass(frozen=True)
class Cluster:
    host: str
    port: int
    folder: Path
    bindir: Path | None = None  # where pg_ctl is (None: not ours to stop and start)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={SUPERUSER} dbname={dbname}"

    def stop(self) -> None:
        """Stop the server (fast: sessions are cut, as a crash or failover cuts them)."""
        _pg_ctl(self, "stop", "-m", "fast")

    def start(self) -> None:
        """Start it again on the same port and socket folder; returns once it accepts."""
        _pg_ctl(self, "start", "-l", str(self.folder / "server.log"), "-o", _options(self))


def _options(cluster: Cluster) -> str:
    return f"-h {cluster.host} -p {cluster.port} -k {cluster.folder} -c max_connections=200"


def _pg_ctl(cluster: Cluster, action: str, *args: str) -> None:
    if cluster.bindir is None:
        raise RuntimeError("this cluster was not started here: no pg_ctl to drive it")
    timeout = START_TIMEOUT_S if action == "start" else STOP_TIMEOUT_S
    _run(
        [str(cluster.bindir / "pg_ctl"), "-D", str(cluster.folder / "data"), *args, "-w",
         "-t", str(timeout), action],
        timeout + 10,
    )  # fmt: skip


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
    # Not under a pytest basetemp: nobody must be able to reach the folder.
    folder = Path(tempfile.mkdtemp(prefix="docket-pg-"))
    if os.geteuid() == 0:
        os.chmod(folder, 0o700)
        shutil.chown(folder, "nobody", "nogroup")
    cluster = Cluster("127.0.0.1", _free_port(), folder, bindir)
    started = False
    try:
        _run(
            [str(bindir / "initdb"), "-D", str(folder / "data"), "-U", SUPERUSER, "-A", "trust",
             "-E", "UTF8"],
            START_TIMEOUT_S,
        )  # fmt: skip
        cluster.start()
        started = True
        yield cluster
    finally:
        if started:
            try:
                cluster.stop()
            except RuntimeError as exc:
                # already stopped (a restart that never came back): said, not hidden
                if "Is server running?" not in str(exc):
                    raise
        shutil.rmtree(folder, ignore_errors=True)


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
