"""`docket run -- CMD`: start the boundary, run the agent under it, reap it, write the receipt.

Order matters and is the point of this module:
  session.start -> boundary listening -> child spawned (own process group, death
  signal bound to ours) -> ... -> child reaped -> process.exit -> boundary
  stopped -> session.end -> ledger closed -> receipt written.
A receipt is a claim that the run ended, so it is written only after it did.
Every duration here is read from the monotonic clock.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from docket import __version__
from docket.clock import Clock
from docket.errors import EXIT_CAP_KILL, InputError

GRACE_SECONDS = 5.0  # SIGTERM to SIGKILL


@dataclass
class RunOptions:
    command: list[str]
    policy_path: str | None = None
    ledger_dir: str | None = None
    max_wall_clock: float | None = None
    grace_seconds: float = GRACE_SECONDS
    extra_env: dict[str, str] = field(default_factory=dict)


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


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)


def child_env(base: dict[str, str], boundary_url: str, token: str, policy) -> dict[str, str]:
    """What the agent sees: base URLs pointing at the boundary and a per-run token, never a key."""
    env = dict(base)
    for name, provider in policy.providers.items():
        env.pop(provider.key_env, None)  # the real key stays with the supervisor
        if provider.kind == "openai":
            env["OPENAI_BASE_URL"] = f"{boundary_url}/{name}/v1"
            env["OPENAI_API_KEY"] = token
        elif provider.kind == "anthropic":
            env["ANTHROPIC_BASE_URL"] = f"{boundary_url}/{name}"
            env["ANTHROPIC_API_KEY"] = token
    env["DOCKET_BOUNDARY_URL"] = boundary_url
    env["DOCKET_RUN_TOKEN"] = token
    return env


def wait_status(returncode: int) -> int:
    """A shell-style exit status: the child's code, or 128 + the signal that killed it."""
    return returncode if returncode >= 0 else 128 - returncode


