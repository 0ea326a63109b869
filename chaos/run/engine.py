"""The chaos engine's door: one supervised run under a seeded fault schedule.

    result = await run_chaos(scenario, seed=1234, folder=Path("runs/x"))

It parses the schedule, prepares the folder, and runs the scenario in this
process (chaos.run.here) or, when a fault may kill the supervisor or crash the
ledger, in a worker process of its own (chaos.run.worker); either way the
result is read back from the folder (chaos.run.collect). Apart from here.py so
that here.py and worker.py (which runs here.py's run) import each other in one
direction only.
"""

from __future__ import annotations

from pathlib import Path

import trio

from chaos.faults import ledger as ledger_faults
from chaos.faults import process as process_faults
from chaos.faults.schedule import FaultSchedule
from chaos.run.collect import RunResult, collect
from chaos.run.here import prepare_folder, repro_command, run_here
from chaos.run.upstreams import check_toxiproxy
from chaos.run.worker import run_in_worker
from chaos.scenario import Scenario


async def run_chaos(
    scenario: Scenario, *, seed: int, folder: Path, toxiproxy_url: str | None = None
) -> RunResult:
    """Run the scenario under `seed`; every file lands in `folder` (created; must be new)."""
    folder = Path(folder)
    schedule = FaultSchedule.parse(seed, scenario.faults)
    repro = repro_command(scenario, seed, toxiproxy_url)
    if toxiproxy_url is not None:
        await check_toxiproxy(toxiproxy_url, schedule)
    prepare_folder(folder)
    if process_faults.kills_supervisor(schedule.faults) or ledger_faults.crashes(schedule.faults):
        return await run_in_worker(scenario, seed=seed, folder=folder, toxiproxy_url=toxiproxy_url)
    started = trio.current_time()
    await run_here(scenario, schedule, folder=folder, toxiproxy_url=toxiproxy_url)
    return collect(
        folder,
        seed=seed,
        schedule=[f.text for f in schedule.faults],
        repro=repro,
        agents=[a.name for a in scenario.agents],
        duration_s=trio.current_time() - started,
    )
