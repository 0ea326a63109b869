"""`docket run -- CMD`: start the boundary, run the agent under it, reap it, write the receipt.

Order matters and is the point of this module:
  signals caught -> session.start -> boundary listening -> child spawned (own
  process group, death signal bound to ours) -> ... -> child reaped ->
  process.exit -> its group's stragglers killed -> boundary stopped ->
  session.end -> ledger closed -> receipt written.
A receipt is a claim that the run ended, so it is written only after it did.
A run that cannot start (the boundary cannot listen, the command does not
exist, Ctrl-C during start-up) still ends legibly: session.end says why and a
receipt is written. Every duration here is read from a monotonic clock: the
wall-clock cap sleeps on trio's, and the ledger's mono_ms come from `clock`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import trio

from docket import __version__
from docket.boundary.proxy import proxy_env
from docket.clock import Clock, rfc3339
from docket.errors import EXIT_CAP_KILL, EXIT_EVIDENCE_LOST, EXIT_USAGE, InputError
from docket.guards.redact import redact_argv
from docket.hooks import RunHooks

GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127


@dataclass
class RunOptions:
    command: list[str]
    policy_path: str | None = None
    ledger_dir: str | None = None
    max_wall_clock: float | None = None  # a hard stop, whatever caps.on_breach says
    budget_mode: str | None = None  # overrides caps.budget_mode ("usd" | "quota")
    grace_seconds: float = GRACE_SECONDS
    extra_env: dict[str, str] = field(default_factory=dict)
    stdout: IO | None = None  # the child's stdout (default: ours), e.g. a file to read its report
    stderr: IO | None = None


@dataclass
class StopRequest:
    """Why the supervisor is ending the run early (a cap, a full ledger, lost evidence)."""

    reason: str
    cap: str | None = None
    exit_status: int = EXIT_CAP_KILL


@dataclass
class Outcome:
    exit_status: int
    reason: str
    cap: str | None
    ledger: Path
    receipt: Path
    # SIGINT/SIGTERM the supervisor caught, by name, in order: a harness that runs
    # the supervisor in its own process learns from this that its user pressed Ctrl-C
    signals: tuple[str, ...] = ()


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)


def child_env(base: dict[str, str], boundary_url: str, token: str, policy) -> dict[str, str]:
    """What the agent sees: base URLs pointing at the boundary and a per-run token, never a key."""
    env = dict(base)
    for provider in policy.providers.values():
        env.pop(provider.key_env, None)  # the real key stays with the supervisor
    for name, provider in policy.providers.items():
        if provider.kind == "openai":
            env["OPENAI_BASE_URL"] = f"{boundary_url}/{name}/v1"
            env["OPENAI_API_KEY"] = token
        elif provider.kind == "anthropic":
            env["ANTHROPIC_BASE_URL"] = f"{boundary_url}/{name}"
            env["ANTHROPIC_API_KEY"] = token
    env["DOCKET_BOUNDARY_URL"] = boundary_url
    env["DOCKET_RUN_TOKEN"] = token
    env.update(proxy_env(boundary_url, token))  # other egress goes through the boundary too
    return env


def wait_status(returncode: int) -> int:
    """A shell-style exit status: the child's code, or 128 + the signal that killed it."""
    return returncode if returncode >= 0 else 128 - returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exited with status {returncode}"


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def command_missing(name: str, path: str) -> bool:
    """True when exec would certainly fail with ENOENT: no such file where execvp looks.

    Only the certain case: a file that exists but cannot be run is left to the
    launcher, which names the real error.
    """
    if "/" in name:
        return not os.path.lexists(name)
    return not any(os.path.lexists(os.path.join(d or ".", name)) for d in path.split(os.pathsep))


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited while we looked: not a member any more
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry.name))
    return members


def _os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind a failed start, unwrapped from nurseries' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


