"""The fleet benchmark's exchange clients (benchmarks/_fleet_rate.py) on a tiny window,
and the benchmark runner's one-line refusal of a bad argument.

Real PostgreSQL (tests/postgres_server.py), real threads and spawned processes; the
figures are not judged here (the machine is shared), the bookkeeping is: every
exchange a client counted is in the budget's row, as spent, and every lease was
given back. `python -m benchmarks fleet` is the measurement.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from benchmarks import _fleet_rate as rate

ROOT = Path(__file__).resolve().parent.parent


def budgets(dsn: str) -> dict[str, tuple[int, int, int]]:
    """Every budget in the database: (spent, leased, lapsed) in nano-USD."""
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT name, spent_nusd, leased_nusd, lapsed_nusd FROM fleet_budgets"
        ).fetchall()
    return {name: (spent, leased, lapsed) for name, spent, leased, lapsed in rows}


@pytest.mark.parametrize(
    ("mode", "kept", "shape"),
    [
        ("threads", False, rate.Shape("shared", 3, 1)),
        ("threads", True, rate.Shape("apart", 2, 2)),
        ("processes", False, rate.Shape("apart", 2, 2)),
    ],
)
def test_exchanges_are_counted_once_and_land_in_the_budget(
    fleet_dsn: str, mode: str, kept: bool, shape: rate.Shape
) -> None:
    results = rate.measure(fleet_dsn, shape, 0.4, mode, kept=kept)
    assert sorted(r["index"] for r in results) == list(range(shape.clients))
    assert all(r["failed"] == 0 and r["short_grants"] == 0 for r in results), results
    for r in results:
        # the window's exchanges, plus at most the one that ended past it
        assert 1 <= len(r["latencies"]) <= r["done"] <= len(r["latencies"]) + 1
    held = budgets(fleet_dsn)
    assert len(held) == shape.budgets
    half = rate.SLICE_NUSD // 2
    # each exchange reported half a slice used; the give-back reported nothing more
    assert sum(spent for spent, _, _ in held.values()) == half * sum(r["done"] for r in results)
    assert all(leased == 0 and lapsed == 0 for _, leased, lapsed in held.values()), held
    summary = rate.summarise(shape, 0.4, results)
    assert summary["exchanges"] == sum(len(r["latencies"]) for r in results)
    assert summary["latency_ms"]["n"] == summary["exchanges"]
    assert summary["per_client_per_s"]["min"] <= summary["per_client_per_s"]["max"]


def test_a_client_that_cannot_reach_the_database_fails_the_run_by_name() -> None:
    dsn = "host=127.0.0.1 port=1 dbname=nothing user=nobody"  # nothing listens on port 1
    said: list[dict] = []
    rate.client(dsn, "b", 0, 0.2, False, said.append, lambda: pytest.fail("it was never ready"))
    assert len(said) == 1 and said[0]["index"] == 0
    assert said[0]["error"].startswith("first exchange: "), said
    with pytest.raises(RuntimeError, match=r"^client 0: first exchange: "):
        rate._collect(lambda timeout: said[0], 1, 5.0, "ready")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--bogus"], "python -m benchmarks: unrecognized arguments: --bogus (see --help)"),
        (["nosuch"], "benchmarks: unknown nosuch; have "),
    ],
)
def test_runner_refuses_a_bad_argument_in_one_line(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(says), done.stderr
