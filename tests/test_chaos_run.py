"""The chaos engine end to end: stubs, fault proxy, supervisor, agents, all real.

Each test reads what the run left on disk (the ledger, chain-verified, the
receipt, the stubs' logs), never only what the engine says about itself.
"""

from __future__ import annotations

import errno
import re
import sys
from functools import partial

import trio
from helpers import read_chain

from chaos.data.locate import folder as data_folder
from chaos.run.collect import parse_metrics
from chaos.run.engine import run_chaos
from chaos.scenario import AgentSpec, Scenario, load_scenario
from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.driver import ToxiproxyDriver
from docket.clock import Clock
from docket.ledger.faults import FailOrdinals
from docket.policy import policy_from_dict
from docket.run.hooks import RunHooks
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

DEADLINE = 60


def scenario(*faults: str, mode: str = "loop", calls: int = 8, **agent) -> Scenario:
    spec = AgentSpec(name="a", mode=mode, calls=calls, timeout=5.0, **agent)
    return Scenario(faults=faults, agents=(spec,), max_wall_clock=30.0, probe_every=0.05)


def fault_decisions(injected: list[dict]) -> list[tuple]:
    return [(i["fault"], i["ordinal"], i.get("action")) for i in injected]


async def test_upstream_faults_are_in_the_chain_before_their_effects(tmp_path):
    faults = ("upstream:status(503)@call 2", "upstream:missing_usage@call 4")
    with trio.fail_after(DEADLINE):
        result = await run_chaos(scenario(*faults, calls=5), seed=21, folder=tmp_path / "r")
    events = read_chain(result.ledger_path)
    types = [e["type"] for e in events]
    # Each record sits between its call's model.request and that call's outcome.
    assert types == [
        "session.start", "process.spawn",
        "model.request", "model.response",
        "model.request", "fault.injected", "model.error",
        "model.request", "model.response",
        "model.request", "fault.injected", "model.response",
        "model.request", "model.response",
        "process.exit", "session.end",
    ]  # fmt: skip
    records = [e for e in events if e["type"] == "fault.injected"]
    assert [(r["fault"], r["ordinal"], r["seed"], r["provider"]) for r in records] == [
        ("upstream:status(503)@call 2", 2, 21, "openai"),
        ("upstream:missing_usage@call 4", 4, 21, "openai"),
    ]
    assert events[6]["status"] == 503
    # What the dependency saw: the stub's own log names the same faults on the same requests.
    log = result.stub_logs["openai"]
    assert [[f["fault"] for f in e["faults"]] for e in log] == [
        [],
        ["upstream:status(503)@call 2"],
        [],
        ["upstream:missing_usage@call 4"],
        [],
    ]
    assert result.receipt["faults"]["injected"] == 2
    assert result.receipt["faults"]["seed"] == 21
    start = events[0]
    assert start["chaos"]["seed"] == 21 and start["chaos"]["faults"] == list(faults)
    assert result.agent_reports["a"]["calls"] == 5
    assert result.exit_status == 0, result.reason
    assert result.probes and all(p["healthz"] == 200 for p in result.probes)
    metrics = parse_metrics(result.metrics)
    assert metrics, "the boundary's metrics were scraped before it stopped"
    assert result.repro.startswith("docket chaos --seed 21 --fault")


async def test_net_fault_records_precede_the_calls_they_slow(tmp_path):
    with trio.fail_after(DEADLINE):
        result = await run_chaos(
            scenario("net:latency(150ms)@call 1", calls=2), seed=22, folder=tmp_path / "r"
        )
    events = read_chain(result.ledger_path)
    types = [e["type"] for e in events]
    added = next(e for e in events if e.get("action") == "toxic_added")
    assert added["fault"] == "net:latency(150ms)@call 1" and added["proxy"] == "docket_openai"
    assert events.index(added) < types.index("process.spawn")  # in place before the agent ran
    connection = [e for e in events if e.get("action") == "connection"]
    assert [(c["ordinal"], c["stream"]) for c in connection] == [(1, "downstream")]
    first = next(e for e in events if e["type"] == "model.response")
    assert first["duration_ms"] >= 150  # the toxic really held the answer back


async def test_the_same_seed_reproduces_decisions_and_event_types(tmp_path):
    chance = (
        "upstream:status(503)@30%",
        "upstream:missing_usage@25%",
        "upstream:truncate(after=20B)@20%",
        "ledger:eio@seq 30..",
    )
    runs = []
    with trio.fail_after(2 * DEADLINE):
        for n in range(2):
            runs.append(
                await run_chaos(scenario(*chance, calls=12), seed=4242, folder=tmp_path / f"{n}")
            )
    first, second = runs
    decisions = fault_decisions(first.injected)
    assert decisions == fault_decisions(second.injected)
    assert len({d[0] for d in decisions}) >= 3  # the chances did fire, not only the ledger fault
    assert [e["type"] for e in read_chain(first.ledger_path)] == [
        e["type"] for e in read_chain(second.ledger_path)
    ]
    assert first.receipt["faults"] == second.receipt["faults"]
    assert first.receipt["ops"]["evidence"]["ledger_complete"] is False


