"""A chaos run in a process of its own, for a schedule that SIGKILLs the supervisor.

`process:sigkill(supervisor)` kills the process the recorder runs in; run in
the caller's process it would kill the caller. So run_chaos hands such a run to
`python -m chaos.run.worker SPEC.json`, which runs it (stubs, proxy, recorder and
all) and is killed by its own fault; the caller then reads the folder
(chaos.run.collect) as for any run. The agents die with it (PR_SET_PDEATHSIG); the
proxies it made on a real Toxiproxy do not, so the caller takes them away.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from functools import partial
from pathlib import Path

import trio

from chaos.faults.schedule import FaultSchedule
from chaos.run.collect import RunResult, collect
from chaos.scenario import AgentSpec, Hosts, ProviderSpec, Scenario

SPARE_SECONDS = 30.0  # beyond the scenario's wall clock, for start-up and teardown
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def scenario_to_json(scenario: Scenario) -> dict:
    return dataclasses.asdict(scenario)


def scenario_from_json(data: dict) -> Scenario:
    return Scenario(
        **{
            **data,
            "faults": tuple(data["faults"]),
            "providers": tuple(ProviderSpec(**p) for p in data["providers"]),
            "hosts": Hosts(**data["hosts"]),
            "agents": tuple(
                AgentSpec(**{**a, "command": tuple(a["command"])}) for a in data["agents"]
            ),
        }
    )


async def run_in_worker(
    scenario: Scenario, *, seed: int, folder: Path, toxiproxy_url: str | None
) -> RunResult:
    from chaos.run.here import add_note, repro_command
    from chaos.run.upstreams import remove_listed_proxies

    spec = folder / "worker.json"
    spec.write_text(
        json.dumps(
            {
                "scenario": scenario_to_json(scenario),
                "seed": seed,
                "folder": str(folder),
                "toxiproxy_url": toxiproxy_url,
            }
        )
    )
    started = trio.current_time()
    argv = [sys.executable, "-m", "chaos.run.worker", str(spec)]
    try:
        with (
            trio.fail_after(scenario.max_wall_clock + SPARE_SECONDS),
            (folder / "worker.out").open("wb") as out,
            (folder / "worker.err").open("wb") as err,
            # A Ctrl-C (or SIGTERM) for us is passed to the worker, whose supervisor ends
            # the run legibly; we wait for it and read the folder as for any other end.
            trio.open_signal_receiver(*FORWARDED_SIGNALS) as signals,
        ):
            async with trio.open_nursery() as nursery:
                run = partial(trio.run_process, argv, check=False, stdout=out, stderr=err)
                worker = await nursery.start(run)
                nursery.start_soon(_forward_signals, signals, worker)
                status = await worker.wait()
                nursery.cancel_scope.cancel()
    finally:
        # the worker is gone, however it went: what it made on a real Toxiproxy goes too
        if toxiproxy_url is not None:
            with trio.CancelScope(shield=True):
                for problem in await remove_listed_proxies(toxiproxy_url, folder):
                    add_note(folder, f"teardown: {problem}")
    if status < 0:
        why = f"the supervisor was killed by {signal.Signals(-status).name}"
        killed = (128 - status, why)
    else:
        killed = (status, f"the worker exited with status {status} without an outcome")
    return collect(
        folder,
        seed=seed,
        schedule=[f.text for f in FaultSchedule.parse(seed, scenario.faults).faults],
        repro=repro_command(scenario, seed, toxiproxy_url),
        agents=[a.name for a in scenario.agents],
        duration_s=trio.current_time() - started,
        killed=killed,
    )


async def _forward_signals(signals, worker: trio.Process) -> None:
    async for signum in signals:
        if worker.returncode is None:
            worker.send_signal(signum)


def main(argv: list[str]) -> int:
    from chaos.run.here import run_here

    spec = json.loads(Path(argv[0]).read_text())
    scenario = scenario_from_json(spec["scenario"])
    schedule = FaultSchedule.parse(spec["seed"], scenario.faults)
    trio.run(
        lambda: run_here(
            scenario,
            schedule,
            folder=Path(spec["folder"]),
            toxiproxy_url=spec["toxiproxy_url"],
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
