"""Run a fleet scenario: one budget in a PostgreSQL behind the embedded fault proxy,
a stub provider, and `docket run` boundaries whose reference agents spend the budget
while the timeline's faults strike the database. Returns the Evidence (chaos.fleet.judge)
read from the run's files and the database once every boundary has ended.

Each boundary is `docket run -- python -m chaos.run.launcher PLAN`: the launcher runs the
scenario's callers, each `docket agent --mode backoff` (one call at a time, honouring the
fleet's Retry-After, so a refused agent waits instead of spinning) with its per-call
timeout set to the scenario's call deadline. The timeline counts from the moment every
boundary has served a call; at `duration` each run is sent SIGTERM (the supervisor
stops its agents, writes the receipt and gives its lease back).

Folder layout: `boundary-N/` (ledger, receipt), `boundary-N.out|.err` (docket run's own),
`agents/boundary-N/caller-M.out|.err` (each agent; its report is its last JSON line),
`agents/boundary-N.json` (the launcher's plan), `fleet.toml` (the boundaries' policy),
`windows.jsonl` (each window as performed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import trio

from chaos.faults.net import toxic_request
from chaos.fleet.judge import BoundarySeen, Evidence, WindowSeen
from chaos.fleet.postgres import Cluster, fresh_database
from chaos.fleet.scenario import FleetScenario, Window
from chaos.stub.server import Stub, StubConfig
from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.api import ApiError, ToxiproxyServer
from chaos.toxiproxy.proxy import Proxy
from chaos.toxiproxy.toxics import ToxicError
from chaos.toxiproxy.toxics.spec import parse_toxic

BUDGET = "fleet-scenario"
KEY_VAR = "DOCKET_FLEET_STUB_KEY"
STUB_KEY = "sk-fleet-scenario-stub-key"
READY_TIMEOUT_S = 60.0  # for every boundary's first call served
STOP_TIMEOUT_S = 30.0  # SIGTERM to exit: the supervisor's grace, the receipt, the give-back
VERIFY_TIMEOUT_S = 60.0
LIFT_TIMEOUT_S = 60.0  # a restart's start (pg_ctl waits up to its own 60 s), a toxic's removal
TOXIC = "fleet_fault"


class HarnessError(Exception):
    """The harness could not set the scenario up (not a verdict on Docket): one line."""


async def run_fleet(scenario: FleetScenario, folder: Path, cluster: Cluster) -> Evidence:
    """The whole scenario in `folder` (made here; it must not exist), against a fresh
    database in `cluster` (which the timeline may stop and start)."""
    folder.mkdir(parents=True)
    (folder / "agents").mkdir()
    dsn = await trio.to_thread.run_sync(fresh_database, cluster)
    from docket.fleet.amounts import Caps
    from docket.fleet.store import FleetStore

    store = FleetStore(dsn)
    cap = round(scenario.cap_usd * 10**9)
    await trio.to_thread.run_sync(store.set_budget, BUDGET, Caps(nusd=cap))
    started = time.monotonic()
    try:
        windows, codes = await _run(scenario, folder, cluster, dsn)
    except BaseExceptionGroup as group:
        # the nursery wraps what its body raised: a set-up failure is said as itself
        refused, other = group.split(HarnessError)
        if refused is None or other is not None:
            raise
        raise _first_leaf(refused) from None
    wall = time.monotonic() - started
    boundaries = [await _seen(folder, i, code, scenario.callers) for i, code in enumerate(codes)]
    status = await trio.to_thread.run_sync(store.status, BUDGET)
    return Evidence(scenario, windows, boundaries, status, wall)


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def _run(
    scenario: FleetScenario, folder: Path, cluster: Cluster, dsn: str
) -> tuple[list[WindowSeen], list[int | None]]:
    """The proxy, the stub, the boundaries and the timeline; each run's exit status."""
    async with trio.open_nursery() as nursery:
        toxiproxy: ToxiproxyServer = await nursery.start(partial(serve_toxiproxy, port=0))
        proxy = await toxiproxy.create_proxy(
            {"name": "postgres", "upstream": f"{cluster.host}:{cluster.port}"}
        )
        stub = Stub(StubConfig(kind="openai", latency=scenario.stub_latency))
        listening = await nursery.start(stub.serve)
        port = int(proxy.to_json()["listen"].rpartition(":")[2])
        policy = _policy(folder, scenario, listening.url, dsn.replace(
            f"port={cluster.port}", f"port={port}"
        ))  # fmt: skip
        runs = [
            await _start_boundary(folder, i, scenario, policy) for i in range(scenario.boundaries)
        ]
        try:
            t0 = await _all_serving(folder, runs, scenario.boundaries)
            windows = await _timeline(scenario.timeline, t0, toxiproxy, proxy, cluster, folder)
            await trio.sleep_until(t0 + scenario.duration)
        finally:
            codes = [await _stop(p) for p in runs]
        nursery.cancel_scope.cancel()
    return windows, codes