async def test_scenario_disk_full_end_to_end(tmp_path):
    loaded = load_scenario(data_folder("scenarios") / "disk-full.yaml")
    with trio.fail_after(DEADLINE):
        result = await run_chaos(loaded, seed=loaded.seed, folder=tmp_path / "r")
    events = read_chain(result.ledger_path)
    (gap,) = [e for e in events if e["type"] == "evidence.gap"]
    assert gap["lost"] == 4 and gap["first_failing_seq"] == 6
    evidence = result.receipt["ops"]["evidence"]
    assert evidence["ledger_complete"] is False and evidence["unwritten_events"] == 4
    ledger_faults = [i for i in result.injected if i["target"] == "ledger"]
    assert [i["ordinal"] for i in ledger_faults] == [6, 7, 8, 9]
    assert all(i["ledger_seq"] is None for i in ledger_faults)  # not in the ledger they broke
    assert result.agent_reports["writer"]["ok"] == 8  # the run went on
    assert result.exit_status == 0


async def test_scenario_partial_outage_end_to_end(tmp_path):
    loaded = load_scenario(data_folder("scenarios") / "partial-outage.yaml")
    with trio.fail_after(DEADLINE):
        result = await run_chaos(loaded, seed=loaded.seed, folder=tmp_path / "r")
    reports = result.agent_reports
    assert reports["on-secondary"]["ok"] == 8
    assert reports["on-primary"]["ok"] == 0
    assert reports["on-primary"]["refused_types"]["docket_breaker_open"] == 5
    events = read_chain(result.ledger_path)
    assert [(e["upstream"], e["to"]) for e in events if e["type"] == "breaker.state"] == [
        ("primary", "open")
    ]
    faulted = {e["provider"] for e in events if e["type"] == "fault.injected"}
    assert faulted == {"primary"}
    secondary = result.stub_logs["secondary"]
    assert len(secondary) == 8 and not any(e["faults"] for e in secondary)
    assert parse_metrics(result.metrics)["docket_breaker_state{upstream=primary}"] == 2


async def test_supervisor_hooks_run_in_order_and_stdout_is_captured(tmp_path):
    calls: list[str] = []
    seen: list[dict] = []

    async def before_spawn(handle):
        assert handle.child_pid is None and handle.boundary_url.startswith("http://127.0.0.1:")
        calls.append("before_spawn")
        await handle.record_fault({"fault": "test:hook", "seed": 5})

    async def started(handle):
        calls.append(f"started {handle.child_pid is not None}")
        await trio.sleep_forever()  # cancelled when the child is reaped

    async def before_stop(handle):
        calls.append("before_stop")

    out = tmp_path / "child.out"
    policy = policy_from_dict({"caps": {"max_model_calls": 3}})
    hooks = RunHooks(
        clock=Clock(),
        write_faults=FailOrdinals(errno.EIO, 99),
        chaos={"seed": 5, "faults": ["test:hook"]},
        observers=(seen.append,),
        before_spawn=before_spawn,
        started=started,
        before_stop=before_stop,
    )
    with out.open("wb") as stdout, trio.fail_after(DEADLINE):
        options = RunOptions(
            command=[sys.executable, "-c", "print('report line')"],
            ledger_dir=str(tmp_path / "run"),
            stdout=stdout,
        )
        outcome = await Supervisor(options, hooks=hooks, policy=policy).run()
    assert calls == ["before_spawn", "started True", "before_stop"]
    assert out.read_text() == "report line\n"
    events = read_chain(outcome.ledger)
    assert [e["type"] for e in events] == [
        "session.start", "fault.injected", "process.spawn", "process.exit", "session.end"
    ]  # fmt: skip
    assert events[0]["chaos"] == {"seed": 5, "faults": ["test:hook"]}
    assert [e["seq"] for e in seen] == [e["seq"] for e in events]
    assert events[0]["caps"]["max_model_calls"] == 3  # the Policy object given, not a file


