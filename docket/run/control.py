"""The supervisor's hold on its child: spawn it, reap it, stop it.

`ChildControl` is an object the supervisor (docket.run.supervisor) makes and
holds, given what it works with and nothing more: the run's options, the
environment, token and policy the child's environment is built from, the hooks,
what the kernel granted at start (`hardening`), `record` (the supervisor's
append) and a `StopLatch` (the run's one stop request, shared with the boundary).
It spawns the child from the main thread (ADR 0004), runs the `before_spawn` and
`started` hooks, reaps the child and records its exit, forwards SIGINT/SIGTERM to
its process group, escalates to SIGKILL after the grace period (at once on a
second signal), stops the child when a stop is requested or the wall-clock cap is
reached, and kills what the child left in its group (and, through its
OrphanSweep, what it detached). `RunHandleOf` is the view of a run its hooks get
(docket.run.hooks.RunHandle).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

import trio

from docket.boundary.stop import StopRequest
from docket.guards.redact import redact_argv
from docket.ledger.limits import EvidenceLost
from docket.run.child import (
    EXIT_CANNOT_EXEC,
    EXIT_NOT_FOUND,
    Child,
    child_env,
    command_missing,
    describe_exit,
    group_members,
    signal_name,
    wait_status,
)
from docket.run.hooks import RunHooks
from docket.run.isolation import PIDNS
from docket.run.orphans import OrphanSweep, Record
from docket.run.values import RunOptions

if TYPE_CHECKING:
    from docket.boundary.app import Boundary
    from docket.policy import Policy


class StopLatch:
    """The run's stop request: the first one wins, and `event` is set by it."""

    def __init__(self) -> None:
        self.requested: StopRequest | None = None
        self.event = trio.Event()

    def request(self, request: StopRequest) -> None:
        if self.requested is None:
            self.requested = request
            self.event.set()


