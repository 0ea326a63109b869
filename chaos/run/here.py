"""One chaos run in this process (`run_here`), as chaos.run.engine.run_chaos starts it.

One trio run owns everything, in one nursery, torn down however it ends (an
error, Ctrl-C, a cancelled caller): the stub providers and the fault proxy in
front of them (chaos.run.upstreams), then the recorder (docket.run.supervisor) with
the hooks that put faults inside it (a failing ledger write, a stepping clock,
a signal) and their evidence in its chain, and under it the agents (one
launcher process, chaos.run.launcher, running each agent of the scenario). While
the agents run, healthz/readyz are sampled; once they have exited, and before
the boundary stops, its metrics are scraped.

Teardown runs inside out: the tasks that act during the run (the `started`
hook's nursery: `@t` net windows, fault timers, probes) end when the agents
have been reaped, while the proxy still serves and the ledger is open, so a
window the run outlived is lifted and recorded; then the recorder closes; then
the proxies and the stubs stop.

Everything the run leaves is in `folder`: ledger.jsonl and receipt.json (the
recorder's), stub-NAME.jsonl (what each stub saw), injected.jsonl (every fault
the harness performed, with the seq of its record), probes.jsonl, metrics.txt,
agents/NAME.out, .err and .pid, outcome.json (and notes.txt, if the run had
something to say; proxies.txt, its proxies on a real Toxiproxy). `RunResult`
is read back from those files (chaos.run.collect), so a run whose supervisor was
killed outright (which happens in a worker process: chaos.run.worker) is read the
same way.

`@t` faults count from one instant: when run_chaos starts; a `@t ... after call N`
fault counts from the moment the ledger recorded the run's N-th model.request.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from functools import partial
from pathlib import Path

import trio

from chaos.faults import clock as clock_faults
from chaos.faults import process as process_faults
from chaos.faults.grammar import Fault
from chaos.faults.ledger import LedgerFaults
from chaos.faults.schedule import FaultSchedule
from chaos.faults.triggers import EventTriggers, injection_fields
from chaos.run.collect import NOTES
from chaos.run.evidence import FaultEvidence
from chaos.run.upstreams import (
    ADDRESSES_FILE,
    Upstreams,
    arm_net_faults,
    hold_window,
    net_windows,
    remove_proxies,
    run_policy,
    start_proxies,
    start_stubs,
)
from chaos.scenario import Scenario
from docket.errors import InputError
from docket.run.hooks import RunHandle, RunHooks
from docket.run.supervisor import Supervisor
from docket.run.values import RunOptions

GRACE_SECONDS = 2.0  # SIGTERM to SIGKILL for the agents when the run is stopped
PROBE_TIMEOUT = 2.0
SCRAPE_TIMEOUT = 5.0
RESOLVE_UP_TO = 100  # ordinals shown in the printed and recorded schedule


def repro_command(scenario: Scenario, seed: int, toxiproxy_url: str | None = None) -> str:
    """The `docket chaos` command line that runs this scenario again with this seed."""
    argv = ["docket", "chaos", "--seed", str(seed)]
    if scenario.source is not None and not scenario.source.startswith("<"):
        argv += ["--scenario", scenario.source]
    else:
        for text in scenario.faults:
            argv += ["--fault", text]
        (agent,) = scenario.agents[:1] or (None,)
        if agent is not None and agent.command:
            argv += ["--", *agent.command]
        elif agent is not None and agent.mode:
            argv += ["--agent", agent.mode]
    if toxiproxy_url:
        argv += ["--toxiproxy", toxiproxy_url]
    argv += scenario.hosts.flags()
    return shlex.join(argv)


def check_folder(folder: Path) -> None:
    """Refuse a folder that already holds a run (before anything is created)."""
    if (folder / "ledger.jsonl").exists():
        raise InputError(f"run folder {folder} already holds a run: give a new folder")


def prepare_folder(folder: Path) -> None:
    check_folder(folder)
    try:
        # Owner only: the docket run's ledger, the stubs' logs and the scraped metrics
        # inside are then closed to other users whatever mode each file gets.
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"run folder {folder}: cannot create ({exc.strerror})") from None
    (folder / "agents").mkdir(exist_ok=True)


async def run_here(
    scenario: Scenario, schedule: FaultSchedule, *, folder: Path, toxiproxy_url: str | None
) -> None:
    """The run itself, in this process; writes outcome.json at the end."""
    run = _Run(scenario, schedule, folder)
    async with trio.open_nursery() as nursery:
        try:
            await start_stubs(
                nursery,
                scenario,
                schedule,
                run.upstreams,
                folder=folder,
                elapsed=run.elapsed,
                evidence=run.evidence,
            )
            await start_proxies(
                nursery,
                scenario,
                schedule,
                run.upstreams,
                elapsed=run.elapsed,
                evidence=run.evidence,
                toxiproxy_url=toxiproxy_url,
                folder=folder,
                note=partial(add_note, folder),
            )
            outcome = await run.supervise()
        finally:
            # The supervisor has returned, so every fault task (the `started`
            # hook's nursery) has ended: the proxies can go.
            problems = await remove_proxies(run.upstreams)
            run.upstreams.close()
            nursery.cancel_scope.cancel()
            for problem in problems:
                add_note(folder, f"teardown: {problem}")
    # A signal the supervisor caught that no process fault of ours sent came from outside:
    # the user's Ctrl-C (or a kill), which the caller must hear about, not just the agent.
    from_outside = list(outcome.signals)
    for name in run.signals_to_self:
        if name in from_outside:
            from_outside.remove(name)
    (folder / "outcome.json").write_text(
        json.dumps(
            {
                "exit_status": outcome.exit_status,
                "reason": outcome.reason,
                "interrupted_by": from_outside[0] if from_outside else None,
            }
        )
        + "\n"
    )


def add_note(folder: Path, line: str) -> None:
    """One line of notes.txt, on file at once: a worker killed later keeps it."""
    with (folder / NOTES).open("a", encoding="utf-8") as notes:
        notes.write(line + "\n")


class _Run:
    """One run's state: what the hooks share with the tasks they start."""

    def __init__(self, scenario: Scenario, schedule: FaultSchedule, folder: Path) -> None:
        self.scenario, self.schedule, self.folder = scenario, schedule, folder
        self.t0 = trio.current_time()
        self.upstreams = Upstreams()
        self.evidence = FaultEvidence(folder / "injected.jsonl")
        self.clock = clock_faults.ChaosClock()
        self._started_began = False
        self._started_ended = trio.Event()  # the `started` hook's tasks have all finished
        self.probes = folder / "probes.jsonl"
        self.signals_to_self: list[str] = []  # process faults aimed at the supervisor
        faults_of = {t: [f for f in schedule.faults if f.target == t] for t in ("clock", "process")}
        self.clock_triggers = EventTriggers(schedule, faults_of["clock"], once=False)
        self.process_triggers = EventTriggers(schedule, faults_of["process"], once=True)
        self.watching = bool(faults_of["clock"] or faults_of["process"])
        self._events_in, self._events_out = trio.open_memory_channel[dict](math.inf)
        # the run's requests as the ledger records them: `@t ... after call N` windows
        # start from the moment call N is durable (trio time), not from the run's start
        self._call_times: list[float] = []
        self._call_waiters: dict[int, trio.Event] = {}

    def elapsed(self) -> float:
        return trio.current_time() - self.t0

    def _observe(self, event: dict) -> None:
        if event["type"] == "model.request":
            self._call_times.append(trio.current_time())
            waiter = self._call_waiters.pop(len(self._call_times), None)
            if waiter is not None:
                waiter.set()
        if self.watching:
            self._events_in.send_nowait(event)

    async def supervise(self):
        write_faults = LedgerFaults(
            self.schedule,
            elapsed=self.elapsed,
            on_inject=lambda fields: self.evidence.unwritable(
                fields, "a ledger fault: its record cannot be in the ledger it breaks"
            ),
        )
        hooks = RunHooks(
            clock=self.clock,
            write_faults=write_faults if write_faults.active else None,
            chaos=self.schedule.receipt_entry(RESOLVE_UP_TO),
            observers=(self._observe,),
            before_spawn=self._before_spawn,
            started=self._started,
            before_stop=self._before_stop,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKET_AGENT_")}
        env |= self.upstreams.env(self.scenario)
        plan = self.folder / "agents" / "plan.json"
        plan.write_text(json.dumps(self._agent_plan(), indent=1) + "\n")
        with (
            open(self.folder / "agents" / "launcher.out", "wb") as out,
            open(self.folder / "agents" / "launcher.err", "wb") as err,
        ):
            options = RunOptions(
                command=[sys.executable, "-m", "chaos.run.launcher", str(plan)],
                ledger_dir=str(self.folder),
                max_wall_clock=self.scenario.max_wall_clock,
                grace_seconds=GRACE_SECONDS,
                stdout=out,
                stderr=err,
            )
            policy = run_policy(self.scenario, self.upstreams)
            supervisor = Supervisor(options, hooks=hooks, env=env, policy=policy)
            return await supervisor.run()

    def _agent_plan(self) -> list[dict]:
        plan = []
        for index, agent in enumerate(self.scenario.agents):
            provider = self.scenario.provider(agent.provider)
            settings = agent.settings()
            # The agent's jitter is seeded from the run's seed, so a rerun backs off alike.
            settings.setdefault("DOCKET_AGENT_SEED", str((self.schedule.seed + index) % (1 << 53)))
            argv = list(agent.command) or [sys.executable, "-m", "docket", "agent"]
            route = f"/{provider.name}" + ("/v1" if provider.kind == "openai" else "")
            out = self.folder / "agents" / agent.name
            plan.append(
                {
                    "name": agent.name,
                    "argv": argv,
                    "env": settings,
                    "route": route,
                    "kind": provider.kind,
                    "stdout": str(out.with_suffix(".out")),
                    "stderr": str(out.with_suffix(".err")),
                    "pidfile": str(out.with_suffix(".pid")),
                    "exitfile": str(out.with_suffix(".exit")),
                }
            )
        return plan

    # -- the hooks

    async def call_seen(self, ordinal: int) -> float:
        """Wait until the ledger holds the run's `ordinal`-th model.request (1-based);
        return the trio time it was recorded. Never returns if that call never comes:
        the task waiting is cancelled with the run, and its fault leaves no record."""
        if ordinal > len(self._call_times):
            await self._call_waiters.setdefault(ordinal, trio.Event()).wait()
        return self._call_times[ordinal - 1]

    async def _before_spawn(self, handle: RunHandle) -> None:
        self.evidence.open(handle)
        note_boundary(self.folder, handle.boundary_url)
        await arm_net_faults(self.scenario, self.schedule, self.upstreams, evidence=self.evidence)

    async def _started(self, handle: RunHandle) -> None:
        """Every task that acts during the run. The supervisor cancels this hook when
        the agent is reaped; the `@t` net windows then lift their toxics (the proxy
        still serves) and record it (the ledger is still open), and _before_stop
        waits for that before it closes the evidence."""
        self._started_began = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.evidence.pump)
                if self.scenario.probe_every > 0:
                    nursery.start_soon(self._probe, handle.boundary_url)
                for window in net_windows(self.scenario, self.schedule, self.upstreams):
                    nursery.start_soon(
                        partial(
                            hold_window,
                            self.upstreams,
                            window,
                            schedule=self.schedule,
                            run_started=self.t0,
                            evidence=self.evidence,
                            call_seen=self.call_seen,
                        )
                    )
                if self.watching:
                    nursery.start_soon(self._watch_events, handle)
                    for triggers in (self.clock_triggers, self.process_triggers):
                        for at, fault in triggers.timers():
                            nursery.start_soon(self._at_time, handle, at, fault)
        finally:
            self._started_ended.set()

    async def _before_stop(self, handle: RunHandle) -> None:
        if self._started_began:
            await self._started_ended.wait()
        await self.evidence.close()
        await self._scrape(handle.boundary_url)

    # -- inside faults: clock and process

    async def _watch_events(self, handle: RunHandle) -> None:
        async for event in self._events_out:
            now = self.elapsed()
            for fault, ordinal in self.clock_triggers.on_event(event, now):
                await self._perform(handle, fault, ordinal)
            for fault, ordinal in self.process_triggers.on_event(event, now):
                await self._perform(handle, fault, ordinal)

    async def _at_time(self, handle: RunHandle, at: float, fault: Fault) -> None:
        after_call = fault.trigger.timed.after_call  # type: ignore[union-attr]
        origin = self.t0 if after_call is None else await self.call_seen(after_call)
        await trio.sleep_until(origin + at)
        await self._perform(handle, fault, None)

    async def _perform(self, handle: RunHandle, fault: Fault, ordinal: int | None) -> None:
        """Record the fault (durable), then act: the evidence precedes the effect."""
        fields = injection_fields(self.schedule, fault, ordinal, at_s=round(self.elapsed(), 3))
        if fault.target == "clock":
            await self.evidence.record(fields)
            self.clock.apply(fault)
            return
        sig = process_faults.signal_of(fault)
        await self.evidence.record(fields | {"signal": sig.name})
        if fault.arg("who") == "supervisor":
            self.signals_to_self.append(sig.name)  # caught by the supervisor: ours, not Ctrl-C
        problem = process_faults.send(fault, handle)
        if problem is not None:
            self.evidence.unwritable(fields, f"signal not sent: {problem}")

    # -- observation

    async def _probe(self, url: str) -> None:
        import httpx

        async with httpx.AsyncClient(base_url=url, timeout=PROBE_TIMEOUT, trust_env=False) as http:
            with self.probes.open("a", encoding="utf-8") as out:
                while True:
                    sample: dict = {"t": round(self.elapsed(), 3)}
                    for name in ("healthz", "readyz"):
                        try:
                            answer = await http.get(f"/docket/{name}")
                        except httpx.HTTPError as exc:
                            sample[name] = None
                            sample[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                            continue
                        sample[name] = answer.status_code
                        if name == "readyz":
                            sample["ready"] = _json_or_text(answer)
                    out.write(json.dumps(sample, separators=(",", ":")) + "\n")
                    out.flush()
                    await trio.sleep(self.scenario.probe_every)

    async def _scrape(self, url: str) -> None:
        import httpx

        target = self.folder / "metrics.txt"
        try:
            with trio.fail_after(SCRAPE_TIMEOUT):
                async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT, trust_env=False) as http:
                    answer = await http.get(f"{url}/docket/metrics")
            target.write_text(answer.text)
        except (httpx.HTTPError, trio.TooSlowError) as exc:
            (self.folder / "metrics.error").write_text(f"{type(exc).__name__}: {exc}\n")


def note_boundary(folder: Path, url: str) -> None:
    """Add where the boundary listens to the run's addresses.json (chaos.run.upstreams)."""
    path = folder / ADDRESSES_FILE
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data["boundary"] = url
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _json_or_text(answer) -> object:
    try:
        return answer.json()
    except ValueError:
        return answer.text
