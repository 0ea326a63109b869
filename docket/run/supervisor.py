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

The parts (docket/run/):
  values.py      RunOptions in, RunOutcome out (StopRequest, why a run ends early, is
                 docket.boundary.stop's: the boundary asks for most stops)
  child.py       the child at the OS level: its environment, Child (wait, reap),
                 exit statuses in words, its process group's live members
  control.py     ChildControl, the child's process object the Supervisor holds
                 (given its collaborators: options, env, hooks, record, the
                 StopLatch): spawn from the main thread (ADR 0004), reap,
                 forward signals, grace then SIGKILL, the wall-clock cap,
                 stragglers; RunHandleOf, the hooks' handle
  orphans.py     OrphanSweep, ChildControl's: every process of the run ended
                 with it, reaped and recorded (as the subreaper)
  isolation.py   its decisions: which way, the freeze-then-kill loop, when to stop
  cgroup.py      the run's cgroup v2 leaf, where the machine allows one
  pid_namespace.py  the run's own PID namespace, where there is no leaf
  hardening.py   prctl: non-dumpable, child subreaper
  launch.py      the child's first process (`python -m docket.run.launch`)
  hooks.py       RunHooks, what a harness may hand a run
  run_report.py  what `docket run` prints: the start line, the receipt's summary
  supervisor.py  this module: Supervisor (the order above, the session's events,
                 the receipt) and `docket run` itself
Each name is imported from the module that defines it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from docket import __version__
from docket.boundary.app import Boundary
from docket.boundary.recorder import Recorder
from docket.boundary.stop import StopRequest
from docket.clock import Clock, rfc3339
from docket.errors import EXIT_EVIDENCE_LOST, EXIT_USAGE, InputError
from docket.fleet.lease import fleet_lease
from docket.guards.keys import agent_drops, bad_keys, missing_keys, missing_warning
from docket.guards.redact import Redactor, redact_argv
from docket.ledger.limits import EvidenceLost, LedgerFull, describe_os_error
from docket.ledger.writer import open_ledger
from docket.policy import load_policy
from docket.pricing import default_price_table
from docket.receipts.receipt import (
    RECEIPT_RESERVE_BYTES,
    build_receipt,
    receipt_line,
    reserve_receipt,
    write_receipt,
    write_receipt_into,
)
from docket.receipts.tally import Tally
from docket.run import pid_namespace
from docket.run.cache_store import open_shared_cache, shared_cache
from docket.run.cgroup import RunCgroup
from docket.run.child import (
    describe_exit,
)
from docket.run.control import ChildControl, StopLatch
from docket.run.hardening import make_non_dumpable, raise_nofile, set_subreaper
from docket.run.hooks import RunHooks
from docket.run.isolation import CGROUP, ISOLATION_ENV, first_way, mechanism
from docket.run.run_report import end_block, start_line
from docket.run.values import RunOptions, RunOutcome
from docket.snapshot.session import SnapshotSession, check_run_options

if TYPE_CHECKING:
    from docket.ledger.writer import Ledger

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)


def _os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind a failed start, unwrapped from nurseries' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