class Supervisor:
    def __init__(self, options: RunOptions, clock: Clock | None = None) -> None:
        from docket.policy import load_policy

        self.options = options
        self.policy = load_policy(options.policy_path)
        self.clock = clock or Clock()
        self.run_id = new_run_id()
        self.token = "dkt-" + secrets.token_urlsafe(24)
        base = Path(options.ledger_dir) if options.ledger_dir else Path("docket-runs") / self.run_id
        self.folder = base
        self.stop_requested: StopRequest | None = None
        self._stop = trio.Event()
        self._child: trio.Process | None = None

    # The boundary and guards call this; the supervisor ends the run legibly.
    def request_stop(self, request: StopRequest) -> None:
        if self.stop_requested is None:
            self.stop_requested = request
            self._stop.set()

    def wall_limit(self) -> float | None:
        limits = [x for x in (self.options.max_wall_clock, self.policy.caps.max_wall_seconds) if x]
        return min(limits) if limits else None

    async def run(self) -> Outcome:
        from docket.boundary.app import Boundary
        from docket.ledger.writer import open_ledger
        from docket.receipt import build_receipt, write_receipt
        from docket.tally import Tally

        self.folder.mkdir(parents=True, exist_ok=True)
        ledger_path = self.folder / "ledger.jsonl"
        if ledger_path.exists() and ledger_path.stat().st_size:
            raise InputError(f"ledger {ledger_path} already exists: give --ledger-dir a new folder")
        tally = Tally()
        async with open_ledger(
            ledger_path, limits=self.policy.ledger_limits(), clock=self.clock, observers=[tally.add]
        ) as ledger:
            self.started_mono = self.clock.mono()
            await ledger.append("session.start", **self.session_facts())
            boundary = Boundary(
                self.policy, ledger, token=self.token, clock=self.clock, stop=self.request_stop
            )
            async with trio.open_nursery() as nursery:
                url = await nursery.start(boundary.serve)
                status = await self._run_child(nursery, ledger, url)
                nursery.cancel_scope.cancel()
            stop = self.stop_requested
            exit_status = stop.exit_status if stop else status
            reason = stop.reason if stop else "child exited"
            cap = stop.cap if stop else None
            await ledger.append(
                "session.end",
                reason=reason,
                exit_status=exit_status,
                cap=cap,
                evidence=ledger.stats.as_dict(),
            )
            evidence, head, count = ledger.stats.as_dict(), ledger.head, ledger.count
        receipt = build_receipt(
            tally,
            ledger_path=ledger_path,
            head=head,
            count=count,
            size=ledger_path.stat().st_size,
            evidence=evidence,
            version=__version__,
        )
        receipt_path = self.folder / "receipt.json"
        write_receipt(receipt_path, receipt)
        return Outcome(exit_status, reason, cap, ledger_path, receipt_path)

    def session_facts(self) -> dict:
        from docket.pricing import load_price_table

        prices = load_price_table()
        return {
            "run_id": self.run_id,
            "docket_version": __version__,
            "policy_digest": self.policy.digest(),
            "pricing": {"table_date": prices.date, "provenance": prices.provenance},
            "caps": self.policy.caps.limits_dict(),
            "argv": self.options.command,
        }

    async def _run_child(self, nursery: trio.Nursery, ledger, url: str) -> int:
        env = child_env(dict(os.environ) | self.options.extra_env, url, self.token, self.policy)
        argv = [
            sys.executable,
            "-m",
            "docket.launch",
            str(os.getpid()),
            "--",
            *self.options.command,
        ]
        child = await trio.lowlevel.open_process(argv, env=env, start_new_session=True)
        self._child = child
        await ledger.append("process.spawn", pid=child.pid, argv=self.options.command)
        nursery.start_soon(self._forward_signals, ledger, child, nursery)
        nursery.start_soon(self._watch_wall_clock, ledger)
        nursery.start_soon(self._stop_on_request, ledger, child)
        returncode = await child.wait()
        status = wait_status(returncode)
        why = f"killed by signal {-returncode}" if returncode < 0 else "exited"
        await ledger.append("process.exit", pid=child.pid, status=returncode, reason=why)
        return status

    async def _signal_group(self, ledger, child: trio.Process, sig: int, reason: str) -> None:
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return  # the group is already gone: nothing was sent, nothing to record
        await ledger.append(
            "signal.forwarded", signal=signal.Signals(sig).name, pgid=child.pid, reason=reason
        )

    async def _terminate(self, ledger, child: trio.Process, reason: str) -> None:
        await self._signal_group(ledger, child, signal.SIGTERM, reason)
        with trio.move_on_after(self.options.grace_seconds):
            await child.wait()
            return
        await self._signal_group(ledger, child, signal.SIGKILL, f"{reason}; grace period over")

    async def _forward_signals(self, ledger, child: trio.Process, nursery: trio.Nursery) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for sig in signals:
                await self._signal_group(ledger, child, sig, "received by the supervisor")
                nursery.start_soon(self._escalate, ledger, child)

    async def _escalate(self, ledger, child: trio.Process) -> None:
        with trio.move_on_after(self.options.grace_seconds):
            await child.wait()
            return
        await self._signal_group(ledger, child, signal.SIGKILL, "grace period over")

    async def _watch_wall_clock(self, ledger) -> None:
        limit = self.wall_limit()
        if limit is None:
            return
        # trio sleeps on the monotonic clock, so a wall clock that steps cannot move this.
        await trio.sleep(max(0.0, limit - (self.clock.mono() - self.started_mono)))
        elapsed = self.clock.mono() - self.started_mono
        await ledger.append(
            "cap.exceeded", cap="max_wall_seconds", limit=limit, observed=round(elapsed, 3)
        )
        self.request_stop(StopRequest("wall-clock cap reached", cap="max_wall_seconds"))

    async def _stop_on_request(self, ledger, child: trio.Process) -> None:
        await self._stop.wait()
        await self._terminate(ledger, child, self.stop_requested.reason)


def run_command(args) -> int:
    options = RunOptions(
        command=args.command,
        policy_path=args.policy,
        ledger_dir=args.ledger_dir,
        max_wall_clock=args.max_wall_clock,
    )
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
