"""The receipt's `fleet` section (spec section 7.10) from one real `docket run` under
[fleet] against a real PostgreSQL: what the receipt states is what this test counts
from the ledger's lines on disk, it agrees with the database's own account, and all
three verifiers accept it (and reject it with the budget renamed, naming the path)."""

from __future__ import annotations

import json

import pytest
import trio
from fleet_runs import run_argv, run_env, write_policy

from chaos.verifiers import find_js
from docket.errors import InputError
from docket.fleet.amounts import Caps
from docket.fleet.lease import database_identity
from docket.fleet.store import FleetStore
from docket.receipts.verify import verify

NANO = 10**9
DIMS = ("nusd", "tokens", "calls")
PREFIXES = {"granted": "granted", "reported": "reported", "returned": "unused", "lapsed": "held"}
OWN_LEASE = {"drawn": "held", "renewed": "held", "returned": "returned", "lost": "lost"}


def counted_from_lines(lines: list[bytes]) -> dict:
    """The fleet section, counted here from the raw ledger lines."""
    events = [json.loads(line) for line in lines]
    start = events[0]
    assert start["type"] == "session.start"
    leases: dict[str, int] = {}
    amounts = {total: dict.fromkeys(DIMS, 0) for total in PREFIXES}
    refused: dict[str, int] = {}
    failures, ended = 0, "none"
    for e in events:
        if e["type"] == "fleet.lease":
            leases[e["change"]] = leases.get(e["change"], 0) + 1
            for total, prefix in PREFIXES.items():
                for dim in DIMS:
                    amounts[total][dim] += e.get(f"{prefix}_{dim}", 0)
            ended = OWN_LEASE.get(e["change"], ended)
        elif e["type"] == "fleet.store":
            failures += 1
        elif e["type"] == "policy.denied" and e.get("rule", "").startswith("fleet."):
            code = e["rule"][len("fleet.") :]
            refused[code] = refused.get(code, 0) + 1
    return {
        "budget": start["fleet"]["budget"],
        "database": start["fleet"]["database"],
        "leases": dict(sorted(leases.items())),
        **amounts,
        "refused_by_code": dict(sorted(refused.items())),
        "store_failures": failures,
        "ended": ended,
    }


async def test_a_fleet_runs_receipt_states_its_lease_cycle(
    tmp_path, stub_server, fleet_dsn, postgres_cluster, go_verifier
):
    store = FleetStore(fleet_dsn)
    # ~11.4 µUSD a call: a cap of $0.0001 is ~8 calls of the 20 asked, in slices of ~2.
    store.set_budget("receipted", Caps(nusd=int(0.0001 * NANO)))
    folder = tmp_path / "run"
    with trio.fail_after(120):
        async with stub_server("openai") as stub:
            policy = write_policy(
                tmp_path / "fleet.toml", stub.url, fleet_dsn, "receipted", slice_usd=0.00003
            )
            argv = run_argv(policy, folder, calls=20, concurrency=2)
            done = await trio.run_process(argv, env=run_env(), capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")

    receipt = json.loads((folder / "receipt.json").read_text())
    lines = (folder / "ledger.jsonl").read_bytes().splitlines()
    fleet = receipt["fleet"]
    assert fleet == counted_from_lines(lines)
    dbname = fleet_dsn.rsplit("dbname=", 1)[1]
    assert fleet["database"] == {
        "host": postgres_cluster.host,
        "port": str(postgres_cluster.port),
        "dbname": dbname,
    }
    assert b"user=" not in b"".join(lines[:1])  # session.start names no role or password
    # A full cycle: leased, spent to the cap, refused, the rest given back.
    assert fleet["leases"]["drawn"] >= 1 and fleet["ended"] == "returned"
    assert fleet["refused_by_code"].get("slice_short", 0) > 0
    # The same refusals as totals.refused_by_rule's fleet (nothing went unrecorded).
    assert sum(fleet["refused_by_code"].values()) == receipt["totals"]["refused_by_rule"]["fleet"]
    # Every grant was either reported spent or given back; the database agrees.
    for dim in DIMS:
        assert fleet["granted"][dim] == fleet["reported"][dim] + fleet["returned"][dim], dim
    status = store.status("receipted")
    assert status["spent"]["nusd"] == fleet["reported"]["nusd"] == receipt["totals"]["cost_nusd"]

    renamed = tmp_path / "renamed.json"
    forged = json.loads(json.dumps(receipt))
    forged["fleet"]["budget"] = "another"
    renamed.write_text(json.dumps(forged))
    ledger = folder / "ledger.jsonl"

    assert verify(folder / "receipt.json").ok
    assert verify(renamed, ledger).field == "fleet.budget"
    for other in (find_js(), go_verifier):
        if other.absent:
            continue  # said by test_verify_js.py / test_verify_go.py, which skip the same way
        assert other.broken is None, other.broken
        assert other.run(folder / "receipt.json").code == "ok", other.name
        assert other.run(renamed, ledger).code == "fleet_mismatch", other.name


def test_the_database_identity_names_no_role_or_password():
    pytest.importorskip("psycopg")
    for dsn in (
        "postgresql://runs:s3cret-pw@db.internal:5433/docket?sslmode=require",
        "host=db.internal port=5433 dbname=docket user=runs password=s3cret-pw",
    ):
        assert database_identity(dsn) == {"host": "db.internal", "port": "5433", "dbname": "docket"}
    assert database_identity("dbname=docket") == {"host": None, "port": None, "dbname": "docket"}


def test_a_dsn_that_does_not_parse_is_one_line_without_its_text():
    pytest.importorskip("psycopg")
    with pytest.raises(InputError) as refused:
        database_identity("host=db password=s3cret-pw oops")
    assert "s3cret-pw" not in str(refused.value) and "\n" not in str(refused.value)