class Supervisor:
    """Runs one command under a boundary and a ledger; `await run()` once, in the main thread.

    `hooks` is the recorder's documented fault hook (docket.run.hooks.RunHooks);
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

        if hooks is not None and (clock is not None or faults is not None):
            raise ValueError("give the clock and write faults in hooks, not beside them")
        if policy is not None and options.policy_path is not None:
            raise ValueError("give a policy or a policy path, not both")
        self.hooks = hooks or RunHooks(clock=clock, write_faults=faults)
        self.options = options
        self.policy = policy if policy is not None else load_policy(options.policy_path)
        # The shipped price table with the policy's [prices] over it: what the boundary
        # charges and caps by, and what session.start's pricing.provenance names.
        self.prices = self.policy.price_table()
        self.clock = self.hooks.clock or Clock()
        self.env = dict(os.environ if env is None else env) | options.extra_env
        self._check_keys()
        self.faults = self.hooks.write_faults
        self.run_id = new_run_id()
        # Read once the ledger is open (cache_store.open_shared_cache): a bad store is
        # said and recorded, and the run goes on without it.
        self.shared_cache = shared_cache(self.policy, self.env)
        self.fleet = fleet_lease(self.policy, self.env, self.run_id)  # None without [fleet]
        self.token = "dkt-" + secrets.token_urlsafe(24)
        # The supervisor's own events pass the same door as the boundary's: the run
        # token and the provider keys never reach the ledger, in any form.
        keys = (self.env.get(p.key_env, "") for p in self.policy.providers.values())
        self._redactor = Redactor([self.token, *keys])
        base = Path(options.ledger_dir) if options.ledger_dir else Path("docket-runs") / self.run_id
        self.folder = base
        self._stop = StopLatch()
        self._ledger: Ledger | None = None  # open from session.start to session.end
        self._recorder: Recorder | None = None  # the way to it, while it is open
        self._opened_mono = 0.0  # the clock's reading when the ledger opened
        self.hardening: dict = {}  # what the kernel was asked at start, and what it said
        self.control = ChildControl(
            options,
            env=self.env,
            token=self.token,
            policy=self.policy,
            hooks=self.hooks,
            hardening=self.hardening,
            record=self._record,
            stop=self._stop,
        )
        # Called once session.start is on disk: `docket run` prints its start warnings
        # there, so a run refused at start (bad folder, full disk) is one line only.
        self.on_started: Callable[[], object] | None = None
        # Called with the boundary's URL once it listens: `docket run`'s start line.
        self.on_listening: Callable[[str], object] | None = None

        self._snapshots = SnapshotSession(options, self.policy)
        # Set by `docket replay` (docket/replay/command.py) before run(): the key its
        # upstream marks answers with, given to the boundary only, and the recorded
        # run's {run_id, head}, recorded in session.start as replay_of.
        self.replay_key: str | None = None
        self.replay_of: dict | None = None

    def _harden(self) -> None:
        """Close this process's environ and memory to the agent, make it the reaper
        of the agent's orphans (hardening.py), and make the run's cgroup leaf
        (docket.run.cgroup); where the kernel cannot, say why (session.start's
        hardening; a warning line for the first two: without a leaf the run's
        processes are still ended, by the freeze-then-kill loop)."""
        if self.hardening:
            return  # done already (docket run does it before the run, to warn at start)
        for name, ask in (("non_dumpable", make_non_dumpable), ("subreaper", set_subreaper)):
            why = ask()
            self.hardening[name] = why is None
            if why is not None:
                self.hardening[f"{name}_error"] = why
        # A descriptor per agent connection: the soft limit up to the hard one, so the
        # boundary's max_connections is what bounds them, not EMFILE.
        before, now = raise_nofile()
        self.hardening["nofile"] = now
        if before != now:
            self.hardening["nofile_raised_from"] = before
        sweep = self.control.sweep
        first = first_way(os.environ.get(ISOLATION_ENV, ""))
        if first == CGROUP:
            sweep.cgroup, why = RunCgroup.create(self.run_id)
        else:
            why = f"{ISOLATION_ENV}={first}"
        namespace_why = None if why is None else pid_namespace.unavailable(first)
        sweep.isolation = mechanism(why, namespace_why)
        self.hardening["isolation"] = sweep.isolation
        if why is not None:  # why not the cgroup, and why not the namespace either
            self.hardening["isolation_error"] = "; ".join(filter(None, (why, namespace_why)))

    def _check_keys(self) -> None:
        """A key that cannot go into a header is refused now (exit 2), never at the
        first call; a missing one is noted (session.start's keys_missing, and the
        warning `docket run` prints)."""

        bad = bad_keys(self.env, self.policy)
        if bad:
            named = "; ".join(f"{name} {why}" for name, why in bad)
            raise InputError(f"provider key {named}: fix the variable (its value is not shown)")
        self.keys_missing = missing_keys(self.env, self.policy)

    # The boundary and guards call this; the supervisor ends the run legibly.
    def request_stop(self, request: StopRequest) -> None:
        self._stop.request(request)

    @property
    def stop_requested(self) -> StopRequest | None:
        return self._stop.requested

    @property
    def boundary_url(self) -> str | None:
        return self.control.boundary_url

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

    async def run(self) -> RunOutcome:
        # Caught from the first instant, so a Ctrl-C during start-up is handled
        # like any other (the run ends legibly), never as a KeyboardInterrupt
        # raised into the middle of a ledger append.
        self._harden()
        try:
            with trio.open_signal_receiver(*FORWARDED_SIGNALS) as signals:
                return await self._run(signals)
        finally:
            sweep = self.control.sweep
            sweep.abandon()  # the run's namespace, if it ended without its sweep
            sweep.close_report_fd()
            if sweep.cgroup is not None:  # the run ended before its sweep: the leaf is empty
                why = sweep.cgroup.remove()
                if why is not None:
                    print(f"docket: warning: {why}", file=sys.stderr)
            if self.hardening.get("subreaper"):
                # The run is over (its orphans ended): a harness that runs the
                # supervisor in its own process gets its process back as it was.
                set_subreaper(False)

    async def _run(self, signals) -> RunOutcome:

        ledger_path = self._prepare_folder()
        reserve = self._reserve_receipt()
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
            self._recorder = Recorder(ledger, self._redactor, self.request_stop)
            self._opened_mono = self.clock.mono()
            if self.fleet is not None:  # each exchange names the folder and pins the ledger
                self.fleet.attach(ledger, self.folder, self.prices)
            self.control.started = trio.current_time()
            start = self.session_facts(policy)
            await self._record_control("session.start", start, unwritten)
            if self.on_started is not None:
                self.on_started()
            boundary = Boundary(
                policy,
                ledger,
                token=self.token,
                clock=self.clock,
                stop=self.request_stop,
                env=self.env,
                prices=self.prices,
                call_probe=self.hooks.call_probe,
                replay_key=self.replay_key,
                fleet=self.fleet,
            )
            if boundary.cache is not None and self.shared_cache is not None:
                await open_shared_cache(
                    self.shared_cache, boundary.cache, self.run_id, self.wall_limit(), self._record
                )
            self.control.on_fault = boundary.note_fault  # the run handle calls it (docs/cache.md)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.control.watch_signals, signals, nursery)
                status = await self._serve_and_run(nursery, boundary, policy)
                self.control.hooks_scope.cancel()
                if self.hooks.before_stop is not None and self.boundary_url is not None:
                    await self.hooks.before_stop(self.control.handle())
                nursery.cancel_scope.cancel()
            exit_status, reason, cap = self.verdict(status)
            end = {
                "reason": reason,
                "exit_status": exit_status,
                "cap": cap,
                "evidence": ledger.stats.as_dict(),
            }
            refused = boundary.recorder.refused_unrecorded
            if refused:  # calls refused with no event on disk: the receipt counts them
                end["refused_unrecorded"] = dict(sorted(refused.items()))
            await self._record_control("session.end", end, unwritten)
            evidence, head, count, size = (
                ledger.stats.as_dict(),
                ledger.head,
                ledger.count,
                ledger.bytes,
            )
        facts = {
            "ledger_path": ledger_path,
            "head": head,
            "count": count,
            "size": size,
            "evidence": evidence,
            "version": __version__,
            "start": unwritten.get("session.start"),
            "end": unwritten.get("session.end"),
        }
        receipt_path, receipt_error = self._deliver_receipt(tally, facts, reserve)
        if self.fleet is not None:
            # The ledger is closed: a failure here can only be said, on stderr.
            problem = await self.fleet.run_ended(receipt_path)
            if problem is not None:
                print(f"docket: warning: fleet: {problem}", file=sys.stderr, flush=True)
        notes = (
            ()
            if ledger.reserve_kept is None
            else (f"the ledger's spare blocks could not be freed: {ledger.reserve_kept}",)
        ) + tuple(self._snapshots.warnings)
        if receipt_error is not None:
            # The run's own status stays in the receipt; the process says evidence was lost.
            exit_status = EXIT_EVIDENCE_LOST
        return RunOutcome(
            exit_status,
            reason,
            cap,
            ledger_path,
            receipt_path,
            tuple(self.control.signals_received),
            evidence=evidence,
            receipt_error=receipt_error,
            notes=notes,
        )

    def _reserve_receipt(self) -> Path:
        """Blocks for the receipt, taken before the run starts (docket.receipts.receipt.reserve_receipt)."""

        try:
            return reserve_receipt(self.folder)
        except OSError as exc:
            raise InputError(
                f"ledger folder {self.folder}: cannot reserve {RECEIPT_RESERVE_BYTES} bytes "
                f"for the receipt ({describe_os_error(exc)})"
            ) from None

    def _deliver_receipt(self, tally, facts: dict, reserve: Path) -> tuple[Path | None, str | None]:
        """Write the receipt into its reserve; where even that fails, into the fallbacks.

        Returns (where the receipt is, why it is not in the run's folder). The
        fallbacks (docs/resilience.md "A full disk"): the receipt as one JSON
        line on stderr, always, and a file in the policy's ledger.fallback_dir,
        naming the ledger relative to that folder so `docket verify` takes it as is.
        """

        receipt = build_receipt(tally, **facts)
        receipt_path = self.folder / "receipt.json"
        try:
            write_receipt_into(reserve, receipt_path, receipt)
            return receipt_path, None
        except OSError as exc:
            error = describe_os_error(exc)
        print(receipt_line(receipt), file=sys.stderr, flush=True)
        fallback_dir = self.policy.ledger.fallback_dir
        if fallback_dir is None:
            return None, error
        where = Path(fallback_dir) / f"{self.run_id}.receipt.json"
        try:
            write_receipt(where, build_receipt(tally, **facts, receipt_dir=fallback_dir))
        except OSError as exc:
            return None, f"{error}; the fallback {where} failed too ({describe_os_error(exc)})"
        return where, error

    def _prepare_folder(self) -> Path:
        try:
            # Owner only (a new folder; parents and an existing folder are left as they are).
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
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

        prices = self.prices
        facts = {
            "run_id": self.run_id,
            "docket_version": __version__,
            "policy_digest": self.policy.digest(),
            "pricing": {"table_date": prices.date, "provenance": prices.provenance},
            "caps": policy.caps.limits_dict(),
            "argv": redact_argv(self.options.command),
        }
        if self.keys_missing:
            facts["keys_missing"] = [m.as_dict() for m in self.keys_missing]
        facts["hardening"] = dict(self.hardening)
        if self.hooks.chaos is not None:
            facts["chaos"] = dict(self.hooks.chaos)
        if self.replay_of is not None:
            facts["replay_of"] = dict(self.replay_of)
        if self.fleet is not None:
            facts["fleet"] = self.fleet.session_facts()
        return facts

    def verdict(self, status: int | None) -> tuple[int, str, str | None]:
        """The run's exit status, why, and the cap that stopped it (if one did)."""
        status, reason, cap = self._verdict(status)
        sweep = self.control.sweep
        if sweep.isolation_failed:
            # Evidence lost of another kind: processes of the run outlived it.
            survivors = sweep.survivors
            shown = ", ".join(map(str, survivors[:8])) + (", ..." if len(survivors) > 8 else "")
            reason += f"; isolation failed: {len(survivors)} process(es) of the run outlived it"
            reason += f" (pids {shown})" if survivors else ""
            if sweep.look_cut:
                reason += ", and a look at /proc was cut short: there may be more"
            status = EXIT_EVIDENCE_LOST
        return status, reason, cap

    def _verdict(self, status: int | None) -> tuple[int, str, str | None]:
        stop = self.stop_requested
        if stop is not None:
            return stop.exit_status, stop.reason, stop.cap
        assert status is not None, "a run with no child always has a stop request"
        child = self.control.child
        assert child is not None, "a run with a status had a child"
        assert child.returncode is not None, "a run with a status has reaped its child"
        reason = f"child {describe_exit(child.returncode)}"
        forwarded = self.control.signals_forwarded
        if forwarded:
            reason += f" after {', '.join(forwarded)} to the supervisor"
        return status, reason, None

    # ------------------------------------------------------------------ recording

    async def _record(self, type: str, **fields) -> int | None:
        """Append; a ceiling or lost evidence stops the run (the recorder asks for the
        stop, as it does for the boundary's events) instead of crashing it."""
        assert self._recorder is not None, "events are recorded only while the ledger is open"
        try:
            return await self._recorder.record(type, **fields)
        except (EvidenceLost, LedgerFull):
            return None  # the recorder has asked the run to stop, saying why

    async def _record_control(self, type: str, fields: dict, unwritten: dict) -> int | None:
        """Record session.start/end; if the line is lost, keep it for the receipt's account."""
        ts, mono_ms = rfc3339(self.clock.wall()), self._mono_ms()
        fields = self._redactor.fields(fields)  # the receipt may carry them unwritten
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
            host = policy.boundary.host
            where = (
                f"[{host}]:{policy.boundary.port}"
                if ":" in host
                else f"{host}:{policy.boundary.port}"
            )
            self.request_stop(
                StopRequest(
                    f"the boundary cannot listen on {where} ({error.strerror or error})",
                    exit_status=EXIT_USAGE,
                )
            )
            return None
        if self.on_listening is not None:
            self.on_listening(url)
        if self.wall_limit() is not None:
            nursery.start_soon(self.control.watch_wall_clock, boundary)
        if self.options.snapshot and not await self._snapshots.take(self):
            return None  # it asked for the stop (why) itself: no child without its snapshot
        status = await self.control.run_child(nursery, url)
        if self.options.snapshot:
            await self._snapshots.after_reap(self)
        return status


def run_command(args) -> int:
    options = RunOptions(
        command=args.command,
        policy_path=args.policy,
        ledger_dir=args.ledger_dir,
        max_wall_clock=_seconds(args.max_wall_clock, "--max-wall-clock", positive=True),
        budget_mode=getattr(args, "budget_mode", None),
        snapshot=tuple(getattr(args, "snapshot", None) or ()),
        rollback_on_breach=bool(getattr(args, "rollback_on_breach", False)),
    )
    grace = _seconds(getattr(args, "grace", None), "--grace", positive=False)
    if grace is not None:
        options.grace_seconds = grace
    if not options.command:
        raise InputError(
            "run: give the command to supervise after --, e.g. docket run -- python agent.py"
        )
    _check_command(options.command)

    check_run_options(options)
    supervisor = Supervisor(options)
    export = supervisor.policy.export
    if export.otlp_endpoint:  # read before the keys leave the environment; bad: exit 2 now
        from docket.export.otel_command import headers_from_env

        export_headers = headers_from_env(export.otlp_headers_env, supervisor.env)
    supervisor._harden()
    _drop_keys_from_environ(supervisor)
    supervisor.on_started = functools.partial(_start_warnings, supervisor)
    quiet = bool(getattr(args, "quiet", False))
    if not quiet:
        supervisor.on_listening = lambda url: print(
            start_line(supervisor.run_id, supervisor.folder, url), file=sys.stderr, flush=True
        )
    outcome = trio.run(supervisor.run)
    # The warnings come after the figures and just before the last line, where they are
    # read (a change to what the snapshot excludes, a failed scan). The figures are left
    # out when the receipt went to stderr: its JSON line is then the one the last line
    # points to ("the JSON line above"), with only these warnings between.
    if not quiet and outcome.receipt is not None and outcome.receipt_error is None:
        for line in end_block(outcome.receipt, supervisor.folder):
            print(line, file=sys.stderr)
    for note in outcome.notes:
        print(f"docket: warning: {note}", file=sys.stderr)
    print(last_line(supervisor.run_id, outcome), file=sys.stderr)
    if export.otlp_endpoint:  # after the receipt, off the request path; never the exit code
        from docket.export.otel_command import export_at_run_end

        export_at_run_end(outcome.ledger, export.otlp_endpoint, export_headers, supervisor.policy)
    return outcome.exit_status


def _check_command(command: list[str]) -> None:
    if not command[0]:
        raise InputError("run: the command to supervise is empty (docket run -- CMD ARGS...)")
    for i, arg in enumerate(command):
        if "\0" in arg:
            where = "the command" if i == 0 else f"argument {i}"
            raise InputError(f"run: {where} holds a NUL byte, which no program can be given")


def _drop_keys_from_environ(supervisor: Supervisor) -> None:
    """The keys leave this process's environment once read, so nothing it starts later
    can inherit them (what the kernel copied at exec, in /proc/<pid>/environ, is what
    non-dumpable closes)."""

    for name in agent_drops(supervisor.policy):
        os.environ.pop(name, None)


def _start_warnings(supervisor: Supervisor) -> None:
    """One line each, once the run has started: a provider key that is not set, an
    environ or an orphan the kernel would not let the supervisor close or reap."""

    if supervisor.keys_missing:
        print(missing_warning(supervisor.keys_missing), file=sys.stderr)
    shipped = [m for m in supervisor.policy.prices if default_price_table().lookup(m) is not None]
    if shipped:  # the policy wins, and says so (the provenance records it too)
        print(
            f"docket: note: the policy's [prices] replace the shipped price of {', '.join(shipped)}",
            file=sys.stderr,
        )
    for name, consequence in (
        ("non_dumpable", "the supervisor's memory and environment stay readable by the agent"),
        ("subreaper", "a process the agent detaches (setsid) may outlive the run"),
    ):
        why = supervisor.hardening.get(f"{name}_error")
        if why is not None:
            print(f"docket: warning: {consequence} ({why})", file=sys.stderr)


def last_line(run_id: str, outcome: RunOutcome) -> str:
    """`docket run`'s last line: how the run ended, where its receipt is, and what the
    record lacks (a reader of this line alone must not take an incomplete ledger for whole)."""
    line = f"docket: run {run_id} ended ({outcome.reason}), exit {outcome.exit_status}; "
    if outcome.receipt_error is None:
        line += f"receipt {outcome.receipt}"
    else:
        line += (
            f"receipt NOT written (durably) in the run's folder ({outcome.receipt_error}): "
            "it is the JSON line above"
        )
        if outcome.receipt is not None:
            line += f" and {outcome.receipt}"
    evidence = outcome.evidence
    if evidence is not None and not evidence["ledger_complete"]:
        line += (
            f"; evidence incomplete: {evidence['unwritten_events']} events unwritten "
            f"from seq {evidence['first_failing_seq']}"
        )
        calls = evidence.get("unrecorded_calls", 0)
        if calls:
            line += f", {calls} model calls went upstream unrecorded"
        if evidence.get("last_error"):
            line += f" ({evidence['last_error']})"
    return line


def _seconds(value: float | None, flag: str, *, positive: bool) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        sign = "> 0" if positive else ">= 0"
        raise InputError(
            f"run: {flag} must be a duration {sign} (seconds, or 500ms, 30s, 10m, 1h), "
            f"got {value:g} s"
        )
    return value