def _policy(folder: Path, s: FleetScenario, stub_url: str, dsn: str) -> Path:
    path = folder / "fleet.toml"
    path.write_text(
        "[providers.openai]\n"
        f'kind = "openai"\nbase_url = "{stub_url}"\nkey_env = "{KEY_VAR}"\n'
        "[fleet]\n"
        f'budget = "{BUDGET}"\ndsn = "{dsn}"\nslice_usd = {s.slice_usd!r}\n'
        f"lease_seconds = {s.lease_seconds!r}\ntimeout = {s.timeout!r}\n"
    )
    return path


def _plan(folder: Path, index: int, s: FleetScenario) -> Path:
    out = folder / "agents" / f"boundary-{index}"
    out.mkdir()
    plan = []
    for caller in range(s.callers):
        base = out / f"caller-{caller}"
        env = {
            "DOCKET_AGENT_MODE": "backoff",
            "DOCKET_AGENT_CALLS": "1000000",  # the run is stopped at `duration`, not by count
            "DOCKET_AGENT_TIMEOUT": f"{s.call_deadline:g}",
            "DOCKET_AGENT_MAX_ATTEMPTS": "1000000",
            "DOCKET_AGENT_RETRY_RATIO": "1",  # every refusal retried after its Retry-After
            "DOCKET_AGENT_DEADLINE": "86400",
            "DOCKET_AGENT_SEED": str(index * 1000 + caller),
        }
        plan.append(
            {
                "name": f"caller-{caller}",
                "argv": [sys.executable, "-m", "docket", "agent"],
                "env": env,
                "route": "/openai/v1",
                "kind": "openai",
                "stdout": str(base.with_suffix(".out")),
                "stderr": str(base.with_suffix(".err")),
                "pidfile": str(base.with_suffix(".pid")),
                "exitfile": str(base.with_suffix(".exit")),
            }
        )
    path = folder / "agents" / f"boundary-{index}.json"
    path.write_text(json.dumps(plan, indent=1) + "\n")
    return path


async def _start_boundary(folder: Path, index: int, s: FleetScenario, policy: Path):
    plan = _plan(folder, index, s)
    argv = [
        sys.executable, "-m", "docket", "run", "--policy", str(policy), "--ledger-dir",
        str(folder / f"boundary-{index}"), "--", sys.executable, "-m", "chaos.run.launcher",
        str(plan),
    ]  # fmt: skip
    with (
        open(folder / f"boundary-{index}.out", "wb") as out,
        open(folder / f"boundary-{index}.err", "wb") as err,
    ):
        return await trio.lowlevel.open_process(
            argv, env={**os.environ, KEY_VAR: STUB_KEY}, stdout=out, stderr=err
        )


async def _all_serving(folder: Path, runs: list, n: int) -> float:
    """When every boundary has served a call (it holds a slice and its agents are
    calling): the timeline's zero. Not the first lease, which comes before the agents
    have started: a window opened then would meet no call."""
    waiting = set(range(n))
    with trio.move_on_after(READY_TIMEOUT_S):
        while waiting:
            for i in sorted(waiting):
                ledger = folder / f"boundary-{i}" / "ledger.jsonl"
                if ledger.exists() and b'"model.response"' in ledger.read_bytes():
                    waiting.discard(i)
                elif runs[i].returncode is not None:
                    raise HarnessError(
                        f"boundary-{i} exited ({runs[i].returncode}) before it served a call: "
                        f"see {folder / f'boundary-{i}.err'}"
                    )
            await trio.sleep(0.05)
        return trio.current_time()
    raise HarnessError(
        f"{', '.join(f'boundary-{i}' for i in sorted(waiting))} served no call within "
        f"{READY_TIMEOUT_S:g} s: see their .err files in {folder}"
    )