class ChildControl:
    """Spawning, reaping, signalling and stopping the child. What the child leaves
    behind outside its group is its OrphanSweep's (`sweep`)."""

    def __init__(
        self,
        options: RunOptions,
        *,
        env: Mapping[str, str],
        token: str,
        policy: Policy,
        hooks: RunHooks,
        hardening: Mapping[str, object],
        record: Record,
        stop: StopLatch,
    ) -> None:
        self.options = options
        self.env = env
        self.token = token
        self.policy = policy
        self.hooks = hooks
        self.hardening = hardening  # filled in at start (the supervisor's _harden)
        self._record = record
        self.stop = stop
        self.sweep = OrphanSweep(record)
        self.child: Child | None = None
        self.boundary_url: str | None = None
        self.signals_forwarded: list[str] = []
        self.signals_received: list[str] = []
        self.started = 0.0  # trio.current_time() at session start (the wall clock's origin)
        self.hooks_scope = trio.CancelScope()  # the `started` hook's; cancelled at the reap
        self._escalating = False
        self._group_killed = False  # a SIGKILL went to the whole group
        # Told before each fault.injected is recorded (the response cache's fault
        # window): the boundary's note_fault, once the supervisor has made it.
        self.on_fault: Callable[[], object] | None = None

    def handle(self) -> RunHandleOf:
        """What a hook is given: the boundary serves by the time any hook runs."""
        assert self.boundary_url is not None, "the hooks run only once the boundary serves"
        return RunHandleOf(self.boundary_url, self, self._record, self.stop)

    async def run_child(self, nursery: trio.Nursery, url: str) -> int | None:
        self.boundary_url = url
        env = child_env(dict(self.env), url, self.token, self.policy)
        command = self.options.command
        if self.stop.requested is not None:
            return None  # stopped during start-up (a signal, lost evidence): nothing to run
        if self.hooks.before_spawn is not None:
            await self.hooks.before_spawn(self.handle())
            if self.stop.requested is not None:
                return None  # the hook (or a signal meanwhile) ended the run before it began
        if command_missing(command[0], env.get("PATH", os.defpath)):
            self.stop.request(
                StopRequest(f"command not found: {command[0]}", exit_status=EXIT_NOT_FOUND)
            )
            return None
        self.sweep.note_children()
        report = self.sweep.open_report_pipe()  # the launcher writes its watcher's pid here
        launch = [sys.executable, "-m", "docket.run.launch", str(os.getpid())]
        launch += ["--report-fd", str(report)]
        if self.sweep.cgroup is not None:  # joined by the launcher before anything else
            launch += ["--cgroup", str(self.sweep.cgroup.path)]
        elif self.sweep.isolation == PIDNS:  # no leaf: the run's own PID namespace
            launch += ["--pid-namespace"]
        argv = [*launch, "--", *command]
        try:
            # Spawned here, in the thread that runs the whole supervisor, and not
            # through trio.lowlevel.open_process: that forks from a worker thread,
            # and the child's death signal (launch.py) fires when the thread that
            # forked it exits, which an idle worker does after a few seconds.
            # Popen forks without running Python in the child, and returns once
            # the launcher is exec'd: a millisecond of blocking, once per run.
            popen = subprocess.Popen(
                argv,
                env=env,
                start_new_session=True,
                stdout=self.options.stdout,
                stderr=self.options.stderr,
                pass_fds=(report,),
            )
        except (OSError, ValueError) as exc:
            self.sweep.close_report_fd()
            self.stop.request(
                StopRequest(f"cannot start the child: {exc}", exit_status=EXIT_CANNOT_EXEC)
            )
            return None
        finally:
            os.close(report)  # the launcher holds its own copy
        child = self.child = Child(popen)
        try:
            await self._record("process.spawn", pid=child.pid, argv=redact_argv(command))
            nursery.start_soon(self._stop_on_request, child, nursery)
            if self.hardening.get("subreaper"):
                nursery.start_soon(self.sweep.reap_while_running, child)
            if self.hooks.started is not None:
                nursery.start_soon(self._run_started_hook)
            returncode = await child.reap()
        finally:
            # Leaving without having reaped it (cancelled, or a bug): never leave it running.
            child.kill_now()
            self.hooks_scope.cancel()
        await self._record(
            "process.exit", pid=child.pid, status=returncode, reason=describe_exit(returncode)
        )
        await self._kill_stragglers(child)
        try:
            await self.sweep.end_orphans(child.pid)
        finally:
            self.sweep.close_report_fd()
        return wait_status(returncode)

    async def _run_started_hook(self) -> None:
        started = self.hooks.started
        assert started is not None, "started only when the hook is given"
        with self.hooks_scope:
            await started(self.handle())

    async def _kill_stragglers(self, child: Child) -> None:
        """The child is gone but processes it started in its group may not be: the run is
        over, so they go too (SIGKILL: they have no supervisor to answer to)."""
        if self._group_killed:
            return  # every member then got SIGKILL already; some may still be dying
        members = group_members(child.pid)
        if not members:
            return
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            return  # they exited while we looked
        await self._record(
            "signal.forwarded",
            signal="SIGKILL",
            pgid=child.pid,
            reason=f"the child exited; {len(members)} process(es) of its group still running",
        )

    async def _signal_group(self, child: Child, sig: int, reason: str) -> bool:
        """Signal the child's group and record it; False if there was nobody to signal."""
        if child.exited.is_set():
            return False  # reaped: the pid may be reused, and there is nothing to stop
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return False  # the group is already gone: nothing was sent, nothing to record
        if sig == signal.SIGKILL:
            self._group_killed = True
        await self._record(
            "signal.forwarded", signal=signal_name(sig), pgid=child.pid, reason=reason
        )
        return True

    def _escalate_once(self, child: Child, nursery: trio.Nursery, reason: str) -> None:
        if not self._escalating:
            self._escalating = True
            nursery.start_soon(self._kill_after_grace, child, reason)

    async def _kill_after_grace(self, child: Child, reason: str) -> None:
        grace = self.options.grace_seconds
        with trio.move_on_after(grace):
            await child.exited.wait()
            return
        await self._signal_group(child, signal.SIGKILL, f"{reason}; not gone after {grace:g} s")

    async def watch_signals(self, signals: AsyncIterator[int], nursery: trio.Nursery) -> None:
        async for sig in signals:
            name = signal_name(sig)
            self.signals_received.append(name)
            child = self.child
            if child is None:
                # Start-up is not finished: nothing to forward, so do not start the child.
                self.stop.request(
                    StopRequest(
                        f"{name} received before the child was started", exit_status=128 + sig
                    )
                )
                continue
            why = f"{name} received by the supervisor"
            if self.signals_forwarded:
                # A second Ctrl-C (or SIGTERM): whoever sent it will not wait out
                # --grace, so the group is killed now, and the record says why.
                why += " again: killed without waiting out the grace period"
                if await self._signal_group(child, signal.SIGKILL, why):
                    self.signals_forwarded.append(name)
                continue
            if await self._signal_group(child, sig, why):
                self.signals_forwarded.append(name)
                self._escalate_once(child, nursery, why)

    async def watch_wall_clock(self, boundary: Boundary) -> None:
        """Tell the caps guard the elapsed time at each threshold it names (warning,
        breach); its on_breach decides. --max-wall-clock stops the run regardless.

        trio sleeps and reads time on the monotonic clock, so a wall clock that
        steps (NTP, a chaos clock fault on `clock`) cannot move any of this.
        """
        hard = self.options.max_wall_clock
        caps = boundary.caps
        while True:
            due = [t for t in (caps.next_wall_threshold(), hard) if t is not None]
            if not due:
                return
            await trio.sleep_until(self.started + min(due))
            elapsed = trio.current_time() - self.started
            try:
                await boundary.cap_events(caps.check_wall(elapsed))  # stops on "kill"
            except EvidenceLost:
                return  # the boundary has asked for the stop (exit 43): the run is ending
            if hard is not None and elapsed >= hard:
                self.stop.request(StopRequest("wall-clock cap reached", cap="max_wall_seconds"))
                return

    async def _stop_on_request(self, child: Child, nursery: trio.Nursery) -> None:
        await self.stop.event.wait()
        assert self.stop.requested is not None, "the event is set with the request"
        reason = self.stop.requested.reason
        await self._signal_group(child, signal.SIGTERM, reason)
        self._escalate_once(child, nursery, reason)


class RunHandleOf:
    """The docket.run.hooks.RunHandle a run gives its hooks."""

    def __init__(self, url: str, control: ChildControl, record: Record, stop: StopLatch) -> None:
        self._url = url
        self._control = control
        self._record = record
        self._stop = stop

    @property
    def boundary_url(self) -> str:
        return self._url

    @property
    def child_pid(self) -> int | None:
        child = self._control.child
        return None if child is None else child.pid

    @property
    def supervisor_pid(self) -> int:
        return os.getpid()

    async def record_fault(self, fields: Mapping[str, object]) -> int | None:
        # The response cache stores no answer in flight while a fault takes effect.
        if self._control.on_fault is not None:
            self._control.on_fault()
        return await self._record("fault.injected", **fields)

    def request_stop(self, reason: str, *, exit_status: int) -> None:
        self._stop.request(StopRequest(reason, exit_status=exit_status))
