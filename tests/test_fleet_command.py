"""`docket fleet` against a real PostgreSQL: init, budget set, status (text and
--json); bad input is one line and exit 2, an unreachable database one line, exit 1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from docket.cli import main as cli_main
from docket.fleet.amounts import Amounts
from docket.fleet.store import FleetStore


@pytest.fixture
def fleet(capsys, monkeypatch):
    """`docket fleet ARGS` through the CLI's main, in this process (one subprocess
    below checks the real command): its exit status, stdout and stderr."""

    def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        code = cli_main(["fleet", *args])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return run


def test_init_set_and_status(fleet_dsn, fleet):
    assert fleet("--dsn", fleet_dsn, "init").returncode == 0
    done = fleet(
        "--dsn-env",
        "MY_DSN",
        "budget",
        "set",
        "team-a",
        "--max-usd",
        "5",
        "--max-calls",
        "100",
        env={"MY_DSN": fleet_dsn},
    )
    assert done.returncode == 0, done.stderr
    store = FleetStore(fleet_dsn)
    got = store.exchange(
        "team-a",
        None,
        Amounts(),
        Amounts(nusd=10**9, calls=5),
        run_id="run-x",
        host="box-1",
        lease_seconds=30,
    )
    assert got.grant.granted == Amounts(nusd=10**9, calls=5)
    text = fleet("--dsn", fleet_dsn, "status", "team-a")
    assert text.returncode == 0
    assert "cap $5.00" in text.stdout and "leased $1.00" in text.stdout
    assert "run run-x on box-1" in text.stdout
    data = json.loads(fleet("--dsn", fleet_dsn, "status", "team-a", "--json").stdout)
    assert data["cap"] == {"nusd": 5 * 10**9, "tokens": None, "calls": 100}
    (lease,) = data["leases"]
    assert (
        lease["run_id"] == "run-x" and lease["host"] == "box-1" and 0 < lease["expires_in_s"] <= 30
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["budget", "set", "b", "--max-usd", "lots"], "--max-usd: not a number"),
        (["budget", "set", "b", "--max-usd", "-1"], "--max-usd: not a positive amount"),
        (["budget", "set", "b b", "--max-usd", "1"], "budget name 'b b'"),
        (
            ["budget", "set", "b", "--max-usd", "1", "--max-calls", "0"],
            "--max-calls: must be at least 1",
        ),
        (["status", "nope"], "no fleet budget 'nope'"),
        ([], "name an action"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(fleet_dsn, fleet, args, message):
    done = fleet("--dsn", fleet_dsn, *args)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1


def test_a_password_in_dsn_and_a_missing_variable_are_refused(fleet):
    done = fleet("--dsn", "host=x password=hunter2", "init")
    assert done.returncode == 2 and "must not hold a password" in done.stderr
    assert "hunter2" not in done.stderr
    done = fleet("--dsn-env", "NO_SUCH_VAR_FOR_DOCKET", "init")
    assert done.returncode == 2 and "NO_SUCH_VAR_FOR_DOCKET is not set" in done.stderr


def test_an_unreachable_database_is_one_line_and_exit_1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "docket",
            "fleet",
            "--dsn",
            f"host=127.0.0.1 port={port} user=x dbname=x",
            "init",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DOCKET_DEBUG": ""},
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "docket:" in done.stderr
    assert "Traceback" not in done.stderr