async def _timeline(
    windows: tuple[Window, ...],
    t0: float,
    toxiproxy: ToxiproxyServer,
    proxy: Proxy,
    cluster: Cluster,
    folder: Path,
) -> list[WindowSeen]:
    seen = []
    for w in windows:
        await trio.sleep_until(t0 + w.at)
        done = await _perform(w, t0, toxiproxy, proxy, cluster)
        seen.append(done)
        with open(folder / "windows.jsonl", "a") as f:
            f.write(
                json.dumps(
                    {"name": w.name, "fault": w.what, "started": done.started,
                     "ended": done.ended, "error": done.error}
                ) + "\n"
            )  # fmt: skip
    return seen


async def _perform(
    w: Window, t0: float, toxiproxy: ToxiproxyServer, proxy: Proxy, cluster: Cluster
) -> WindowSeen:
    """Strike, hold for `for`, lift. A fault the harness could not perform or lift is the
    window's error (its check fails), never a silent gap."""
    errors: list[str] = []
    started = time.time()  # a restart's outage begins as the server begins to stop
    try:
        if w.fault is None:
            await trio.to_thread.run_sync(cluster.stop)
        elif w.fault.kind == "down":
            await toxiproxy.update_proxy(proxy, {"enabled": False})
            started = time.time()
        else:
            proxy.add_toxic(parse_toxic(toxic_request(w.fault, TOXIC).to_json()))
            started = time.time()  # a toxic acts from when it is in place
    except (RuntimeError, subprocess.TimeoutExpired, ApiError, ToxicError, OSError) as exc:
        errors.append(f"strike: {exc}")
    try:
        await trio.sleep_until(t0 + w.end)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(LIFT_TIMEOUT_S) as lifting:
            try:
                if w.fault is None:
                    await trio.to_thread.run_sync(cluster.start)
                elif w.fault.kind == "down":
                    await toxiproxy.update_proxy(proxy, {"enabled": True})
                elif TOXIC in proxy.toxics:
                    proxy.remove_toxic(TOXIC)
            except (RuntimeError, subprocess.TimeoutExpired, ApiError, OSError) as exc:
                errors.append(f"lift: {exc}")
        if lifting.cancelled_caught:
            errors.append(f"lift: not done in {LIFT_TIMEOUT_S:g} s")
    return WindowSeen(w, started, time.time(), "; ".join(errors) or None)


async def _stop(process) -> int | None:
    """SIGTERM, then wait; None when it would not stop and had to be killed."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    with trio.move_on_after(STOP_TIMEOUT_S):
        return await process.wait()
    process.kill()
    await process.wait()
    return None


async def _seen(folder: Path, index: int, code: int | None, callers: int) -> BoundarySeen:
    run = folder / f"boundary-{index}"
    ledger = run / "ledger.jsonl"
    events = [json.loads(x) for x in ledger.read_text().splitlines()] if ledger.exists() else []
    receipt_path = run / "receipt.json"
    receipt = json.loads(receipt_path.read_text()) if receipt_path.exists() else None
    verified, said = False, "no receipt"
    if receipt is not None:
        with trio.fail_after(VERIFY_TIMEOUT_S):
            done = await trio.run_process(
                [sys.executable, "-m", "docket", "verify", str(receipt_path)],
                capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
        verified = done.returncode == 0
        text = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()
        said = text[-1] if text else f"exit {done.returncode}"
    reports = [
        _report(folder / "agents" / f"boundary-{index}" / f"caller-{c}.out") for c in range(callers)
    ]
    return BoundarySeen(f"boundary-{index}", code, events, receipt, verified, said, reports)


def _report(path: Path) -> dict | None:
    """An agent's report: the last line of its stdout that is a JSON object."""
    if not path.exists():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line of its other output
        if isinstance(value, dict):
            return value
    return None