async def test_a_net_window_the_run_outlives_is_lifted_and_recorded_at_teardown(tmp_path):
    faults = ("net:latency(5ms)@t 0", "net:timeout(0)@t 25s..29s")  # open; never begins
    with trio.fail_after(DEADLINE):
        result = await run_chaos(scenario(*faults, mode="once"), seed=23, folder=tmp_path / "r")
    assert result.exit_status == 0, result.reason
    events = read_chain(result.ledger_path)
    types = [e["type"] for e in events]
    net = [(e["fault"], e["action"]) for e in events if e["type"] == "fault.injected"]
    assert net == [(faults[0], "toxic_added"), (faults[0], "toxic_removed")]
    removed = next(e for e in events if e.get("action") == "toxic_removed")
    assert removed["teardown"] is True and 0 < removed["at_s"] < 25
    assert "error" not in removed  # lifted while the proxy still served
    assert types.index("model.response") < events.index(removed) < types.index("session.end")
    assert result.receipt["faults"]["injected"] == 2
    assert all("note" not in i for i in result.injected)


async def test_with_an_external_toxiproxy_windows_are_lifted_and_proxies_destroyed(tmp_path):
    faults = ("net:latency(5ms)@t 0",)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve_toxiproxy, port=0))
            result = await run_chaos(
                scenario(*faults, mode="once"),
                seed=24,
                folder=tmp_path / "r",
                toxiproxy_url=server.url,
            )
            left = await trio.to_thread.run_sync(ToxiproxyDriver(server.url).proxy_names)
            nursery.cancel_scope.cancel()
    assert result.exit_status == 0, result.reason
    records = [e for e in read_chain(result.ledger_path) if "action" in e]
    assert [e["action"] for e in records] == ["toxic_added", "toxic_removed"]
    # on a shared Toxiproxy the proxy carries the run's tag, and the run took it away
    assert re.fullmatch(r"docket_[0-9a-f]{6}_openai", records[0]["proxy"])
    assert left == []
    assert result.notes == []


async def test_every_forwarded_call_is_in_the_stub_s_log(tmp_path):
    faults = ("upstream:status(503)@25%", "upstream:latency(20ms)@50%")
    with trio.fail_after(DEADLINE):
        result = await run_chaos(
            scenario(*faults, mode="hammer", calls=24, concurrency=6),
            seed=25,
            folder=tmp_path / "r",
        )
    assert result.exit_status == 0, result.reason
    events = read_chain(result.ledger_path)
    forwarded = [e for e in events if e["type"] == "model.request"]
    log = result.stub_logs["openai"]
    assert len(forwarded) == len(log) == 24
    assert not any("incomplete" in entry for entry in log)
    faulted = sum(1 for entry in log for f in entry["faults"] if "status" in f["fault"])
    assert faulted == sum(1 for e in events if e["type"] == "model.error")


async def test_each_agent_s_pid_is_on_file_before_it_runs(tmp_path):
    folder = tmp_path / "r"
    pidfile = folder / "agents" / "reader.pid"
    # The agent's first act is to read its own pid file: it must already be there.
    code = (
        "import json, os, sys; "
        "text = open(sys.argv[1]).read(); "
        "print(json.dumps({'pid': os.getpid(), 'on_file': text.strip()}))"
    )
    agent = AgentSpec(name="reader", mode=None, command=(sys.executable, "-c", code, str(pidfile)))
    plain = AgentSpec(name="plain", mode="once", timeout=5.0)
    run = Scenario(agents=(agent, plain), max_wall_clock=30.0, probe_every=0.0)
    with trio.fail_after(DEADLINE):
        result = await run_chaos(run, seed=26, folder=folder)
    assert result.exit_status == 0, result.reason
    report = result.agent_reports["reader"]
    assert report["on_file"] == str(report["pid"])
    assert result.agent_pids["reader"] == report["pid"]
    assert set(result.agent_pids) == {"reader", "plain"}
    assert result.agent_pids["plain"] not in (report["pid"], 0)


async def test_a_cap_kill_stops_the_agent_which_still_reports(tmp_path):
    run = scenario(mode="hammer", calls=400, concurrency=2)
    run = Scenario(
        agents=run.agents,
        policy={"caps": {"max_model_calls": 5, "on_breach": "kill"}},
        max_wall_clock=30.0,
        probe_every=0.0,
    )
    with trio.fail_after(DEADLINE):
        result = await run_chaos(run, seed=27, folder=tmp_path / "r")
    assert result.exit_status == 42  # the run's own verdict, not the agent's 143
    assert result.receipt["exit"]["status"] == 42
    report = result.agent_reports["a"]
    assert report["stopped"] == "sigterm"
    assert report["calls"] < 400
    events = read_chain(result.ledger_path)
    exit_event = next(e for e in events if e["type"] == "process.exit")
    assert exit_event["status"] == 143  # the launcher passed on the agent's status
