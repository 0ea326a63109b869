"""`docket fleet` against a real PostgreSQL: init, budget set, status (text and
--json); bad input is one line and exit 2, an unreachable database one line, exit 1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from docket.cli import main as cli_main
from docket.fleet.amounts import Amounts, Caps
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
        (["runs", "nope"], "no fleet budget 'nope'"),
        (["runs", "b b"], "budget name 'b b'"),
        (["runs", "team-a", "--limit", "0"], "--limit: must be at least 1, got 0"),
        ([], "name an action"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(fleet_dsn, fleet, args, message):
    FleetStore(fleet_dsn).set_budget("team-a", Caps(nusd=10))
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


def test_runs_and_status_per_host_read_the_database(fleet_dsn, fleet):
    store = FleetStore(fleet_dsn)
    store.set_budget("t", Caps(nusd=10**6))

    def lease(run, host, seconds=30.0, report=0, lease_id=None):
        return store.exchange(
            "t", lease_id, Amounts(nusd=report), Amounts(nusd=1000), run_id=run, host=host,
            lease_seconds=seconds, folder=f"/runs/{run}", pin=(3, "a" * 64),
        ).grant.lease_id  # fmt: skip

    ended = lease("run-ended", "box-1")
    store.give_back("t", ended, Amounts(nusd=400))
    store.run_ended("t", "run-ended", "f" * 64)
    lease("run-dead", "box-2", seconds=0.001)
    lease("run-live", "box-1")
    lease("run-late", "box-2", seconds=3.0)  # in its last quarter after 2.25 s
    store.status("t")  # folds run-dead's lease into lapsed
    got = json.loads(fleet("--dsn", fleet_dsn, "runs", "t", "--json").stdout)["runs"]
    by_run = {r["run_id"]: r for r in got}
    assert [r["run_id"] for r in got][0] == "run-late"  # newest first
    assert by_run["run-ended"]["state"] == "ended"
    assert by_run["run-ended"]["receipt_sha256"] == "f" * 64
    assert by_run["run-ended"]["spent"]["nusd"] == 400
    assert by_run["run-dead"]["state"] == "lapsed" and by_run["run-dead"]["receipt"] == "none: died"
    assert by_run["run-dead"]["lapsed_nusd"] == 1000
    assert by_run["run-live"]["state"] == "active"
    assert by_run["run-live"]["receipt"] == "none: still running"
    assert by_run["run-live"]["held_nusd"] == 1000 and by_run["run-live"]["host"] == "box-1"
    assert (
        len(
            json.loads(fleet("--dsn", fleet_dsn, "runs", "t", "--json", "--limit", "2").stdout)[
                "runs"
            ]
        )
        == 2
    )
    text = fleet("--dsn", fleet_dsn, "runs", "t").stdout
    assert "run-dead  lapsed" in text and "receipt none: died" in text
    # status: per host, and the lease in its last quarter marked
    deadline = time.monotonic() + 10
    while True:
        status = json.loads(fleet("--dsn", fleet_dsn, "status", "t", "--json").stdout)
        late = [x for x in status["leases"] if x["run_id"] == "run-late"]
        if late and late[0]["expiring"]:
            break
        assert late and time.monotonic() < deadline, status
        time.sleep(0.05)
    hosts = {h["host"]: h for h in status["hosts"]}
    assert hosts["box-1"]["held_nusd"] == 1000 and hosts["box-1"]["runs"] == 2
    assert hosts["box-2"]["lapsed_nusd"] == 1000 and hosts["box-2"]["active_leases"] == 1
    live = [x for x in status["leases"] if x["run_id"] == "run-live"]
    assert not live[0]["expiring"]
    # the dead run is named to a boundary on its host, not to another host's
    assert [c.run_id for c in store.lapsed_here("t", "box-2")] == ["run-dead"]
    assert store.lapsed_here("t", "box-1") == ()