class Child:
    """The spawned agent: its pid (also its process group's id) and its exit.

    One task owns it and calls `reap`; any other task waits on `exited`.
    The pid cannot be reused until `reap` has run, so signalling the group
    before then always reaches the right processes.
    """

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.returncode: int | None = None
        self.exited = trio.Event()

    async def reap(self) -> int:
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = None  # no pidfd (Linux < 5.3): a worker thread waits instead
        if pidfd is None:
            await trio.to_thread.run_sync(_wait_no_reap, self.pid, abandon_on_cancel=True)
        else:
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        self.returncode = self.popen.wait()  # it has exited: this only reaps
        self.exited.set()
        return self.returncode

    def kill_now(self) -> None:
        """For a run leaving abnormally: SIGKILL the group and reap, blocking briefly."""
        if self.returncode is None:
            if self.popen.poll() is None:
                # Cannot miss: an unreaped leader stays in its group, even as a zombie.
                os.killpg(self.pid, signal.SIGKILL)
            self.returncode = self.popen.wait()
            self.exited.set()


def _wait_no_reap(pid: int) -> None:
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


class Supervisor:
    """Runs one command under a boundary and a ledger; `await run()` once, in the main thread.

    `hooks` is the recorder's documented fault hook (docket.hooks.RunHooks);
    `clock` and `faults` are shorthands for its `clock` and `write_faults`.
    `env` is the environment the provider keys are read from and the child's is
    built from (default: os.environ). `policy`, a docket.policy.Policy, is used
    instead of reading `options.policy_path`.
    """

    def __init__(
        self,
        options: RunOptions,
        clock: Clock | None = None,
        *,
        env: dict[str, str] | None = None,
        faults=None,
        hooks: RunHooks | None = None,
        policy=None,
    ) -> None:
        from docket.policy import load_policy

        if hooks is not None and (clock is not None or faults is not None):
            raise ValueError("give the clock and write faults in hooks, not beside them")
        if policy is not None and options.policy_path is not None:
            raise ValueError("give a policy or a policy path, not both")
        self.hooks = hooks or RunHooks(clock=clock, write_faults=faults)
        self.options = options
        self.policy = policy if policy is not None else load_policy(options.policy_path)
        self.clock = self.hooks.clock or Clock()
        self.env = dict(os.environ if env is None else env) | options.extra_env
        self.faults = self.hooks.write_faults
        self.run_id = new_run_id()
        self.token = "dkt-" + secrets.token_urlsafe(24)
        base = Path(options.ledger_dir) if options.ledger_dir else Path("docket-runs") / self.run_id
        self.folder = base
        self.stop_requested: StopRequest | None = None
        self.signals_forwarded: list[str] = []
        self.signals_received: list[str] = []
        self._stop = trio.Event()
        self._child: Child | None = None
        self._ledger = None
        self._started = 0.0  # trio.current_time() at session start
        self._opened_mono = 0.0  # the clock's reading when the ledger opened
        self._escalating = False
        self._group_killed = False  # a SIGKILL went to the whole group
        self.boundary_url: str | None = None
        self._hooks_scope = trio.CancelScope()  # the `started` hook's; cancelled at the reap

    # The boundary and guards call this; the supervisor ends the run legibly.
    def request_stop(self, request: StopRequest) -> None:
        if self.stop_requested is None:
            self.stop_requested = request
            self._stop.set()

    def wall_limit(self) -> float | None:
        limits = [x for x in (self.options.max_wall_clock, self.policy.caps.max_wall_seconds) if x]
        return min(limits) if limits else None

    def run_policy(self):
        """The policy the boundary enforces: the file's, with --max-wall-clock and
        --budget-mode folded in (so the policy digest covers them too)."""
        caps = dataclasses.replace(self.policy.caps, max_wall_seconds=self.wall_limit())
        mode = self.options.budget_mode
        if mode is not None:
            if mode == "quota" and caps.max_usd is not None:
                raise InputError(
                    "--budget-mode quota: the policy sets caps.max_usd, which does not apply "
                    "to a subscription with no per-token bill; remove it or use --budget-mode usd"
                )
            caps = dataclasses.replace(caps, budget_mode=mode)
        return dataclasses.replace(self.policy, caps=caps)

    async def run(self) -> Outcome:
        # Caught from the first instant, so a Ctrl-C during start-up is handled
        # like any other (the run ends legibly), never as a KeyboardInterrupt
        # raised into the middle of a ledger append.
        with trio.open_signal_receiver(*FORWARDED_SIGNALS) as signals:
            return await self._run(signals)

    async def _run(self, signals) -> Outcome:
        from docket.boundary.app import Boundary
        from docket.ledger.writer import open_ledger
        from docket.receipt import build_receipt, write_receipt
        from docket.tally import Tally

        ledger_path = self._prepare_folder()
        policy = self.run_policy()
        tally = Tally()
        unwritten: dict[str, dict] = {}
        async with open_ledger(
            ledger_path,
            limits=policy.ledger_limits(),
            clock=self.clock,
            observers=[tally.add, *self.hooks.observers],
            faults=self.faults,
        ) as ledger:
            self._ledger = ledger
            self._opened_mono = self.clock.mono()
            self._started = trio.current_time()
            start = self.session_facts(policy)
            await self._record_control("session.start", start, unwritten)
            boundary = Boundary(
                policy,
                ledger,
                token=self.token,
                clock=self.clock,
                stop=self.request_stop,
                env=self.env,
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_signals, signals, nursery)
                status = await self._serve_and_run(nursery, boundary, policy)
                self._hooks_scope.cancel()
                if self.hooks.before_stop is not None and self.boundary_url is not None:
                    await self.hooks.before_stop(RunHandleOf(self))
                nursery.cancel_scope.cancel()
            exit_status, reason, cap = self.verdict(status)
            end = {
                "reason": reason,
                "exit_status": exit_status,
                "cap": cap,
                "evidence": ledger.stats.as_dict(),
            }
            await self._record_control("session.end", end, unwritten)
            evidence, head, count, size = (
                ledger.stats.as_dict(),
                ledger.head,
                ledger.count,
                ledger.bytes,
            )
        receipt = build_receipt(
            tally,
            ledger_path=ledger_path,
            head=head,
            count=count,
            size=size,
            evidence=evidence,
            version=__version__,
            start=unwritten.get("session.start"),
            end=unwritten.get("session.end"),
        )
        receipt_path = self.folder / "receipt.json"
        write_receipt(receipt_path, receipt)
        return Outcome(
            exit_status, reason, cap, ledger_path, receipt_path, tuple(self.signals_received)
        )

    def _prepare_folder(self) -> Path:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(
                f"ledger folder {self.folder}: cannot create ({exc.strerror})"
            ) from None
        ledger_path = self.folder / "ledger.jsonl"
        if ledger_path.exists() and ledger_path.stat().st_size:
            raise InputError(f"ledger {ledger_path} already exists: give --ledger-dir a new folder")
        vfs = os.statvfs(self.folder)
        free, floor = vfs.f_bavail * vfs.f_frsize, self.policy.ledger.min_free_bytes
        if free < floor:
            # Starting a run whose evidence cannot fit would only produce a gap.
            raise InputError(
                f"ledger folder {self.folder}: {free} bytes free, below ledger.min_free_bytes {floor}"
            )
        return ledger_path

    def session_facts(self, policy) -> dict:
        from docket.pricing import load_price_table

        prices = load_price_table()
        return {
            "run_id": self.run_id,
            "docket_version": __version__,
            "policy_digest": self.policy.digest(),
            "pricing": {"table_date": prices.date, "provenance": prices.provenance},
            "caps": policy.caps.limits_dict(),
            "argv": redact_argv(self.options.command),
        } | ({} if self.hooks.chaos is None else {"chaos": dict(self.hooks.chaos)})

    def verdict(self, status: int | None) -> tuple[int, str, str | None]:
        """The run's exit status, why, and the cap that stopped it (if one did)."""
        stop = self.stop_requested
        if stop is not None:
            return stop.exit_status, stop.reason, stop.cap
        assert status is not None, "a run with no child always has a stop request"
        reason = f"child {describe_exit(self._child.returncode)}"
        if self.signals_forwarded:
            reason += f" after {', '.join(self.signals_forwarded)} to the supervisor"
        return status, reason, None

    # ------------------------------------------------------------------ recording

    async def _record(self, type: str, **fields) -> int | None:
        """Append; a ceiling or lost evidence stops the run instead of crashing it."""
        from docket.ledger.writer import EvidenceLost, LedgerFull

        try:
            return await self._ledger.append(type, **fields)
        except EvidenceLost as exc:
            self.request_stop(
                StopRequest(
                    f"evidence could not be written (fail_fast_evidence): {exc}",
                    exit_status=EXIT_EVIDENCE_LOST,
                )
            )
        except LedgerFull as exc:
            self.request_stop(StopRequest(f"ledger full ({exc.reason})", cap=exc.reason))
        return None

    async def _record_control(self, type: str, fields: dict, unwritten: dict) -> int | None:
        """Record session.start/end; if the line is lost, keep it for the receipt's account."""
        ts, mono_ms = rfc3339(self.clock.wall()), self._mono_ms()
        seq = await self._record(type, **fields)
        if seq is None:
            # What the line would have said, so the receipt can state (unbacked) claims.
            unwritten[type] = {**fields, "type": type, "ts": ts, "mono_ms": mono_ms}
        return seq

    def _mono_ms(self) -> int:
        return int((self.clock.mono() - self._opened_mono) * 1000)

    # ------------------------------------------------------------------ the run

    async def _serve_and_run(self, nursery: trio.Nursery, boundary, policy) -> int | None:
        """Start the boundary, then the child; the child's exit status, or None if none ran."""
        try:
            url = await nursery.start(boundary.serve)
        except (OSError, BaseExceptionGroup) as exc:
            error = _os_error_in(exc)
            if error is None:
                raise
            where = f"{policy.boundary.host}:{policy.boundary.port}"
            self.request_stop(
                StopRequest(
                    f"the boundary cannot listen on {where} ({error.strerror or error})",
                    exit_status=EXIT_USAGE,
                )
            )
            return None
        self.boundary_url = url
        if self.wall_limit() is not None:
            nursery.start_soon(self._watch_wall_clock, boundary)
        return await self._run_child(nursery, url)

    async def _run_child(self, nursery: trio.Nursery, url: str) -> int | None:
        env = child_env(self.env, url, self.token, self.policy)
        command = self.options.command
        if self.stop_requested is not None:
            return None  # stopped during start-up (a signal, lost evidence): nothing to run
        if self.hooks.before_spawn is not None:
            await self.hooks.before_spawn(RunHandleOf(self))
            if self.stop_requested is not None:
                return None  # the hook (or a signal meanwhile) ended the run before it began
        if command_missing(command[0], env.get("PATH", os.defpath)):
            self.request_stop(
                StopRequest(f"command not found: {command[0]}", exit_status=EXIT_NOT_FOUND)
            )
            return None
        argv = [sys.executable, "-m", "docket.launch", str(os.getpid()), "--", *command]
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
            )
        except (OSError, ValueError) as exc:
            self.request_stop(
                StopRequest(f"cannot start the child: {exc}", exit_status=EXIT_CANNOT_EXEC)
            )
            return None
        child = self._child = Child(popen)
        try:
            await self._record("process.spawn", pid=child.pid, argv=redact_argv(command))
            nursery.start_soon(self._stop_on_request, child, nursery)
            if self.hooks.started is not None:
                nursery.start_soon(self._run_started_hook)
            returncode = await child.reap()
        finally:
            # Leaving without having reaped it (cancelled, or a bug): never leave it running.
            child.kill_now()
            self._hooks_scope.cancel()
        await self._record(
            "process.exit", pid=child.pid, status=returncode, reason=describe_exit(returncode)
        )
        await self._kill_stragglers(child)
        return wait_status(returncode)

    async def _run_started_hook(self) -> None:
        with self._hooks_scope:
            await self.hooks.started(RunHandleOf(self))

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

    async def _watch_signals(self, signals, nursery: trio.Nursery) -> None:
        async for sig in signals:
            name = signal_name(sig)
            self.signals_received.append(name)
            child = self._child
            if child is None:
                # Start-up is not finished: nothing to forward, so do not start the child.
                self.request_stop(
                    StopRequest(
                        f"{name} received before the child was started", exit_status=128 + sig
                    )
                )
                continue
            why = f"{name} received by the supervisor"
            if await self._signal_group(child, sig, why):
                self.signals_forwarded.append(name)
                self._escalate_once(child, nursery, why)

    async def _watch_wall_clock(self, boundary) -> None:
        """Tell the caps guard the elapsed time at each threshold it names (warning,
        breach); its on_breach decides. --max-wall-clock stops the run regardless.

        trio sleeps and reads time on the monotonic clock, so a wall clock that
        steps (NTP, a chaos clock fault on `clock`) cannot move any of this.
        """
        from docket.ledger.writer import EvidenceLost

        hard = self.options.max_wall_clock
        caps = boundary.caps
        while True:
            due = [t for t in (caps.next_wall_threshold(), hard) if t is not None]
            if not due:
                return
            await trio.sleep_until(self._started + min(due))
            elapsed = trio.current_time() - self._started
            try:
                await boundary.cap_events(caps.check_wall(elapsed))  # stops on "kill"
            except EvidenceLost:
                return  # the boundary has asked for the stop (exit 43): the run is ending
            if hard is not None and elapsed >= hard:
                self.request_stop(StopRequest("wall-clock cap reached", cap="max_wall_seconds"))
                return

    async def _stop_on_request(self, child: Child, nursery: trio.Nursery) -> None:
        await self._stop.wait()
        reason = self.stop_requested.reason
        await self._signal_group(child, signal.SIGTERM, reason)
        self._escalate_once(child, nursery, reason)


