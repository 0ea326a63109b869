"""[fleet]: every key checked like the rest of the policy (one line naming the key),
a password in `dsn` refused, and the DSN's variable kept from the agent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from docket.fleet.lease import fleet_lease
from docket.guards.keys import agent_drops
from docket.policy import PolicyError, policy_from_dict

GOOD = {"budget": "team-a", "dsn": "host=db.internal dbname=docket user=docket"}


def fleet(**keys):
    return policy_from_dict({"fleet": {**GOOD, **keys}}).fleet


def test_defaults_and_a_good_table():
    assert not policy_from_dict({}).fleet.enabled
    f = fleet(slice_usd=0.25, lease_seconds="1m", low_water="25%", timeout="500ms")
    assert f.enabled and f.budget == "team-a" and str(f.slice_usd) == "0.25"
    assert (f.lease_seconds, f.low_water, f.timeout) == (60.0, 0.25, 0.5)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"budget": ""}, "fleet.budget: must be a non-empty string"),
        ({"budget": "a b"}, "fleet.budget: is not a valid name"),
        ({"dsn_env": "FLEET_DSN"}, "fleet: must have one of dsn or dsn_env"),
        ({"dsn": "host=db password=hunter2"}, "fleet.dsn: must not hold a password"),
        ({"dsn": "postgresql://u:hunter2@db/x"}, "fleet.dsn: must not hold a password"),
        ({"slice_usd": -1}, "fleet.slice_usd: must be a positive number"),
        ({"slice_calls": 0}, "fleet.slice_calls"),
        ({"lease_seconds": 1}, "fleet.lease_seconds: must be at least 2 s"),
        ({"timeout": 20}, "fleet.timeout: must be under half of lease_seconds"),
        ({"low_water": 2}, "fleet.low_water"),
        ({"slise_usd": 1}, "slise_usd"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(keys, message):
    with pytest.raises(PolicyError) as info:
        fleet(**keys)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert "hunter2" not in str(info.value)


def test_without_dsn_the_table_needs_dsn_env():
    with pytest.raises(PolicyError, match="one of dsn or dsn_env"):
        policy_from_dict({"fleet": {"budget": "b"}})


def test_dsn_env_is_read_at_start_and_dropped_from_the_agent():
    policy = policy_from_dict({"fleet": {"budget": "b", "dsn_env": "FLEET_DSN"}})
    assert "FLEET_DSN" in agent_drops(policy)
    lease = fleet_lease(policy, {"FLEET_DSN": "host=x password=s3cret"}, "run-1")
    assert lease is not None and lease.store.dsn == "host=x password=s3cret"
    with pytest.raises(Exception, match="the variable FLEET_DSN is not set"):
        fleet_lease(policy, {}, "run-1")


def test_the_digest_names_the_budget_not_the_dsn():
    a = policy_from_dict({"fleet": {**GOOD}})
    b = policy_from_dict({"fleet": {**GOOD, "dsn": "host=elsewhere"}})
    assert a.digest() == b.digest() != policy_from_dict({}).digest()
    assert "dsn" not in a.to_dict()["fleet"] and a.to_dict()["fleet"]["budget"] == "team-a"


def test_docket_run_refuses_a_bad_fleet_table_with_exit_2(tmp_path):
    path = tmp_path / "docket.toml"
    path.write_text('[fleet]\nbudget = "b"\ndsn = "host=db password=x"\n')
    done = subprocess.run(
        [sys.executable, "-m", "docket", "run", "--policy", str(path), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "fleet.dsn: must not hold a password" in done.stderr
