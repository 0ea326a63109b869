"""The example agent's tests, run from recordings by docket's pytest plugin.

    pytest --docket-record examples/pytest_replay    # once, against the policy's provider
    pytest examples/pytest_replay                    # then offline, for nothing

Each test names its own recording (one run each). `policy` is the docket.toml the
recording is made and replayed under (record_bodies = true)."""

from __future__ import annotations

import agent
import pytest


@pytest.mark.docket_replay("runs/greet", policy="docket.toml")
def test_greets_one():
    assert agent.greet("Ada").strip()


@pytest.mark.docket_replay("runs/greet_all", policy="docket.toml")
def test_greets_each_in_order(docket_replay):
    said = agent.greet_all(["Ada", "Grace"])
    assert list(said) == ["Ada", "Grace"] and all(s.strip() for s in said.values())
