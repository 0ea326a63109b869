"""The processes the agent left: ended with the run, whatever their fork rate, and recorded.

An agent that starts a process with setsid (or a double fork) puts it out of
reach of its process group, and one that forks faster than it is killed, or
deeper than any number of rounds, outruns a sweep by pid: such a process
outlived the run, and one that polled /proc read the next run's key. So every
process of the run ends with it (docket.run.isolation decides, this module acts):

- Where the machine allows it, the run has a cgroup v2 leaf of its own
  (docket.run.cgroup), which the launcher joins before the agent exists: the
  leaf is frozen, its members noted, killed with `cgroup.kill` and waited on
  until empty, then removed.
- Without a leaf, where user namespaces are on, the run has a PID namespace of
  its own (docket.run.pid_namespace): its members are noted, its init (docket's
  own, reported like the watcher) is SIGKILLed, and the kernel ends the rest
  before the init is reaped. Those are recorded "killed with the run's pid
  namespace", with no status: the init reaps them, and the orphans that exit
  while the agent runs too (those go unrecorded).
- Then, always, the freeze-then-kill loop over the run's process tree: the
  supervisor is a child subreaper (docket.run.hardening), so a process whose
  parent dies comes back to it instead of init; every process in the tree is
  SIGSTOPped, by pid and by process group (a group signal reaches a child forked
  meanwhile), until a look finds them all stopped (a stopped process cannot
  fork), then SIGKILLed, and the tree looked at again until a look finds
  nothing. Without a leaf this is the whole of it; with one, it ends what moved
  itself out of the leaf. Two things keep it ahead of a bomb that churns (each
  member forks its replacement and exits, thousands of times a second): exited
  children are reaped straight from the kernel before each look
  (docket.run.child.reap_exited), so a look never walks a pile of zombies that
  grows faster than it reads; and each group about to be stopped is first set to
  the lowest CPU priority (nice 19, which needs no privilege), so the bomb cannot
  take the cores the loop needs. (Once told `isolation failed` at 60 members as
  uid 65534; with these it holds 60, and 250 only in 2 of 4 runs: hence the
  namespace. The attack family `orphans` tries 60 and 250.)

Both stop when nothing of the run is alive, or at SWEEP_SECONDS: what is alive
then is recorded by pid (`process.orphan` with `survivors`: the run's isolation
failed), and the run exits 43 (docket.run.supervisor). Every process seen is
reaped and recorded as `process.orphan`: pid, argv (redacted), whether it was
still running, and how it ended; sixteen are listed, the rest counted in one event.

Docket's own watcher (docket.run.launch.keep_group) is ended the same way; the
launcher reports its pid on a pipe, and it is not recorded as the agent's.
Processes of the supervisor's own session (a harness running the supervisor in
its process may have children of its own) and those that were its children
before the spawn are never touched.

While the agent runs, an orphan that exits is reaped on SIGCHLD and recorded
(`found: exited`), so none piles up as a zombie in a long run.

`OrphanSweep` is an object of its own, held by docket.run.control.ChildControl;
its one collaborator is `record`, the supervisor's way to append an event.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable

import trio

from docket.guards.redact import redact_argv
from docket.run.cgroup import RunCgroup
from docket.run.child import (
    Child,
    children_of,
    cmdline_of,
    describe_exit,
    process_table,
    process_table_until,
    reap_exited,
    reap_now,
)
from docket.run.isolation import (
    DEAD,
    PIDNS,
    SIGNALS,
    cgroup_step,
    groups_of,
    next_step,
    run_tree,
)

MAX_ORPHAN_EVENTS = 16  # each listed; past this one event counts the rest (the ledger's
# control reserve is for the end of the record, not for an agent's thousand daemons)
MAX_SURVIVORS_LISTED = 64  # pids named in the isolation failure; all are counted
SWEEP_SECONDS = 10.0  # for the whole end: every process of the run gone, and reaped
NOTE_SECONDS = 1.0  # to look at a pid namespace's members, for the record, before its end
FREEZE_WAIT = 0.5  # for the cgroup freezer (for the record) before the kill goes anyway
POLL_SECONDS = 0.002  # between looks: signals and the kernel's bookkeeping land meanwhile
ARGV_ITEMS, ARGV_CHARS = 8, 200  # an orphan's argv, as recorded
ARGV_NOTED = 4 * MAX_ORPHAN_EVENTS  # argvs read at the end (only sixteen are listed)


# How an event reaches the ledger: the supervisor's append (redacted; a full ledger
# or lost evidence stops the run instead of raising), the seq or None.
Record = Callable[..., Awaitable[int | None]]


class OrphanSweep:
    """Find, end, reap and record what the agent left behind."""

    def __init__(self, record: Record) -> None:
        self._record = record
        self._children_before: frozenset[int] = frozenset()
        self._orphans_listed = 0
        self._orphans_unlisted = 0
        self._report_fd: int | None = None  # the launcher's pipe: docket's own pid
        self._report = b""  # what has come on it so far
        self._watcher: int | None = None  # the pid read from it
        self._init_fd: int | None = None  # the run's pid namespace's init, as a pidfd
        self.cgroup: RunCgroup | None = None  # the run's leaf, when the machine allows one
        self.isolation = SIGNALS  # how the run's processes are ended (docket.run.isolation)
        self._seen: dict[int, tuple[list[str], str]] = {}  # pid -> (argv, found), unrecorded
        self._argv_noted = 0
        # Reaped by the end, recorded once it is over: (pid, argv, found, status, reason).
        self._ended: list[tuple[int, list[str], str, int | None, str | None]] = []
        self._isolation_errors: list[str] = []
        self.survivors: list[int] = []  # alive at the end's deadline: the isolation failed
        self.look_cut = False  # a look at /proc did not finish by the deadline

    def note_children(self) -> None:
        """Before the spawn: the children this process has already, never ours to end."""
        self._children_before = frozenset(children_of(os.getpid()))

    def open_report_pipe(self) -> int:
        """Before the spawn: the pipe the launcher reports docket's own process on; the
        write end."""
        self._report_fd, report = os.pipe()
        os.set_blocking(self._report_fd, False)
        self._report = b""
        self._watcher = None
        return report

    def _watcher_pid(self) -> int | None:
        """Docket's own process in the run (the watcher, or the namespace's init), as
        the launcher reported it. Read without blocking: if it is not there yet, ask
        again later."""
        if self._report_fd is not None:
            self._read_report()
        return self._watcher

    def _read_report(self) -> None:
        """The launcher's lines (docket.run.launch): `PID` (its watcher), `PID
        pid_namespace [NOTE]` (the run's init, docket.run.pid_namespace), or `refused
        WHY` (the namespace the kernel would not make) and then the watcher's pid.
        Read until a pid line, or the pipe's end."""
        fd = self._report_fd
        assert fd is not None, "read only while the pipe is open"
        while not _has_pid_line(self._report):
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                return  # the launcher has not written it all yet
            if not data or len(self._report) > 4096:
                break  # the launcher is gone (or rambles): what it said is all there is
            self._report += data
        self.close_report_fd()
        for line in self._report.decode("ascii", "replace").splitlines():
            word, _, rest = line.partition(" ")
            if word == "refused" and self.isolation == PIDNS:
                self.isolation = SIGNALS
                self._isolation_errors.append(
                    f"the kernel refused the run's pid namespace ({rest}): "
                    "its processes were ended by signals"
                )
            elif word.isdigit():
                self._watcher = int(word)
                kind, _, note = rest.partition(" ")
                if kind == PIDNS:
                    self._open_init(int(word), note)

    def _open_init(self, pid: int, note: str) -> None:
        """The run's init: held by a pidfd, so no other process takes its pid."""
        try:
            self._init_fd = os.pidfd_open(pid)
        except OSError as exc:  # gone already: the namespace, and all in it, with it
            self._isolation_errors.append(f"the run's pid namespace's init {pid}: {exc}")
        if note:  # it holds, but not all of it (the machine's /proc kept)
            self._isolation_errors.append(f"the run's pid namespace: {note}")

    def close_report_fd(self) -> None:
        fd, self._report_fd = self._report_fd, None
        if fd is not None:
            os.close(fd)

    def abandon(self) -> None:
        """A run that ended without its sweep (cancelled, or a bug): its namespace,
        if it has one, ends now, and every process in it."""
        if self._report_fd is not None:
            self._read_report()
        fd, self._init_fd = self._init_fd, None
        if fd is not None:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                return  # ended already, and the namespace with it
            finally:
                os.close(fd)

    def _orphans(self, agent: int) -> dict[int, str]:
        me, session = os.getpid(), os.getsid(0)
        return {
            pid: state
            for pid, (state, sid) in children_of(me).items()
            if pid != agent and pid not in self._children_before and sid != session
        }

    async def reap_while_running(self, child: Child) -> None:
        """While the agent runs, an orphan that exits is reaped at once (SIGCHLD) and
        recorded: a long run whose agent daemonizes short-lived tools leaves no
        zombies piling up. Stops when the agent has exited: the sweep takes over."""
        with trio.open_signal_receiver(signal.SIGCHLD) as sigchld:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when_set, child.exited, nursery.cancel_scope)
                async for _ in sigchld:
                    await self._reap_exited(child)

    def _ours(self, agent: int) -> Callable[[int], bool]:
        """Whether an exited child is the run's to reap here: not the agent (its own
        wait reaps it), not a child from before the spawn, not of our own session."""
        excluded, session = self._children_before | {agent}, os.getsid(0)

        def ours(pid: int) -> bool:
            try:
                return pid not in excluded and os.getsid(pid) != session
            except OSError:
                return False  # gone: whoever reaped it is its owner

        return ours

    async def _reap_exited(self, child: Child) -> None:
        if child.exited.is_set():
            return  # the sweep takes over: it reaps and records
        # Without a look at /proc first: a churning bomb's zombies come faster than a
        # look walks them (docket.run.child.reap_exited).
        reaped, whole = reap_exited(self._ours(child.pid))
        for pid, status in reaped:
            if pid != self._watcher_pid():
                await self._record_orphan(pid, [], "exited", status)
        if whole:
            return
        for pid, state in self._orphans(child.pid).items():
            # No await between the check and the reap: the sweep, once the agent has
            # exited, never finds a pid half taken by this task.
            if state != "Z" or child.exited.is_set():
                continue
            returncode = reap_now(pid)
            if returncode is None or pid == self._watcher_pid():
                continue
            await self._record_orphan(pid, [], "exited", returncode)

    async def _record_orphan(
        self, pid: int, argv: list[str], found: str, returncode: int | None,
        reason: str | None = None,
    ) -> None:  # fmt: skip
        if self._orphans_listed >= MAX_ORPHAN_EVENTS:
            self._orphans_unlisted += 1
            return
        self._orphans_listed += 1
        if reason is None:
            reason = describe_exit(returncode) if returncode is not None else "not reaped"
        await self._record(
            "process.orphan",
            pid=pid,
            argv=[a[:ARGV_CHARS] for a in redact_argv(argv)[:ARGV_ITEMS]],
            found=found,
            status=returncode,
            reason=reason,
        )

    async def end_orphans(self, agent: int) -> None:
        """After the agent is reaped: end every process of the run, reap and record
        each, and name those still alive at the deadline (`survivors`)."""
        deadline = trio.current_time() + SWEEP_SECONDS
        survivors: set[int] = set()
        leaf, self.cgroup = self.cgroup, None
        if leaf is not None:
            survivors.update(await self._end_leaf(leaf, deadline))
        if self._report_fd is not None:
            self._read_report()  # the launcher is gone: all it said is there
        init, self._init_fd = self._init_fd, None
        if init is not None:
            survivors.update(await self._end_namespace(agent, init, deadline))
        # Always, last: a process of ours outside the leaf (one that moved itself out;
        # every one, without a leaf or namespace) is ended by freezing and killing the tree.
        survivors.update(await self._end_tree(agent, deadline))
        await self._account(agent, deadline, survivors)
        # Recorded once the end is over: the ledger's fsyncs never slow the loop down.
        for pid, argv, found, returncode, reason in self._ended:
            await self._record_orphan(pid, argv, found, returncode, reason)
        self._ended.clear()
        unlisted = self._orphans_unlisted
        if unlisted:
            await self._record(
                "process.orphan",
                unlisted=unlisted,
                reason=f"{unlisted} more orphan(s) ended, not listed one by one",
            )
        if leaf is not None and not survivors:
            why = leaf.remove()
            if why is not None:
                self._isolation_errors.append(why)
        if self.look_cut:
            self._isolation_errors.append(
                f"a look at /proc did not finish within {SWEEP_SECONDS:g} s: "
                "processes of the run it did not reach may be alive"
            )
        if survivors or self._isolation_errors:
            await self._record_isolation(sorted(survivors))

    async def _end_leaf(self, leaf: RunCgroup, deadline: float) -> list[int]:
        """Freeze, note, kill the run's cgroup until it is empty: [] or who is left."""
        froze_at: float | None = None
        noted = False
        try:
            while True:
                now = trio.current_time()
                froze_for = None if froze_at is None else now - froze_at
                frozen = froze_at is not None and leaf.frozen()
                step = cgroup_step(leaf.populated(), frozen, froze_for, now, deadline,
                                   freeze_wait=FREEZE_WAIT)  # fmt: skip
                if step.action == "done":
                    return []
                if step.action == "give_up":
                    return leaf.members()
                if step.action == "freeze":
                    leaf.freeze()
                    froze_at = now
                elif step.action == "kill":
                    if not noted:  # who was there, before the kill empties /proc
                        self._note(dict.fromkeys(leaf.members(), "S"))
                        noted = True
                    leaf.kill()
                await trio.sleep(POLL_SECONDS)
        except OSError as exc:
            # The leaf failed us (removed under us, a write refused): the tree loop
            # that follows ends whatever of the run is still our descendant.
            self._isolation_errors.append(f"the run's cgroup {leaf.path}: {exc.strerror or exc}")
            return []

    async def _end_namespace(self, agent: int, init: int, deadline: float) -> list[int]:
        """Note who is in the run's pid namespace, kill its init, and wait for it to
        exit: by then the kernel has ended (and freed) every other process in it.
        [] or the init, if it outlived the deadline."""
        try:
            noted_by = min(deadline, trio.current_time() + NOTE_SECONDS)
            # For the record only: a look cut short lists fewer, and ends no fewer.
            table, whole = process_table_until(lambda: trio.current_time() >= noted_by)
            self._note(self._tree(agent, table))
            if not whole:  # said, so a bomb's end is never a silent one
                self._isolation_errors.append(
                    f"a look at /proc for the record did not finish within {NOTE_SECONDS:g} s: "
                    "members of the run's pid namespace were ended unlisted"
                )
            try:
                signal.pidfd_send_signal(init, signal.SIGKILL)
            except ProcessLookupError:  # killed from outside: the namespace ended with it
                self._isolation_errors.append("the run's pid namespace's init ended before the run")
            with trio.move_on_at(deadline):
                await trio.lowlevel.wait_readable(init)
                for pid in [p for p, (_, found) in self._seen.items() if found == "running"]:
                    self._settle(pid, None, "killed with the run's pid namespace")
                return []
            return [self._watcher] if self._watcher is not None else []
        finally:
            os.close(init)

    async def _end_tree(self, agent: int, deadline: float) -> list[int]:
        """The freeze-then-kill loop over the run's process tree: [] or who is left."""
        stop_sent: set[int] = set()
        session = os.getsid(0)
        while True:
            self._drain(agent)  # before the look: it need not walk the churn's zombies
            table, whole = process_table_until(lambda: trio.current_time() >= deadline)
            members = self._tree(agent, table)
            if not whole:  # what it saw is alive; what it did not see may be too
                self.look_cut = True
                return sorted(p for p, state in members.items() if state not in DEAD)
            self._reap_zombies(members)
            self._note(members)
            step = next_step(members, frozenset(stop_sent), trio.current_time(), deadline)
            if step.action == "done":
                return []
            if step.action == "give_up":
                return sorted(step.survivors)
            for group in groups_of(step.stop, table, session):
                # Last in line for the CPU first: a bomb that forks and churns as fast as
                # it can otherwise takes the cores this loop needs to catch it.
                _signal(_lowest_priority, group, 0)
            for sig, pids in ((signal.SIGSTOP, step.stop), (signal.SIGKILL, step.kill)):
                for group in groups_of(pids, table, session):
                    _signal(os.killpg, group, sig)  # its forks meanwhile too
                for pid in pids:
                    _signal(os.kill, pid, sig)  # one that left its group meanwhile
            stop_sent.update(step.stop)
            await trio.sleep(POLL_SECONDS)  # for the signals to land

    def _tree(self, agent: int, table: dict | None = None) -> dict[int, str]:
        excluded = self._children_before | {agent}
        table = process_table() if table is None else table
        return run_tree(table, os.getpid(), os.getsid(0), excluded)

    def _note(self, members: dict[int, str]) -> None:
        """The first sight of each live process: its argv, before a kill empties it.
        (One first seen dead, a zombie, is recorded as `found: exited` when reaped.)
        Only the first ARGV_NOTED are read: only sixteen are listed, and reading a
        process's cmdline waits on its memory map, which a forking bomb keeps busy."""
        for pid, state in members.items():
            if state not in DEAD and pid not in self._seen:
                argv = cmdline_of(pid) if self._argv_noted < ARGV_NOTED else []
                self._argv_noted += 1
                self._seen[pid] = (argv, "running")

    def _drain(self, agent: int) -> None:
        """Reap every exited child of the run the kernel shows, without a look."""
        for pid, returncode in reap_exited(self._ours(agent))[0]:
            self._settle(pid, returncode)

    def _reap_zombies(self, members: dict[int, str]) -> None:
        for pid, state in members.items():
            if state in DEAD:
                returncode = reap_now(pid)  # None: not ours yet (its parent is dying)
                if returncode is not None:
                    self._settle(pid, returncode)

    def _settle(self, pid: int, returncode: int | None, reason: str | None = None) -> None:
        argv, found = self._seen.pop(pid, ([], "exited"))
        if pid != self._watcher_pid():  # docket's own is not the agent's
            self._ended.append((pid, argv, found, returncode, reason))

    async def _account(self, agent: int, deadline: float, survivors: set[int]) -> None:
        """Every process seen is reaped and recorded: the dead ones in transit (a
        zombie whose parent was killed with it comes back to us a moment later) are
        waited for until the deadline; one reaped by its own parent is recorded so."""
        for pid in survivors:
            self._seen.pop(pid, None)  # named in the isolation failure, not here
        while self._seen and trio.current_time() < deadline:
            self._drain(agent)
            self._reap_zombies(self._tree(agent))
            for pid in [p for p in self._seen if not os.path.exists(f"/proc/{p}")]:
                self._settle(pid, None, "ended; reaped by its parent, a process of the run")
            await trio.sleep(POLL_SECONDS)
        for pid in list(self._seen):
            self._settle(pid, None, f"not reaped within {SWEEP_SECONDS:g} s")

    @property
    def isolation_failed(self) -> bool:
        """Processes of the run may have outlived it: named ones, or unseen ones."""
        return bool(self.survivors) or self.look_cut

    async def _record_isolation(self, survivors: list[int]) -> None:
        """Survivors: the run's isolation failed, and the record says so by pid."""
        self.survivors = survivors
        fields: dict[str, object] = {"isolation": self.isolation}
        if survivors or self.look_cut:
            fields["survivors"] = survivors[:MAX_SURVIVORS_LISTED]
            fields["survivors_count"] = len(survivors)
            reason = (
                f"isolation failed: {len(survivors)} process(es) of the run still alive "
                f"{SWEEP_SECONDS:g} s after the end began; they may outlive the run"
            )
        else:
            reason = "the run's processes were all ended, not all as planned"
        if self._isolation_errors:
            fields["isolation_errors"] = self._isolation_errors
            reason += " (" + "; ".join(self._isolation_errors) + ")"
        await self._record("process.orphan", **fields, reason=reason)


def _has_pid_line(report: bytes) -> bool:
    return any(line[:1].isdigit() for line in report.split(b"\n")[:-1])


def _lowest_priority(group: int, _: int) -> None:
    os.setpriority(os.PRIO_PGRP, group, 19)  # raising a nice value needs no privilege


def _signal(send: Callable[[int, int], None], target: int, sig: int) -> None:
    try:
        send(target, sig)
    except ProcessLookupError:
        return  # it exited meanwhile: reaped on a later look


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