class RunHandleOf:
    """The docket.hooks.RunHandle a supervisor gives its hooks."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    @property
    def boundary_url(self) -> str:
        url = self._supervisor.boundary_url
        assert url is not None, "the hooks run only once the boundary serves"
        return url

    @property
    def child_pid(self) -> int | None:
        child = self._supervisor._child
        return None if child is None else child.pid

    @property
    def supervisor_pid(self) -> int:
        return os.getpid()

    async def record_fault(self, fields) -> int | None:
        return await self._supervisor._record("fault.injected", **fields)

    def request_stop(self, reason: str, *, exit_status: int) -> None:
        self._supervisor.request_stop(StopRequest(reason, exit_status=exit_status))


def run_command(args) -> int:
    options = RunOptions(
        command=args.command,
        policy_path=args.policy,
        ledger_dir=args.ledger_dir,
        max_wall_clock=_seconds(args.max_wall_clock, "--max-wall-clock", positive=True),
        budget_mode=getattr(args, "budget_mode", None),
    )
    grace = _seconds(getattr(args, "grace", None), "--grace", positive=False)
    if grace is not None:
        options.grace_seconds = grace
    if not options.command:
        raise InputError(
            "run: give the command to supervise after --, e.g. docket run -- python agent.py"
        )
    supervisor = Supervisor(options)
    outcome = trio.run(supervisor.run)
    print(
        f"docket: run {supervisor.run_id} ended ({outcome.reason}), exit {outcome.exit_status}; "
        f"receipt {outcome.receipt}",
        file=sys.stderr,
    )
    return outcome.exit_status


def _seconds(value: float | None, flag: str, *, positive: bool) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        sign = "> 0" if positive else ">= 0"
        raise InputError(f"run: {flag} must be a number of seconds {sign}, got {value:g}")
    return value
