"""Staging means another host: every address the harness binds and advertises is
configurable.

Distinct loopback addresses stand for hosts: Toxiproxy (the real server, started
here) on 127.0.0.2, the stub providers on 127.0.0.3, the boundary on 127.0.0.1. If
anything still assumed one address (a proxy listening on 127.0.0.1, a stub only
reachable there), the run would fail to connect or its evidence would name the
wrong address. Read back from the run's folder: addresses.json, the stub's own log
(the Host header the boundary sent is the proxy it dialed) and the chain.
Loopback only: nothing here listens beyond the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import trio
from helpers import read_chain

from chaos.run.engine import run_chaos
from chaos.scenario import AgentSpec, Hosts, Scenario, load_scenario
from chaos.toxiproxy import real

DEADLINE = 60
TOXIPROXY_HOST, STUB_HOST, BOUNDARY_HOST = "127.0.0.2", "127.0.0.3", "127.0.0.4"
BLACK_HOLE = "net:timeout(0)@t 0..600ms after call 1"


def staging_scenario(boundary: str = "127.0.0.1") -> Scenario:
    agent = AgentSpec(name="looper", mode="loop", calls=8, timeout=5.0)
    timeouts = {"upstream_timeout": 0.3, "connect_timeout": 0.3}
    return Scenario(
        faults=(BLACK_HOLE,),
        agents=(agent,),
        policy={"boundary": timeouts | {"host": boundary}},
        max_wall_clock=30.0,
        probe_every=0.1,
        hosts=Hosts(stubs=STUB_HOST, proxies=TOXIPROXY_HOST),
    )


def check_addresses(folder, toxiproxy_host: str, boundary: str = "127.0.0.1") -> dict:
    addresses = json.loads((folder / "addresses.json").read_text())
    assert urlsplit(addresses["toxiproxy"]).hostname == toxiproxy_host
    assert urlsplit(addresses["boundary"]).hostname == boundary
    assert urlsplit(addresses["stubs"]["openai"]).hostname == STUB_HOST
    proxy = addresses["proxies"]["openai"]
    assert proxy["listen"].startswith(f"{TOXIPROXY_HOST}:")
    assert proxy["upstream"] == addresses["stubs"]["openai"].removeprefix("http://")
    return proxy


def check_the_traffic_crossed_both_hosts(result, proxy: dict) -> None:
    assert result.exit_status == 0, result.reason
    log = result.stub_logs["openai"]
    assert log, "no request reached the stub on 127.0.0.3"
    # the boundary dialed the proxy on 127.0.0.2 (its Host header), which forwarded
    # to the stub on 127.0.0.3: the request is in the stub's own log
    hosts = {dict(e["headers"])["host"] for e in log}
    assert hosts == {proxy["listen"]}
    events = read_chain(result.ledger_path)
    actions = [e["action"] for e in events if e["type"] == "fault.injected"]
    assert actions == ["toxic_added", "toxic_removed"]
    timed_out = [e for e in events if e["type"] == "model.error" and e.get("reason") == "timeout"]
    assert timed_out, "the toxic on the proxy at 127.0.0.2 acted on no call"
    assert result.agent_reports["looper"]["ok"] >= 1


async def test_embedded_proxy_on_one_address_stubs_on_another_boundary_on_a_third(tmp_path):
    folder = tmp_path / "run"
    with trio.fail_after(DEADLINE):
        result = await run_chaos(staging_scenario(BOUNDARY_HOST), seed=5, folder=folder)
    proxy = check_addresses(folder, TOXIPROXY_HOST, BOUNDARY_HOST)
    # the harness's own probes reached the boundary where it was
    assert result.probes and all(p["healthz"] == 200 for p in result.probes)
    check_the_traffic_crossed_both_hosts(result, proxy)


@pytest.fixture
def real_toxiproxy_on_its_own_address():
    binary, where = real.locate()
    if binary is None:
        pytest.skip(f"needs a real Toxiproxy server: none at {where}")
    with real.running(binary, TOXIPROXY_HOST) as url:
        yield url


async def test_real_toxiproxy_on_one_address_stubs_on_another(
    tmp_path, real_toxiproxy_on_its_own_address
):
    url = real_toxiproxy_on_its_own_address
    folder = tmp_path / "run"
    with trio.fail_after(DEADLINE):
        result = await run_chaos(staging_scenario(), seed=5, folder=folder, toxiproxy_url=url)
    proxy = check_addresses(folder, TOXIPROXY_HOST)
    assert json.loads((folder / "addresses.json").read_text())["embedded"] is False
    check_the_traffic_crossed_both_hosts(result, proxy)
    assert result.notes == []  # its proxy was taken away from the real server


def test_the_flags_set_the_hosts_and_the_repro_keeps_them(tmp_path):
    folder = tmp_path / "run"
    argv = [sys.executable, "-m", "docket", "chaos", "--seed", "3", "--agent", "once"]
    argv += ["--fault", "net:latency(5ms)", "--stub-host", STUB_HOST]
    argv += ["--proxy-host", TOXIPROXY_HOST, "--boundary-host", BOUNDARY_HOST]
    argv += ["--dir", str(folder)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    check_addresses(folder, TOXIPROXY_HOST, BOUNDARY_HOST)
    flags = f"--stub-host {STUB_HOST} --proxy-host {TOXIPROXY_HOST} --boundary-host {BOUNDARY_HOST}"
    assert flags in done.stdout


def test_a_bad_host_is_one_line_and_exit_2(tmp_path):
    argv = [sys.executable, "-m", "docket", "chaos", "--agent", "once", "--stub-host", "a b"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "docket: --stub-host must be an IP address or a host name, got 'a b'"
    ]
    phase = tmp_path / "s.yaml"
    phase.write_text("hosts:\n  stubs: 127.0.0.3\n  proxy: 127.0.0.2\n")
    with pytest.raises(
        Exception, match=r"s.yaml:3: at hosts.proxy unknown key \(did you mean proxies\?\)"
    ):
        load_scenario(phase)
    phase.write_text("hosts: {stubs: 127.0.0.3, proxies: 127.0.0.2}\n")
    assert load_scenario(phase).hosts == Hosts(stubs=STUB_HOST, proxies=TOXIPROXY_HOST)


def test_the_hosts_cross_into_a_worker_process():
    # a run whose supervisor may be killed runs in a worker (chaos.run.worker): same hosts there
    from chaos.run.worker import scenario_from_json, scenario_to_json

    scenario = staging_scenario()
    assert scenario_from_json(json.loads(json.dumps(scenario_to_json(scenario)))) == scenario


def test_the_game_day_flags_reach_every_run_of_every_phase():
    from chaos.gameday.phase import load_phases
    from chaos.gameday.runner import phases_on_hosts

    phases = phases_on_hosts(load_phases(), STUB_HOST, TOXIPROXY_HOST, BOUNDARY_HOST)
    specs = [spec for phase in phases for spec in phase.runs]
    assert len(phases) == 9 and len(specs) > 9
    for spec in specs:
        assert spec.scenario.hosts == Hosts(stubs=STUB_HOST, proxies=TOXIPROXY_HOST)
        assert spec.scenario.policy["boundary"]["host"] == BOUNDARY_HOST
        # a subprocess phase hands its block to `docket chaos`: the hosts go with it
        assert spec.data["hosts"] == {"stubs": STUB_HOST, "proxies": TOXIPROXY_HOST}
        assert spec.data["policy"]["boundary"]["host"] == BOUNDARY_HOST
    assert phases_on_hosts(phases, None, None) is phases


def test_a_game_day_against_the_real_toxiproxy_on_its_own_address(
    tmp_path, real_toxiproxy_on_its_own_address
):
    # the partition phase (in-process, net faults on the real server) and the
    # supervisor-killed phase (`docket chaos` in a child process), hosts split three ways
    url = real_toxiproxy_on_its_own_address
    argv = [sys.executable, "-m", "docket", "game-day", "--toxiproxy", url]
    argv += ["--phase", "partition", "--phase", "supervisor-killed:kill"]
    argv += ["--stub-host", STUB_HOST, "--proxy-host", TOXIPROXY_HOST]
    argv += ["--boundary-host", BOUNDARY_HOST, "--report", str(tmp_path / "report")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "report" / "gameday.json").read_text())
    assert [(p["name"], p["verdict"]) for p in results["phases"]] == [
        ("partition", "pass"),
        ("supervisor-killed", "pass"),
    ]
